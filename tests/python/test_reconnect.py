"""A client that reconnects by itself (``reconnect=``, :mod:`ferry.reconnect`), against the fake
daemon (a real unix socket server thread): the requests waiting when the connection is lost
fail with 302, subscribed rooms are reported Failed with a reason, requests made while it is
down fail at once with 300, the memory lent is registered again with the same memfds on the new
connection, a draining ferryd is noticed, reconnecting gives up after ``max_attempts``, and
closing stops it and closes what it kept. The same against real ferryd processes:
test_reconnect_daemons.py."""

from __future__ import annotations

import os
import queue
import threading

import pytest

from conftest import IO_TIMEOUT, FakeConn, FakeDaemon
from ferry import (Client, Disconnected, Draining, Errc, Event, FerryError, Reconnect,
                   Reconnected, Status)
from ferry.memory import create_memfd
from ferry.protocol import (Error, Hello, MemoryBuffer, Ok, Poll, Prepare, RegisterMemory,
                            Subscribe)

T = IO_TIMEOUT
FAST = Reconnect(initial_delay=0.01, max_delay=0.05)


def connect(fake: FakeDaemon, reconnect: object = FAST) -> tuple[Client, queue.Queue]:
    c = Client(fake.path, name="test", timeout=T, reconnect=reconnect)  # type: ignore[arg-type]
    notices: queue.Queue = queue.Queue()
    c.on_connection(notices.put)
    return c, notices


def next_notice(notices: queue.Queue, kind: type) -> object:
    n = notices.get(timeout=T)
    assert isinstance(n, kind), n
    return n


def test_waiting_requests_fail_with_peer_lost_and_subscribed_rooms_fail_with_a_reason(
        fake: FakeDaemon) -> None:
    def serve(c: FakeConn) -> None:
        c.hello()
        seq, msg = c.recv()
        assert msg == Subscribe(7)
        c.send(Ok(), seq)
        c.send(Event(7, Status.Transferring, Errc.OK, ""), 0)
        seq, msg = c.recv()
        assert msg == Poll(7)  # never answered: the daemon dies with it outstanding
    fake.serve(serve, connections=1)
    client, notices = connect(fake, reconnect=Reconnect(initial_delay=T, max_delay=T))
    try:
        events = client.events()
        client.subscribe(7)
        assert events.get(timeout=T).status == Status.Transferring
        with pytest.raises(FerryError) as info:
            client.poll(7)
        assert info.value.code == Errc.PEER_LOST
        assert info.value.message == "ferryd closed the connection"
        ev = client.wait_terminal(7, timeout=T)
        assert (ev.room, ev.status, ev.code) == (7, Status.Failed, Errc.PEER_LOST)
        assert "went away (ferryd closed the connection) before the room ended" in ev.reason
        assert "a restarted daemon does not know it" in ev.reason
        assert events.get(timeout=T) == ev  # the queue has it too, never dropped
        n = next_notice(notices, Disconnected)
        assert isinstance(n, Disconnected)
        assert n.failed_rooms == (7,) and n.reconnecting and not n.drained
        assert n.error.code == Errc.PEER_LOST
        # while it is down (the next attempt is T away), a request fails at once with 300
        with pytest.raises(FerryError) as info:
            client.poll(7)
        assert info.value.code == Errc.PEER_UNREACHABLE
        assert info.value.message.startswith(f"not connected to ferryd at {fake.path}: the "
                                             f"connection was lost ")
        assert "reconnecting in the background" in info.value.message
        assert not client.connected and not client.closed and "reconnecting" in repr(client)
    finally:
        client.close()
    assert client.closed
    fake.join()


def test_memory_is_registered_again_with_the_same_memfds_on_the_new_connection(
        fake: FakeDaemon) -> None:
    fd = create_memfd("reconnect-test", 1 << 16)
    table = [MemoryBuffer(0, 0, 4096, 16, 0, 0, 0)]
    seen: list[tuple[int, RegisterMemory, list[int]]] = []
    hellos: list[Hello] = []
    release = threading.Event()

    def serve(c: FakeConn) -> None:
        hellos.append(c.hello())
        seq, msg = c.recv()
        assert isinstance(msg, RegisterMemory)
        seen.append((len(hellos), msg, [os.fstat(f).st_ino for f in c.fds]))
        c.send(Ok(), seq)
        if len(hellos) == 1:
            return  # the first connection ends here: ferryd went away
        seq, msg = c.recv()
        assert msg == Prepare(9, ["127.0.0.1:1"], [1], None, None, 0)
        c.send(Ok(), seq)
        release.wait(T)
        c.wait_closed()
    fake.serve(serve, connections=2)
    client, notices = connect(fake)
    try:
        client.register_memory("kv", table, [fd])
        os.close(fd)  # the engine's own descriptor: the client kept a duplicate
        next_notice(notices, Disconnected)
        n = next_notice(notices, Reconnected)
        assert isinstance(n, Reconnected)
        assert (n.generation, n.registered, n.not_registered, n.remapped) == \
            (2, ("kv",), {}, ())
        assert n.attempts >= 1 and n.downtime >= 0
        assert client.connected and client.generation == 2
        client.prepare(9, "127.0.0.1:1", [1])
        assert [h.client_name for h in hellos] == ["test", "test"]
        assert [(gen, m.pool, m.buffers) for gen, m, _ in seen] == [(1, 0, table), (2, 0, table)]
        assert seen[0][2] == seen[1][2] and len(seen[1][2]) == 1  # the same memfd both times
        kept = list(client._registrations[0].fds)
    finally:
        release.set()
        client.close()
    for k in kept:  # closing the client closed its duplicates
        with pytest.raises(OSError):
            os.fstat(k)
    fake.join()


def test_a_registration_answered_just_before_the_loss_is_made_again(fake: FakeDaemon) -> None:
    # ferryd's Ok and the end of the stream come together. The caller of register_memory is
    # held after its reply until the reconnect is over: what the reconnect registers must not
    # depend on the caller having run first (the reader keeps the registration with the reply).
    fd = create_memfd("reconnect-race", 1 << 16)
    table = [MemoryBuffer(0, 0, 4096, 16, 0, 0, 0)]
    pools: list[int] = []

    def serve(c: FakeConn) -> None:
        c.hello()
        seq, msg = c.recv()
        assert isinstance(msg, RegisterMemory)
        pools.append(msg.pool)
        c.send(Ok(), seq)
        if len(pools) == 2:
            c.wait_closed()
    fake.serve(serve, connections=2)
    client, notices = connect(fake)
    seen: list[object] = []
    wait, caller = client._wait, threading.current_thread()

    def held_wait(p: object, timeout: object) -> object:
        reply = wait(p, timeout)  # type: ignore[arg-type]
        if threading.current_thread() is caller and not seen:  # not the reconnect's own
            seen.append(next_notice(notices, Disconnected))
            seen.append(next_notice(notices, Reconnected))
        return reply
    client._wait = held_wait  # type: ignore[method-assign]
    try:
        client.register_memory("kv", table, [fd])
        os.close(fd)
        n = seen[1]
        assert isinstance(n, Reconnected)
        assert (n.generation, n.registered, n.not_registered) == (2, ("kv",), {})
        assert pools == [0, 0] and len(client._registrations[0].fds) == 1
    finally:
        client.close()
    fake.join()


def test_a_draining_ferryd_is_noticed_and_its_end_is_not_a_surprise(fake: FakeDaemon) -> None:
    def serve(c: FakeConn) -> None:
        c.hello()
        seq, _ = c.recv()
        c.send(Error(407, "peer 127.0.0.1:9 is draining: stopping"), seq)  # a peer's, not ours
        seq, _ = c.recv()
        c.send(Error(407, "ferryd is draining: it finishes the 1 rooms it accepted and takes "
                          "no new one"), seq)
    fake.serve(serve, connections=1)
    client, notices = connect(fake, reconnect=Reconnect(initial_delay=T, max_delay=T))
    try:
        with pytest.raises(FerryError) as info:
            client.prepare(1, "127.0.0.1:9", [1])
        assert info.value.code == Errc.DRAINING and not client.draining
        with pytest.raises(FerryError) as info:
            client.prepare(2, "127.0.0.1:9", [1])
        assert info.value.code == Errc.DRAINING
        n = next_notice(notices, Draining)
        assert isinstance(n, Draining) and n.message.startswith("ferryd is draining")
        d = next_notice(notices, Disconnected)
        assert isinstance(d, Disconnected) and d.drained and d.reconnecting
    finally:
        client.close()
    fake.join()


def test_reconnecting_gives_up_after_max_attempts(fake: FakeDaemon) -> None:
    unlisten = threading.Event()

    def serve(c: FakeConn) -> None:
        c.hello()
        unlisten.wait(T)
    fake.serve(serve, connections=1)
    client, notices = connect(fake, reconnect=Reconnect(initial_delay=0.01, max_delay=0.01,
                                                        max_attempts=2))
    try:
        fake.close()  # nothing listens any more: every attempt fails
        os.unlink(fake.path)
        unlisten.set()  # and the connection ends
        fake.join()
        first = next_notice(notices, Disconnected)
        assert isinstance(first, Disconnected) and first.reconnecting
        last = next_notice(notices, Disconnected)
        assert isinstance(last, Disconnected) and not last.reconnecting
        assert last.error.message.startswith(f"gave up reconnecting to ferryd at {fake.path} "
                                             f"after 2 attempts: cannot connect")
        assert client.closed and not client.connected
        with pytest.raises(FerryError) as info:
            client.poll(1)
        assert info.value.code == Errc.PEER_UNREACHABLE and "gave up" in info.value.message
        assert client.events().get(timeout=T) is None  # the event stream ended
    finally:
        client.close()


def test_close_stops_a_reconnect_waiting_for_hello(fake: FakeDaemon) -> None:
    drop, second = threading.Event(), threading.Event()

    def serve(c: FakeConn) -> None:
        if len(fake.conns) == 1:
            c.hello()
            drop.wait(T)
            return
        assert isinstance(c.recv()[1], Hello)
        second.set()
        c.wait_closed()  # never answers the hello
    fake.serve(serve, connections=2)
    client, notices = connect(fake, reconnect=Reconnect())
    drop.set()
    next_notice(notices, Disconnected)
    assert second.wait(T)
    client.close()  # must not wait for the hello's timeout (T)
    assert client.closed
    assert client._reconnector is not None and not client._reconnector.is_alive()
    fake.join()


def test_without_reconnect_a_lost_connection_stays_lost_and_rooms_still_fail(
        fake: FakeDaemon) -> None:
    def serve(c: FakeConn) -> None:
        c.hello()
        seq, _ = c.recv()
        c.send(Ok(), seq)
    fake.serve(serve, connections=1)
    client, notices = connect(fake, reconnect=False)
    try:
        client.subscribe(4)
        ev = client.wait_terminal(4, timeout=T)
        assert (ev.status, ev.code) == (Status.Failed, Errc.PEER_LOST)
        d = next_notice(notices, Disconnected)
        assert isinstance(d, Disconnected) and not d.reconnecting and d.failed_rooms == (4,)
        assert client.closed
        with pytest.raises(FerryError) as info:
            client.poll(4)
        assert (info.value.code, info.value.message) == \
            (Errc.PEER_LOST, "ferryd closed the connection")
    finally:
        client.close()
    fake.join()


def test_a_lost_rooms_failure_does_not_answer_the_same_room_id_used_again(
        fake: FakeDaemon) -> None:
    def serve(c: FakeConn) -> None:
        c.hello()
        if len(fake.conns) == 1:
            seq, _ = c.recv()
            c.send(Ok(), seq)
            return
        seq, msg = c.recv()
        assert msg == Subscribe(4)
        c.send(Ok(), seq)
        c.send(Event(4, Status.Success, Errc.OK, ""), 0)
        c.wait_closed()
    fake.serve(serve, connections=2)
    client, notices = connect(fake)
    try:
        client.subscribe(4)
        next_notice(notices, Disconnected)
        next_notice(notices, Reconnected)
        client.subscribe(4)  # the id again, on the new connection: the old failure is dropped
        assert client.wait_terminal(4, timeout=T).status == Status.Success
    finally:
        client.close()
    fake.join()


def test_reconnect_rejects_a_bad_policy() -> None:
    with pytest.raises(ValueError, match="initial_delay <= max_delay"):
        Reconnect(initial_delay=2, max_delay=1)
    with pytest.raises(ValueError, match="max_attempts >= 1"):
        Reconnect(max_attempts=0)
    assert [Reconnect(initial_delay=0.1, max_delay=0.5).delay(a) for a in (1, 2, 3, 4)] == \
        [0.1, 0.2, 0.4, 0.5]
