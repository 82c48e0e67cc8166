"""The fake engine (scripts/fake_engine.py) end to end, small: two engine processes driving the
SGLang-shaped adapter against real ferryd daemons from FERRY_BIN_DIR (default build/src), with
prefix hits, aborts on both sides, byte-exact verification, and the TP2-prefill phase."""

from __future__ import annotations

import subprocess
import sys

from conftest import BIN_DIR, REPO


def test_the_fake_engine_passes_with_40_requests_and_the_tp2_phase() -> None:
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "fake_engine.py"),
                          "--bin-dir", str(BIN_DIR), "--requests", "40", "--seed", "11",
                          "--tp2-requests", "16", "--timeout", "90"],
                         capture_output=True, text=True, timeout=180)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    summary = [line for line in out.stdout.splitlines() if line.startswith("fake_engine: PASS:")]
    assert len(summary) == 1, text[-6000:]
    line = summary[0]
    assert "40 requests" in line and "byte-exact" in line, line
    assert "TP2 phase ok" in line and "0 rooms active, allocators full" in line, line
    assert " 0 zero-page last chunks" not in line, line  # the schedule forces a full prefix hit
