"""Page-indexed state components end to end (issue 29 item 3), against real ferryd processes
speaking protocol v8, every pool described by the registration (``memory: client``): a
gpt-oss-shaped SWA model (full-attention KV layers, sliding-window layers as a ``swa``
component whose window pages are not the KV pages), an MLA model with a ``dsa`` indexer and a
MiniMax-like ``minimax_index_k`` model move byte for byte at equal TP, checked on every byte of
the decode rank's memory; ``dsa`` moves under TP 2 -> 1 (MLA: replicated, from the lowest
prefill rank); ``swa`` and ``minimax_index_k`` under TP 2 -> 1 are refused at the handshake with
SGLang's reason; page lists of different lengths, or that the decode's pool cannot take, fail
the request with ferryd's words."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from typing import Iterator

import pytest

from conftest import IO_TIMEOUT, Daemon, start_daemon, start_pair
from ferry import Client, Errc, FerryError
from ferry.memory import MemfdPool
from ferry.protocol import PROTOCOL_VERSION, BufferKind
from ferry.sglang import (FerryBootstrap, FerryKVArgs, FerryKVManager, FerryKVReceiver,
                          FerryKVSender, KVPoll)

from engine_ranks import BOOT, T, stop_all, wait_all
from sglang_engine_memory import METADATA_ROWS
from sglang_paged_memory import (REGISTERED_POOLS, PagedModel, PagedRank, copies_of,
                                 deepseek_dsa_like, gpt_oss_like, minimax_like)

ROOM = 0x5A6E_0000_0000_0000
SWA_TP_REFUSAL = "SGLang refuses SWA state under a TP mismatch for non-MLA models"
"""The daemon's words (docs/protocol.md, after SGLang's 'PD Disaggregation does NOT support PD
different TP sizes for non-MLA SWA hybrid models yet')."""


class Rank:
    """An engine rank: its memory and its manager (which registers it)."""

    def __init__(self, daemon: Daemon, mode: str, boot: FerryBootstrap, m: PagedModel,
                 seed: int, tp_size: int = 1, tp_rank: int = 0) -> None:
        self.mem = PagedRank(m, tp_size, tp_rank, name=f"{mode}{tp_rank}")
        self.mem.fill(seed)
        try:
            self.mgr = FerryKVManager(self.mem.kv_args(), mode, is_mla_backend=m.mla,
                                      socket_path=daemon.sock, bootstrap=boot,
                                      timeout=IO_TIMEOUT * 3, register_timeout=T)
        except BaseException:
            self.mem.close()
            raise

    def close(self) -> None:
        self.mgr.close()
        self.mem.close()


class Pair:
    def __init__(self, m: PagedModel, name: str) -> None:
        self.tmp = tempfile.mkdtemp(prefix="ferry-paged-")
        self.daemons = list(start_pair(self.tmp, f"prefill-{name}", f"decode-{name}",
                                       REGISTERED_POOLS))
        self.ranks: list[Rank] = []
        try:
            boot = FerryBootstrap({BOOT: [self.daemons[0].control]})
            self.p = self._rank(self.daemons[0], "prefill", boot, m, 1)
            self.d = self._rank(self.daemons[1], "decode", boot, m, 2)
        except BaseException:
            self.close()
            raise

    def _rank(self, daemon: Daemon, mode: str, boot: FerryBootstrap, m: PagedModel,
              seed: int) -> Rank:
        r = Rank(daemon, mode, boot, m, seed)
        self.ranks.append(r)
        return r

    def close(self) -> None:
        for r in reversed(self.ranks):
            r.close()
        stop_all(self.daemons)
        shutil.rmtree(self.tmp, ignore_errors=True)


def run_room(pair: Pair, room: int, kv_src: list[int], kv_dst: list[int], st_src: list[int],
             st_dst: list[int], row_src: int, row_dst: int, chunks: list[int]
             ) -> tuple[FerryKVReceiver, FerryKVSender]:
    """One room in SGLang's order: the decode's metadata with its pages of the component, the
    prefill's chunks, the last with the prefill's pages of the component."""
    pair.p.mem.set_room(row_src, room)
    r = FerryKVReceiver(pair.d.mgr, BOOT, room)
    s = FerryKVSender(pair.p.mgr, BOOT, room, [0], 0)
    r.init(0)
    r.send_metadata(kv_dst, aux_index=row_dst, state_indices=[st_dst])
    assert wait_all([s], KVPoll.WaitingForInput) == [KVPoll.WaitingForInput], \
        (s.failure, r.failure)
    s.init(len(kv_src), row_src)
    at = 0
    for i, n in enumerate(chunks):
        last = i == len(chunks) - 1
        s.send(kv_src[at:at + n], [st_src] if last else None)
        at += n
    assert at == len(kv_src)
    return r, s


def check_room(pair: Pair, r: FerryKVReceiver, s: FerryKVSender, kv_src: list[int],
               kv_dst: list[int], st_src: list[int], st_dst: list[int], row_src: int,
               row_dst: int) -> None:
    p, d = pair.p.mem, pair.d.mem
    metas = [f"meta{i}" for i in range(len(METADATA_ROWS))]
    src_before = bytes(p.view)
    want = d.expect(p, copies_of(d.kv_keys(), kv_src, kv_dst) +
                    copies_of(d.state_keys(), st_src, st_dst) +
                    copies_of(metas, [row_src], [row_dst]))
    assert wait_all([s, r]) == [KVPoll.Success, KVPoll.Success], (s.failure, r.failure)
    assert d.diff(want) == []  # every byte of every pool of the decode rank
    assert bytes(p.view) == src_before  # and nothing written on the prefill


# --- (a) an SWA model shaped like gpt-oss ---------------------------------------------------

@pytest.fixture(scope="module")
def swa_pair() -> Iterator[Pair]:
    p = Pair(gpt_oss_like(), "swa")
    try:
        yield p
    finally:
        p.close()


def test_the_swa_component_is_registered_as_swa(swa_pair: Pair) -> None:
    with Client(swa_pair.daemons[1].sock, name="observer", timeout=IO_TIMEOUT) as c:
        assert c.version == PROTOCOL_VERSION
        kv, state = c.pools["kv"], c.pools["state"]
    m = swa_pair.d.mem.m
    assert [(b.kind, b.layer_id) for b in kv.buffers] == \
        [(BufferKind.K, l) for l in m.kv_layers] + [(BufferKind.V, l) for l in m.kv_layers]
    # K over the sliding-window layers, then V over the same layers; the SWA pool's own pages
    assert [(b.tensor, b.layer_id, b.items, b.kind) for b in state.buffers] == \
        [(t, l, m.swa_pages, BufferKind.STATE) for t in (0, 1) for l in m.state_layers]
    assert swa_pair.d.mgr.paged_state and swa_pair.d.mgr.client.version == PROTOCOL_VERSION


def test_an_swa_room_moves_every_byte_to_its_place(swa_pair: Pair) -> None:
    """Six KV pages in two chunks; the window's two SWA pages (SGLang's translated indices:
    neither the KV pages nor in order) move with the last chunk."""
    kv_src, kv_dst = [1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 15]
    st_src, st_dst = [9, 3], [5, 2]
    r, s = run_room(swa_pair, ROOM + 1, kv_src, kv_dst, st_src, st_dst, 3, 6, [4, 2])
    check_room(swa_pair, r, s, kv_src, kv_dst, st_src, st_dst, 3, 6)
    assert s.get_transfer_metric().transfer_total_bytes == \
        6 * sum(swa_pair.p.mem.kv_args().kv_item_lens) + 2 * 6 * swa_pair.p.mem.state_item


def test_an_swa_room_whose_window_is_one_page(swa_pair: Pair) -> None:
    kv_src, kv_dst, st_src, st_dst = [7], [20], [11], [0]
    r, s = run_room(swa_pair, ROOM + 2, kv_src, kv_dst, st_src, st_dst, 1, 2, [1])
    check_room(swa_pair, r, s, kv_src, kv_dst, st_src, st_dst, 1, 2)


# --- (d) page lists of different lengths ------------------------------------------------------

def test_page_lists_of_different_lengths_fail_the_room_loudly(swa_pair: Pair) -> None:
    """SGLang truncates the longer list with a warning; ferryd refuses the prefill's last send
    naming both counts (the adapter then cancels the room, so the decode fails too), and no
    state page is written."""
    d = swa_pair.d.mem
    before = bytes(d.view)
    room = ROOM + 3
    r, s = run_room(swa_pair, room, [1, 2], [16, 17], [6], [4, 8], 2, 4, [2])
    assert wait_all([s, r]) == [KVPoll.Failed, KVPoll.Failed], (s.failure, r.failure)
    assert s.failure == (Errc.INVALID_REQUEST,
                         f"room {room}: the last chunk names 1 state pages but the decode "
                         f"prepared 2 (the lists must be the same length)")
    assert r.failure is not None and r.failure[0] == Errc.CANCELLED, r.failure
    assert d.diff(before) == []  # nothing of the room landed: the last send was refused


def test_a_decode_page_list_ferryd_cannot_take_fails_the_request(swa_pair: Pair) -> None:
    """Each page in the SWA pool and named once; a slot is no way to name a paged pool."""
    for room, pages, why in (
            (ROOM + 4, [4, 40], "dst swa state page 40 (position 1) is outside the pool of 12 "
                                "pages"),
            (ROOM + 5, [4, 4], "dst swa state page 4 is named twice (positions 0 and 1)")):
        r = FerryKVReceiver(swa_pair.d.mgr, BOOT, room)
        r.init(0)
        r.send_metadata([1], aux_index=0, state_indices=[pages])
        assert r.poll() == KVPoll.Failed
        assert r.failure == (Errc.INVALID_REQUEST, f"room {room}: {why}")
    with pytest.raises(FerryError) as info:
        swa_pair.d.mgr.client.prepare(ROOM + 6, [swa_pair.daemons[0].control], [1],
                                      state_slot=2, aux_row=0)
    assert info.value.message == (f"room {ROOM + 6}: dst state slot 2 given, but the swa state "
                                  f"pool is indexed by pages (state_pages), not by a slot")


# --- (b) an MLA model with a DSA indexer ------------------------------------------------------

def test_a_dsa_room_moves_every_byte_to_its_place() -> None:
    pair = Pair(deepseek_dsa_like(), "dsa")
    try:
        with Client(pair.daemons[1].sock, name="observer", timeout=IO_TIMEOUT) as c:
            state = c.pools["state"]
        m = pair.d.mem.m
        assert [(b.tensor, b.layer_id, b.items) for b in state.buffers] == \
            [(0, l, m.kv_pages) for l in m.state_layers]
        # the indexer is indexed by the full KV page id: SGLang names every page of the request
        kv_src, kv_dst = [2, 3, 4, 5, 6], [17, 9, 12, 13, 20]
        r, s = run_room(pair, ROOM + 10, kv_src, kv_dst, kv_src, kv_dst, 0, 7, [3, 2])
        check_room(pair, r, s, kv_src, kv_dst, kv_src, kv_dst, 0, 7)
    finally:
        pair.close()


def test_a_minimax_index_k_room_moves_every_byte_to_its_place() -> None:
    pair = Pair(minimax_like(), "mmx")
    try:
        m = pair.d.mem.m
        with Client(pair.daemons[1].sock, name="observer", timeout=IO_TIMEOUT) as c:
            state = c.pools["state"]
        assert [(b.tensor, b.layer_id, b.items) for b in state.buffers] == \
            [(0, l, m.kv_pages) for l in m.state_layers]
        kv_src, kv_dst = [8, 1, 2], [3, 4, 22]
        r, s = run_room(pair, ROOM + 15, kv_src, kv_dst, kv_src, kv_dst, 5, 5, [1, 2])
        check_room(pair, r, s, kv_src, kv_dst, kv_src, kv_dst, 5, 5)
    finally:
        pair.close()


# --- (c) TP 2 -> 1 -----------------------------------------------------------------------------

class Tp2To1:
    """Two prefill ranks at TP 2 and one decode rank at TP 1, every pool registered."""

    def __init__(self, tmp: str, m: PagedModel, name: str) -> None:
        extra = "tp: {{size: 2, rank: {}}}\n"
        self.daemons: list[Daemon] = []
        self.ranks: list[Rank] = []
        try:
            for r in (0, 1):
                self.daemons.append(start_daemon(tmp, f"prefill-{name}{r}", "prefill",
                                                 REGISTERED_POOLS, extra.format(r)))
            self.daemons.append(start_daemon(tmp, f"decode-{name}", "decode",
                                             REGISTERED_POOLS))
            boot = FerryBootstrap({BOOT: [self.daemons[0].control, self.daemons[1].control]})
            for r in (0, 1):
                self.ranks.append(Rank(self.daemons[r], "prefill", boot, m, 5 + r, 2, r))
            self.ranks.append(Rank(self.daemons[2], "decode", boot, m, 7))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for x in reversed(self.ranks):
            x.close()
        stop_all(self.daemons)


@pytest.mark.parametrize("kind", ["swa", "minimax_index_k"])
def test_a_non_mla_paged_component_under_a_tp_mismatch_is_refused_at_the_handshake(
        tmp_path, kind: str) -> None:
    m = gpt_oss_like() if kind == "swa" else minimax_like()
    why = SWA_TP_REFUSAL if kind == "swa" else \
        "SGLang refuses minimax_index_k under a TP mismatch"
    g = Tp2To1(str(tmp_path), m, kind[:3])
    try:
        d = g.ranks[2].mem
        before = bytes(d.view)
        r = FerryKVReceiver(g.ranks[2].mgr, BOOT, ROOM + 20)
        r.init(0)
        r.send_metadata([1, 2], aux_index=0, state_indices=[[1, 2]])
        assert wait_all([r]) == [KVPoll.Failed]
        assert r.failure is not None
        code, reason = r.failure
        assert code == Errc.PEER_INCOMPATIBLE, r.failure
        assert reason.startswith("could not use peer "), reason
        assert reason.endswith(": peer refused the handshake: incompatible layouts (prefill TP 2 "
                               "rank 0 PP 1 stage 0, decode TP 1 rank 0 PP 1 stage 0): "
                               f"{kind} state cannot move from prefill TP 2 to decode TP 1: "
                               f"{why}"), reason
        assert d.diff(before) == []  # nothing landed
    finally:
        g.close()


def test_dsa_under_tp_2_to_1_moves_from_the_lowest_prefill_rank(tmp_path) -> None:
    """MLA KV and the DSA indexer are replicated: the lowest prefill rank of the group sends
    them (and the aux row), byte for byte; both ranks send their chunks as SGLang's do."""
    g = Tp2To1(str(tmp_path), deepseek_dsa_like(), "dsa")
    try:
        p0, p1, d = (x.mem for x in g.ranks)
        room, src, dst = ROOM + 30, [2, 3, 11], [9, 10, 0]
        for p in (p0, p1):
            p.set_room(1, room)
        metas = [f"meta{i}" for i in range(len(METADATA_ROWS))]
        want = d.expect(p0, copies_of(d.kv_keys(), src, dst) + copies_of(d.state_keys(), src, dst)
                        + copies_of(metas, [1], [4]))
        assert p0.item("KV0", 2) != p1.item("KV0", 2)  # which rank sent is visible
        r = FerryKVReceiver(g.ranks[2].mgr, BOOT, room)
        r.init(0)
        r.send_metadata(dst, aux_index=4, state_indices=[dst])
        senders = [FerryKVSender(x.mgr, BOOT, room, [0], 0) for x in g.ranks[:2]]
        assert wait_all(senders, KVPoll.WaitingForInput) == [KVPoll.WaitingForInput] * 2
        for s in senders:
            s.init(len(src), 1)
            s.send(src[:2], None)
            s.send(src[2:], [src])
        assert wait_all(senders + [r]) == [KVPoll.Success] * 3, \
            [x.failure for x in senders + [r]]
        assert d.diff(want) == []
    finally:
        g.close()


# --- a state pool ferryd's config describes -------------------------------------------------

CONFIG_SWA = """pools:
  kv: {layer_ids: [0, 2], page_tokens: 2, kv_heads: 2, head_dim: 32, dtype_bytes: 2, pages: 24, memory: client}
  mamba:
    type: swa
    slots: 12
    layer_ids: [1, 3]
    tensors:
      - {name: k, shape: [2, 2, 32], dtype_bytes: 2}
      - {name: v, shape: [2, 2, 32], dtype_bytes: 2}
    memory: client
  aux: {rows: 8, row_bytes: 64, memory: client}
"""


def test_a_config_described_swa_pool_is_lent_and_moved_as_swa(tmp_path) -> None:
    """``pools.mamba.type: swa`` with a shape: MemfdPool.for_client lends it as swa, KVArgs
    naming mamba are refused before anything is lent, and a room moves the window's pages."""
    pd, dd = start_pair(str(tmp_path), "prefill-cfg", "decode-cfg", CONFIG_SWA)
    pools: list[MemfdPool] = []
    mgrs: list[FerryKVManager] = []
    try:
        boot = FerryBootstrap({BOOT: [pd.control]})
        args = {}
        for mode, daemon in (("prefill", pd), ("decode", dd)):
            with Client(daemon.sock, name="layout", timeout=IO_TIMEOUT) as c:
                kv, st, aux = (MemfdPool.for_client(c, k, name=f"{mode}-{k}")
                               for k in ("kv", "state", "aux"))
            pools += [kv, st, aux]
            assert st.state_type == "swa" and [b.items for b in st.buffers] == [12] * 4
            for pool, seed in ((kv, 1), (st, 2), (aux, 3)):
                view = pool.view()
                view[:] = bytes((i * 7 + seed + len(mode)) & 0xFF for i in range(len(view)))
            args[mode] = lambda t, kv=kv, st=st, aux=aux: FerryKVArgs.from_memfd_pools(
                kv=kv, state=st, aux=aux, page_size=2, state_type=t)
            with pytest.raises(FerryError) as info:
                FerryKVManager(args[mode]("mamba"), mode, socket_path=daemon.sock,
                               bootstrap=boot, timeout=IO_TIMEOUT)
            assert info.value.message == (f"ferryd at {daemon.sock} has a swa state pool "
                                          f"(pools.mamba.type), but the KVArgs' state_types "
                                          f"name a mamba component")
            mgrs.append(FerryKVManager(args[mode]("swa"), mode, socket_path=daemon.sock,
                                       bootstrap=boot, timeout=IO_TIMEOUT * 3,
                                       register_timeout=T))
        pkv, pst, paux, dkv, dst, daux = pools
        room = ROOM + 50
        paux.item(0, 1)[:8] = room.to_bytes(8, "little")
        want = {("kv", b, d): bytes(pkv.item(b, s)) for b in range(4) for s, d in ((3, 7), (4, 8))}
        want.update({("state", b, d): bytes(pst.item(b, s)) for b in range(4)
                     for s, d in ((10, 1), (2, 6))})
        want[("aux", 0, 5)] = bytes(paux.item(0, 1))
        r = FerryKVReceiver(mgrs[1], BOOT, room)
        s = FerryKVSender(mgrs[0], BOOT, room, [0], 0)
        r.init(0)
        r.send_metadata([7, 8], aux_index=5, state_indices=[[1, 6]])
        assert wait_all([s], KVPoll.WaitingForInput) == [KVPoll.WaitingForInput]
        s.init(2, 1)
        s.send([3, 4], [[10, 2]])
        assert wait_all([s, r]) == [KVPoll.Success] * 2, (s.failure, r.failure)
        got = {"kv": dkv, "state": dst, "aux": daux}
        assert [k for k, v in want.items() if bytes(got[k[0]].item(k[1], k[2])) != v] == []
    finally:
        for m in mgrs:
            m.close()
        for p in pools:
            p.close()
        stop_all([pd, dd])


def test_minimax_index_k_with_pp_2_is_refused_at_registration(tmp_path) -> None:
    """SGLang refuses MiniMax's sparse index with PP > 1; a prefill stage's ferryd refuses the
    registration, so the manager is not constructed and nothing is lent."""
    d = start_daemon(str(tmp_path), "prefill-mpp", "prefill", REGISTERED_POOLS,
                     "pp: {size: 2, rank: 1}\n")
    try:
        m = dataclasses.replace(minimax_like(), kv_layers=[2, 3], state_layers=[3])
        with pytest.raises(FerryError) as info:
            Rank(d, "prefill", FerryBootstrap({}), m, 1)
        assert info.value.code == Errc.INVALID_REQUEST
        assert info.value.message == (
            "pool state: the registration describes a pool this daemon cannot serve: "
            "pools.mamba.type: expected pp.size 1 for minimax_index_k state (SGLang refuses it "
            "with PP > 1), got pp.size 2")
    finally:
        stop_all([d])
