"""SGLang's abort orders through the adapter against real ferryd processes: no call an engine
makes from its scheduler loop waits on the network or a drain, a prefill abort that reached its
ferryd before the decode's prepare fails that prepare at once, and Failed (from ``poll()``,
``poll_all`` or ``conclude_state``) still means ferryd has drained the room, so the engine may
reuse its memory."""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
from typing import Callable, Iterator

import pytest

from conftest import start_pair
from ferry import Client, Errc
from ferry.sglang import (ABORTED, FROM_ANOTHER_RANK, FerryBootstrap, FerryKVReceiver,
                          FerryKVSender, FerryKVTransferError, KVPoll, poll_all)

from engine_ranks import BOOT, CLIENT_POOLS, Engine, stop_all, wait_all

ROOM = 0x6A5B_0000_0000_0000  # SGLang's room ids are random 63-bit numbers


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Engine, Engine]]:
    tmp = tempfile.mkdtemp(prefix="ferry-abort-")
    p, d = start_pair(tmp, "prefill-ab", "decode-ab", CLIENT_POOLS)
    try:
        boot = FerryBootstrap({BOOT: [p.control]})
        pe = Engine(p, "prefill", boot)
        de = Engine(d, "decode", boot)
        yield pe, de
        de.close()
        pe.close()
    finally:
        stop_all([p, d])
        shutil.rmtree(tmp, ignore_errors=True)


class Calls:
    """Counts the requests an engine's adapter makes of its ferryd while in ``with``."""

    def __init__(self, e: Engine) -> None:
        self.client = e.mgr.client
        self.made: list[str] = []

    def __enter__(self) -> "Calls":
        for name in ("poll", "poll_many", "cancel", "send", "prepare"):
            setattr(self.client, name, self._counted(name, getattr(self.client, name)))
        return self

    def _counted(self, name: str, f: Callable) -> Callable:
        def call(*a, **k):  # type: ignore[no-untyped-def]
            self.made.append(name)
            return f(*a, **k)
        return call

    def __exit__(self, *exc: object) -> None:
        for name in ("poll", "poll_many", "cancel", "send", "prepare"):
            delattr(self.client, name)


def daemon_status(e: Engine, room: int) -> int:
    with Client(e.daemon.sock, name="observer") as c:
        return int(c.poll(room).status)


def raised(obj: FerryKVSender | FerryKVReceiver) -> FerryKVTransferError:
    with pytest.raises(FerryKVTransferError) as info:
        obj.failure_exception()
    return info.value


def test_a_prefill_abort_before_the_decodes_prepare_in_sglangs_order(
        engines: tuple[Engine, Engine]) -> None:
    p, d = engines
    room = ROOM + 1
    s = FerryKVSender(p.mgr, BOOT, room, [0], 0)
    assert s.poll() == KVPoll.Bootstrapping  # the decode's prepare has not arrived
    start = time.monotonic()
    with Calls(p) as calls:
        s.abort()  # SGLang: abort(), then the next step's poll(), then failure_exception()
        assert s.poll() == KVPoll.Failed
        e = raised(s)
    took = time.monotonic() - start
    assert calls.made == ["cancel"]  # nothing of the room was in flight: nothing waited for
    assert (e.code, e.failure_reason, e.bootstrap_room) == (Errc.CANCELLED, ABORTED, room)
    print(f"abort, poll and failure_exception: {took * 1000:.1f} ms")
    assert took < p.mgr.drain_timeout / 2, f"abort, poll and failure_exception took {took:.3f} s"
    # The decode's prepare arrives after the abort: refused at once, naming the cancel (its
    # waiting_for_input_ms would otherwise hold the decode's pages for a minute).
    r = FerryKVReceiver(d.mgr, BOOT, room)
    r.init(0)
    r.send_metadata([3, 4], aux_index=1, state_indices=[[1]])
    assert wait_all([r]) == [KVPoll.Failed]
    e = raised(r)
    assert e.code == Errc.CANCELLED and not e.is_from_another_rank
    assert e.failure_reason == (f"prefill {p.daemon.control} refused the prepare: room {room} was "
                                f"cancelled on the prefill before this decode prepared it")


def live_room(p: Engine, d: Engine, room: int) -> tuple[FerryKVSender, FerryKVReceiver]:
    """A room prepared by the decode and fed one chunk of three by the prefill: live on both
    ferryds, waiting for the rest."""
    p.aux.item(0, 2)[:8] = room.to_bytes(8, "little")
    r = FerryKVReceiver(d.mgr, BOOT, room)
    s = FerryKVSender(p.mgr, BOOT, room, [0], 0)
    r.init(0)
    r.send_metadata([10, 11, 12], aux_index=2, state_indices=[[2]])
    assert wait_all([s], KVPoll.WaitingForInput) == [KVPoll.WaitingForInput]
    s.init(3, 2)
    s.send([20], None)
    assert KVPoll.Failed not in poll_all([s, r])
    return s, r


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_abort_only_sends_the_cancel_and_failed_means_drained(
        engines: tuple[Engine, Engine], side: str) -> None:
    p, d = engines
    room = ROOM + (10 if side == "prefill" else 20)
    s, r = live_room(p, d, room)
    obj, e = (s, p) if side == "prefill" else (r, d)
    before = obj.poll()
    with Calls(e) as calls:
        obj.abort()
    assert calls.made == ["cancel"]  # SGLang's abort() returns at once
    assert obj.conclude_state is None  # not Failed before ferryd has drained the room
    # Until ferryd reports the room terminal the engine sees no change; then Failed, and at
    # that moment ferryd holds the room terminal (its memory may be reused).
    seen = [before]
    deadline = time.monotonic() + 30
    while seen[-1] != KVPoll.Failed and time.monotonic() < deadline:
        seen.append(obj.poll())
    assert seen[-1] == KVPoll.Failed and set(seen[:-1]) <= {before}
    assert daemon_status(e, room) in (KVPoll.Failed, KVPoll.Success)
    assert obj.conclude_state == KVPoll.Failed
    with Calls(e) as calls:
        err = raised(obj)
    assert calls.made == []
    assert (err.code, err.failure_reason) == (Errc.CANCELLED, ABORTED)
    other = r if side == "prefill" else s
    assert wait_all([other]) == [KVPoll.Failed]  # its peer was told
    assert "cancelled by client" in raised(other).failure_reason


def test_a_failure_from_another_rank_cancels_and_drains_within_the_bound(
        engines: tuple[Engine, Engine]) -> None:
    """The one call that waits: the MIN-reduced poll said Failed for another rank's failure,
    and SGLang frees this rank's memory right after failure_exception(). It cancels and waits
    for the drain, bounded by the manager's drain_timeout (docs/integration.md)."""
    p, d = engines
    s, r = live_room(p, d, ROOM + 30)
    start = time.monotonic()
    err = raised(s)
    took = time.monotonic() - start
    assert err.is_from_another_rank and err.failure_reason == FROM_ANOTHER_RANK
    assert daemon_status(p, ROOM + 30) == KVPoll.Failed
    assert s.conclude_state == KVPoll.Failed
    print(f"failure_exception from another rank drained the room in {took * 1000:.1f} ms")
    assert wait_all([r]) == [KVPoll.Failed]


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_a_connection_ferryd_closes_holds_its_rooms_until_ferryd_has_drained_them(
        side: str) -> None:
    """ferryd closes an engine's connection while it lives on (here: bytes that are no frame;
    in life a frame timeout). It cancels the connection's rooms and drains them within
    timeouts.drain_ms, so a peer's write can still land in their memory: poll() must not say
    Failed before ferryd reports the room terminal. The other side's ferryd is stopped
    (SIGSTOP), so a decode's drain lasts until that peer reports its own (a prefill's waits only
    for its own writes in flight): the drain and heartbeat bounds are long enough here that the
    hold lasts until the test has seen it, however loaded the machine, and only then is the
    peer let go on. After the reconnect to the same daemon the adapter asks it again; the room
    ends Failed with the reason."""
    tmp = tempfile.mkdtemp(prefix="ferry-closed-")
    held = "timeouts: {drain_ms: 60000, heartbeat_ms: 1000, heartbeat_misses: 60}\n"
    pd, dd = start_pair(tmp, "prefill-cl", "decode-cl", CLIENT_POOLS, extra=held)
    engines: list[Engine] = []
    try:
        boot = FerryBootstrap({BOOT: [pd.control]})
        p, d = Engine(pd, "prefill", boot), Engine(dd, "decode", boot)
        engines = [p, d]
        room = ROOM + (40 if side == "prefill" else 50)
        s, r = live_room(p, d, room)
        obj, e, other = (s, p, dd) if side == "prefill" else (r, d, pd)
        before = obj.poll()
        other.proc.send_signal(signal.SIGSTOP)
        try:
            with Client(e.daemon.sock, name="observer") as observer:
                e.mgr.client._link.sock.sendall(b"\xff" * 64)  # not a frame: ferryd closes
                seen, held_while_live = [before], 0
                deadline = time.monotonic() + 30
                while seen[-1] != KVPoll.Failed and time.monotonic() < deadline:
                    seen.append(obj.poll())
                    live = not KVPoll(int(observer.poll(room).status)) in (
                        KVPoll.Failed, KVPoll.Success)
                    assert not (seen[-1] == KVPoll.Failed and live), \
                        "poll() said Failed while ferryd still held the room live"
                    held_while_live += live
                    if held_while_live == 1:  # the hold is seen: let the peer report its drain
                        other.proc.send_signal(signal.SIGCONT)
                    time.sleep(0.002)
        finally:
            other.proc.send_signal(signal.SIGCONT)
        assert seen[-1] == KVPoll.Failed and set(seen[:-1]) <= {before}, seen
        if side == "decode":
            # Its drain waits for the stopped prefill's report: the hold was seen from outside.
            # A prefill room with no write in flight (its one chunk completed before the stop)
            # has nothing to drain and ends at once, so there only the rule above is checked.
            assert held_while_live > 0
        err = raised(obj)
        assert err.code in (Errc.CANCELLED, Errc.PEER_LOST)
        assert "connection" in err.failure_reason, err.failure_reason
    finally:
        for eng in reversed(engines):
            eng.close()
        stop_all([pd, dd])
        shutil.rmtree(tmp, ignore_errors=True)
