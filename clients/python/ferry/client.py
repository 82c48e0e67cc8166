"""A thread-safe client of one ferryd (docs/protocol.md), standard library only.

    from ferry import Client, Status
    with Client("/tmp/ferry-decode.sock") as c:            # connects and says hello
        c.prepare(7, ["127.0.0.1:7401"], dst_pages=[5, 6, 7], state_slot=2, aux_row=2)
        c.subscribe(7)
        ev = c.wait_terminal(7, timeout=30)                  # Event(room, status, code, reason)
        for r in c.poll_many(range(1000)):                   # v4: one round trip
            ...

Any number of threads may issue requests at once: each request gets its own seq and waits for
its own reply, whatever order ferryd answers in. Pushed events go to the callbacks registered
with :meth:`Client.on_event`, to the queue of :meth:`Client.events` and to
:meth:`Client.wait_terminal`. The client offers protocol versions 3..10 by default and speaks
what ferryd's ``hello_reply`` says (``client.version``), falling back to version 3 with an old
daemon.

This module is the API an engine calls; the connection under it (the hello, seq matching, the
reader and dispatcher threads, closing) is :class:`ferry.connection.Connection`, its base.
"""

from __future__ import annotations

import functools
import json
import mmap
import queue
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

from .connection import Connection, EventCallback
from .errors import Errc, FerryError, ProtocolError
from .protocol import (MAX_POLL_MANY, MAX_REGISTER_FDS, SUPPORTED_VERSIONS, Cancel, Discover,
                       DiscoveredRank, DiscoverReply, Drain, Event, Info, InfoReply, InfoTopic,
                       MemoryBuffer, MemoryKind, Poll, PollMany, PollManyReply, PollReply,
                       PollResult, Prepare, RegisterMemory, Send, SetLogLevel, StateType,
                       Subscribe, encode, pool_number, state_type_number)
from .reconnect import NoticeCallback

_TOPICS = {"status": InfoTopic.STATUS, "rooms": InfoTopic.ROOMS, "peers": InfoTopic.PEERS,
           "pools": InfoTopic.POOLS, "timelines": InfoTopic.TIMELINES}


def _memory_buffer(b: Union[MemoryBuffer, Mapping[str, Any], Sequence[int]]) -> MemoryBuffer:
    """A register_memory table entry from a MemoryBuffer, a dict of its fields or a tuple."""
    if isinstance(b, MemoryBuffer):
        return b
    if isinstance(b, Mapping):
        return MemoryBuffer(**b)
    fields: tuple[Any, ...] = tuple(b)  # the codec checks each field
    return MemoryBuffer(*fields)


class Client(Connection):
    """A connection to one ferryd's client socket. Thread-safe; use as a context manager or call
    :meth:`close`.

    Attributes set by the hello: ``version`` (the connection's protocol version),
    ``daemon_versions`` (the daemon's range; ``(3, 3)`` for a v3 daemon), ``hello_reply``,
    ``node``, ``instance``, ``role``, ``control``, ``tp_size``, ``tp_rank``, ``page_tokens``,
    ``config_yaml`` and ``pools`` (``{"kv": Pool, "state": Pool, "aux": Pool}``).

    The constructor is :class:`~ferry.connection.Connection`'s: it connects and says hello.
    With ``reconnect=True`` (or a :class:`~ferry.reconnect.Reconnect`) it connects again by
    itself when ferryd goes away, registers the memory it lent again, and says so to
    :meth:`on_connection` (:mod:`ferry.reconnect`).
    """

    # --- requests ----------------------------------------------------------------------------

    def prepare(self, room: int, prefill_peers: Union[str, Sequence[str]],
                dst_pages: Sequence[int], state_slot: Optional[int] = None,
                aux_row: Optional[int] = None, *, prefix_tokens: int = 0,
                state_pages: Optional[Sequence[int]] = None, checksum: bool = False,
                timeout: Optional[float] = None) -> None:
        """Decode side: where ``room``'s bytes land. ``prefill_peers`` is a prefill ferryd's
        control address ``"host:port"`` or a list of them (every rank of the prefill instance
        is fine). ``state_slot`` is exactly one Mamba slot (an int; None = absent), ``aux_row``
        one aux row. ``prefix_tokens`` (v4): tokens of the prompt this decode already holds
        (a multiple of the page size); the prefill's ``poll`` answers it. ``state_pages`` (v8):
        the destination pages of a page-indexed state pool (swa, dsa, minimax_index_k), each
        once, with no ``state_slot``. ``checksum`` (v10): check this room end to end, as every
        room of a decode with ``integrity.checksums`` is: it reports Success only once the
        landed bytes digest as the prefill's did, else Failed with ``CHECKSUM_MISMATCH``."""
        peers = [prefill_peers] if isinstance(prefill_peers, str) else list(prefill_peers)
        if prefix_tokens and self.version < 4:
            raise FerryError(Errc.UNSUPPORTED_VERSION,
                             f"prefix_tokens needs protocol version 4; this connection speaks "
                             f"{self.version}")
        pages = self._state_pages(state_pages)
        if checksum and self.version < 10:
            # an older daemon would not check it, and its Success would claim it had
            raise FerryError(Errc.UNSUPPORTED_VERSION,
                             f"a checked room needs protocol version 10; this connection speaks "
                             f"{self.version}")
        self._forget_lost(room)
        self.request(Prepare(room, peers, list(dst_pages), state_slot, aux_row, prefix_tokens,
                             pages, bool(checksum)), timeout)

    def send(self, room: int, src_pages: Sequence[int], last: bool = False,
             state_slot: Optional[int] = None, aux_row: Optional[int] = None, *,
             first_layer: int = 0, layer_count: int = 0,
             state_pages: Optional[Sequence[int]] = None,
             timeout: Optional[float] = None) -> None:
        """Prefill side: one chunk of ``room``; the last chunk carries the one state slot and
        the aux row.

        (v6) With ``layer_count`` > 0 the send carries the layers ``[first_layer, first_layer +
        layer_count)`` of the chunk only (global layer ids, within :attr:`layers`), so an engine
        sends each layer as its forward pass produces it: every send of a chunk names the
        chunk's pages (and, on the last chunk, the state slot and the aux row), each layer once;
        the chunk is complete once every layer was sent, and the send that completes the last
        chunk carries the aux row (docs/protocol.md, "Layer-wise sends").

        (v8) ``state_pages``: on the last chunk, the source pages of a page-indexed state pool
        (swa, dsa, minimax_index_k), as many as the decode's ``state_pages``, with no
        ``state_slot``."""
        if (first_layer or layer_count) and self.version < 6:
            raise FerryError(Errc.UNSUPPORTED_VERSION,
                             f"a layer range needs protocol version 6; this connection speaks "
                             f"{self.version}")
        pages = self._state_pages(state_pages)
        self.request(Send(room, list(src_pages), bool(last), state_slot, aux_row,
                          first_layer, layer_count, pages), timeout)

    def _state_pages(self, state_pages: Optional[Sequence[int]]) -> list[int]:
        pages = [] if state_pages is None else list(state_pages)
        if pages and self.version < 8:
            raise FerryError(Errc.UNSUPPORTED_VERSION,
                             f"state_pages need protocol version 8; this connection speaks "
                             f"{self.version}")
        return pages

    @property
    def layers(self) -> list[int]:
        """The global layer ids the daemon's rank holds (its KV and state buffers), ascending:
        what a layer range of :meth:`send` names."""
        ids = {b.layer_id for kind in ("kv", "state") for b in self.pools[kind].buffers
               if self.pools[kind].present}
        return sorted(ids)

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
                        timeout: Optional[float] = None, *, page_tokens: int = 0,
                        room_id_buffer: Optional[int] = None,
                        state_type: Union[str, int] = StateType.MAMBA) -> None:
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
        64 descriptors or 4096 buffers.

        (v7) A pool ferryd's config leaves to the registration (``memory: client`` and nothing
        else) is described by this table: any byte offsets, each buffer's slicing facts
        (:class:`~ferry.protocol.MemoryBuffer`), ``page_tokens`` for a kv pool and
        ``room_id_buffer`` (the aux buffer whose rows start with the room id, or None) for an aux
        pool. The first registration fixes the pool's layout for ferryd's life.

        (v8) ``state_type``: what a state pool holds (:class:`~ferry.protocol.StateType` or its
        name: ``"mamba"``, slot-indexed, or the page-indexed ``"swa"``, ``"dsa"``,
        ``"minimax_index_k"``), which must be the peers' too; a state pool the registration
        describes takes its type from it. Only mamba can be registered before v8 (312)."""
        st = state_type_number(state_type)
        if st != StateType.MAMBA and self.version < 8:
            raise FerryError(Errc.UNSUPPORTED_VERSION,
                             f"state type {st.wire_name} needs protocol version 8; this "
                             f"connection speaks {self.version}")
        if self.version < 4:
            lo, hi = self.version_range
            raise FerryError(Errc.UNSUPPORTED_VERSION,
                             f"register_memory needs protocol version 4, but this connection "
                             f"speaks version {self.version} (the client offered {lo}..{hi}, "
                             f"ferryd speaks {self.daemon_versions[0]}.."
                             f"{self.daemon_versions[1]})")
        table = [_memory_buffer(b) for b in buffers]
        fds = [int(fd) for fd in fds]
        msg = RegisterMemory(pool_number(pool), memory_kind, len(fds), table, int(page_tokens),
                             room_id_buffer, st)
        if len(fds) > MAX_REGISTER_FDS:
            encode(msg, 0, self.version)  # raises the codec's EncodeError naming fd_count
        reg = self._registration(msg, fds)
        try:
            keep = None if reg is None else functools.partial(self._keep_registration, reg)
            self._wait(self._start(msg, fds, on_ok=keep), timeout)
        finally:
            if reg is not None and not reg.kept:  # refused, timed out, or the link was lost
                reg.close()

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

    def drain(self, *, timeout: Optional[float] = None) -> None:
        """(v5) Start the daemon's drain, as a SIGTERM does: it refuses new rooms (407
        ``draining``), lets the accepted ones end (bounded by ``timeouts.stop_ms``), then exits.
        Asking again while it drains is answered the same way."""
        self._need_version(5, "drain")
        self.request(Drain(), timeout)

    def set_log_level(self, level: str, logger: str = "", *,
                      timeout: Optional[float] = None) -> None:
        """(v5) Set the level (trace, debug, info, warn, error, off) of the daemon's logger
        ``logger`` (ferryd, scheduler, room, peer, client, transport), or of every logger when
        it is empty; ``info("status")["log"]`` shows them all."""
        self._need_version(5, "set_log_level")
        self.request(SetLogLevel(logger, level), timeout)

    def _need_version(self, version: int, what: str) -> None:
        if self.version < version:
            raise FerryError(Errc.UNSUPPORTED_VERSION,
                             f"{what} needs protocol version {version}, but this connection "
                             f"speaks version {self.version}")

    def cancel(self, room: int, *, timeout: Optional[float] = None) -> None:
        """Fail ``room`` with ``cancelled by client``; the peer daemon is told."""
        self.request(Cancel(room), timeout)

    def subscribe(self, room: int, *, timeout: Optional[float] = None) -> None:
        """Have ferryd push an :class:`Event` with the room's current status and one per change
        until it is terminal (see :meth:`on_event`, :meth:`events`, :meth:`wait_terminal`).
        Should the connection be lost before that, the client reports the room Failed (code
        302, the reason says ferryd went away)."""
        self._forget_lost(room)
        with self._lock:  # before the request: its first event may come before the reply
            self._subscribed.add(room)
        try:
            self.request(Subscribe(room), timeout)
        except FerryError:
            with self._lock:
                self._subscribed.discard(room)
            raise

    def info(self, topic: Union[str, int] = "status", *,
             timeout: Optional[float] = None) -> Any:
        """The daemon's document of ``topic`` (``"status"``, ``"rooms"``, ``"peers"``,
        ``"pools"``, ``"timelines"`` or their numbers 0..4), parsed: a dict for status, pools and
        timelines, a list for
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

    def on_connection(self, callback: NoticeCallback) -> Callable[[], None]:
        """Call ``callback(notice)`` when the connection changes, on the dispatcher thread and
        in order with the events: :class:`~ferry.reconnect.Draining` (ferryd answered 407
        ``ferryd is draining``: it is going away), :class:`~ferry.reconnect.Disconnected` (after
        the Failed events of the rooms it failed), :class:`~ferry.reconnect.Reconnected`
        (connected again, memory registered again, daemon pools mapped anew). An exception it
        raises is logged and dropped; it must not wait for the reconnect. Returns a function
        that unregisters it."""
        with self._events_cond:
            self._notice_callbacks = self._notice_callbacks + [callback]

        def remove() -> None:
            with self._events_cond:
                self._notice_callbacks = [c for c in self._notice_callbacks
                                          if c is not callback]
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
        or the connection's error when it ends first. A subscribed room whose connection is
        lost is Failed with code 302 (the reason says ferryd went away)."""
        deadline = time.monotonic() + timeout
        with self._events_cond:
            while True:
                ev = self._terminal.pop(room, None)
                if ev is not None:
                    self._lost.discard(room)
                    return ev
                if self._dispatch_done:
                    raise self._closed_error()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FerryError(Errc.TIMED_OUT, f"room {room} reached no terminal status "
                                                     f"within {timeout} s (is it subscribed?)")
                self._events_cond.wait(left)

    # --- lifetime ----------------------------------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open" if self.connected else "reconnecting"
        return (f"<ferry.Client {self.socket_path!r} {self.role} {self.node}/{self.instance} "
                f"v{self.version} {state}>")

    # --- memory ------------------------------------------------------------------------------

    def pool(self, kind: str) -> memoryview:
        """The daemon's pool ``kind`` (``"kv"``, ``"state"``, ``"aux"``) mapped read-write, as a
        memoryview (release the views before :meth:`close` to unmap it at once). After a
        reconnect the pool is mapped anew (:class:`~ferry.reconnect.Reconnected` ``remapped``):
        views taken before it no longer share memory with ferryd; call this again."""
        return memoryview(self._map_pool(kind))

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
