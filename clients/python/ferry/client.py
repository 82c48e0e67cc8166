"""A thread-safe client of one ferryd (docs/protocol.md), standard library only.

    from ferry import Client, Status
    with Client("/tmp/ferry-decode.sock") as c:            # connects and says hello
        c.prepare(7, ["127.0.0.1:7401"], dst_pages=[5, 6, 7], state_slot=2, aux_row=2)
        c.subscribe(7)
        ev = c.wait_terminal(7, timeout=30)                  # Event(room, status, code, reason)
        for r in c.poll_many(range(1000)):                   # v4: one round trip
            ...

Any number of threads may issue requests at once: each request gets its own seq and waits for
its own reply, whatever order ferryd answers in. A background reader thread owns the receive
side of the socket; sends are serialized by a lock. Pushed events go to a background
dispatcher thread, which hands them to the callbacks registered with :meth:`Client.on_event`
and to the queue of :meth:`Client.events`; a slow callback delays other events, never replies.

The client offers protocol versions 3..4 by default and speaks what ferryd's ``hello_reply``
says (``client.version``). A daemon that only speaks version 3 refuses the v4 hello; the client
then says hello again in version 3 on a new connection, so new clients work with old daemons.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import queue
import socket
import threading
import time
from array import array
from collections import OrderedDict
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

from .errors import Errc, FerryError, ProtocolError
from .protocol import (MAX_POLL_MANY, MAX_REGISTER_FDS, MIN_PROTOCOL_VERSION, POOL_KINDS,
                       PROTOCOL_VERSION, SUPPORTED_VERSIONS, Cancel, Error, Event, Frame,
                       Discover, DiscoveredRank, DiscoverReply, FrameReader, Hello, HelloReply,
                       Info, InfoReply, InfoTopic, MemoryBuffer,
                       MemoryKind, Message, MessageType, Ok, Poll, PollMany, PollManyReply,
                       PollReply, PollResult, Pool, Prepare, RegisterMemory, Send, Subscribe,
                       check_flags, decode, encode, message_type, pool_number, type_name)

_log = logging.getLogger("ferry")

EventCallback = Callable[[Event], None]

_STOP = object()  # ends the dispatcher thread
_MAX_TERMINAL = 65536  # terminal events kept for wait_terminal (as many as ferryd keeps rooms)
_HELLO_SEQ = 1

_EXPECT: dict[type, type] = {
    Hello: HelloReply, Prepare: Ok, Send: Ok, Poll: PollReply, Cancel: Ok, Subscribe: Ok,
    Info: InfoReply, PollMany: PollManyReply, RegisterMemory: Ok, Discover: DiscoverReply,
}
_TOPICS = {"status": InfoTopic.STATUS, "rooms": InfoTopic.ROOMS, "peers": InfoTopic.PEERS,
           "pools": InfoTopic.POOLS}


class _Pending:
    """One request waiting for its reply."""

    __slots__ = ("seq", "request", "expect", "done", "result", "error")

    def __init__(self, request: str, expect: type) -> None:
        self.seq = 0
        self.request = request
        self.expect = expect
        self.done = threading.Event()
        self.result: Optional[Message] = None
        self.error: Optional[FerryError] = None

    def resolve(self, msg: Message) -> None:
        self.result = msg
        self.done.set()

    def fail(self, err: FerryError) -> None:
        self.error = err
        self.done.set()


def _memory_buffer(b: Union[MemoryBuffer, Mapping[str, Any], Sequence[int]]) -> MemoryBuffer:
    """A register_memory table entry from a MemoryBuffer, a dict of its fields or a tuple."""
    if isinstance(b, MemoryBuffer):
        return b
    if isinstance(b, Mapping):
        return MemoryBuffer(**b)
    return MemoryBuffer(*b)


def _seq_list(seqs: Sequence[int]) -> str:
    if not seqs:
        return "no request is outstanding"
    shown = ", ".join(f"seq {s}" for s in seqs[:8])
    more = f" and {len(seqs) - 8} more" if len(seqs) > 8 else ""
    return f"waiting for {shown}{more}"


class Client:
    """A connection to one ferryd's client socket. Thread-safe; use as a context manager or call
    :meth:`close`.

    Attributes set by the hello: ``version`` (the connection's protocol version),
    ``daemon_versions`` (the daemon's range; ``(3, 3)`` for a v3 daemon), ``hello_reply``,
    ``node``, ``instance``, ``role``, ``control``, ``tp_size``, ``tp_rank``, ``page_tokens``,
    ``config_yaml`` and ``pools`` (``{"kv": Pool, "state": Pool, "aux": Pool}``).
    """

    def __init__(self, socket_path: str, name: str = "ferry-python",
                 timeout: Optional[float] = 30.0, cancel_on_disconnect: bool = True, *,
                 version_range: tuple[int, int] = (MIN_PROTOCOL_VERSION, PROTOCOL_VERSION)
                 ) -> None:
        """Connect to ``socket_path`` and say hello.

        ``timeout`` bounds each request's wait for its reply (and the connect and hello); None
        waits forever. With ``cancel_on_disconnect`` (the default) ferryd cancels the rooms this
        connection creates when it closes. ``version_range=(lo, hi)`` is the range of protocol
        versions offered, within 3..4; ``(3, 3)`` forces version 3.

        Raises :class:`FerryError`: the daemon's refusal (e.g. 312 ``unsupported_version``, or
        a refusal beyond ``limits.max_clients``), 300 when the socket cannot be connected."""
        lo, hi = version_range
        if not (MIN_PROTOCOL_VERSION <= lo <= hi <= PROTOCOL_VERSION):
            raise ValueError(f"version_range must lie within {MIN_PROTOCOL_VERSION}.."
                             f"{PROTOCOL_VERSION} with lo <= hi, got {lo}..{hi}")
        self.socket_path = socket_path
        self.name = name
        self.timeout = timeout
        self.cancel_on_disconnect = cancel_on_disconnect
        self.version_range = (lo, hi)

        self._lock = threading.Lock()  # pending requests, seq, state
        self._send_lock = threading.Lock()  # one frame on the socket at a time
        self._pending: dict[int, _Pending] = {}
        self._abandoned: set[int] = set()  # seqs whose waiter timed out; their replies are dropped
        self._seq = _HELLO_SEQ
        self._error: Optional[FerryError] = None  # why the connection ended
        self._closed = False
        self._maps: dict[str, mmap.mmap] = {}

        self._events_in: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._events_cond = threading.Condition()
        self._callbacks: list[EventCallback] = []
        self._user_queue: Optional[queue.Queue[Optional[Event]]] = None
        self._terminal: OrderedDict[int, Event] = OrderedDict()
        self._dispatch_done = False

        self.fell_back_to_v3 = False  # a v4 hello was refused and a v3 one accepted
        sock, frames, reply = self._handshake(lo, hi)
        self._sock = sock
        self._frames = frames
        self.hello_reply: HelloReply = reply
        self.version: int = reply.version
        self.daemon_versions: tuple[int, int] = (reply.min_version, reply.max_version)
        self.node, self.instance, self.role = reply.node, reply.instance, reply.role
        self.control = reply.control
        self.tp_size, self.tp_rank, self.page_tokens = reply.tp_size, reply.tp_rank, reply.page_tokens
        self.config_yaml = reply.config_yaml  # the daemon's effective config (pools, TP/PP)
        self.pools: dict[str, Pool] = dict(zip(POOL_KINDS, reply.pools))

        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name=f"ferry-reader[{name}]")
        self._dispatcher = threading.Thread(target=self._dispatch_loop, daemon=True,
                                            name=f"ferry-events[{name}]")
        self._dispatcher.start()
        self._reader.start()

    # --- hello -------------------------------------------------------------------------------

    def _handshake(self, lo: int, hi: int) -> tuple[socket.socket, FrameReader, HelloReply]:
        got = self._hello_once(lo, hi)
        if isinstance(got, Error) and hi >= 4 and lo <= 3 and \
                got.code in (Errc.UNSUPPORTED_VERSION, Errc.MALFORMED_FRAME):
            # A daemon that speaks only version 3 cannot read a v4 hello: it answers
            # unsupported_version, or (not knowing the trailing min_version) malformed_frame.
            self.fell_back_to_v3 = True
            got = self._hello_once(lo, 3)
        if isinstance(got, Error):
            raise FerryError(got.code, got.message)
        return got

    def _hello_once(self, lo: int, hi: int
                    ) -> Union[tuple[socket.socket, FrameReader, HelloReply], Error]:
        """Connect and say a hello offering ``lo..hi``: the socket, its reader and the reply, or
        the daemon's error reply to the hello (the connection is then closed). A connection-level
        error (seq 0) raises."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            try:
                sock.connect(self.socket_path)
            except OSError as e:
                raise FerryError(Errc.PEER_UNREACHABLE,
                                 f"cannot connect to ferryd at {self.socket_path}: {e}") from e
            hello = Hello(version=hi, client_name=self.name,
                          cancel_on_disconnect=self.cancel_on_disconnect, min_version=lo)
            frames = FrameReader()
            send_error: Optional[OSError] = None
            try:
                sock.sendall(encode(hello, _HELLO_SEQ, hi))
            except OSError as e:
                # ferryd may have refused the connection before reading anything (beyond
                # limits.max_clients): its reason, an error with seq 0, says more.
                send_error = e
            while True:
                f = frames.next()
                if f is None:
                    if deadline is not None:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise FerryError(Errc.TIMED_OUT, "timed out waiting for ferryd's "
                                                             "hello_reply")
                        sock.settimeout(left)
                    try:
                        chunk = sock.recv(1 << 16)
                    except socket.timeout:
                        raise FerryError(Errc.TIMED_OUT, "timed out waiting for ferryd's "
                                                         "hello_reply") from None
                    except OSError as e:
                        raise FerryError(Errc.PEER_LOST, f"reading ferryd's hello_reply failed: "
                                                         f"{send_error or e}") from None
                    if not chunk:
                        why = f"writing the hello failed: {send_error}" if send_error else \
                            "ferryd closed the connection before its hello_reply"
                        raise FerryError(Errc.PEER_LOST, why)
                    frames.feed(chunk)
                    continue
                check_flags(f)
                if f.type == MessageType.ERROR and f.seq in (0, _HELLO_SEQ):
                    err = decode(f.type, f.seq, f.body, max(hi, 3))
                    assert isinstance(err, Error)
                    if f.seq == 0:  # about the connection (e.g. beyond limits.max_clients)
                        raise FerryError(err.code, err.message)
                    sock.close()
                    return err
                if f.seq != _HELLO_SEQ:
                    raise ProtocolError(Errc.MALFORMED_FRAME,
                                        f"protocol error: ferryd sent a reply of type "
                                        f"{type_name(f.type)} ({f.type}) with seq {f.seq}, which "
                                        f"matches no outstanding request (waiting for seq "
                                        f"{_HELLO_SEQ}, the hello)")
                if f.type != MessageType.HELLO_REPLY:
                    raise ProtocolError(Errc.MALFORMED_FRAME,
                                        f"protocol error: ferryd answered hello (seq "
                                        f"{_HELLO_SEQ}) with {type_name(f.type)}, expected "
                                        f"hello_reply")
                reply = decode(f.type, f.seq, f.body, max(hi, 3))
                assert isinstance(reply, HelloReply)
                if not lo <= reply.version <= hi:
                    raise ProtocolError(Errc.UNSUPPORTED_VERSION,
                                        f"protocol error: ferryd answered in protocol version "
                                        f"{reply.version}, outside the range {lo}..{hi} this "
                                        f"client offered")
                sock.settimeout(self.timeout)
                return sock, frames, reply
        except BaseException:
            sock.close()
            raise

    # --- requests ----------------------------------------------------------------------------

    def request(self, msg: Message, timeout: Optional[float] = None) -> Message:
        """Send any request and return its reply message (low level; the methods below wrap
        it). ``timeout`` overrides the client's for this call. An ``error`` reply raises
        :class:`FerryError`."""
        return self._wait(self._start(msg), timeout)

    def _start(self, msg: Message, fds: Sequence[int] = ()) -> _Pending:
        """Encode, register and send ``msg``; the pending request to wait on. ``fds`` go with
        the frame's first byte (SCM_RIGHTS; register_memory)."""
        expect = _EXPECT.get(type(msg))
        if expect is None:
            raise TypeError(f"{type(msg).__name__} is not a request")
        frame = bytearray(encode(msg, 0, self.version))  # may raise EncodeError: nothing sent
        p = _Pending(message_type(msg).wire_name, expect)
        with self._send_lock:
            if fds:
                self._quiesce(p.request)
            with self._lock:
                if self._error is not None:
                    raise self._error.copy()
                seq = self._seq
                while True:
                    seq = seq % 0xFFFFFFFF + 1  # 1..2^32-1: seq 0 is for events
                    if seq not in self._pending and seq not in self._abandoned:
                        break
                self._seq = p.seq = seq
                self._pending[seq] = p
            frame[8:12] = seq.to_bytes(4, "little")
            try:
                if fds:
                    self._send_with_fds(frame, fds)
                else:
                    self._sock.sendall(frame)
                return p
            except OSError as e:
                send_error = e
        # The connection broke. The reader thread will see why (ferryd's seq-0 error, or the
        # end of the stream) and fail every pending request with it, this one included.
        if isinstance(send_error, socket.timeout):
            self._fail_connection(FerryError(Errc.TIMED_OUT, f"writing {p.request} to ferryd "
                                                             f"timed out; the connection is "
                                                             f"closed"))
        elif not p.done.wait(5.0 if self.timeout is None else min(self.timeout, 5.0)):
            self._fail_connection(FerryError(Errc.PEER_LOST,
                                             f"writing to ferryd failed: {send_error}"))
        return p

    def _send_with_fds(self, frame: bytearray, fds: Sequence[int]) -> None:
        """The whole frame in one sendmsg, the descriptors on its first byte; should the socket
        take only part of it, the rest follows without descriptors (they went with the first
        byte). Called with the send lock held."""
        view = memoryview(frame)
        sent = self._sock.sendmsg([view], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                            array("i", fds))])
        if sent < len(frame):
            self._sock.sendall(view[sent:])

    def _quiesce(self, what: str) -> None:
        """Wait (bounded by the client's timeout) until every request already sent has its
        reply, so that ferryd has read every byte before the next frame. Called with the send
        lock held, so nothing else is sent meanwhile.

        Why: Linux delivers a unix stream's bytes from several writes in one recvmsg, and the
        descriptors passed with the last of them come with it; a daemon that attributes
        descriptors to the first byte it received then credits them to the frame before. With
        nothing unread ahead of it, the frame carrying descriptors starts ferryd's next read."""
        with self._lock:
            ahead = list(self._pending.values())
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        for q in ahead:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not q.done.wait(left):
                _log.warning("ferry: sending %s while %s (seq %d) still waits for its reply; "
                             "ferryd may take the descriptors for that frame's", what,
                             q.request, q.seq)
                return

    def _wait(self, p: _Pending, timeout: Optional[float]) -> Message:
        if timeout is None:
            timeout = self.timeout
        if not p.done.wait(timeout):
            with self._lock:
                if self._pending.get(p.seq) is p:
                    del self._pending[p.seq]
                    self._abandoned.add(p.seq)  # its reply, if it ever comes, is dropped
                    raise FerryError(Errc.TIMED_OUT, f"timed out after {timeout} s waiting for "
                                                     f"ferryd's reply to {p.request} "
                                                     f"(seq {p.seq})")
            # The reader took it off the list and is delivering it right now.
            p.done.wait()
        if p.error is not None:
            raise p.error
        assert p.result is not None
        return p.result

    def prepare(self, room: int, prefill_peers: Union[str, Sequence[str]],
                dst_pages: Sequence[int], state_slot: Optional[int] = None,
                aux_row: Optional[int] = None, *, prefix_tokens: int = 0,
                timeout: Optional[float] = None) -> None:
        """Decode side: where ``room``'s bytes land. ``prefill_peers`` is a prefill ferryd's
        control address ``"host:port"`` or a list of them (every rank of the prefill instance
        is fine). ``state_slot`` is exactly one Mamba slot (an int; None = absent), ``aux_row``
        one aux row. ``prefix_tokens`` (v4): tokens of the prompt this decode already holds
        (a multiple of the page size); the prefill's ``poll`` answers it."""
        peers = [prefill_peers] if isinstance(prefill_peers, str) else list(prefill_peers)
        if prefix_tokens and self.version < 4:
            raise FerryError(Errc.UNSUPPORTED_VERSION,
                             f"prefix_tokens needs protocol version 4; this connection speaks "
                             f"{self.version}")
        self.request(Prepare(room, peers, list(dst_pages), state_slot, aux_row, prefix_tokens),
                     timeout)

    def send(self, room: int, src_pages: Sequence[int], last: bool = False,
             state_slot: Optional[int] = None, aux_row: Optional[int] = None, *,
             timeout: Optional[float] = None) -> None:
        """Prefill side: one chunk of ``room``; the last chunk carries the one state slot and
        the aux row."""
        self.request(Send(room, list(src_pages), bool(last), state_slot, aux_row), timeout)

    def poll(self, room: int, *, timeout: Optional[float] = None) -> PollReply:
        """The room's status (``.status``, a :class:`Status`), ``.code`` (v4; None in v3) and,
        for Failed, ``.reason``."""
        reply = self.request(Poll(room), timeout)
        assert isinstance(reply, PollReply)
        return reply

    def poll_many(self, rooms: Iterable[int], *,
                  timeout: Optional[float] = None) -> list[PollResult]:
        """(v4) The status of every room in ``rooms``, in order, as :meth:`poll` would answer
        (an unknown room on a decode daemon is Failed with code ``unknown_room``; reasons are
        cut at 1000 bytes). One round trip per 16384 rooms; the requests of a longer list are
        in flight together. Raises :class:`FerryError` 312 on a version-3 connection."""
        if self.version < 4:
            lo, hi = self.version_range
            raise FerryError(Errc.UNSUPPORTED_VERSION,
                             f"poll_many needs protocol version 4, but this connection speaks "
                             f"version {self.version} (the client offered {lo}..{hi}, ferryd "
                             f"speaks {self.daemon_versions[0]}..{self.daemon_versions[1]})")
        rooms = list(rooms)
        chunks = [rooms[i:i + MAX_POLL_MANY] for i in range(0, len(rooms), MAX_POLL_MANY)]
        pending = [(chunk, self._start(PollMany(chunk))) for chunk in chunks]
        out: list[PollResult] = []
        for chunk, p in pending:
            reply = self._wait(p, timeout)
            assert isinstance(reply, PollManyReply)
            if len(reply.rooms) != len(chunk) or any(
                    r.room != room for r, room in zip(reply.rooms, chunk)):
                got = [r.room for r in reply.rooms]
                bad = next((i for i, (a, b) in enumerate(zip(got, chunk)) if a != b),
                           min(len(got), len(chunk)))
                raise ProtocolError(Errc.MALFORMED_FRAME,
                                    f"protocol error: ferryd's poll_many_reply (seq {p.seq}) "
                                    f"answers {len(got)} rooms for {len(chunk)} asked, and "
                                    f"differs at entry {bad}")
            out.extend(reply.rooms)
        return out

    def register_memory(self, pool: Union[str, int],
                        buffers: Sequence[Union[MemoryBuffer, Mapping[str, Any],
                                                Sequence[int]]],
                        fds: Sequence[int], memory_kind: int = MemoryKind.HOST,
                        timeout: Optional[float] = None) -> None:
        """(v4) Lend ferryd this process's memory for a ``memory: client`` pool (``"kv"``,
        ``"state"``, ``"aux"``, or 0..2).

        ``buffers`` lists every buffer of the pool in the order of its layout in
        ``self.pools[pool].buffers`` (:class:`~ferry.protocol.MemoryBuffer`, or dicts with its
        field names, or tuples in its order), each a range of ``fds[fd_index]``: memfds sealed with ``F_SEAL_SHRINK``,
        offsets multiples of 4096 (:class:`ferry.memory.MemfdPool` builds all of this). The
        descriptors go with the frame as SCM_RIGHTS; the caller keeps its own (ferryd receives
        duplicates and closes them once mapped). The registration lasts as long as this
        connection: closing the client cancels every room of the daemon, and the pool can be
        registered again once ferryd released it.

        Raises :class:`FerryError`: ferryd's refusal, which names the buffer or descriptor
        (e.g. ``pool kv: fd 0 is not sealed against shrinking (F_SEAL_SHRINK): ...``), 312 on a
        version-3 connection; :class:`~ferry.errors.EncodeError` (nothing sent) for more than
        64 descriptors or 4096 buffers."""
        if self.version < 4:
            lo, hi = self.version_range
            raise FerryError(Errc.UNSUPPORTED_VERSION,
                             f"register_memory needs protocol version 4, but this connection "
                             f"speaks version {self.version} (the client offered {lo}..{hi}, "
                             f"ferryd speaks {self.daemon_versions[0]}.."
                             f"{self.daemon_versions[1]})")
        table = [_memory_buffer(b) for b in buffers]
        fds = [int(fd) for fd in fds]
        msg = RegisterMemory(pool_number(pool), memory_kind, len(fds), table)
        if len(fds) > MAX_REGISTER_FDS:
            encode(msg, 0, self.version)  # raises the codec's EncodeError naming fd_count
        self._wait(self._start(msg, fds), timeout)

    def discover(self, address: str, *, timeout: Optional[float] = None
                 ) -> list[DiscoveredRank]:
        """(v4) Every rank of the engine instance one of whose ranks' ferryd listens at
        ``address`` ("host:port"): the named rank first, then the others its config lists, each
        ``up`` with its node and TP/PP position or down with the reason. The addresses of the
        ranks that are up are what a prepare names."""
        if self.version < 4:
            raise FerryError(Errc.UNSUPPORTED_VERSION,
                             f"discover needs protocol version 4, but this connection speaks "
                             f"version {self.version}")
        reply = self.request(Discover(address), timeout)
        assert isinstance(reply, DiscoverReply)
        return list(reply.ranks)

    def cancel(self, room: int, *, timeout: Optional[float] = None) -> None:
        """Fail ``room`` with ``cancelled by client``; the peer daemon is told."""
        self.request(Cancel(room), timeout)

    def subscribe(self, room: int, *, timeout: Optional[float] = None) -> None:
        """Have ferryd push an :class:`Event` with the room's current status and one per change
        until it is terminal (see :meth:`on_event`, :meth:`events`, :meth:`wait_terminal`)."""
        self.request(Subscribe(room), timeout)

    def info(self, topic: Union[str, int] = "status", *,
             timeout: Optional[float] = None) -> Any:
        """The daemon's document of ``topic`` (``"status"``, ``"rooms"``, ``"peers"``,
        ``"pools"`` or their numbers 0..3), parsed: a dict for status and pools, a list for
        rooms and peers (fields in docs/protocol.md, "info documents"). A reply that is not
        JSON raises :class:`ProtocolError`."""
        if isinstance(topic, str):
            if topic not in _TOPICS:
                raise ValueError(f"unknown info topic {topic!r}: one of {', '.join(_TOPICS)}")
            t = _TOPICS[topic]
        else:
            t = InfoTopic(topic)
        reply = self.request(Info(t), timeout)
        assert isinstance(reply, InfoReply)
        try:
            return json.loads(reply.text)
        except ValueError as e:
            raise ProtocolError(Errc.MALFORMED_FRAME,
                                f"ferryd's info {t.name.lower()} reply is not JSON: {e}",
                                message_type="info_reply", field="text") from None

    # --- events ------------------------------------------------------------------------------

    def on_event(self, callback: EventCallback) -> Callable[[], None]:
        """Call ``callback(event)`` for every pushed event from now on, on the dispatcher
        thread (never on the reader thread). An exception it raises is logged to the ``ferry``
        logger and dropped. Returns a function that unregisters it."""
        with self._events_cond:
            self._callbacks = self._callbacks + [callback]

        def remove() -> None:
            with self._events_cond:
                self._callbacks = [c for c in self._callbacks if c is not callback]
        return remove

    def events(self) -> queue.Queue[Optional[Event]]:
        """The queue that receives every pushed event from the first call of this method on
        (call it before subscribing); the same queue on each call. After the connection ends
        it receives ``None``."""
        with self._events_cond:
            if self._user_queue is None:
                self._user_queue = queue.Queue()
                if self._dispatch_done:
                    self._user_queue.put(None)
            return self._user_queue

    def iter_events(self, timeout: Optional[float] = None) -> Iterator[Event]:
        """Iterate over :meth:`events`; stops when no event came for ``timeout`` seconds (None:
        never) or the connection ended."""
        q = self.events()
        while True:
            try:
                ev = q.get(timeout=timeout)
            except queue.Empty:
                return
            if ev is None:
                q.put(None)  # for the next reader of the queue
                return
            yield ev

    def wait_terminal(self, room: int, timeout: float = 60.0) -> Event:
        """Wait for the Success or Failed event of a subscribed ``room`` (it may have arrived
        already) and return it. Raises FerryError 405 when none comes in ``timeout`` seconds,
        or the connection's error when it ends first."""
        deadline = time.monotonic() + timeout
        with self._events_cond:
            while True:
                ev = self._terminal.pop(room, None)
                if ev is not None:
                    return ev
                if self._dispatch_done:
                    raise self._closed_error()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FerryError(Errc.TIMED_OUT, f"room {room} reached no terminal status "
                                                     f"within {timeout} s (is it subscribed?)")
                self._events_cond.wait(left)

    def _dispatch_loop(self) -> None:
        while True:
            item = self._events_in.get()
            if item is _STOP:
                break
            assert isinstance(item, Event)
            with self._events_cond:
                if item.terminal:
                    self._terminal[item.room] = item
                    self._terminal.move_to_end(item.room)
                    if len(self._terminal) > _MAX_TERMINAL:
                        self._terminal.popitem(last=False)
                    self._events_cond.notify_all()
                q, callbacks = self._user_queue, self._callbacks
            if q is not None:
                q.put(item)
            for cb in callbacks:
                try:
                    cb(item)
                except Exception:
                    _log.exception("ferry: event callback %r failed on %r", cb, item)
        with self._events_cond:
            self._dispatch_done = True
            self._events_cond.notify_all()
            q = self._user_queue
        if q is not None:
            q.put(None)

    # --- the reader thread -------------------------------------------------------------------

    def _read_loop(self) -> None:
        try:
            while True:
                f = self._frames.next()
                if f is not None:
                    self._on_frame(f)
                    continue
                try:
                    chunk = self._sock.recv(1 << 16)
                except socket.timeout:
                    continue
                except OSError as e:
                    if self._error is not None:
                        return
                    raise FerryError(Errc.PEER_LOST, f"reading from ferryd failed: {e}") from None
                if not chunk:
                    if self._error is not None:
                        return
                    raise FerryError(Errc.PEER_LOST, "ferryd closed the connection")
                self._frames.feed(chunk)
        except FerryError as e:
            self._fail_connection(e)
        except BaseException as e:  # a bug here must not leave waiters hanging
            self._fail_connection(FerryError(Errc.INTERNAL,
                                             f"the ferry client's reader thread failed: {e!r}"))
            raise

    def _on_frame(self, f: Frame) -> None:
        check_flags(f)  # a ProtocolError here ends the connection
        if f.seq == 0:
            if f.type == MessageType.EVENT:
                self._events_in.put(decode(f.type, 0, f.body, self.version))
                return
            if f.type == MessageType.ERROR:  # about the connection itself; ferryd closes it
                err = decode(f.type, 0, f.body, self.version)
                assert isinstance(err, Error)
                raise FerryError(err.code, err.message)
        with self._lock:
            p = self._pending.pop(f.seq, None)
            if p is None:
                if f.seq in self._abandoned:
                    self._abandoned.discard(f.seq)  # the reply of a request that timed out
                    return
                waiting = _seq_list(sorted(self._pending))
        if p is None:
            # Taking it for another request's reply would shift every later reply.
            raise ProtocolError(Errc.MALFORMED_FRAME,
                                f"protocol error: ferryd sent a reply of type "
                                f"{type_name(f.type)} ({f.type}) with seq {f.seq}, which "
                                f"matches no outstanding request ({waiting})")
        try:
            msg = decode(f.type, f.seq, f.body, self.version)
        except ProtocolError as e:  # the stream is still in step: only this request fails
            p.fail(e)
            return
        if isinstance(msg, Error):
            p.fail(FerryError(msg.code, msg.message))
        elif not isinstance(msg, p.expect):
            p.fail(ProtocolError(Errc.MALFORMED_FRAME,
                                 f"protocol error: ferryd answered {p.request} (seq {f.seq}) "
                                 f"with {type_name(f.type)}, expected "
                                 f"{type_name(message_type(p.expect))}"))
        else:
            p.resolve(msg)

    def _fail_connection(self, err: FerryError) -> None:
        """End the connection with ``err``: every waiting request raises it, later requests
        too. The first call wins."""
        with self._lock:
            if self._error is not None:
                return
            self._error = err
            pending = list(self._pending.values())
            self._pending.clear()
        for p in pending:
            p.fail(err.copy())
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the reader and a blocked sender
        except OSError:
            pass
        self._events_in.put(_STOP)

    def _closed_error(self) -> FerryError:
        err = self._error
        return err.copy() if err is not None else FerryError(Errc.CANCELLED, "the client was closed")

    # --- lifetime ----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once the connection ended (closed by :meth:`close`, by ferryd, or by an
        error)."""
        return self._error is not None

    @property
    def error(self) -> Optional[FerryError]:
        """Why the connection ended, or None while it is open."""
        return self._error

    def close(self) -> None:
        """Close the connection (requests still waiting raise FerryError 406), stop the
        threads, and unmap the pools (a pool still viewed is unmapped with its last view).
        Idempotent; may be called from an event callback."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._fail_connection(FerryError(Errc.CANCELLED, "the client was closed"))
        current = threading.current_thread()
        for t in (self._reader, self._dispatcher):
            if t is not current and t.is_alive():
                t.join(timeout=10.0)
        with self._send_lock:
            self._sock.close()
        for m in self._maps.values():
            try:
                m.close()
            except BufferError:
                pass
        self._maps.clear()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return (f"<ferry.Client {self.socket_path!r} {self.role} {self.node}/{self.instance} "
                f"v{self.version} {state}>")

    # --- memory ------------------------------------------------------------------------------

    def pool(self, kind: str) -> memoryview:
        """The daemon's pool ``kind`` (``"kv"``, ``"state"``, ``"aux"``) mapped read-write, as a
        memoryview (release the views before :meth:`close` to unmap it at once)."""
        with self._lock:
            if kind not in self._maps:
                p = self.pools[kind]
                if not p.present:
                    raise FerryError(Errc.INVALID_REQUEST, f"the daemon has no {kind} pool")
                if not p.shm_name:
                    raise FerryError(Errc.INVALID_REQUEST,
                                     f"pool {kind} is client memory (memory: client): there is "
                                     f"no shm object to map; use the memory lent with "
                                     f"register_memory (ferry.memory.MemfdPool)")
                fd = os.open("/dev/shm" + p.shm_name, os.O_RDWR)
                try:
                    self._maps[kind] = mmap.mmap(fd, p.total_bytes)
                finally:
                    os.close(fd)
            return memoryview(self._maps[kind])

    @property
    def maps(self) -> dict[str, mmap.mmap]:
        """The pools mapped so far."""
        return self._maps

    def item(self, kind: str, buffer: int, index: int) -> tuple[int, int]:
        """``(offset, length)`` of item ``index`` of buffer ``buffer`` in pool ``kind``,
        bounds-checked."""
        b = self.pools[kind].buffers[buffer]
        if not 0 <= index < b.items:
            raise FerryError(Errc.INVALID_REQUEST, f"{kind} item {index} is outside the pool of "
                                                   f"{b.items}")
        return b.offset + index * b.item_bytes, b.item_bytes


__all__ = ["Client", "EventCallback", "SUPPORTED_VERSIONS"]
