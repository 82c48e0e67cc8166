"""One connection to a ferryd's client socket (docs/protocol.md), the plumbing under
:class:`ferry.Client`: the thread shell around the connection's pure machine
(:class:`ferry.session.Session`, which numbers the requests, matches replies to them by seq and
says what each frame means): the socket, the reader and dispatcher threads, the waits, and the
end of the connection and reconnecting. Standard library only.

Any number of threads may issue requests at once: each request gets its own seq and waits for
its own reply, whatever order ferryd answers in. A background reader thread owns the receive
side of the socket; sends are serialized by a lock. Pushed events go to a background
dispatcher thread, which hands them to the callbacks and the queue the client registered
(:meth:`~ferry.Client.on_event`, :meth:`~ferry.Client.events`) and keeps terminal ones for
:meth:`~ferry.Client.wait_terminal`; a slow callback delays other events, never replies.

The connection offers protocol versions 3..10 by default and speaks what ferryd's
``hello_reply`` says (``version``). A daemon that only speaks version 3 refuses the v4 hello;
the connection then says hello again in version 3 on a new socket, so new clients work with old
daemons.

With ``reconnect`` (:class:`~ferry.reconnect.Reconnect`) a lost connection is made again in
the background, and the memory the client lent is registered again (:mod:`ferry.reconnect`).
Everything that belongs to one socket (its requests waiting for replies, its seqs, its reader
thread) is a :class:`_Link`; a reconnect makes a new one, so no reply on the old socket can be
taken for a request on the new one.
"""

from __future__ import annotations

import logging
import mmap
import os
import queue
import socket
import threading
import time
from array import array
from collections import OrderedDict
from typing import Callable, Optional, Sequence, Union

from .errors import Errc, FerryError
from .protocol import (MIN_PROTOCOL_VERSION, POOL_KINDS, PROTOCOL_VERSION, Event, Frame,
                       FrameReader, Hello, HelloReply, Message, Pool, RegisterMemory, Status,
                       message_type)
from .reconnect import (AttemptLog, Disconnected, Draining, NoticeCallback, Reconnect,
                        Reconnected, reconnect_policy)
from .session import (Dropped, Ended, Failed, HelloAccepted, HelloRefused, Pushed, Refused,
                      Reply, Session, hello_outcome)

_log = logging.getLogger("ferry")

EventCallback = Callable[[Event], None]

_STOP = object()  # ends the dispatcher thread
_MAX_TERMINAL = 65536  # terminal events kept for wait_terminal (as many as ferryd keeps rooms)


class _Pending:
    """One request waiting for its reply on ``link`` (the token its session hands back)."""

    __slots__ = ("seq", "request", "done", "result", "error", "link", "on_ok")

    def __init__(self, request: str, on_ok: Optional[Callable[[], None]] = None) -> None:
        self.seq = 0
        self.request = request
        self.done = threading.Event()
        self.result: Optional[Message] = None
        self.error: Optional[FerryError] = None
        self.link: Optional[_Link] = None
        self.on_ok = on_ok  # run by the reader on a successful reply, before the waiter wakes

    def resolve(self, msg: Message) -> None:
        self.result = msg
        self.done.set()

    def fail(self, err: FerryError) -> None:
        self.error = err
        self.done.set()


class _Link:
    """One socket to ferryd, said hello on, and what belongs to it: its session (the requests
    waiting for their replies, its seqs), its reader thread, and why it ended (``error``)."""

    def __init__(self, number: int, sock: socket.socket, frames: FrameReader,
                 session: Session) -> None:
        self.number = number
        self.sock = sock
        self.frames = frames
        self.session = session
        self.error: Optional[FerryError] = None
        self.draining = False  # ferryd said 407 "ferryd is draining" on it
        self.reader: Optional[threading.Thread] = None


class _Registration:
    """A ``register_memory`` this client made, kept to make it again after a reconnect: the
    table and duplicates of the descriptors (owned; closed with the client)."""

    def __init__(self, msg: RegisterMemory, fds: Sequence[int]) -> None:
        self.msg = msg
        self.fds = [os.dup(fd) for fd in fds]
        self.kept = False  # set by the reader thread once ferryd accepted it

    def close(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


class _Delivered:
    """An event already kept for wait_terminal (a room failed because the connection was
    lost), for the dispatcher to hand to callbacks and the queue only."""

    __slots__ = ("event",)

    def __init__(self, event: Event) -> None:
        self.event = event


class Connection:
    """A connection to one ferryd's client socket: the base of :class:`ferry.Client`, which adds
    the typed requests, the events API and the pools' memory (use :class:`~ferry.Client`).

    Thread-safe. :meth:`request` sends any request and waits for its reply; :meth:`close` ends
    the connection (and unmaps the pools mapped through it)."""

    def __init__(self, socket_path: str, name: str = "ferry-python",
                 timeout: Optional[float] = 30.0, cancel_on_disconnect: bool = True, *,
                 version_range: tuple[int, int] = (MIN_PROTOCOL_VERSION, PROTOCOL_VERSION),
                 reconnect: Union[bool, Reconnect, None] = False) -> None:
        """Connect to ``socket_path`` and say hello.

        ``timeout`` bounds each request's wait for its reply (and the connect and hello); None
        waits forever. With ``cancel_on_disconnect`` (the default) ferryd cancels the rooms this
        connection creates when it closes. ``version_range=(lo, hi)`` is the range of protocol
        versions offered, within 3..4; ``(3, 3)`` forces version 3.

        ``reconnect`` (off by default; True for the defaults of
        :class:`~ferry.reconnect.Reconnect`, or a ``Reconnect``): when the connection is lost,
        connect again in the background, say hello, and register again the memory this client
        lent (:mod:`ferry.reconnect`). Without it a lost connection stays lost: every later
        request raises the loss's error.

        Raises :class:`FerryError`: the daemon's refusal (e.g. 312 ``unsupported_version``, or
        a refusal beyond ``limits.max_clients``), 300 when the socket cannot be connected (the
        first connection is not retried, with or without ``reconnect``)."""
        lo, hi = version_range
        if not (MIN_PROTOCOL_VERSION <= lo <= hi <= PROTOCOL_VERSION):
            raise ValueError(f"version_range must lie within {MIN_PROTOCOL_VERSION}.."
                             f"{PROTOCOL_VERSION} with lo <= hi, got {lo}..{hi}")
        self.socket_path = socket_path
        self.name = name
        self.timeout = timeout
        self.cancel_on_disconnect = cancel_on_disconnect
        self.version_range = (lo, hi)
        self.reconnect: Optional[Reconnect] = reconnect_policy(reconnect)

        self._lock = threading.Lock()  # the link, its pending requests, state
        self._send_lock = threading.Lock()  # one frame on the socket at a time
        self._error: Optional[FerryError] = None  # why no link serves requests (None: one does)
        self._ended = False  # no link will serve requests again
        self._closed = False
        self._maps: dict[str, mmap.mmap] = {}
        self._stale_maps: list[mmap.mmap] = []  # mappings of a former daemon still viewed
        self._subscribed: set[int] = set()  # rooms subscribed on the link, not yet terminal
        self._registrations: dict[int, _Registration] = {}  # by pool number, with reconnect
        self._down_since = 0.0
        self._attempt = 0  # reconnect attempts since the loss
        self._attempt_error: Optional[FerryError] = None  # the last attempt's
        self._stopping = threading.Event()  # set by close(): ends a reconnect's wait
        self._reconnector: Optional[threading.Thread] = None
        self._connecting: Optional[socket.socket] = None  # a reconnect attempt's socket

        self._events_in: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._events_cond = threading.Condition()
        self._callbacks: list[EventCallback] = []
        self._notice_callbacks: list[NoticeCallback] = []
        self._user_queue: Optional[queue.Queue[Optional[Event]]] = None
        self._terminal: OrderedDict[int, Event] = OrderedDict()
        self._lost: set[int] = set()  # rooms in _terminal failed by a lost connection
        self._dispatch_done = False

        self.fell_back_to_v3 = False  # a v4 hello was refused and a v3 one accepted
        sock, frames, session, reply = self._handshake(lo, hi)
        self._apply_hello(reply)
        self._link = _Link(1, sock, frames, session)

        self._dispatcher = threading.Thread(target=self._dispatch_loop, daemon=True,
                                            name=f"ferry-events[{name}]")
        self._dispatcher.start()
        self._start_reader(self._link)

    def _apply_hello(self, reply: HelloReply) -> None:
        self.hello_reply: HelloReply = reply
        self.version: int = reply.version
        self.daemon_versions: tuple[int, int] = (reply.min_version, reply.max_version)
        self.node, self.instance, self.role = reply.node, reply.instance, reply.role
        self.control = reply.control
        self.tp_size, self.tp_rank, self.page_tokens = reply.tp_size, reply.tp_rank, reply.page_tokens
        self.config_yaml = reply.config_yaml  # the daemon's effective config (pools, TP/PP)
        self.pools: dict[str, Pool] = dict(zip(POOL_KINDS, reply.pools))

    def _start_reader(self, link: _Link) -> None:
        link.reader = threading.Thread(target=self._read_loop, args=(link,), daemon=True,
                                       name=f"ferry-reader[{self.name}]")
        link.reader.start()

    # --- hello -------------------------------------------------------------------------------

    def _handshake(self, lo: int, hi: int
                   ) -> tuple[socket.socket, FrameReader, Session, HelloReply]:
        got = self._hello_once(lo, hi)
        if isinstance(got, HelloRefused) and got.retry_v3:
            self.fell_back_to_v3 = True
            got = self._hello_once(lo, 3)
        if isinstance(got, HelloRefused):
            raise got.error
        return got

    def _hello_once(self, lo: int, hi: int
                    ) -> Union[tuple[socket.socket, FrameReader, Session, HelloReply],
                               HelloRefused]:
        """Connect and say a hello offering ``lo..hi``: the socket, its reader, its session and
        the reply, or the daemon's refusal of the hello (the connection is then closed). A
        connection-level error (seq 0) raises."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with self._lock:
            if self._stopping.is_set():
                sock.close()
                raise FerryError(Errc.CANCELLED, "the client was closed")
            self._connecting = sock  # close() shuts it down to end a reconnect's hello
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
            session = Session(hi)
            _, frame = session.start(hello, None)
            send_error: Optional[OSError] = None
            try:
                sock.sendall(frame)
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
                got = hello_outcome(session.on_frame(f), lo, hi)
                if isinstance(got, Ended):  # e.g. beyond limits.max_clients, or a bad answer
                    raise got.error
                if isinstance(got, HelloRefused):
                    sock.close()
                    return got
                assert isinstance(got, HelloAccepted)
                reply = got.reply
                session.version = reply.version
                sock.settimeout(self.timeout)
                return sock, frames, session, reply
        except BaseException:
            sock.close()
            raise
        finally:
            self._connecting = None
    # --- requests ----------------------------------------------------------------------------

    def request(self, msg: Message, timeout: Optional[float] = None) -> Message:
        """Send any request and return its reply message (low level; the methods of
        :class:`~ferry.Client` wrap it). ``timeout`` overrides the client's for this call. An
        ``error`` reply raises :class:`FerryError`."""
        return self._wait(self._start(msg), timeout)

    def _start(self, msg: Message, fds: Sequence[int] = (), *,
               link: Optional[_Link] = None,
               on_ok: Optional[Callable[[], None]] = None) -> _Pending:
        """Encode, register and send ``msg``; the pending request to wait on. ``fds`` go with
        the frame's first byte (SCM_RIGHTS; register_memory). ``link`` is given by a reconnect
        that registers memory again on a link that does not serve requests yet. ``on_ok`` runs
        on the reader thread when the reply is a success, before the end of the stream that
        may follow it is seen (so a reconnect already knows what it did)."""
        p = _Pending(message_type(msg).wire_name, on_ok)
        with self._lock:
            session = (link or self._link).session
        framed = session.encode(msg)  # may raise EncodeError (TypeError): nothing is sent
        with self._send_lock:
            with self._lock:
                if link is None:
                    if self._error is not None:
                        raise self._unavailable_error()
                    on = self._link
                else:
                    on = link
                    if on.error is not None:
                        raise on.error.copy()
            if fds:
                self._quiesce(p.request, on)
            with self._lock:
                if on.error is not None:
                    raise on.error.copy() if link is not None else self._unavailable_error()
                if on.session is not session:  # a reconnect came between: its version
                    framed = on.session.encode(msg)
                p.seq, frame = on.session.number(framed, p)
                p.link = on
            try:
                if fds:
                    self._send_with_fds(on.sock, frame, fds)
                else:
                    on.sock.sendall(frame)
                return p
            except OSError as e:
                send_error = e
        # The connection broke. The reader thread will see why (ferryd's seq-0 error, or the
        # end of the stream) and fail every pending request with it, this one included.
        if isinstance(send_error, socket.timeout):
            self._lose(on, FerryError(Errc.TIMED_OUT, f"writing {p.request} to ferryd timed "
                                                      f"out; the connection is closed"))
        elif not p.done.wait(5.0 if self.timeout is None else min(self.timeout, 5.0)):
            self._lose(on, FerryError(Errc.PEER_LOST, f"writing to ferryd failed: {send_error}"))
        return p

    def _unavailable_error(self) -> FerryError:
        """What a request made while no link serves raises (called with the lock held)."""
        err = self._error
        assert err is not None
        if self._ended:
            return err.copy()
        last = self._attempt_error
        tried = f"attempt {self._attempt} failed: {last.message}" if last is not None and \
            self._attempt else "connecting again"
        return FerryError(Errc.PEER_UNREACHABLE,
                          f"not connected to ferryd at {self.socket_path}: the connection was "
                          f"lost {time.monotonic() - self._down_since:.1f} s ago "
                          f"({err.message}); reconnecting in the background ({tried})")

    def _send_with_fds(self, sock: socket.socket, frame: bytes, fds: Sequence[int]) -> None:
        """The whole frame in one sendmsg, the descriptors on its first byte; should the socket
        take only part of it, the rest follows without descriptors (they went with the first
        byte). Called with the send lock held."""
        view = memoryview(frame)
        sent = sock.sendmsg([view], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", fds))])
        if sent < len(frame):
            sock.sendall(view[sent:])

    def _quiesce(self, what: str, link: _Link) -> None:
        """Wait (bounded by the client's timeout) until every request already sent on ``link``
        has its reply, so that ferryd has read every byte before the next frame. Called with
        the send lock held, so nothing else is sent meanwhile.

        Why: Linux delivers a unix stream's bytes from several writes in one recvmsg, and the
        descriptors passed with the last of them come with it; a daemon that attributes
        descriptors to the first byte it received then credits them to the frame before. With
        nothing unread ahead of it, the frame carrying descriptors starts ferryd's next read."""
        with self._lock:
            ahead: list[_Pending] = link.session.tokens()
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
                link = p.link
                if link is not None and link.session.abandon(p.seq):
                    # its reply, if it ever comes, is dropped
                    raise FerryError(Errc.TIMED_OUT, f"timed out after {timeout} s waiting for "
                                                     f"ferryd's reply to {p.request} "
                                                     f"(seq {p.seq})")
            # The reader took it off the list and is delivering it right now.
            p.done.wait()
        if p.error is not None:
            raise p.error
        assert p.result is not None
        return p.result

    def _note_draining(self, link: _Link, err: FerryError) -> None:
        """ferryd said it is draining: it is going away. Tell the engine once per link."""
        with self._lock:
            if link.draining:
                return
            link.draining = True
        _log.info("ferry: ferryd at %s is draining (%s): it takes no new room and will exit",
                  self.socket_path, err.message)
        self._events_in.put(Draining(err.message))

    @property
    def draining(self) -> bool:
        """True once ferryd answered 407 ``ferryd is draining`` on the current connection: it
        is stopping (reset by a reconnect)."""
        return self._link.draining

    @property
    def generation(self) -> int:
        """The number of the current connection to ferryd: 1 for the first, one more for each
        reconnect. A room created under an earlier generation is gone."""
        return self._link.number

    def _forget_lost(self, room: int) -> None:
        """Drop the Failed event kept for ``room`` by a lost connection: the room id is used
        again (a new prepare or subscription), and that failure must not answer it."""
        with self._events_cond:
            if room in self._lost:
                self._lost.discard(room)
                self._terminal.pop(room, None)

    def _registration(self, msg: RegisterMemory, fds: Sequence[int]) -> Optional[_Registration]:
        """What a register_memory keeps for a reconnect (None without reconnect): duplicates of
        ``fds`` taken before the request is sent, so the engine may close its own at any time."""
        return None if self.reconnect is None else _Registration(msg, fds)

    def _keep_registration(self, reg: _Registration) -> None:
        """ferryd accepted ``reg`` (on the reader thread, in order with the stream: a reconnect
        triggered by a loss after this reply registers it again)."""
        with self._lock:
            old = self._registrations.pop(reg.msg.pool, None)
            reg.kept = True
            if self._closed:
                reg.close()
            else:
                self._registrations[reg.msg.pool] = reg
        if old is not None:
            old.close()

    # --- the dispatcher thread ---------------------------------------------------------------

    def _dispatch_loop(self) -> None:
        while True:
            item = self._events_in.get()
            if item is _STOP:
                break
            if isinstance(item, (Draining, Disconnected, Reconnected)):
                with self._events_cond:
                    notice_callbacks = self._notice_callbacks
                for ncb in notice_callbacks:
                    try:
                        ncb(item)
                    except Exception:
                        _log.exception("ferry: connection callback %r failed on %r", ncb, item)
                continue
            if isinstance(item, _Delivered):
                item, kept = item.event, True
            else:
                kept = False
            assert isinstance(item, Event)
            with self._events_cond:
                if item.terminal and not kept:
                    self._keep_terminal(item)
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

    def _keep_terminal(self, ev: Event) -> None:
        """Keep a terminal event for wait_terminal (called with the events condition held)."""
        self._terminal[ev.room] = ev
        self._terminal.move_to_end(ev.room)
        self._lost.discard(ev.room)
        if len(self._terminal) > _MAX_TERMINAL:
            self._terminal.popitem(last=False)
        self._events_cond.notify_all()

    # --- the reader thread -------------------------------------------------------------------

    def _read_loop(self, link: _Link) -> None:
        try:
            while True:
                f = link.frames.next()
                if f is not None:
                    self._on_frame(link, f)
                    continue
                try:
                    chunk = link.sock.recv(1 << 16)
                except socket.timeout:
                    continue
                except OSError as e:
                    if link.error is not None:
                        return
                    raise FerryError(Errc.PEER_LOST, f"reading from ferryd failed: {e}") from None
                if not chunk:
                    if link.error is not None:
                        return
                    raise FerryError(Errc.PEER_LOST, "ferryd closed the connection")
                link.frames.feed(chunk)
        except FerryError as e:
            self._lose(link, e)
        except BaseException as e:  # a bug here must not leave waiters hanging
            self._lose(link, FerryError(Errc.INTERNAL,
                                        f"the ferry client's reader thread failed: {e!r}"))
            raise

    def _on_frame(self, link: _Link, f: Frame) -> None:
        # The session's state under the lock, the decoding (a poll_many_reply of 16384 rooms
        # takes ~0.1 s) outside it, so other threads start and abandon requests meanwhile.
        with self._lock:
            taken = link.session.take(f)
        got = link.session.read(f, taken)
        if isinstance(got, Pushed):
            with self._lock:
                if link.error is not None:
                    return  # its rooms were reported failed with the link
                if got.event.terminal:
                    self._subscribed.discard(got.event.room)
                self._events_in.put(got.event)
            return
        if isinstance(got, Ended):
            raise got.error  # the connection cannot go on
        if isinstance(got, Dropped):
            return  # the reply of a request that timed out
        p: _Pending = got.token
        if isinstance(got, Refused):
            if got.draining:  # noted before the end of the stream that follows it
                self._note_draining(link, got.error)
            p.fail(got.error)
        elif isinstance(got, Failed):
            p.fail(got.error)
        else:
            assert isinstance(got, Reply)
            if p.on_ok is not None:
                p.on_ok()
            p.resolve(got.message)

    # --- losing the connection, and reconnecting ---------------------------------------------

    def _lose(self, link: _Link, err: FerryError) -> None:
        """End ``link`` with ``err``: every request waiting on it raises it. When it was the
        link serving requests, the rooms subscribed on it are reported Failed, and the client
        reconnects (with ``reconnect``) or ends: later requests raise. The first call wins."""
        with self._lock:
            if link.error is not None:
                return
            link.error = err
            pending: list[_Pending] = link.session.end()
            serving = link is self._link and self._error is None
            if serving:
                self._error = err
                self._down_since = time.monotonic()
                self._attempt, self._attempt_error = 0, None
                rooms = [] if self._closed else sorted(self._subscribed)
                self._subscribed.clear()
                reconnecting = self.reconnect is not None and not self._closed
                self._ended = not reconnecting
        for p in pending:
            p.fail(err.copy())
        try:
            link.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader and a blocked sender
        except OSError:
            pass
        if not serving:
            return  # a reconnect's link lost while registering memory again: it tries again
        if self._closed:
            self._events_in.put(_STOP)
            return
        self._report_lost_rooms(rooms, err, link.draining)
        self._events_in.put(Disconnected(err.copy(), tuple(rooms), reconnecting, link.draining))
        if reconnecting:
            level = logging.INFO if link.draining else logging.WARNING
            _log.log(level, "ferry: lost ferryd at %s (%s)%s; %d subscribed rooms failed; "
                            "reconnecting", self.socket_path, err.message,
                     " after it drained" if link.draining else "", len(rooms))
            t = threading.Thread(target=self._reconnect_loop, daemon=True,
                                 name=f"ferry-reconnect[{self.name}]")
            with self._lock:
                self._reconnector = t
            t.start()
        else:
            self._events_in.put(_STOP)

    def _report_lost_rooms(self, rooms: Sequence[int], err: FerryError, drained: bool) -> None:
        """Fail each of ``rooms`` (subscribed, not terminal) because its ferryd went away:
        kept for wait_terminal at once, and delivered to callbacks and the queue."""
        why = "it drained and stopped" if drained else err.message
        reason = (f"ferryd at {self.socket_path} went away ({why}) before the room ended; a room "
                  f"does not survive its ferryd: a restarted daemon does not know it")
        events = [Event(room, Status.Failed, Errc.PEER_LOST, reason) for room in rooms]
        with self._events_cond:
            for ev in events:
                self._keep_terminal(ev)
                self._lost.add(ev.room)
        for ev in events:
            self._events_in.put(_Delivered(ev))

    def _reconnect_loop(self) -> None:
        policy = self.reconnect
        assert policy is not None
        log = AttemptLog(f"ferryd at {self.socket_path}", policy.log_every)
        attempt = 0
        while not self._stopping.is_set():
            attempt += 1
            try:
                notice = self._reconnect_once(attempt)
            except FerryError as e:
                with self._lock:
                    self._attempt, self._attempt_error = attempt, e
                last = policy.max_attempts is not None and attempt >= policy.max_attempts
                delay = None if last else policy.delay(attempt)
                if self._stopping.is_set():
                    return
                log.failed(attempt, e, delay)
                if delay is None:
                    self._give_up(e, attempt)
                    return
                self._stopping.wait(delay)
                continue
            _log.info("ferry: reconnected to ferryd at %s after %.1f s (%d attempts): instance "
                      "%s (was %s); registered again: %s%s", self.socket_path, notice.downtime,
                      notice.attempts, notice.instance, notice.previous_instance,
                      ", ".join(notice.registered) or "none",
                      f"; daemon pools mapped anew (views taken before no longer share memory "
                      f"with ferryd): {', '.join(notice.remapped)}" if notice.remapped else "")
            for kind, why in notice.not_registered.items():
                _log.error("ferry: after reconnecting to ferryd at %s, pool %s could not be "
                           "registered again: %s", self.socket_path, kind, why)
            self._events_in.put(notice)
            return

    def _reconnect_once(self, attempt: int) -> Reconnected:
        """One attempt: connect, say hello, register the memory again, map the daemon pools
        again, then serve requests on the new link. Raises FerryError when any of it fails."""
        lo, hi = self.version_range
        sock, frames, session, reply = self._handshake(lo, hi)
        with self._lock:
            if self._closed:
                sock.close()
                raise FerryError(Errc.CANCELLED, "the client was closed")
            link = _Link(self._link.number + 1, sock, frames, session)
            previous, old = self.instance, self._link
            self._link = link
            self._apply_hello(reply)
            registrations = list(self._registrations.values())
        if old.reader is not None:
            old.reader.join(timeout=10.0)  # it saw the loss; nothing reads the old socket now
        old.sock.close()
        self._start_reader(link)
        registered: list[str] = []
        refused: dict[str, FerryError] = {}
        for reg in registrations:
            kind = POOL_KINDS[reg.msg.pool]
            try:
                self._register_again(link, reg)
                registered.append(kind)
            except FerryError as e:
                if link.error is not None:
                    raise
                refused[kind] = e
        remapped = self._map_again()
        with self._lock:
            if link.error is not None:
                raise link.error.copy()
            downtime = time.monotonic() - self._down_since
            self._error = None
        return Reconnected(link.number, attempt, downtime, reply.instance, previous,
                           tuple(registered), refused, tuple(remapped))

    def _register_again(self, link: _Link, reg: _Registration) -> None:
        """register_memory of ``reg`` on ``link``; a pool ferryd is still releasing (the same
        daemon, after a broken connection) is asked again for the client's timeout."""
        deadline = time.monotonic() + (30.0 if self.timeout is None else self.timeout)
        while True:
            try:
                self._wait(self._start(reg.msg, reg.fds, link=link), self.timeout)
                return
            except FerryError as e:
                if link.error is not None or "is still being released" not in e.message or \
                        time.monotonic() >= deadline:
                    raise
            if self._stopping.wait(0.05):
                raise FerryError(Errc.CANCELLED, "the client was closed")

    def _map_again(self) -> list[str]:
        """Map anew the daemon pools that were mapped: a restarted ferryd's shm objects are new
        (even under the same name), and the old mapping shares nothing with it."""
        with self._lock:
            kinds = list(self._maps)
            for kind in kinds:
                m = self._maps.pop(kind)
                try:
                    m.close()
                except BufferError:  # still viewed: unmapped with its last view, or at close
                    self._stale_maps.append(m)
        remapped = []
        for kind in kinds:
            try:
                self._map_pool(kind)
                remapped.append(kind)
            except (FerryError, OSError) as e:
                _log.error("ferry: cannot map pool %s of ferryd at %s again: %s", kind,
                           self.socket_path, e)
        return remapped

    def _map_pool(self, kind: str) -> mmap.mmap:
        """The daemon's pool ``kind`` mapped read-write (mapped now if it is not yet)."""
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
            return self._maps[kind]

    def _give_up(self, err: FerryError, attempts: int) -> None:
        with self._lock:
            if self._closed:
                return
            self._ended = True
            self._error = FerryError(err.code, f"gave up reconnecting to ferryd at "
                                               f"{self.socket_path} after {attempts} attempts: "
                                               f"{err.message}")
            final = self._error
        self._events_in.put(Disconnected(final.copy(), (), False, False))
        self._events_in.put(_STOP)

    def _closed_error(self) -> FerryError:
        err = self._error
        return err.copy() if err is not None else FerryError(Errc.CANCELLED, "the client was closed")

    # --- lifetime ----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once the connection ended for good: closed by :meth:`close`, or lost (by
        ferryd or an error) without reconnecting, or reconnecting gave up."""
        return self._ended

    @property
    def connected(self) -> bool:
        """True while a connection to ferryd serves requests (False while reconnecting)."""
        return self._error is None

    @property
    def error(self) -> Optional[FerryError]:
        """Why no connection serves requests (why it ended, or was lost while reconnecting),
        or None while connected."""
        return self._error

    def close(self) -> None:
        """Close the connection (requests still waiting raise FerryError 406), stop the
        threads and any reconnecting, close the descriptors kept for registering memory again,
        and unmap the pools (a pool still viewed is unmapped with its last view). Idempotent;
        may be called from an event callback."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stopping.set()  # a reconnect's next hello is not begun
            link = self._link
            serving = self._error is None
            if not serving and not self._ended:  # reconnecting: stop it here
                self._ended = True
                self._error = FerryError(Errc.CANCELLED, "the client was closed")
            connecting = self._connecting
        if connecting is not None:
            try:
                connecting.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._lose(link, FerryError(Errc.CANCELLED, "the client was closed"))
        if not serving:
            self._events_in.put(_STOP)  # _lose ended no serving link
        current = threading.current_thread()
        reconnector = self._reconnector
        if reconnector is not None and reconnector is not current and reconnector.is_alive():
            reconnector.join(timeout=10.0)
        with self._lock:
            link = self._link  # a reconnect may have made one meanwhile
        if link.error is None:
            self._lose(link, FerryError(Errc.CANCELLED, "the client was closed"))
        for t in (link.reader, self._dispatcher):
            if t is not None and t is not current and t.is_alive():
                t.join(timeout=10.0)
        with self._send_lock:
            link.sock.close()
        with self._lock:
            registrations = list(self._registrations.values())
            self._registrations.clear()
        for reg in registrations:
            reg.close()
        for m in list(self._maps.values()) + self._stale_maps:
            try:
                m.close()
            except BufferError:
                pass
        self._maps.clear()
        self._stale_maps.clear()


__all__ = ["Connection", "EventCallback"]
