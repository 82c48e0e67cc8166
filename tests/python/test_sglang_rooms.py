"""The SGLang adapter's senders and receivers (clients/python/ferry/sglang/rooms.py) against the
model daemons of sglang_fakes.py: the call order on the wire, decode_prefix_len's path, the
state_indices rules (one request failing alone), last-chunk detection, refusals and failures
with their codes, and poll_all's batching."""

from __future__ import annotations

from typing import Iterator

import time

import pytest

from conftest import IO_TIMEOUT
from ferry import Errc, FerryError
from ferry.protocol import Cancel, Error, Poll, PollMany, Pool, Prepare, Send, Status
from ferry.sglang import (ABORTED, FROM_ANOTHER_RANK, FerryBootstrap, FerryKVArgs,
                          FerryKVManager, FerryKVReceiver, FerryKVSender, KVPoll, poll_all)
from sglang_fakes import BOOT, PAGE_TOKENS, PREFILL_RANKS, ModelDaemon, Setup, World, failure


@pytest.fixture
def env(short_tmp: str) -> Iterator[Setup]:
    s = Setup(short_tmp)
    try:
        yield s
    finally:
        s.close()


# --- a room's call order ---------------------------------------------------------------------------

def test_a_room_in_sglang_call_order(env: Setup) -> None:
    w = env.world
    r = FerryKVReceiver(env.decode.mgr, BOOT, 77)
    assert r.poll() == KVPoll.Bootstrapping
    r.init(prefill_dp_rank=0)
    assert r.poll() == KVPoll.WaitingForInput
    assert w.requests("decode", Prepare, Poll) == []  # nothing reached the decode's ferryd yet
    s = FerryKVSender(env.prefill.mgr, BOOT, 77, dest_tp_ranks=[0], pp_rank=0)
    assert s.poll() == KVPoll.Bootstrapping  # the prefill ferryd has not seen the prepare
    r.send_metadata([5, 6, 7, 8, 9], aux_index=3, state_indices=[[2]], decode_prefix_len=0)
    assert w.requests("decode", Prepare) == [Prepare(77, PREFILL_RANKS, [5, 6, 7, 8, 9], 2, 3)]
    assert s.poll() == KVPoll.WaitingForInput
    assert s.pop_decode_prefix_len() == 0
    s.init(5, 1)
    assert s.should_send_kv_chunk(2, False) and not s.should_send_kv_chunk(0, False)
    s.send([10, 11], None)
    s.send([12, 13], None)
    assert r.poll() == KVPoll.Transferring
    s.send([14], [[0]])
    assert w.requests("prefill", Send) == [Send(77, [10, 11], False, None, None),
                                           Send(77, [12, 13], False, None, None),
                                           Send(77, [14], True, 0, 1)]
    assert s.poll() == KVPoll.Success and r.poll() == KVPoll.Success
    n = len(w.log)
    assert s.poll() == KVPoll.Success and r.poll() == KVPoll.Success
    assert len(w.log) == n  # terminal statuses are not asked again
    m = s.get_transfer_metric()  # 5 pages of 4 KV buffers, and the Mamba slot's 2 tensors
    assert m.transfer_total_bytes == 5 * 4 * 256 + 128 + 512
    assert m.alloc_latency_s is not None and m.transfer_latency_s is not None


# --- decode_prefix_len -----------------------------------------------------------------------------

def test_decode_prefix_len_travels_with_the_prepare_and_comes_back_in_the_prefill_poll(
        env: Setup) -> None:
    w = env.world
    r = env.receiver(5)
    s = env.sender(5)
    assert s.poll() == KVPoll.Bootstrapping and s.pop_decode_prefix_len() == 0
    # the decode holds 2 pages (32 tokens) of the prompt: it names only the pages after them
    r.send_metadata([40, 41], aux_index=0, state_indices=[[1]], decode_prefix_len=2 * PAGE_TOKENS)
    assert w.requests("decode", Prepare) == [Prepare(5, PREFILL_RANKS, [40, 41], 1, 0, 32)]
    assert s.poll() == KVPoll.WaitingForInput
    prefix = s.pop_decode_prefix_len()
    assert prefix == 32
    prompt_tokens = 60  # 4 pages of 16; the last partly filled
    num_pages = -(-(prompt_tokens - prefix) // PAGE_TOKENS)
    s.init(num_pages, 4)
    s.send([102, 103], [[3]])  # the pages of tokens 32..59 only
    assert w.requests("prefill", Send) == [Send(5, [102, 103], True, 3, 4)]
    assert s.poll() == KVPoll.Success and r.poll() == KVPoll.Success
    r.clear()


def test_with_ferry_checksums_every_prepare_asks_for_its_room_to_be_checked(
        short_tmp: str) -> None:
    env = Setup(short_tmp, version=10)
    try:
        w = env.world
        env.decode.mgr.settings.checksums = True  # FERRY_CHECKSUMS=1
        r = env.receiver(6)
        s = env.sender(6)
        r.send_metadata([40, 41], aux_index=0, state_indices=[[1]], decode_prefix_len=0)
        assert w.requests("decode", Prepare) == [Prepare(6, PREFILL_RANKS, [40, 41], 1, 0, 0, [],
                                                         True)]
        s.init(2, 4)
        s.send([102, 103], [[3]])
        assert s.poll() == KVPoll.Success and r.poll() == KVPoll.Success
    finally:
        env.close()


def test_with_ferry_checksums_a_ferryd_below_protocol_10_fails_the_request_by_name(
        env: Setup) -> None:
    env.decode.mgr.settings.checksums = True
    r = env.receiver(7)
    r.send_metadata([40], aux_index=0, state_indices=[[1]])
    assert r.poll() == KVPoll.Failed
    e = failure(r)
    assert (e.code, e.failure_reason) == (Errc.UNSUPPORTED_VERSION, "a checked room needs "
                                          "protocol version 10; this connection speaks 4")
    assert env.world.requests("decode", Prepare) == []  # never sent unchecked


def test_a_prefix_that_is_not_whole_pages_fails_that_request(env: Setup) -> None:
    bad, good = env.receiver(6), env.receiver(7)
    bad.send_metadata([1], aux_index=0, state_indices=[[0]], decode_prefix_len=5)
    good.send_metadata([2], aux_index=1, state_indices=[[1]], decode_prefix_len=16)
    assert bad.poll() == KVPoll.Failed and good.poll() == KVPoll.WaitingForInput
    e = failure(bad)
    assert e.code == Errc.INVALID_REQUEST and e.bootstrap_room == 6
    assert e.failure_reason == "decode_prefix_len 5 of room 6 is not a multiple of the page size 16"
    assert [p.room for p in env.world.requests("decode", Prepare)] == [7]


# --- state_indices ---------------------------------------------------------------------------------

def test_state_indices_on_the_decode(env: Setup) -> None:
    w = env.world
    cases = {
        10: ([[2]], None),
        11: ([3], None),  # the flat format of older SGLang
        12: ([[2, 3]], "got src=1, dst=2"),
        13: (None, "got src=1, dst=0"),
        14: ([[]], "got src=1, dst=0"),
        15: ([None], "got src=1, dst=0"),
    }
    rs = {room: env.receiver(room) for room in cases}
    for room, (idx, _) in cases.items():
        rs[room].send_metadata([room], aux_index=room - 10, state_indices=idx)
    assert [(p.room, p.state_slot) for p in w.requests("decode", Prepare)] == [(10, 2), (11, 3)]
    for room, (_, why) in cases.items():
        if why is None:
            assert rs[room].poll() == KVPoll.WaitingForInput
        else:
            assert rs[room].poll() == KVPoll.Failed
            e = failure(rs[room])
            assert e.failure_reason == f"PD state transfer failed: mamba requires single state " \
                                       f"index, {why}"
            assert e.code == Errc.INVALID_REQUEST and not e.is_from_another_rank
            assert str(e).startswith(f"KVTransferError(bootstrap_room={room}): [400] PD state")
    assert not [m for m in w.requests("decode", Cancel)]  # nothing to cancel: never prepared


def test_state_indices_on_the_prefill_fail_that_request_and_cancel_its_room(env: Setup) -> None:
    w = env.world
    for room in (20, 21, 22):
        env.receiver(room).send_metadata([room], aux_index=room - 20, state_indices=[[room - 20]])
    ss = {room: env.sender(room) for room in (20, 21, 22)}
    for room, s in ss.items():
        assert s.poll() == KVPoll.WaitingForInput
        s.init(2, room - 20)
        s.send([room * 10], [[7, 8]])  # not the last chunk: its state_indices are not used
    ss[20].send([201], [[5]])
    ss[21].send([211], [[5, 6]])
    ss[22].send([221], None)
    assert ss[20].poll() == KVPoll.Success
    for room, why in ((21, "got src=2, dst=1"), (22, "got src=0, dst=1")):
        assert ss[room].poll() == KVPoll.Failed
        assert failure(ss[room]).failure_reason == \
            f"PD state transfer failed: mamba requires single state index, {why}"
    assert [s.room for s in w.requests("prefill", Send) if s.last] == [20]
    assert [c.room for c in w.requests("prefill", Cancel)] == [21, 22]
    # (the model shares one room table: the cancel reaches the decode's room, as ferryd tells
    # the peer)
    assert w.status("decode", 21).status == Status.Failed
    assert w.status("decode", 20).status == Status.Success


def test_without_a_state_pool_state_indices_must_be_empty(short_tmp: str) -> None:
    world = World()
    d = ModelDaemon(short_tmp, "decode", world, client_memory=False)
    d.pools = (d.pools[0], Pool(False, "", 0, ()), d.pools[2])
    try:
        mgr = FerryKVManager(FerryKVArgs(), "decode", socket_path=d.path,
                             bootstrap=FerryBootstrap({BOOT: PREFILL_RANKS}), timeout=IO_TIMEOUT)
        ok, bad = FerryKVReceiver(mgr, BOOT, 1), FerryKVReceiver(mgr, BOOT, 2)
        ok.init(0)
        bad.init(0)
        ok.send_metadata([1], aux_index=0, state_indices=[])
        bad.send_metadata([2], aux_index=1, state_indices=[[4]])
        assert world.requests("decode", Prepare) == [Prepare(1, PREFILL_RANKS, [1], None, 0)]
        assert bad.poll() == KVPoll.Failed
        assert "this ferryd has no state pool" in failure(bad).failure_reason
        mgr.close()
    finally:
        d.close()


class ZeroD:
    """Like the 0-d numpy array SGLang's Mamba payload holds
    (``req_index_to_mamba_index_mapping[idx].cpu().numpy()``): an index without a length."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __index__(self) -> int:
        return self.v

    def __len__(self) -> int:
        raise TypeError("len() of unsized object")


def test_state_indices_as_sglang_builds_them(env: Setup) -> None:
    r = env.receiver(110)
    r.send_metadata([1], aux_index=0, state_indices=[[ZeroD(3)]])
    assert env.world.requests("decode", Prepare)[-1].state_slot == 3
    s = env.sender(110)
    s.init(1, 0)
    s.send([4], [[ZeroD(1)]])
    assert env.world.requests("prefill", Send)[-1] == Send(110, [4], True, 1, 0)
    flat = env.receiver(111)
    flat.send_metadata([2], aux_index=1, state_indices=[ZeroD(2)])  # the pre-component format
    assert env.world.requests("decode", Prepare)[-1].state_slot == 2
    neg = env.receiver(112)
    neg.send_metadata([3], aux_index=2, state_indices=[[-1]])
    assert "state index -1 is not a slot number" in failure(neg).failure_reason


# --- last chunk ------------------------------------------------------------------------------------

def test_the_chunk_that_reaches_num_pages_is_the_last(env: Setup) -> None:
    w = env.world
    env.receiver(30).send_metadata(list(range(5)), aux_index=0, state_indices=[[0]])
    s = env.sender(30)
    s.init(5, 2)
    s.send([1, 2], None)
    s.send([], None)  # a zero-page chunk that is not the last: nothing to send
    s.send([3], None)
    s.send([4, 5], [[1]])
    assert [(m.src_pages, m.last, m.state_slot, m.aux_row) for m in w.requests("prefill", Send)] \
        == [([1, 2], False, None, None), ([3], False, None, None), ([4, 5], True, 1, 2)]
    assert s.poll() == KVPoll.Success


def test_a_last_chunk_may_have_zero_pages(env: Setup) -> None:
    """A full prefix hit on the decode: no page to send, the state and the aux row still go."""
    w = env.world
    r = env.receiver(31)
    r.send_metadata([], aux_index=5, state_indices=[[3]], decode_prefix_len=4 * PAGE_TOKENS)
    s = env.sender(31)
    assert s.poll() == KVPoll.WaitingForInput and s.pop_decode_prefix_len() == 64
    s.init(0, 6)
    assert s.should_send_kv_chunk(0, True)
    s.send([], [[2]])
    assert w.requests("prefill", Send) == [Send(31, [], True, 2, 6)]
    assert s.poll() == KVPoll.Success and r.poll() == KVPoll.Success


def test_zero_page_chunks_of_a_full_prefix_hit_wait_for_the_one_with_the_state(
        env: Setup) -> None:
    """With every page in the decode's prefix each chunk of a chunked prefill has zero pages to
    send, and page counting alone would take the first as the last: the last one is the chunk
    that brings state_indices, which SGLang passes only there."""
    w = env.world
    env.receiver(35).send_metadata([], aux_index=1, state_indices=[[0]],
                                   decode_prefix_len=8 * PAGE_TOKENS)
    s = env.sender(35)
    s.init(0, 4)
    s.send([], None)
    s.send([], None)
    assert w.requests("prefill", Send) == [] and s.poll() == KVPoll.WaitingForInput
    s.send([], [[3]])
    assert w.requests("prefill", Send) == [Send(35, [], True, 3, 4)]
    assert s.poll() == KVPoll.Success


def test_last_chunk_says_it_outright(env: Setup) -> None:
    """The scheduler's own flag wins over counting; a last chunk that does not reach init()'s
    page count fails that request alone."""
    w = env.world
    for room in (36, 37):
        env.receiver(room).send_metadata([1, 2], aux_index=room - 36, state_indices=[[0]])
    s = env.sender(36)
    s.init(2, 0)
    s.send([1, 2], [[0]], last_chunk=False)  # all pages, but the scheduler says: more to come
    s.send([], [[0]], last_chunk=True)
    assert [(m.src_pages, m.last, m.state_slot) for m in w.requests("prefill", Send)] == \
        [([1, 2], False, None), ([], True, 0)]
    assert s.poll() == KVPoll.Success
    short = env.sender(37)
    short.init(2, 1)
    short.send([1], [[1]], last_chunk=True)
    assert short.poll() == KVPoll.Failed
    assert failure(short).failure_reason == \
        "room 37: the last chunk ends at page 1 of the 2 of init()"


def test_chunks_beyond_num_pages_or_after_the_last_fail_that_request(env: Setup) -> None:
    w = env.world
    for room in (32, 33):
        env.receiver(room).send_metadata([1, 2], aux_index=room - 32, state_indices=[[0]])
    over, after = env.sender(32), env.sender(33)
    over.init(2, 0)
    over.send([1], None)
    over.send([2, 3], [[0]])
    assert over.poll() == KVPoll.Failed
    assert failure(over).failure_reason == \
        "room 32: chunk of 2 pages at position 1 goes beyond the 2 pages of init()"
    after.init(2, 1)
    after.send([1, 2], [[1]])
    assert after.poll() == KVPoll.Success
    after.send([3], [[1]])  # a concluded request ignores further chunks, as SGLang's do
    assert [(m.room, m.src_pages, m.last) for m in w.requests("prefill", Send)] == \
        [(32, [1], False), (33, [1, 2], True)]
    assert [c.room for c in w.requests("prefill", Cancel)] == [32]
    early = env.sender(34)
    early.send([1], None)
    assert failure(early).failure_reason == "send of room 34 before init(num_pages, aux_index)"


# --- refusals and failures -------------------------------------------------------------------------

def test_ferryd_refusals_fail_one_request_with_the_code(env: Setup) -> None:
    w = env.world
    w.refuse[("decode", 40)] = Error(Errc.DUPLICATE_ROOM, "duplicate room 40: it is already "
                                                         "active on this decode daemon")
    w.refuse[("prefill", 41)] = Error(Errc.INVALID_REQUEST, "room 41: src page 9 is named twice "
                                                           "(positions 0 and 1)")
    dup, fine = env.receiver(40), env.receiver(41)
    dup.send_metadata([1], aux_index=0, state_indices=[[0]])
    fine.send_metadata([2, 3], aux_index=1, state_indices=[[1]])
    assert dup.poll() == KVPoll.Failed
    e = failure(dup)
    assert e.code == Errc.DUPLICATE_ROOM and e.failure_reason.startswith("duplicate room 40")
    assert not w.requests("decode", Cancel)  # another connection's room is left alone
    s = env.sender(41)
    s.init(2, 1)
    s.send([9, 9], [[1]])
    assert s.poll() == KVPoll.Failed
    e = failure(s)
    assert (e.code, e.failure_reason) == (Errc.INVALID_REQUEST, "room 41: src page 9 is named "
                                                                "twice (positions 0 and 1)")
    assert [c.room for c in w.requests("prefill", Cancel)] == [41]


def test_a_room_failed_by_ferryd_carries_its_code(env: Setup) -> None:
    r = env.receiver(50)
    r.send_metadata([1], aux_index=0, state_indices=[[0]])
    env.world.failed[50] = (Errc.PEER_LOST, "peer 127.0.0.1:7401 lost: no heartbeat for 3000 ms")
    assert r.poll() == KVPoll.Failed
    e = failure(r)
    assert (e.code, e.is_from_another_rank) == (Errc.PEER_LOST, False)
    assert e.failure_reason == "peer 127.0.0.1:7401 lost: no heartbeat for 3000 ms"
    assert isinstance(e, FerryError) and e.code.wire_name == "peer_lost"


def test_abort_sends_the_cancel_and_returns_then_poll_says_failed_once_drained(
        env: Setup) -> None:
    w = env.world
    r = env.receiver(60)
    r.send_metadata([1], aux_index=0, state_indices=[[0]])
    assert r.poll() == KVPoll.WaitingForInput
    n = len(w.log)
    r.abort()
    assert w.log[n:] == [("decode", Cancel(60))]  # the cancel alone: no wait
    assert r.conclude_state is None  # the engine must not reuse the room's memory yet
    assert r.poll() == KVPoll.Failed  # the model ferryd ends a cancelled room at once
    assert w.requests("decode", Poll)[-1] == Poll(60)
    e = failure(r)
    assert (e.code, e.failure_reason) == (Errc.CANCELLED, ABORTED)
    unprepared = env.receiver(61)
    unprepared.abort()
    assert unprepared.poll() == KVPoll.Failed
    assert [m.room for m in w.requests("decode", Cancel)] == [60]  # nothing to cancel for 61
    s = env.sender(62)
    n = len(w.log)
    s.abort()  # the prefill ferryd does not know room 62 yet: nothing of it is in flight
    assert s.poll() == KVPoll.Failed and failure(s).failure_reason == ABORTED
    assert w.log[n:] == [("prefill", Cancel(62))]  # and it is not polled: that starts it anew


def test_a_failure_from_another_rank_cancels_this_ranks_room(env: Setup) -> None:
    r = env.receiver(70)
    r.send_metadata([1], aux_index=0, state_indices=[[0]])
    assert r.poll() == KVPoll.WaitingForInput
    e = failure(r)  # the scheduler's all-reduce said Failed; this rank saw nothing
    assert e.is_from_another_rank and e.failure_reason == FROM_ANOTHER_RANK
    assert [m.room for m in env.world.requests("decode", Cancel)] == [70]
    assert r.poll() == KVPoll.Failed


# --- poll_all ------------------------------------------------------------------------------------

def test_poll_all_asks_each_ferryd_once(env: Setup) -> None:
    w = env.world
    rs = [env.receiver(room) for room in (90, 91, 92)]
    rs[0].send_metadata([1], aux_index=0, state_indices=[[0]])
    rs[1].send_metadata([2], aux_index=1, state_indices=[[1]])
    ss = [env.sender(room) for room in (90, 91, 93)]
    ss[0].init(1, 0)
    ss[0].send([7], [[0]])
    before = len(w.log)
    got = poll_all(rs + ss)
    assert got == [KVPoll.Success, KVPoll.WaitingForInput, KVPoll.WaitingForInput,
                   KVPoll.Success, KVPoll.WaitingForInput, KVPoll.Bootstrapping]
    asked = [(role, m) for role, m in w.log[before:]]
    assert asked == [("decode", PollMany([90, 91])), ("prefill", PollMany([90, 91, 93]))]
    # concluded rooms are answered locally from now on
    before = len(w.log)
    assert poll_all([rs[0], ss[0]]) == [KVPoll.Success, KVPoll.Success]
    assert len(w.log) == before
    assert all(isinstance(x, int) for x in got)


def test_a_room_whose_ferryd_vanishes_is_held_then_failed_after_the_drain_bound(
        env: Setup) -> None:
    """ferryd's connection closes and no ferryd answers again: it may have closed the connection
    itself and still drain the room, so the room keeps the status the engine saw; once no
    connection came back within the manager's drain_timeout (longer than any ferryd drain),
    Failed, with why."""
    r = env.receiver(60)
    r.send_metadata([1], aux_index=0, state_indices=[[0]])
    before = r.poll()
    assert before == KVPoll.WaitingForInput
    env.dd.vanish()
    seen = [before]
    deadline = time.monotonic() + 30
    while seen[-1] != KVPoll.Failed and time.monotonic() < deadline:
        seen.append(r.poll())
        time.sleep(0.01)
    assert seen[-1] == KVPoll.Failed and set(seen[:-1]) == {before}, seen
    e = failure(r)
    assert e.code == Errc.PEER_LOST
    assert "not connected again within the drain bound of 2 s" in e.failure_reason, \
        e.failure_reason
