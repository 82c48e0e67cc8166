"""The fake engine (tests/fake_engine/fake_engine.py) end to end, in its short CI form (``--ci``): two
engine processes holding their memory as SGLang does (per-layer tensors at allocator offsets in
one memfd per rank, an EAGLE draft layer, Mamba ``[layers, size + 1, ...]`` tensors,
MetadataBuffers of ten tensors) and built with SGLang's signatures (a KVBootstrapServer,
``KVManager(kv_args, mode, server_args, is_mla_backend)`` with FERRY_SOCKET), against real
ferryd daemons from FERRY_BIN_DIR (default build/src) whose pools the registration describes;
prefix hits, aborts at five points on each side, byte-exact verification, the TP 2 -> 1 and
TP 1 -> 2 phases, and the SWA phase (a gpt-oss-shaped model whose ``swa`` component's window
pages come from the SWA pool's own allocator). The latency check is the script's own (its
report); here only outcomes are asserted."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

from conftest import BIN_DIR, REPO

POINTS_P = ("before_bootstrap", "waiting_for_input", "before_first_chunk", "mid_chunks",
            "after_last_chunk")
POINTS_D = ("before_init", "before_metadata", "after_metadata", "transferring", "after_success")


def test_the_fake_engine_passes_its_ci_form(tmp_path) -> None:
    report = tmp_path / "fake_engine.json"
    out = subprocess.run([sys.executable, str(REPO / "tests" / "fake_engine" / "fake_engine.py"),
                          "--bin-dir", str(BIN_DIR), "--ci", "--seed", "11",
                          "--json", str(report)],
                         capture_output=True, text=True, timeout=600)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    summary = [line for line in out.stdout.splitlines() if line.startswith("fake_engine: PASS:")]
    assert len(summary) == 1, text[-6000:]
    r = json.loads(report.read_text())
    assert r["ok"] and r["errors"] == [], r
    dec, pre = r["main"]["decode"], r["main"]["prefill"]
    # every abort point of both sides was reached
    assert {p for p, n in pre["aborts"].items() if n} == set(POINTS_P), pre["aborts"]
    assert {p for p, n in dec["aborts"].items() if n} == set(POINTS_D), dec["aborts"]
    assert dec["succeeded"] >= 25 and dec["reused_after_abort"] >= 1, dec
    # page-rounded non-last chunks with no whole page are skipped; a full prefix hit still
    # sends its last, zero-page chunk (the state and the metadata rows)
    assert pre["chunks_skipped"] >= 1 and pre["zero_page_last"] >= 1, pre
    assert r["main"]["ferryd"]["decode"]["succeeded"] >= dec["succeeded"]
    assert r["main"]["ferryd"]["decode"]["bytes"] > 0
    for phase in ("tp2", "tp12", "swa"):
        assert r[phase]["ok"] and r[phase]["decode"]["succeeded"] >= 3, r[phase]
    # the SWA phase moved window pages (every SWA buffer's, verified) and no Mamba slot
    swa = r["swa"]["decode"]
    assert swa["verified_state_indices"] >= swa["succeeded"], swa
    assert swa["windows_of_the_whole_prompt"] >= 1 and swa["windows_of_a_tail"] >= 1, swa
    assert swa["verified_state_bytes"] > 0 and r["swa"]["latency"]["n"] > 0, r["swa"]
    assert any("SWA ok" in line for line in summary), summary
    # every call kind SGLang's schedulers make was made (and timed)
    assert {"KVSender", "KVReceiver", "init", "send", "send_metadata", "poll", "abort",
            "failure_exception", "clear", "pop_decode_prefix_len",
            "try_ensure_parallel_info"} <= set(r["latency"]), r["latency"]


def test_the_fake_engine_finds_a_byte_landing_in_memory_an_abort_handed_back() -> None:
    """The decode's end check: what an abort handed back and no later request reused still
    holds the poison written when ferryd ended the room; one stray byte in it is an error."""
    sys.path.insert(0, str(REPO / "tests" / "fake_engine"))
    from fake_engine_decode import DecodeEngine
    from fake_engine_memory import Model, RankMemory

    class Rank:
        mem = RankMemory(Model(kv_layers=[3], mamba_layers=[0], tokens=64, page=4, slots=2,
                               rows=4), 1, 0, "memfd", "poison")

    try:
        eng = object.__new__(DecodeEngine)
        eng.ranks, eng.who, eng.errors = [Rank()], "decode", []
        eng.uncovered_pages, eng.uncovered_states, eng.uncovered_rows = {2, 3}, {1}, {3}
        eng.poison([2, 3], [1], 3)
        eng.check_poison()
        assert eng.errors == []
        mem = Rank.mem
        for view in (mem.kv_run(2, 3, 1), mem.state_item(1, 1), mem.meta_row(7, 3)):
            eng.errors = []
            view[len(view) - 1] ^= 0xFF
            eng.check_poison()
            assert len(eng.errors) == 1 and "bytes landed in memory an abort had handed back" \
                in eng.errors[0], eng.errors
            view[len(view) - 1] ^= 0xFF
        del view
        eng.errors = []
        eng.check_poison()
        assert eng.errors == []
    finally:
        Rank.mem.close()


def test_the_swa_phase_finds_a_byte_landing_in_a_window_page_an_abort_handed_back() -> None:
    """The same end check over the SWA phase's memory: an aborted request's window pages (in
    every SWA buffer) stay poisoned until a later request reuses them."""
    sys.path.insert(0, str(REPO / "tests" / "fake_engine"))
    from fake_engine_swa import SwaDecodeEngine, SwaModel, SwaRankMemory

    class Rank:
        mem = SwaRankMemory(SwaModel(kv_layers=[1], swa_layers=[0, 2], tokens=64, page=4,
                                     rows=4), 1, 0, "ordinary", "swa-poison")

    try:
        eng = object.__new__(SwaDecodeEngine)
        eng.ranks, eng.who, eng.errors = [Rank()], "decode", []
        eng.uncovered_pages, eng.uncovered_states, eng.uncovered_rows = {2}, {5, 7}, {1}
        eng.poison([2], [5, 7], 1)
        eng.check_poison()
        assert eng.errors == []
        view = Rank.mem.state_item(3, 7)  # V of the second SWA layer, window page 7
        view[0] ^= 0xFF
        eng.check_poison()
        assert len(eng.errors) == 1 and "swa buffer 3 (V2) page 7" in eng.errors[0], eng.errors
        view[0] ^= 0xFF
        view.release()
    finally:
        Rank.mem.close()


def test_the_fake_engines_memory_is_laid_out_as_sglang_lays_it_out() -> None:
    """What a fake engine rank lends: SGLang's KVArgs over tensors at allocator offsets."""
    sys.path.insert(0, str(REPO / "tests" / "fake_engine"))
    from fake_engine_memory import BOOTSTRAP_ROOM, METADATA, Model, RankMemory

    m = Model(tokens=256, slots=2, rows=4)
    for aux in ("ordinary", "memfd"):
        mem = RankMemory(m, 2, 1, aux, "layout")
        try:
            a = mem.kv_args()
            region = a.memory_regions[0]
            # target K, target V, then the EAGLE draft layer's K and V with its own id
            assert a.kv_layer_ids == m.kv_layers + m.kv_layers + [0, 0]
            assert any(p % 4096 for p in a.kv_data_ptrs)  # not page-aligned
            assert all(region.contains(p, n) for p, n in zip(a.kv_data_ptrs, a.kv_data_lens))
            assert a.kv_item_lens[0] == m.page * (m.kv_heads // 2) * m.head_dim * 2
            # Mamba: per-layer views of [layers, size + 1, ...] tensors, tensor-major
            (ptrs,), (items,), (lens,) = a.state_data_ptrs, a.state_item_lens, a.state_data_lens
            nl = len(m.mamba_layers)
            assert len(ptrs) == 2 * nl and a.state_types == ["mamba"]
            assert all(ptrs[i + 1] - ptrs[i] == lens[i] == (m.slots + 1) * items[i]
                       for i in range(nl - 1))
            assert a.state_layer_ids == [m.mamba_layers * 2]
            assert a.state_conv_shard_groups[0][0] == list(m.conv_groups)
            assert a.state_dim_per_tensor[0][0] == sum(m.conv_groups) // 2
            # MetadataBuffers: ten tensors, bootstrap_room not last
            assert a.aux_item_lens == [r for _, r in METADATA] and len(a.aux_data_ptrs) == 10
            assert a.bootstrap_room_ptr == a.aux_data_ptrs[BOOTSTRAP_ROOM] != a.aux_data_ptrs[-1]
            inside = [region.contains(p, n) for p, n in zip(a.aux_data_ptrs, a.aux_data_lens)]
            assert inside == [aux == "memfd"] * 10
        finally:
            mem.close()


def test_the_swa_phases_memory_is_laid_out_as_sglangs_swa_kv_pool() -> None:
    """The SWA phase's rank: full-attention K and V as the KV pool, the sliding-window
    layers' K then V as the swa component, a pool of its own with fewer pages (SGLang's
    SWAKVPool); the window is the pages of the prompt's last 128 tokens, start floored to a
    page."""
    sys.path.insert(0, str(REPO / "tests" / "fake_engine"))
    from fake_engine_swa import SwaModel, SwaRankMemory

    m = SwaModel(tokens=256, rows=4)
    assert m.swa_tokens == 192 and m.swa_pages_usable() == 12  # 0.8 x 256, whole pages
    # (first token page, pages): short prompts are all window; 200 tokens start at 72 -> 64
    assert [m.window(n) for n in (1, 16, 17, 128, 129, 200, 208)] == \
        [(0, 1), (0, 1), (0, 2), (0, 8), (0, 9), (4, 9), (5, 8)]
    mem = SwaRankMemory(m, 1, 0, "ordinary", "swa-layout")
    try:
        a = mem.kv_args()
        region = a.memory_regions[0]
        assert a.state_types == ["swa"] and a.kv_layer_ids == m.kv_layers * 2
        (ptrs,), (lens,), (items,) = a.state_data_ptrs, a.state_data_lens, a.state_item_lens
        assert a.state_layer_ids == [m.swa_layers * 2] and len(ptrs) == 2 * len(m.swa_layers)
        assert items == [m.page * m.kv_heads * m.head_dim * 2] * len(ptrs) == \
            a.kv_item_lens[:len(ptrs)]
        assert lens == [(m.swa_tokens + m.page) * m.kv_heads * m.head_dim * 2] * len(ptrs)
        assert a.kv_data_lens[0] == (m.tokens + m.page) * m.kv_heads * m.head_dim * 2
        assert all(region.contains(p, n) for p, n in zip(ptrs, lens))
        assert any(p % 4096 for p in ptrs)  # not page-aligned
        # K over the SWA layers, then V; page i of buffer e at its item offset
        assert ptrs[len(m.swa_layers)] == mem.base + mem.places[f"sV{m.swa_layers[0]}"]
        view = mem.state_item(3, 5)
        assert ctypes.addressof(ctypes.c_char.from_buffer(view)) == ptrs[3] + 5 * items[3]
        assert view.nbytes == items[3] and mem.state_pad == 0
        view.release()
    finally:
        mem.close()
