"""scripts/perf-plots.py reads what ferry-bench writes: real --json documents of each mode, from
a real pair, go through its series functions; ucx_perftest's output is parsed; the plots are
drawn from them when Debian's python3-matplotlib is installed (a reported skip otherwise). No
figure is judged: timing belongs to the benchmark."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from conftest import BIN_DIR, KV_ONLY_POOLS, REPO, Daemon, start_pair

spec = importlib.util.spec_from_file_location("perf_plots", REPO / "scripts" / "perf-plots.py")
plots = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plots)


@pytest.fixture(scope="module")
def documents() -> Iterator[dict]:
    """One document per mode the plots read, from a small tcp pair, as bench.sh keeps them."""
    work = tempfile.mkdtemp(prefix="ferry-plots-")
    p, d = start_pair(work, "prefill-pp", "decode-pp", KV_ONLY_POOLS)
    try:
        def bench(*args: str) -> dict:
            r = subprocess.run([str(BIN_DIR / "ferry-bench"), "--prefill-socket", p.sock,
                                "--decode-socket", d.sock, "--json", *args],
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stdout + r.stderr
            doc = json.loads(r.stdout)
            doc["bench"] = {"provider": "tcp", "page_tokens": 1, "args": list(args)}
            return doc
        yield {
            "throughput": bench("--prompt-tokens", "16", "--requests", "4", "--concurrency", "2"),
            "latency": bench("--latency", "--prompt-tokens", "16", "--requests", "2",
                             "--gap-ms", "0,1"),
            "open_loop": bench("--open-loop", "500", "--mix", "16:0.5,64:0.5", "--requests",
                               "6", "--duration-s", "5"),
        }
    finally:
        assert [p.stop(), d.stop()] == [0, 0]
        shutil.rmtree(work, ignore_errors=True)


def test_series_read_every_mode_of_ferry_bench(documents: dict) -> None:
    t, lat, ol = documents["throughput"], documents["latency"], documents["open_loop"]
    bulk = plots.bulk_series([t, lat, ol])  # the other modes' documents are not throughput
    assert list(bulk) == ["tcp"]
    assert bulk["tcp"]["ferry"] == (t["ferry"]["gbps_median"], t["ferry"]["gbps_min"],
                                    t["ferry"]["gbps_max"])
    assert bulk["tcp"]["raw"][0] == t["raw"]["gbps_median"] and bulk["tcp"]["ratio"] == t["ratio"]
    small = plots.small_series([t])["tcp"]
    assert small["ferry"] == t["ferry"]["rooms_per_s_median"]
    assert small["raw"] == pytest.approx(t["raw"]["gbps_median"] * 1e9 /
                                         t["per_request"]["bytes"])
    assert small["writes"] == t["per_request"]["writes"] == 2  # 1 layer x K and V
    rows = plots.latency_series([t, lat, ol])["tcp"]
    assert [r["gap_ms"] for r in rows] == [0, 1]
    for r, g in zip(rows, lat["latency"]["gaps"]):
        assert r["ferry"] == (g["ferry_ms"]["p50"], g["ferry_ms"]["p99"])
        assert r["raw"] == (g["raw_ms"]["p50"], g["raw_ms"]["p99"])
        assert r["single"] is not None and r["ratio"] == g["ratio_p50"]
    o = plots.open_loop_series([t, lat, ol])["tcp"]
    assert o["rate"] == 500 and o["sustained"] == ol["open_loop"]["sustained"]
    assert [c["tokens"] for c in o["classes"]] == [16, 64]
    assert sum(c["committed"] for c in o["classes"]) == ol["open_loop"]["committed"]
    ucx = [{"provider": "tcp", "tls": "tcp", "size": 4096, "iterations": 10, "gbps": 0.5}]
    sizes = plots.size_series([t], ucx)
    # A 16-token room of the KV-only pool is 2 writes (K and V) of 16 pages x 128 B.
    assert sizes["Ferry tcp"] == [(2048, t["ferry"]["gbps_median"])]
    assert sizes["raw fi_writedata tcp"] == [(2048, t["raw"]["gbps_median"])]
    assert sizes["UCX put_bw tcp"] == [(4096, 0.5)]


def test_ucx_perftest_output_is_read_from_its_final_line() -> None:
    out = """+--------------+--------------+------------------------------+---------------------+
|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
Final:                  2000      6.597   404.049   404.049      154.68     154.68        2475        2475
"""
    assert plots.parse_ucx_output(out) == pytest.approx(154.68 * 1048576 / 1e9)
    with pytest.raises(plots.PlotError, match="printed no 'Final:' line"):
        plots.parse_ucx_output("[1] UCX ERROR Failed to setup endpoints: unreachable")


def test_the_quick_plan_is_bounded_and_the_full_one_sizes_pools_for_32k_rooms() -> None:
    quick, full = plots.plan(True), plots.plan(False)
    assert int(full["small"]["env"]["KV_TOKENS"]) >= 3 * 32768
    assert "32768:0.01" in " ".join(full["small"]["runs"])
    for p in (quick, full):
        assert any("--latency" in r and "--gap-ms 0,50" in r for r in p["small"]["runs"])
        for r in p["small"]["runs"] + p["sizes"]["runs"]:
            assert "--requests" in r or "--duration-s" in r  # every run is bounded
    assert sum(quick["ucx_iterations"].values()) < sum(full["ucx_iterations"].values())


def test_the_plots_are_drawn_from_the_documents(documents: dict, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="python3-matplotlib is missing "
                                            "(scripts/perf-plots.py --install)")
    t = documents["throughput"]
    results = {"quick": True, "date": "test", "bulk": [t], "small": list(documents.values()),
               "sizes": [t], "ucx": [{"provider": "tcp", "tls": "tcp", "size": 4096,
                                      "iterations": 10, "gbps": 0.5}], "ucx_note": None}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    assert plots.main(["--from-json", str(path), "--out", str(tmp_path / "img")]) == 0
    names = sorted(x.name for x in (tmp_path / "img").iterdir())
    assert names == ["perf-bulk.png", "perf-latency.png", "perf-open-loop.png",
                     "perf-small-rooms.png", "perf-write-sizes.png"]
    for n in names:
        assert (tmp_path / "img" / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
