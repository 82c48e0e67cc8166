"""The SGLang adapter's page-indexed state components (issue 29 item 3) against the model
daemons of sglang_fakes.py speaking protocol v8: a ``swa``, ``dsa`` or ``minimax_index_k``
component is registered with its state type, its page lists travel as ``state_pages`` (the
decode's in the prepare, the prefill's in the last send, never a slot), and what the adapter
refuses at construction is refused by name, before a word to ferryd."""

from __future__ import annotations

import os
from typing import Iterator

import pytest

from ferry import Errc, FerryError
from ferry.protocol import BufferKind, Prepare, Send, StateType
from ferry.sglang import FerryBootstrap, FerryKVArgs, FerryKVManager, FerryKVReceiver, \
    FerryKVSender, KVPoll
from ferry.sglang.kvargs import DSA_NEEDS_MLA
from sglang_fakes import BOOT, PREFILL_RANKS, Engine, ModelDaemon, World, failure


class Paged:
    """A prefill and a decode engine rank over v8 fake daemons, with one state component of
    ``kind`` (the fakes' two-buffer state pool)."""

    def __init__(self, tmp: str, kind: str, mla: bool = False) -> None:
        self.world = World()
        boot = FerryBootstrap({BOOT: PREFILL_RANKS})
        self.pd = ModelDaemon(tmp, "prefill", self.world, version=8, state_type=kind)
        self.dd = ModelDaemon(tmp, "decode", self.world, version=8, state_type=kind)
        self.engines: list[Engine] = []
        self.prefill = self._engine(self.pd, "prefill", boot, kind, mla)
        self.decode = self._engine(self.dd, "decode", boot, kind, mla)

    def _engine(self, d: ModelDaemon, mode: str, boot: FerryBootstrap, kind: str,
                mla: bool) -> Engine:
        e = Engine(d, mode, boot, state_type=kind, mla=mla)
        self.engines.append(e)
        return e

    def room(self, room: int) -> tuple[FerryKVReceiver, FerryKVSender]:
        r = FerryKVReceiver(self.decode.mgr, BOOT, room)
        r.init(0)
        return r, FerryKVSender(self.prefill.mgr, BOOT, room, [0], 0)

    def close(self) -> None:
        for e in self.engines:
            e.close()
        self.pd.close()
        self.dd.close()


@pytest.fixture(params=["swa", "minimax_index_k"])
def swa(request: pytest.FixtureRequest, short_tmp: str) -> Iterator[Paged]:
    p = Paged(short_tmp, request.param)
    try:
        yield p
    finally:
        p.close()


def test_a_paged_component_registers_with_its_state_type(swa: Paged) -> None:
    want = swa.decode.mgr.state_type
    assert want in (StateType.SWA, StateType.MINIMAX_INDEX_K)
    assert swa.world.state_types == [("prefill", want), ("decode", want)]
    assert swa.decode.mgr.paged_state and swa.decode.mgr.client.version == 8
    # unsliced: the slicing facts of a paged component are not registered
    entries = swa.decode.args.entries("state")
    assert [(e.tensor, e.kind, e.slice_dim, e.outer, e.groups) for e in entries] == \
        [(0, BufferKind.STATE, 0, 0, ()), (1, BufferKind.STATE, 0, 0, ())]


def test_page_lists_travel_as_state_pages_never_a_slot(swa: Paged) -> None:
    r, s = swa.room(500)
    r.send_metadata([1, 2, 3], aux_index=1, state_indices=[[6, 7]])
    assert r.poll() == KVPoll.WaitingForInput
    assert s.poll() == KVPoll.WaitingForInput
    s.init(3, 2)
    s.send([4, 5], None)  # not the last chunk: no state
    s.send([6], [[2, 3]])
    assert swa.world.requests("decode", Prepare) == \
        [Prepare(500, PREFILL_RANKS, [1, 2, 3], None, 1, 0, [6, 7])]
    assert swa.world.requests("prefill", Send) == \
        [Send(500, [4, 5], False, None, None), Send(500, [6], True, None, 2, 0, 0, [2, 3])]
    assert [s.poll(), r.poll()] == [KVPoll.Success, KVPoll.Success]
    # two pages of each of the two state buffers (128 and 512 bytes), with the KV pages
    kv = sum(swa.prefill.args.kv_item_lens)
    assert s.get_transfer_metric().transfer_total_bytes == 3 * kv + 2 * (128 + 512)


def test_a_flat_page_list_and_numpy_like_indices_are_taken(swa: Paged) -> None:
    class Int32:  # what a numpy int32 is to the adapter: an index
        def __init__(self, v: int) -> None:
            self.v = v

        def __index__(self) -> int:
            return self.v
    r, s = swa.room(501)
    r.send_metadata([1], aux_index=0, state_indices=[Int32(9), Int32(10)])  # the flat form
    s.init(1, 0)
    s.send([2], [[Int32(1), Int32(2)]], last_chunk=True)
    assert swa.world.requests("decode", Prepare)[-1].state_pages == [9, 10]
    assert swa.world.requests("prefill", Send)[-1].state_pages == [1, 2]


def test_no_entry_sends_no_state_pages(swa: Paged) -> None:
    """SGLang skips a component whose entry is None; so does the adapter (ferryd then checks
    both sides named none)."""
    r, s = swa.room(502)
    r.send_metadata([1], aux_index=0, state_indices=[None])
    s.init(1, 0)
    s.send([2], None, last_chunk=True)
    assert swa.world.requests("decode", Prepare)[-1].state_pages == []
    last = swa.world.requests("prefill", Send)[-1]
    assert last.last and last.state_pages == [] and last.state_slot is None


def test_a_page_that_is_not_a_page_number_fails_the_request_alone(swa: Paged) -> None:
    name = swa.decode.mgr.state_type.wire_name
    r, s = swa.room(503)
    r.send_metadata([1], aux_index=0, state_indices=[[4, -1]])
    assert r.poll() == KVPoll.Failed
    e = failure(r)
    assert e.code == Errc.INVALID_REQUEST
    assert e.failure_reason == f"PD state transfer failed: dst {name} state index -1 is not a " \
                               f"page number"
    assert swa.world.requests("decode", Prepare) == []
    r2, s2 = swa.room(504)
    r2.send_metadata([1], aux_index=0, state_indices=[[4]])
    s2.init(1, 0)
    s2.send([2], [["x"]])
    assert s2.poll() == KVPoll.Failed
    assert failure(s2).failure_reason == f"PD state transfer failed: src {name} state index " \
                                         f"'x' is not a page number"


# --- refused at construction ----------------------------------------------------------------

def test_two_state_components_are_refused_naming_them(short_tmp: str) -> None:
    d = ModelDaemon(short_tmp, "decode", World(), version=8)
    try:
        for types in (["mamba", "swa"], ["dsa", "dsa"], ["swa", "swa_ring"]):
            with pytest.raises(FerryError) as info:
                FerryKVManager(FerryKVArgs(state_types=types), "decode", is_mla_backend=True,
                               socket_path=d.path)
            assert info.value.code == Errc.INVALID_REQUEST
            if "swa_ring" in types:  # what cannot move at all is named first
                assert info.value.message.startswith(f"state_types {types}: Ferry cannot move "
                                                     f"swa_ring yet (")
                continue
            assert info.value.message == (
                f"state_types {types}: one state component per rank; got 2 "
                f"({', '.join(types)}): Ferry has one state pool (pools.mamba)")

        class Member:  # SGLang's StateType members, named by their value
            def __init__(self, v: str) -> None:
                self.value = v
        with pytest.raises(FerryError) as info:
            FerryKVManager(FerryKVArgs(state_types=[Member("SWA"), Member("dsa")]), "decode",
                           socket_path=d.path)
        assert "one state component per rank; got 2 (swa, dsa)" in info.value.message
        assert d.world.log == []  # refused before it said a word to ferryd
    finally:
        d.close()


def test_dsa_without_mla_is_refused_with_sglangs_reason(short_tmp: str) -> None:
    d = ModelDaemon(short_tmp, "decode", World(), version=8)
    try:
        with pytest.raises(FerryError) as info:
            FerryKVManager(FerryKVArgs(state_types=["dsa"]), "decode", socket_path=d.path)
        assert info.value.code == Errc.INVALID_REQUEST
        assert info.value.message == ("state_types ['dsa']: a dsa component needs MLA KV, and "
                                      "this backend is not MLA (is_mla_backend false): DSA is "
                                      "MLA-only")
        assert DSA_NEEDS_MLA == "DSA is MLA-only"
        assert d.world.log == []
    finally:
        d.close()


def test_dsa_with_mla_registers_as_dsa(short_tmp: str) -> None:
    p = Paged(short_tmp, "dsa", mla=True)
    try:
        assert p.world.state_types == [("prefill", StateType.DSA), ("decode", StateType.DSA)]
        r, s = p.room(510)
        r.send_metadata([1, 2], aux_index=0, state_indices=[[1, 2]])  # dsa: every page
        s.init(2, 0)
        s.send([3, 4], [[3, 4]])
        assert p.world.requests("prefill", Send)[-1].state_pages == [3, 4]
    finally:
        p.close()


def test_a_state_type_other_than_the_configs_is_refused_before_any_memory_is_lent(
        short_tmp: str) -> None:
    """A state pool ferryd's config describes has the config's type (pools.mamba.type, as the
    hello's config_yaml says it); KVArgs naming another are refused by name."""
    for i, (have, want) in enumerate((("swa", "mamba"), ("mamba", "dsa"),
                                      ("swa", "minimax_index_k"))):
        os.mkdir(os.path.join(short_tmp, str(i)))
        d = ModelDaemon(os.path.join(short_tmp, str(i)), "decode", World(), version=8,
                        state_type=have)
        try:
            with pytest.raises(FerryError) as info:
                Engine(d, "decode", FerryBootstrap({}), state_type=want, mla=True)
            assert info.value.code == Errc.INVALID_REQUEST
            assert info.value.message == (f"ferryd at {d.path} has a {have} state pool "
                                          f"(pools.mamba.type), but the KVArgs' state_types name "
                                          f"a {want} component")
            assert d.world.registered == []
        finally:
            d.close()


def test_a_paged_component_needs_a_v8_ferryd(short_tmp: str) -> None:
    d = ModelDaemon(short_tmp, "decode", World(), version=7, state_type="swa")
    try:
        with pytest.raises(FerryError) as info:
            Engine(d, "decode", FerryBootstrap({}), state_type="swa")
        assert info.value.code == Errc.UNSUPPORTED_VERSION
        assert info.value.message == (f"a swa state component needs protocol version 8; ferryd "
                                      f"at {d.path} speaks 3..7")
        assert d.world.registered == []  # nothing lent
    finally:
        d.close()
    os.mkdir(os.path.join(short_tmp, "v7"))
    d = ModelDaemon(os.path.join(short_tmp, "v7"), "decode", World(), version=7)
    try:  # mamba still registers on a v7 daemon, with no state_type on the wire
        e = Engine(d, "decode", FerryBootstrap({}))
        assert d.world.state_types == [("decode", 0)] and e.mgr.client.version == 7
        e.close()
    finally:
        d.close()


def test_mamba_keeps_its_single_slot(short_tmp: str) -> None:
    p = Paged(short_tmp, "mamba")
    try:
        r, _ = p.room(520)
        r.send_metadata([1], aux_index=0, state_indices=[[1, 2]])
        assert failure(r).failure_reason == ("PD state transfer failed: mamba requires single "
                                             "state index, got src=1, dst=2")
        r, s = p.room(521)
        r.send_metadata([1], aux_index=0, state_indices=[[3]])
        s.init(1, 0)
        s.send([2], [[1]])
        assert p.world.requests("decode", Prepare)[-1] == \
            Prepare(521, PREFILL_RANKS, [1], 3, 0, 0, [])
        assert p.world.requests("prefill", Send)[-1] == Send(521, [2], True, 1, 0, 0, 0, [])
        assert s.get_transfer_metric().transfer_total_bytes == \
            sum(p.prefill.args.kv_item_lens) + 128 + 512
    finally:
        p.close()

