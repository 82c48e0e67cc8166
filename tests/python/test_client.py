"""The client against a fake daemon (a real unix socket server thread speaking the protocol with
the Python codec): version negotiation, seq matching with several threads and out-of-order
replies, protocol errors, the connection-level error, events, close."""

from __future__ import annotations

import json
import queue
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import IO_TIMEOUT, FakeConn, FakeDaemon
from ferry import Client, Errc, Event, FerryError, ProtocolError, Status
from ferry.protocol import (Cancel, Error, Hello, HelloReply, Info, InfoReply, Ok, Poll,
                            PollMany, PollManyReply, PollReply, PollResult, Prepare, Subscribe)

T = IO_TIMEOUT


def connect(fake: FakeDaemon, **kw: object) -> Client:
    return Client(fake.path, name="test", timeout=T, **kw)  # type: ignore[arg-type]


def subscribed(c: FakeConn, room: int) -> None:
    """Answer the client's subscribe to ``room`` (events are pushed only after it, as ferryd
    does, so the test registered its callbacks and queue before they come)."""
    seq, msg = c.recv()
    assert msg == Subscribe(room)
    c.send(Ok(), seq)


# --- version negotiation --------------------------------------------------------------------

def test_hello_offers_3_to_10_and_speaks_4_with_a_v4_daemon(fake: FakeDaemon) -> None:
    seen: list[Hello] = []

    def serve(c: FakeConn) -> None:
        seen.append(c.hello())
        seq, msg = c.recv()
        assert msg == Poll(5)
        c.send(PollReply(5, Status.Failed, Errc.TIMED_OUT, "timed out"), seq)
        c.wait_closed()
    fake.serve(serve)
    with connect(fake) as client:
        assert client.version == 4 and client.daemon_versions == (3, 4)
        assert not client.fell_back_to_v3
        r = client.poll(5)
        assert seen == [Hello(10, "test", True, 3)]  # kept by the server before it read the poll
        assert r == PollReply(5, Status.Failed, Errc.TIMED_OUT, "timed out")
        assert r.code is Errc.TIMED_OUT
    fake.join()


def test_version_range_3_forces_v3(fake: FakeDaemon) -> None:
    raw: list[bytes] = []

    def serve(c: FakeConn) -> None:
        mtype, seq, body = c.recv_raw()
        raw.append(body)
        # the hello is answered by hand, as a v3 daemon would
        c.version = 3
        c.send(HelloReply(version=3, role="decode"), seq)
        seq, msg = c.recv()
        c.send(PollReply(5, Status.Failed, None, "room 5 failed"), seq)
        c.wait_closed()
    fake.serve(serve)
    with connect(fake, cancel_on_disconnect=False, version_range=(3, 3)) as client:
        # a v3 hello: version 3, the name, the flag, and no min_version
        assert raw == [struct.pack("<HI", 3, 4) + b"test" + b"\x00"]
        assert client.version == 3 and client.daemon_versions == (3, 3)
        r = client.poll(5)
        assert r.status is Status.Failed and r.code is None and r.reason == "room 5 failed"
        with pytest.raises(FerryError) as info:
            client.poll_many([1, 2])
        assert info.value.code == Errc.UNSUPPORTED_VERSION
        assert "poll_many needs protocol version 4, but this connection speaks version 3" \
            in info.value.message
        assert not client.closed  # a local refusal: nothing was sent
    fake.join()


@pytest.mark.parametrize("refusal", ["unsupported_version", "malformed_frame"])
def test_a_v3_daemon_is_spoken_to_in_v3(fake: FakeDaemon, refusal: str) -> None:
    """A daemon of the previous release cannot read a v4 hello: it answers unsupported_version
    and closes, or (not knowing the trailing min_version) malformed_frame. The client says hello
    again in version 3 on a new connection."""
    hellos: list[tuple[int, int]] = []

    def serve(c: FakeConn) -> None:
        mtype, seq, body = c.recv_raw()
        version = struct.unpack_from("<H", body)[0]
        hellos.append((version, len(body)))
        if version != 3:
            if refusal == "unsupported_version":
                c.send(Error(312, "client protocol version 4 is not supported (ferryd speaks 3)"),
                       seq, 3)
            else:
                c.send(Error(310, "malformed hello frame: 2 unexpected bytes after the last "
                                  "field"), seq, 3)
            return
        c.version = 3
        c.send(HelloReply(version=3), seq)
        c.wait_closed()
    fake.serve(serve, connections=2)
    with connect(fake) as client:
        assert client.version == 3 and client.fell_back_to_v3
    assert hellos == [(10, 2 + 4 + 4 + 1 + 2), (3, 2 + 4 + 4 + 1)]  # u16, "test", u8 (, u16)
    fake.join()


def test_no_common_version_raises_the_daemons_error(fake: FakeDaemon) -> None:
    fake.serve(lambda c: (c.hello(speaks=(5, 6)), None)[1])
    with pytest.raises(FerryError) as info:
        connect(fake, version_range=(4, 4))
    assert info.value.code == Errc.UNSUPPORTED_VERSION
    assert info.value.message == "client speaks protocol versions 4..4, ferryd speaks 5..6"
    fake.join()


def test_a_reply_outside_the_offered_range_is_a_protocol_error(fake: FakeDaemon) -> None:
    def serve(c: FakeConn) -> None:
        seq, _ = c.recv()
        c.send(HelloReply(version=4), seq)
    fake.serve(serve)
    with pytest.raises(ProtocolError) as info:
        connect(fake, version_range=(3, 3))
    assert "answered in protocol version 4, outside the range 3..3" in info.value.message
    fake.join()


def test_bad_version_range() -> None:
    with pytest.raises(ValueError):
        Client("/nonexistent", version_range=(2, 4))
    with pytest.raises(ValueError):
        Client("/nonexistent", version_range=(4, 3))


def test_connect_failure_is_a_ferry_error(short_tmp: str) -> None:
    with pytest.raises(FerryError) as info:
        Client(short_tmp + "/none.sock", timeout=T)
    assert info.value.code == Errc.PEER_UNREACHABLE and "none.sock" in info.value.message


@pytest.mark.parametrize("code", [Errc.INVALID_REQUEST, Errc.MALFORMED_FRAME])
def test_a_refusal_before_hello_is_the_daemons_error(fake: FakeDaemon, code: Errc) -> None:
    """Beyond limits.max_clients ferryd sends an error with seq 0 and closes at once. It is not
    an answer to the hello: the client does not try a v3 hello after it."""
    fake.serve(lambda c: c.send(Error(code, "too many clients: limits.max_clients is 2"), 0))
    with pytest.raises(FerryError) as info:
        connect(fake)
    assert info.value.code == code
    assert info.value.message == "too many clients: limits.max_clients is 2"
    assert not isinstance(info.value, ProtocolError)
    fake.join()


# --- info -----------------------------------------------------------------------------------

def test_info_asks_by_name_or_number_and_returns_the_parsed_document(fake: FakeDaemon) -> None:
    asked: list[Info] = []
    docs = {0: '{"role": "decode", "decode": {"active": 2}}', 1: "[]",
            2: '[{"address": "127.0.0.1:7401", "state": "connecting"}]',
            3: '{"kv": {"items": 256, "in_use": 3}}'}

    def serve(c: FakeConn) -> None:
        c.hello()
        for _ in range(6):
            seq, msg = c.recv()
            asked.append(msg)
            c.send(InfoReply(docs[msg.topic] if len(asked) < 6 else "role: decode\n"), seq)
        c.wait_closed()
    fake.serve(serve)
    with connect(fake) as client:
        assert client.info("status") == {"role": "decode", "decode": {"active": 2}}
        assert client.info("rooms") == []
        assert client.info("peers") == [{"address": "127.0.0.1:7401", "state": "connecting"}]
        assert client.info("pools")["kv"] == {"items": 256, "in_use": 3}
        assert client.info(3)["kv"]["in_use"] == 3
        with pytest.raises(ValueError) as bad:
            client.info("stats")
        assert "unknown info topic 'stats'" in str(bad.value)
        with pytest.raises(ProtocolError) as info:  # text is not a document
            client.info(0)
        assert info.value.code == Errc.MALFORMED_FRAME and info.value.field == "text"
        assert info.value.message.startswith("ferryd's info status reply is not JSON: ")
    assert asked == [Info(0), Info(1), Info(2), Info(3), Info(3), Info(0)]
    fake.join()


# --- several requests in flight -------------------------------------------------------------

def test_out_of_order_replies_reach_their_requests(fake: FakeDaemon) -> None:
    """16 threads issue requests at once; the daemon reads all 16 before answering any, then
    answers in reverse order. Each thread gets its own reply."""
    n = 16

    def serve(c: FakeConn) -> None:
        c.hello()
        held = [c.recv() for _ in range(n)]
        for seq, msg in reversed(held):
            if isinstance(msg, Poll):
                c.send(PollReply(msg.room, Status.Transferring, Errc.OK, f"room {msg.room}"), seq)
            elif isinstance(msg, Info):
                c.send(InfoReply(json.dumps({"topic": msg.topic, "seq": seq})), seq)
            elif isinstance(msg, PollMany):
                c.send(PollManyReply([PollResult(r, Status.Bootstrapping, Errc.OK, "")
                                      for r in msg.rooms]), seq)
            else:
                c.send(Error(402, f"room {msg.room} is unknown"), seq)  # type: ignore[union-attr]
        c.wait_closed()
    fake.serve(serve)
    client = connect(fake)
    start = threading.Barrier(n, timeout=T)

    def work(i: int) -> object:
        start.wait()
        kind = i % 4
        if kind == 0:
            return client.poll(1000 + i)
        if kind == 1:
            return client.info(i % 3)
        if kind == 2:
            return client.poll_many([i, i + 1, i + 2])
        try:
            client.cancel(1000 + i)
        except FerryError as e:
            return e
        return None
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(work, range(n), timeout=T))
    for i, r in enumerate(results):
        kind = i % 4
        if kind == 0:
            assert r == PollReply(1000 + i, Status.Transferring, Errc.OK, f"room {1000 + i}")
        elif kind == 1:
            assert isinstance(r, dict) and r["topic"] == i % 3 and r["seq"] > 1, r
        elif kind == 2:
            assert isinstance(r, list) and [x.room for x in r] == [i, i + 1, i + 2]
        else:
            assert isinstance(r, FerryError) and r.code == Errc.UNKNOWN_ROOM
            assert r.message == f"room {1000 + i} is unknown"
    client.close()
    fake.join()


def test_a_reply_with_an_unknown_seq_fails_every_waiter_and_closes(fake: FakeDaemon) -> None:
    def serve(c: FakeConn) -> None:
        c.hello()
        held = [c.recv() for _ in range(3)]
        assert sorted(s for s, _ in held) == [2, 3, 4]
        c.send(Ok(), 99)  # for a seq nobody sent
        c.wait_closed()
    fake.serve(serve)
    client = connect(fake)
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(client.poll, room) for room in (1, 2, 3)]
        errors = [f.exception(timeout=T) for f in futures]
    for e in errors:
        assert isinstance(e, ProtocolError) and e.code == Errc.MALFORMED_FRAME
        assert "ferryd sent a reply of type ok (100) with seq 99, which matches no outstanding " \
               "request (waiting for seq 2, seq 3, seq 4)" in e.message
    assert client.closed
    with pytest.raises(ProtocolError, match="seq 99"):  # later calls say why it closed
        client.poll(4)
    client.close()
    fake.join()


def test_a_connection_error_with_seq_0_fails_every_waiter(fake: FakeDaemon) -> None:
    def serve(c: FakeConn) -> None:
        c.hello()
        c.recv(), c.recv()
        c.send(Error(310, "client frame incomplete after 10000 ms"), 0)
    fake.serve(serve)
    client = connect(fake)
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(client.poll, room) for room in (1, 2)]
        errors = [f.exception(timeout=T) for f in futures]
    for e in errors:
        assert type(e) is FerryError  # the daemon's own error, not a client-side protocol error
        assert e.code == Errc.MALFORMED_FRAME
        assert e.message == "client frame incomplete after 10000 ms"
    assert client.closed and client.error is not None
    client.close()
    fake.join()


def test_a_daemon_that_closes_fails_the_waiters(fake: FakeDaemon) -> None:
    def serve(c: FakeConn) -> None:
        c.hello()
        c.recv()
    fake.serve(serve)
    client = connect(fake)
    with pytest.raises(FerryError) as info:
        client.poll(1)
    assert info.value.code == Errc.PEER_LOST and "closed the connection" in info.value.message
    client.close()
    fake.join()


def test_a_malformed_reply_fails_only_its_request(fake: FakeDaemon) -> None:
    def serve(c: FakeConn) -> None:
        c.hello()
        seq, _ = c.recv()
        body = struct.pack("<QBHH", 1, 0, 405, 0)  # the reason's length is cut
        c.send_raw(struct.pack("<IHHI", 8 + len(body), 103, 0, seq) + body)
        seq, _ = c.recv()
        c.send(Ok(), seq)  # answering a poll with ok
        seq, _ = c.recv()
        c.send(PollReply(3, Status.Success, Errc.OK, ""), seq)
        c.wait_closed()
    fake.serve(serve)
    with connect(fake) as client:
        with pytest.raises(ProtocolError) as info:
            client.poll(1)
        assert info.value.message == ("malformed poll_reply frame: truncated at field 'reason': "
                                      "needs 4 bytes, 2 remain")
        assert info.value.field == "reason"
        with pytest.raises(ProtocolError) as info:
            client.poll(2)
        assert info.value.message == ("protocol error: ferryd answered poll (seq 3) with ok, "
                                      "expected poll_reply")
        assert client.poll(3).status is Status.Success  # the connection is still usable
    fake.join()


def test_a_late_reply_after_a_timeout_is_dropped(fake: FakeDaemon) -> None:
    def serve(c: FakeConn) -> None:
        c.hello()
        late, _ = c.recv()  # not answered until the next request shows the client gave up
        seq, _ = c.recv()
        c.send(PollReply(1, Status.Success, Errc.OK, ""), late)
        c.send(PollReply(2, Status.Transferring, Errc.OK, ""), seq)
        c.wait_closed()
    fake.serve(serve)
    with connect(fake) as client:
        with pytest.raises(FerryError) as info:
            client.poll(1, timeout=0.2)
        assert info.value.code == Errc.TIMED_OUT and "(seq 2)" in info.value.message
        assert client.poll(2) == PollReply(2, Status.Transferring, Errc.OK, "")
        assert not client.closed
    fake.join()


def test_poll_many_beyond_16384_rooms_is_split(fake: FakeDaemon) -> None:
    sizes: list[int] = []

    def serve(c: FakeConn) -> None:
        c.hello()
        held = [c.recv(), c.recv()]  # both requests are in flight before either is answered
        for seq, msg in reversed(held):
            assert isinstance(msg, PollMany)
            sizes.append(len(msg.rooms))
            c.send(PollManyReply([PollResult(r, Status.Failed, Errc.UNKNOWN_ROOM, "")
                                  for r in msg.rooms]), seq)
        c.wait_closed()
    fake.serve(serve)
    with connect(fake) as client:
        rooms = list(range(5, 5 + 20000))
        got = client.poll_many(rooms)
        assert [r.room for r in got] == rooms
        assert all(r.code is Errc.UNKNOWN_ROOM and r.status is Status.Failed for r in got)
        assert client.poll_many([]) == []
    assert sorted(sizes) == [20000 - 16384, 16384]
    fake.join()


def test_a_poll_many_reply_for_other_rooms_is_a_protocol_error(fake: FakeDaemon) -> None:
    def serve(c: FakeConn) -> None:
        c.hello()
        seq, _ = c.recv()
        c.send(PollManyReply([PollResult(1, Status.Success, Errc.OK, "")]), seq)
        c.wait_closed()
    fake.serve(serve)
    with connect(fake) as client:
        with pytest.raises(ProtocolError, match="answers 1 rooms for 2 asked"):
            client.poll_many([1, 2])
    fake.join()


# --- events ---------------------------------------------------------------------------------

def test_events_reach_callbacks_and_the_queue_while_requests_wait(fake: FakeDaemon) -> None:
    go_on = threading.Event()

    def serve(c: FakeConn) -> None:
        c.hello()
        subscribed(c, 7)
        seq, msg = c.recv()  # a poll, answered only after the events were seen
        for status in (Status.WaitingForInput, Status.Transferring):
            c.send(Event(7, status, Errc.OK, ""), 0)
        c.send(Event(7, Status.Failed, Errc.PEER_LOST, "peer 127.0.0.1:7401 lost: reset"), 0)
        assert go_on.wait(T)
        c.send(PollReply(7, Status.Failed, Errc.PEER_LOST, "peer 127.0.0.1:7401 lost"), seq)
        c.wait_closed()
    fake.serve(serve)
    with connect(fake) as client:
        seen: list[Event] = []
        threads: list[str] = []
        three = threading.Event()

        def callback(ev: Event) -> None:
            seen.append(ev)
            threads.append(threading.current_thread().name)
            if len(seen) == 3:
                three.set()
        client.on_event(callback)
        q = client.events()
        client.subscribe(7)
        with ThreadPoolExecutor(1) as pool:
            poll = pool.submit(client.poll, 7)
            assert three.wait(T), "the events did not reach the callback"
            got = [q.get(timeout=T) for _ in range(3)]
            assert not poll.done()  # the poll is still waiting for its reply
            go_on.set()
            assert poll.result(timeout=T).code is Errc.PEER_LOST
        assert got == seen
        assert [e.status for e in got] == [Status.WaitingForInput, Status.Transferring,
                                           Status.Failed]
        assert got[2].code is Errc.PEER_LOST and got[2].failed
        assert all(name.startswith("ferry-events") for name in threads)
        assert client.wait_terminal(7, timeout=T) == got[2]
    fake.join()


def test_a_slow_callback_does_not_delay_replies(fake: FakeDaemon) -> None:
    def serve(c: FakeConn) -> None:
        c.hello()
        subscribed(c, 1)
        c.send(Event(1, Status.Transferring, Errc.OK, ""), 0)
        c.send(Event(1, Status.Success, Errc.OK, ""), 0)
        for _ in range(5):
            seq, msg = c.recv()
            c.send(PollReply(msg.room, Status.Success, Errc.OK, ""), seq)  # type: ignore
        c.wait_closed()
    fake.serve(serve)
    release = threading.Event()
    entered = threading.Event()

    def slow(ev: Event) -> None:
        entered.set()
        release.wait(T)  # blocks the dispatcher until the test is done
    client = connect(fake)
    try:
        client.on_event(slow)
        client.subscribe(1)
        assert entered.wait(T)
        for room in range(5):  # replies come while the callback still blocks
            assert client.poll(room).status is Status.Success
        assert not release.is_set()
    finally:
        release.set()
        client.close()
    fake.join()


def test_a_callback_that_raises_is_logged_and_the_next_still_runs(
        fake: FakeDaemon, caplog: pytest.LogCaptureFixture) -> None:
    def serve(c: FakeConn) -> None:
        c.hello()
        subscribed(c, 1)
        c.send(Event(1, Status.Success, Errc.OK, ""), 0)
        c.wait_closed()
    got: "queue.Queue[Event]" = queue.Queue()

    def bad(ev: Event) -> None:
        raise RuntimeError("boom")
    fake.serve(serve)
    with connect(fake) as client:
        client.on_event(bad)
        remove = client.on_event(got.put)
        client.subscribe(1)
        assert got.get(timeout=T).room == 1
        remove()
    assert any("event callback" in r.getMessage() for r in caplog.records)
    fake.join()


def test_close_ends_the_event_stream_and_wait_terminal(fake: FakeDaemon) -> None:
    def serve(c: FakeConn) -> None:
        c.hello()
        subscribed(c, 3)
        c.send(Event(3, Status.Transferring, Errc.OK, ""), 0)
        c.wait_closed()
    fake.serve(serve)
    client = connect(fake)
    q = client.events()
    it = client.iter_events(timeout=T)
    client.subscribe(3)
    assert next(it).room == 3
    with pytest.raises(FerryError) as info:
        client.wait_terminal(3, timeout=0.05)
    assert info.value.code == Errc.TIMED_OUT
    client.close()
    assert list(it) == []  # ended by the close, not by the timeout
    assert q.get(timeout=T) is None
    with pytest.raises(FerryError) as info:
        client.wait_terminal(3, timeout=T)
    assert info.value.code == Errc.CANCELLED
    fake.join()


# --- lifetime ---------------------------------------------------------------------------------

def test_close_is_idempotent_and_fails_waiters(fake: FakeDaemon) -> None:
    received = threading.Event()

    def serve(c: FakeConn) -> None:
        c.hello()
        c.recv()
        received.set()
        c.wait_closed()
    fake.serve(serve)
    client = connect(fake)
    with ThreadPoolExecutor(1) as pool:
        f = pool.submit(client.poll, 1)
        assert received.wait(T)
        client.close()
        e = f.exception(timeout=T)
    assert isinstance(e, FerryError) and e.code == Errc.CANCELLED
    client.close()
    assert client.closed
    with pytest.raises(FerryError) as info:
        client.poll(1)
    assert info.value.code == Errc.CANCELLED and "closed" in info.value.message
    assert "closed" in repr(client)
    fake.join()


def test_close_from_a_callback(fake: FakeDaemon) -> None:
    def serve(c: FakeConn) -> None:
        c.hello()
        subscribed(c, 1)
        c.send(Event(1, Status.Success, Errc.OK, ""), 0)
        c.wait_closed()
    fake.serve(serve)
    client = connect(fake)
    done = threading.Event()

    def close_it(ev: Event) -> None:
        client.close()
        done.set()
    client.on_event(close_it)
    client.subscribe(1)
    assert done.wait(T) and client.closed
    fake.join()


def test_requests_encode_their_fields(fake: FakeDaemon) -> None:
    got: list[object] = []

    def serve(c: FakeConn) -> None:
        c.hello()
        for _ in range(3):
            seq, msg = c.recv()
            got.append(msg)
            c.send(Ok(), seq)
        c.wait_closed()
    fake.serve(serve)
    with connect(fake) as client:
        client.prepare(7, "127.0.0.1:7401", [5, 6], state_slot=2)
        client.prepare(8, ["a:1", "b:2"], range(3), aux_row=1)
        client.cancel(9)
        with pytest.raises(ValueError, match="field 'dst_pages'"):
            client.prepare(10, "a:1", [-1])  # nothing sent
    assert got == [Prepare(7, ["127.0.0.1:7401"], [5, 6], 2, None),
                   Prepare(8, ["a:1", "b:2"], [0, 1, 2], None, 1), Cancel(9)]
    fake.join()


def test_the_compatibility_module(fake: FakeDaemon) -> None:
    import ferry_client
    assert ferry_client.Client is Client and ferry_client.FerryError is FerryError
    assert (ferry_client.FAILED, ferry_client.SUCCESS) == (0, 4)
    assert ferry_client.STATUS[2] == "WaitingForInput"
    assert ferry_client.POLL_MANY == 8 and ferry_client.POLL_MANY_REPLY == 106
    assert ferry_client.EVENT == 105 and ferry_client.NO_INDEX == 0xFFFFFFFF
    assert ferry_client.POOLS == ("kv", "state", "aux")
    assert ferry_client.Event is Event
    assert ferry_client.Buffer._fields == ("offset", "item_bytes", "items", "layer_id", "tensor",
                                           "kind")
    assert ferry_client.Pool._fields == ("present", "shm_name", "total_bytes", "buffers",
                                         "registered")
