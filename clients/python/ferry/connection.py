"""One connection to a ferryd's client socket (docs/protocol.md), the plumbing under
:class:`ferry.Client`: the hello, requests matched to their replies by seq, the reader and
dispatcher threads, and the end of the connection. Standard library only.

Any number of threads may issue requests at once: each request gets its own seq and waits for
its own reply, whatever order ferryd answers in. A background reader thread owns the receive
side of the socket; sends are serialized by a lock. Pushed events go to a background
dispatcher thread, which hands them to the callbacks and the queue the client registered
(:meth:`~ferry.Client.on_event`, :meth:`~ferry.Client.events`) and keeps terminal ones for
:meth:`~ferry.Client.wait_terminal`; a slow callback delays other events, never replies.

The connection offers protocol versions 3..4 by default and speaks what ferryd's
``hello_reply`` says (``version``). A daemon that only speaks version 3 refuses the v4 hello;
the connection then says hello again in version 3 on a new socket, so new clients work with old
daemons.
"""

from __future__ import annotations

import logging
import mmap
import queue
import socket
import threading
import time
from array import array
from collections import OrderedDict
from typing import Callable, Optional, Sequence, Union

from .errors import Errc, FerryError, ProtocolError
from .protocol import (MIN_PROTOCOL_VERSION, POOL_KINDS, PROTOCOL_VERSION, Cancel, Discover,
                       DiscoverReply, Error, Event, Frame, FrameReader, Hello, HelloReply, Info,
                       InfoReply, Message, MessageType, Ok, Poll, PollMany, PollManyReply,
                       PollReply, Pool, Prepare, RegisterMemory, Send, Subscribe, check_flags,
                       decode, encode, message_type, type_name)

_log = logging.getLogger("ferry")

EventCallback = Callable[[Event], None]

_STOP = object()  # ends the dispatcher thread
_MAX_TERMINAL = 65536  # terminal events kept for wait_terminal (as many as ferryd keeps rooms)
_HELLO_SEQ = 1

_EXPECT: dict[type, type] = {
    Hello: HelloReply, Prepare: Ok, Send: Ok, Poll: PollReply, Cancel: Ok, Subscribe: Ok,
    Info: InfoReply, PollMany: PollManyReply, RegisterMemory: Ok, Discover: DiscoverReply,
}


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


def _seq_list(seqs: Sequence[int]) -> str:
    if not seqs:
        return "no request is outstanding"
    shown = ", ".join(f"seq {s}" for s in seqs[:8])
    more = f" and {len(seqs) - 8} more" if len(seqs) > 8 else ""
    return f"waiting for {shown}{more}"


class Connection:
    """A connection to one ferryd's client socket: the base of :class:`ferry.Client`, which adds
    the typed requests, the events API and the pools' memory (use :class:`~ferry.Client`).

    Thread-safe. :meth:`request` sends any request and waits for its reply; :meth:`close` ends
    the connection (and unmaps the pools mapped through it)."""

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
        """Send any request and return its reply message (low level; the methods of
        :class:`~ferry.Client` wrap it). ``timeout`` overrides the client's for this call. An
        ``error`` reply raises :class:`FerryError`."""
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
    # --- the dispatcher thread ---------------------------------------------------------------

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


__all__ = ["Connection", "EventCallback"]
