"""tests/fake_engine/adapter_bench.py end to end, tiny: the adapter and ferry-bench (its --json output)
move the same rooms through real daemons and both commit all of them. No timing is asserted;
the figures belong in docs/performance.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import BIN_DIR, REPO


@pytest.mark.parametrize("wait", ["events", "poll"])
def test_adapter_bench_moves_every_room_both_ways(tmp_path, wait: str) -> None:
    report = tmp_path / "ab.json"
    out = subprocess.run([sys.executable, str(REPO / "tests" / "fake_engine" / "adapter_bench.py"),
                          "--bin-dir", str(BIN_DIR), "--tokens", "64", "--requests", "6",
                          "--concurrency", "2", "--repeat", "1", "--wait", wait,
                          "--pages", "512", "--slots", "2",
                          "--json", str(report)],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    r = json.loads(report.read_text())
    assert r["wait"] == wait and len(r["sizes"]) == 1
    row = r["sizes"][0]
    assert row["tokens"] == 64 and row["requests"] == 6 and row["writes_per_room"] > 0
    for side in ("adapter", "ferry-bench"):
        (run,) = row["runs"][side]
        assert run["committed"] == 6 and not run["failed"], run
        assert run["p50_ms"] > 0 and run["rooms_per_s"] > 0
