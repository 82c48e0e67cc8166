"""The fake engine (scripts/fake_engine.py) end to end, small: two engine processes driving the
SGLang-shaped adapter against real ferryd daemons from FERRY_BIN_DIR (default build/src), with
prefix hits, aborts on both sides, byte-exact verification, and the TP2-prefill phase."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import BIN_DIR, REPO


def test_the_fake_engine_passes_with_40_requests_and_the_tp2_phase(tmp_path) -> None:
    report = tmp_path / "fake_engine.json"
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "fake_engine.py"),
                          "--bin-dir", str(BIN_DIR), "--requests", "40", "--seed", "11",
                          "--tp2-requests", "16", "--timeout", "90", "--json", str(report)],
                         capture_output=True, text=True, timeout=180)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    summary = [line for line in out.stdout.splitlines() if line.startswith("fake_engine: PASS:")]
    assert len(summary) == 1, text[-6000:]
    r = json.loads(report.read_text())
    assert r["ok"] and r["errors"] == [], r
    dec, pre = r["main"]["decode"], r["main"]["prefill"]
    aborted = dec["decode_aborts"] + pre["prefill_aborts"]
    assert dec["succeeded"] + aborted >= 40 and dec["succeeded"] >= 30, r["main"]
    assert dec["decode_aborts"] >= 1 and pre["prefill_aborts"] >= 1, r["main"]
    assert dec["reused_after_abort"] >= 1, r["main"]
    # the schedule forces a full prefix hit of several chunks: zero-page chunks reach the
    # adapter, and only the one carrying the state is taken as the last
    assert pre["zero_page_chunks"] >= 1 and pre["zero_page_last"] >= 1, pre
    assert r["main"]["ferryd"]["decode"]["succeeded"] >= dec["succeeded"]
    assert r["main"]["ferryd"]["decode"]["bytes"] > 0
    assert r["tp2"]["ok"] and r["tp2"]["decode"]["succeeded"] >= 12, r["tp2"]
