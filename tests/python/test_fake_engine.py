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
                          "--tp2-requests", "16", "--max-tokens", "2048", "--timeout", "90",
                          "--json", str(report)],
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


class _Pool:
    """A stand-in for a MemfdPool: buffers of equal items over bytearrays."""

    def __init__(self, buffers: int, items: int, item_bytes: int) -> None:
        self.item_bytes = item_bytes
        self.mem = [bytearray(items * item_bytes) for _ in range(buffers)]
        self.buffers = [None] * buffers

    def view(self, b: int) -> memoryview:
        return memoryview(self.mem[b])

    def item(self, b: int, i: int) -> memoryview:
        return memoryview(self.mem[b])[i * self.item_bytes:(i + 1) * self.item_bytes]


def test_the_fake_engine_finds_a_byte_landing_in_memory_an_abort_handed_back() -> None:
    """The decode's end check: what an abort handed back and no later request reused still
    holds the poison written when ferryd ended the room; one stray byte in it is an error."""
    sys.path.insert(0, str(REPO / "scripts"))
    from fake_engine_decode import DecodeEngine
    from fake_engine_rank import Geometry

    class Rank:
        kv, state, aux = _Pool(2, 8, 64), _Pool(2, 4, 32), _Pool(1, 4, 16)

    eng = object.__new__(DecodeEngine)
    eng.rank, eng.who, eng.errors = Rank(), "decode", []
    eng.geo = Geometry(1, 1)
    eng.geo.page_bytes = 64
    eng.uncovered_pages, eng.uncovered_slots, eng.uncovered_rows = {2, 3}, {1}, {3}
    eng.poison([2, 3], 1, 3)
    eng.check_poison()
    assert eng.errors == []
    for pool, b, off in ((Rank.kv, 1, 3 * 64 + 63), (Rank.state, 0, 32 + 5), (Rank.aux, 0, 48)):
        eng.errors = []
        pool.mem[b][off] ^= 0xFF
        eng.check_poison()
        assert len(eng.errors) == 1 and "bytes landed in memory an abort had handed back" in \
            eng.errors[0], eng.errors
        pool.mem[b][off] ^= 0xFF
    eng.errors = []
    eng.check_poison()
    assert eng.errors == []
