"""The SGLang adapter's senders and receivers (see :mod:`ferry.sglang`): one request's room on
each side, SGLang's ``KVSender`` and ``KVReceiver`` call by call, with its status as SGLang's
``KVPoll``, its failure as SGLang's ``KVTransferError``, and :func:`poll_all` for a scheduler's
batch of them.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterable, Optional, Sequence

from ..client import Client
from ..errors import Errc, FerryError
from ..protocol import PollResult, Status
from .manager import FerryKVManager
from .state import _as_index, _RequestFailed
from .types import (ABORTED, FROM_ANOTHER_RANK, FerryKVTransferError,
                           FerryTransferMetric, KVPoll)

# Where a room's ferryd stands for the adapter (_FerryRoom._link)
_LIVE = "live"  # ask it
_HELD = "held"  # the connection is lost; ferryd may still be draining the room: ask nothing
_GONE = "gone"  # nothing of the room can land any more: Failed
# A request's failure the client reports itself (no answer of ferryd's): the connection was
# lost, no reply in time, the client closed. It says nothing about the room.
_CLIENT_FAILURES = (Errc.PEER_LOST, Errc.TIMED_OUT, Errc.CANCELLED)


# --------------------------------------------------------------------------------------------
# Senders and receivers


class _FerryRoom:
    """What senders and receivers share: the room's status as ferryd reports it, a local
    failure, and the terminal status once seen.

    The drain rule: the engine reuses a request's pages, slot and row once ``poll()`` says
    Failed (or ``conclude_state`` is Failed), so neither says so while ferryd may still write
    into them. A failure of a room ferryd holds live (an abort, a refused chunk) sends the
    cancel and returns; the room then reports the status the engine last saw until ferryd has
    drained it, and Failed from then on. No call waits for that, except ``failure_exception()``
    of a room that is not drained yet (see there).

    A lost connection to ferryd keeps the rule: ferryd cancels the rooms a closed connection
    handed it and fences their peers within ``timeouts.drain_ms``, and it may live on (it closed
    the connection itself: a frame timeout, a malformed frame). Until the client is connected
    again the room shows the status the engine last saw; on the same ferryd (its instance) the
    adapter asks it again and reports Failed once it has drained the room; on a restarted ferryd
    (a new instance) nothing of the old one can write, so the room is Failed at once. Without a
    connection for the manager's ``drain_timeout`` (longer than any ferryd drain), Failed."""

    _local_status: Status

    def __init__(self, mgr: FerryKVManager, bootstrap_addr: str,
                 bootstrap_room: Optional[int]) -> None:
        if bootstrap_room is None:
            raise ValueError("Ferry needs a bootstrap_room (the room id) for every request")
        self.kv_mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.bootstrap_room = int(bootstrap_room)
        self.conclude_state: Optional[Status] = None
        self.failure: Optional[tuple[int, str]] = None  # (code, reason)
        self.last_result: Optional[PollResult] = None
        self.generation: Optional[int] = None  # the client's connection the room lives on
        self.instance: Optional[str] = None  # and the ferryd instance on its other end
        self._lost_at: Optional[float] = None  # when the room's connection was seen lost
        self._lost_why = ""
        self._cancel_sent = False
        self._gone = False  # ferryd holds nothing of the room that could still be written
        self._draining = False  # cancelled on ferryd, which has not reported it terminal yet
        self._shown: Optional[Status] = None  # the status poll() last returned
        self.created_at = time.monotonic()
        self.seen_at: dict[int, float] = {}  # when poll() / poll_all first returned a status
        self._lock = threading.Lock()

    def _bind(self) -> None:
        """The room now lives on the client's current connection to ferryd."""
        c = self.kv_mgr.client
        if c.connected:
            self.generation, self.instance = c.generation, c.instance

    # whether this rank handed the room to ferryd on its connection (ferryd cancels such rooms
    # when the connection closes)
    def _handed_over(self) -> bool:
        raise NotImplementedError

    def _link(self) -> str:
        """Whether ferryd can be asked about the room (_LIVE), the connection is lost and the
        room is held at the status the engine last saw (_HELD), or nothing of the room can land
        any more (_GONE, Failed). See the class's drain rule."""
        if self._gone:
            return _GONE
        c = self.kv_mgr.client
        if self.generation is None or (c.connected and c.generation == self.generation):
            return _LIVE
        where = f"ferryd at {c.socket_path}"
        if self._lost_at is None:
            self._lost_at = time.monotonic()
            self._lost_why = c.error.message if c.error is not None else "connected again"
        if c.connected and c.instance == self.instance:
            # The same ferryd on a new connection: it cancelled what the old one handed it and
            # drains that; ask it until it reports the room terminal.
            self.generation, self._lost_at = c.generation, None
            if self._handed_over() and self.conclude_state is None:
                self._fail(Errc.PEER_LOST,
                           f"the connection to {where} was lost while room "
                           f"{self.bootstrap_room} was in flight ({self._lost_why}); ferryd "
                           f"cancelled the room")
                self._cancel_sent = self._draining = True
            return _LIVE
        if c.connected:
            why = f"it restarted as instance {c.instance}"
        elif time.monotonic() - self._lost_at >= self.kv_mgr.drain_timeout:
            why = (f"{self._lost_why}; not connected again within the drain bound of "
                   f"{self.kv_mgr.drain_timeout:g} s")
        else:
            return _HELD
        self._fail(Errc.PEER_LOST,
                   f"{where} went away while room {self.bootstrap_room} was in flight ({why}); "
                   f"a room does not survive its ferryd: a restarted daemon does not know it")
        self._gone = True  # no ferryd knows the room any more: nothing to cancel or wait for
        return _GONE

    # whether ferryd knows (or may know) the room and is asked for its status
    def _daemon_room(self) -> bool:
        raise NotImplementedError

    def _fail(self, code: int, reason: str) -> None:
        with self._lock:
            if self.failure is None:
                self.failure = (int(code), reason)

    def _apply(self, r: PollResult) -> Status:
        """Take ferryd's answer for this room."""
        self.last_result = r
        if self.kv_mgr.client.generation == self.generation:
            self._lost_at = None  # ferryd answered on the room's connection
        status = Status(r.status)
        if self._draining:  # failed here: Failed once ferryd has drained it, whatever its end
            if not status.terminal:
                return self._held()
            self._draining = False
            status = Status.Failed
        elif status == Status.Failed:
            self._fail(Errc.INTERNAL if not r.code else int(r.code), r.reason)
        if status == Status.Success and self.conclude_state is None:
            self._succeeded()
        if status.terminal:
            self.conclude_state = status
        return status

    def _succeeded(self) -> None:
        """The room ended in Success: what must happen before the engine is told."""

    def _held(self) -> Status:
        """While a failed room drains: the status the engine last saw, so it neither reuses
        the room's memory nor moves the request on."""
        return self._shown if self._shown is not None and not self._shown.terminal \
            else self._local_status

    def _current(self) -> Optional[Status]:
        """The status when ferryd need not (or cannot) be asked."""
        if self.conclude_state is not None:
            return self.conclude_state
        if self._daemon_room():
            link = self._link()
            if link == _GONE:
                self._draining = False
                self.conclude_state = Status.Failed
                return Status.Failed
            if link == _HELD:
                return self._held()
            if self._draining and not self._cancel_sent and not self._send_cancel():
                self._draining = False  # the cancel found nothing of the room on ferryd
        if self._draining:
            return None
        if self.failure is not None:
            self.conclude_state = Status.Failed
            return Status.Failed
        if not self._daemon_room():
            return self._local_status
        return None

    def _poll_failed(self, e: FerryError) -> Status:
        """A poll of the room raised ``e``. ferryd's own answer (it does not know the room)
        means nothing of it can land: Failed. A failure of the client (the connection lost, no
        reply in time) says nothing about the room: held, within the drain bound."""
        c = self.kv_mgr.client
        if e.code not in _CLIENT_FAILURES and c.connected and c.generation == self.generation:
            self._fail(e.code, f"polling room {self.bootstrap_room} failed: {e.message}")
            self._draining = False
            self.conclude_state = Status.Failed
            return Status.Failed
        if self._lost_at is None:
            self._lost_at, self._lost_why = time.monotonic(), e.message
        if self._link() == _GONE or time.monotonic() - self._lost_at >= self.kv_mgr.drain_timeout:
            self._fail(e.code, f"polling room {self.bootstrap_room} failed: {e.message}")
            self._draining, self._gone = False, True
            self.conclude_state = Status.Failed
            return Status.Failed
        return self._held()

    def _show(self, s: Status) -> int:
        self._shown = s
        self.seen_at.setdefault(int(s), time.monotonic())
        return int(s)

    def poll(self) -> int:
        """The room's :class:`KVPoll` status; Failed and Success are final."""
        s = self._current()
        if s is not None:
            return self._show(s)
        try:
            r = self.kv_mgr.client.poll(self.bootstrap_room)
        except FerryError as e:
            return self._show(self._poll_failed(e))
        return self._show(self._apply(r))

    def _cancel(self) -> None:
        """The room failed here: cancel it on ferryd unless nothing of it can be in flight
        there, and return at once. Failed (poll, conclude_state) waits for ferryd's drain."""
        if self.conclude_state is not None or self._draining:
            return
        if self._daemon_room() and self._send_cancel():
            self._draining = True
        else:
            self.conclude_state = Status.Failed

    def _drain(self) -> None:
        """Wait (bounded by the manager's ``drain_timeout``) until ferryd reports the cancelled
        room terminal."""
        c = self.kv_mgr.client
        deadline = time.monotonic() + self.kv_mgr.drain_timeout
        while self._draining and time.monotonic() < deadline:
            if self._current() is None:  # ferryd can be asked
                try:  # each poll within what is left of the bound, not the client's own timeout
                    self._apply(c.poll(self.bootstrap_room,
                                       timeout=max(0.001, deadline - time.monotonic())))
                except FerryError as e:
                    self._poll_failed(e)
            if self._draining:
                time.sleep(0.005)
        self._draining = False
        self.conclude_state = Status.Failed

    def _send_cancel(self) -> bool:
        """Cancel the room on ferryd (once); False when ferryd holds nothing of it to wait
        for: the cancel found no live room (unknown, or already finished), or its ferryd is
        gone. While the connection is lost the cancel waits for it (``_current`` sends it)."""
        link = self._link()
        if link == _GONE:
            return False
        if self._cancel_sent or link == _HELD:
            return True
        self._cancel_sent = True
        try:
            self.kv_mgr.client.cancel(self.bootstrap_room)
        except FerryError as e:
            if e.code in (Errc.UNKNOWN_ROOM, Errc.ROOM_FINISHED):
                self._gone = True  # and not polled again: that starts a prefill room anew
                return False
            if e.code in _CLIENT_FAILURES:  # not answered: sent again once ferryd can be asked
                self._cancel_sent = False
                return self._link() != _GONE
        return True

    def failure_exception(self) -> None:
        """Raise the request's failure (:class:`FerryKVTransferError`, with ferryd's code); a
        rank that saw no failure itself (the request failed on another rank) raises SGLang's
        'from another rank' text.

        Returns at once after a poll said Failed. Called earlier (SGLang does so when the
        all-reduced poll says Failed for another rank's failure, then frees this rank's
        memory), it cancels a room ferryd holds live and waits for its drain, bounded by the
        manager's ``drain_timeout`` (ferryd's own ``timeouts.drain_ms`` bounds the drain)."""
        from_other = self.failure is None
        if from_other:
            self._fail(Errc.CANCELLED, FROM_ANOTHER_RANK)
        self._cancel()
        if self._draining:
            self._drain()  # the engine reuses the room's memory once this returns
        self.conclude_state = Status.Failed
        assert self.failure is not None
        code, reason = self.failure
        raise FerryKVTransferError(self.bootstrap_room, reason, code, from_other)

    def abort(self) -> None:
        """Fail the request (``Aborted by AbortReq.``) and cancel its room on ferryd, which tells
        the peer; returns at once. The room reports Failed once ferryd has drained it (at once
        when nothing of it was in flight), so its pages, slot and row may then be reused."""
        if self.conclude_state is not None:
            return
        self._fail(Errc.CANCELLED, ABORTED)
        self._cancel()

    def clear(self) -> None:
        """Nothing is held per request beyond this object."""

    def get_transfer_metric(self) -> FerryTransferMetric:
        return FerryTransferMetric()


class FerryKVReceiver(_FerryRoom):
    """Decode side of one request (SGLang's ``KVReceiver``); see :mod:`ferry.sglang`."""

    def __init__(self, mgr: FerryKVManager, bootstrap_addr: str,
                 bootstrap_room: Optional[int] = None) -> None:
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        self._local_status = Status.Bootstrapping
        self.prefill_peers: Optional[list[str]] = None
        self.prefill_dp_rank: Optional[int] = None
        self.prepared = False
        self.decode_prefix_len = 0
        self.aux_row: Optional[int] = None

    def _daemon_room(self) -> bool:
        return self.prepared

    def _handed_over(self) -> bool:
        return self.prepared

    def init(self, prefill_dp_rank: int = 0) -> None:
        """Resolve the prefill instance's ranks (:class:`FerryBootstrap`); WaitingForInput."""
        if self.conclude_state is not None or self.failure is not None:
            return
        self.prefill_dp_rank = prefill_dp_rank
        boot = self.kv_mgr.bootstrap
        try:
            if boot is None:
                raise LookupError("the FerryKVManager has no FerryBootstrap")
            self.prefill_peers = boot.prefill_peers(self.bootstrap_addr, prefill_dp_rank,
                                                    self.kv_mgr.client)
        except Exception as e:
            self._fail(Errc.PEER_UNREACHABLE,
                       f"Could not fetch bootstrap info for bootstrap_addr {self.bootstrap_addr} "
                       f"(prefill_dp_rank {prefill_dp_rank}): {e}")
            return
        self._local_status = Status.WaitingForInput

    def send_metadata(self, kv_indices: Iterable[int], aux_index: Optional[int] = None,
                      state_indices: Any = None, decode_prefix_len: Optional[int] = None,
                      **_: Any) -> None:
        """One ``prepare`` of the room: ``kv_indices`` (the pages after the decode's prefix,
        in token order) as ``dst_pages``, the state component's entry of ``state_indices`` (a
        Mamba slot as ``state_slot``, or a page-indexed component's page list as
        ``state_pages``), the aux row, naming every prefill rank's control address. A refusal
        fails this request alone."""
        if self.conclude_state is not None or self.failure is not None:
            return
        try:
            if self.prefill_peers is None:
                raise _RequestFailed(Errc.INVALID_REQUEST,
                                     f"send_metadata of room {self.bootstrap_room} before "
                                     f"init(prefill_dp_rank)")
            if self.prepared:
                raise _RequestFailed(Errc.INVALID_REQUEST,
                                     f"send_metadata of room {self.bootstrap_room} twice")
            pages = [int(p) for p in kv_indices]
            prefix = int(decode_prefix_len or 0)
            page = self.kv_mgr.page_size
            if prefix < 0 or prefix % page:
                raise _RequestFailed(Errc.INVALID_REQUEST,
                                     f"decode_prefix_len {prefix} of room {self.bootstrap_room} "
                                     f"is not a multiple of the page size {page}")
            slot, state_pages = self.kv_mgr.state_of(state_indices, "dst")
            row = None
            if self.kv_mgr.has_aux:
                row = _as_index(aux_index) if aux_index is not None else None
                if row is None or row < 0:
                    raise _RequestFailed(Errc.INVALID_REQUEST,
                                         f"room {self.bootstrap_room}: aux_index {aux_index!r} "
                                         f"is not an aux row (this ferryd has an aux pool)")
        except _RequestFailed as e:
            self._fail(e.code, e.reason)
            return
        shadow = self.kv_mgr.aux_shadow
        if shadow is not None and row is not None and row >= shadow.rows:
            self._fail(Errc.INVALID_REQUEST, f"room {self.bootstrap_room}: aux row {row} is "
                                             f"outside the {shadow.rows} rows of the metadata "
                                             f"buffers")
            return
        self.decode_prefix_len = prefix
        self.aux_row = row
        try:
            self.kv_mgr.client.prepare(self.bootstrap_room, self.prefill_peers, pages,
                                       state_slot=slot, aux_row=row, prefix_tokens=prefix,
                                       state_pages=state_pages,
                                       checksum=self.kv_mgr.settings.checksums)
        except FerryError as e:  # refused: no room was created by it
            self._fail(e.code, e.message)
            return
        self._bind()
        self.prepared = True

    def _succeeded(self) -> None:
        """Metadata in ordinary memory: the row ferryd wrote into the manager's memfd goes into
        the engine's tensors before Success is reported (SGLang's gate then reads it)."""
        shadow = self.kv_mgr.aux_shadow
        if shadow is not None and self.aux_row is not None:
            shadow.deliver(self.aux_row)

    def clear(self) -> None:
        """SGLang's cleanup hook: ferryd forgets a terminal room by itself."""

    @staticmethod
    def query_prefill_dp_ranks(bootstrap_addr: str, bootstrap_rooms: list[int]
                               ) -> dict[str, int]:
        """SGLang's: the prefill DP rank each room's prefill registered (``POST
        /query_dp_ranks`` to the bootstrap server), ``{str(room): dp_rank}``."""
        from .http import query_prefill_dp_ranks
        return query_prefill_dp_ranks(bootstrap_addr, bootstrap_rooms)


class FerryKVSender(_FerryRoom):
    """Prefill side of one request (SGLang's ``KVSender``); see :mod:`ferry.sglang`."""

    def __init__(self, mgr: FerryKVManager, bootstrap_addr: str, bootstrap_room: int,
                 dest_tp_ranks: Optional[Sequence[int]] = None, pp_rank: int = 0,
                 req_has_disagg_prefill_dp_rank: bool = False) -> None:
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        self._local_status = Status.Bootstrapping
        self.dest_tp_ranks = list(dest_tp_ranks or [])
        self.pp_rank = pp_rank
        self.num_kv_indices: Optional[int] = None
        self.aux_index: Optional[int] = None
        self.curr_idx = 0
        self.sent_last = False
        self.chunks_sent = 0
        self.first_send_at: Optional[float] = None
        self.state_sent = False
        self.state_items = 0  # state slots or pages the last chunk named
        self._bind()  # a prefill ferryd knows the room from its first poll
        why = mgr.register_room_dp_rank(bootstrap_addr, self.bootstrap_room,
                                        req_has_disagg_prefill_dp_rank)
        if why is not None:  # as SGLang's: this rank is not the room's DP group
            self._fail_and_cancel(Errc.INVALID_REQUEST, why)

    def _daemon_room(self) -> bool:
        return True  # a prefill ferryd answers Bootstrapping for a room it has not seen yet

    def _handed_over(self) -> bool:
        return self.chunks_sent > 0 or self._cancel_sent

    def pop_decode_prefix_len(self) -> int:
        """The decode's ``decode_prefix_len`` for this room, as the last poll of ferryd
        answered it (``prefix_tokens``; 0 before WaitingForInput)."""
        r = self.last_result
        return 0 if r is None else int(r.prefix_tokens)

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None) -> None:
        """The number of pages this room sends (after the decode's prefix) and its aux row."""
        self.num_kv_indices = int(num_kv_indices)
        self.aux_index = aux_index

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        """A chunk with pages, or the last one (which carries state and aux even with none)."""
        return num_pages > 0 or last_chunk

    def send(self, kv_indices: Iterable[int], state_indices: Any = None,
             token_position_offset: int = 0, last_chunk: Optional[bool] = None,
             **_: Any) -> None:
        """One chunk: ``send(room, pages, last, state_slot, aux_row, state_pages)``. The chunk
        that brings the pages sent to ``num_pages`` (of :meth:`init`) is the last one and carries
        the state (the Mamba slot, the one element of ``state_indices``' Mamba entry, or a
        page-indexed component's page list as ``state_pages``) and the aux row; a zero-page
        chunk that is not the last is skipped. A refusal fails this request alone (and cancels
        its room, so the decode learns at once).

        When every page is already sent (or there is none: a full prefix hit on the decode),
        counting pages cannot tell a zero-page chunk from the last one. SGLang passes
        ``state_indices`` only with the last chunk, so with a state pool a zero-page chunk
        without them is not the last; ``last_chunk`` (the scheduler's own flag) settles it
        outright and is the only way to tell on a model without state."""
        if self.conclude_state is not None or self.failure is not None:
            return
        link = self._link()
        if link == _GONE:
            self.conclude_state = Status.Failed
            return
        if link == _HELD:
            self._fail_and_cancel(Errc.PEER_LOST,
                                  f"room {self.bootstrap_room}: a chunk while the connection to "
                                  f"ferryd is lost ({self._lost_why})")
            return
        pages = [int(p) for p in kv_indices]
        try:
            if self.num_kv_indices is None:
                raise _RequestFailed(Errc.INVALID_REQUEST,
                                     f"send of room {self.bootstrap_room} before "
                                     f"init(num_pages, aux_index)")
            if self.sent_last:
                raise _RequestFailed(Errc.INVALID_REQUEST,
                                     f"room {self.bootstrap_room}: a chunk of {len(pages)} pages "
                                     f"after the last one")
            end = self.curr_idx + len(pages)
            if end > self.num_kv_indices:
                raise _RequestFailed(Errc.INVALID_REQUEST,
                                     f"room {self.bootstrap_room}: chunk of {len(pages)} pages "
                                     f"at position {self.curr_idx} goes beyond the "
                                     f"{self.num_kv_indices} pages of init()")
            if last_chunk is None:
                last = end == self.num_kv_indices and (
                    bool(pages) or state_indices is not None or not self.kv_mgr.has_state)
            else:
                last = bool(last_chunk)
                if last and end != self.num_kv_indices:
                    raise _RequestFailed(Errc.INVALID_REQUEST,
                                         f"room {self.bootstrap_room}: the last chunk ends at "
                                         f"page {end} of the {self.num_kv_indices} of init()")
            if not pages and not last:
                return
            slot = row = None
            state_pages: list[int] = []
            if last:
                slot, state_pages = self.kv_mgr.state_of(state_indices, "src")
                if self.kv_mgr.has_aux:
                    row = _as_index(self.aux_index) if self.aux_index is not None else None
                    if row is None or row < 0:
                        raise _RequestFailed(Errc.INVALID_REQUEST,
                                             f"room {self.bootstrap_room}: aux_index "
                                             f"{self.aux_index!r} is not an aux row (this "
                                             f"ferryd has an aux pool)")
                    shadow = self.kv_mgr.aux_shadow
                    if shadow is not None:  # the engine's metadata row, where ferryd reads it
                        try:
                            shadow.stage(row)
                        except IndexError as e:
                            raise _RequestFailed(Errc.INVALID_REQUEST,
                                                 f"room {self.bootstrap_room}: {e}") from None
        except _RequestFailed as e:
            self._fail_and_cancel(e.code, e.reason)
            return
        try:
            self.kv_mgr.client.send(self.bootstrap_room, pages, last, state_slot=slot,
                                    aux_row=row, state_pages=state_pages)
        except FerryError as e:
            self._fail_and_cancel(e.code, e.message)
            return
        self.curr_idx = end
        self.sent_last = last
        self.state_items = len(state_pages) if state_pages else int(slot is not None)
        self.state_sent = self.state_items > 0
        self.chunks_sent += 1
        if self.first_send_at is None:
            self.first_send_at = time.monotonic()

    def _fail_and_cancel(self, code: int, reason: str) -> None:
        """Fail the request here and cancel its room on ferryd, which tells the decode (and,
        for a room it has not seen yet, refuses the decode's prepare); Failed once drained."""
        self._fail(code, reason)
        self._cancel()

    def get_transfer_metric(self) -> FerryTransferMetric:
        """SGLang's metric of this request (:class:`FerryTransferMetric` says what each field
        measures)."""
        args = self.kv_mgr.kv_args
        total = self.curr_idx * sum(int(n) for n in args.kv_item_lens)
        if self.state_sent:  # a Mamba slot, or each page of a paged component, of every buffer
            total += self.state_items * sum(int(n) for n in args._pool_lists("state")[2])
        seen = [t for st, t in self.seen_at.items() if st >= Status.WaitingForInput]
        ok = self.seen_at.get(int(Status.Success))
        return FerryTransferMetric(
            transfer_latency_s=None if ok is None or self.first_send_at is None
            else max(0.0, ok - self.first_send_at),
            alloc_latency_s=min(seen) - self.created_at if seen else None,
            transfer_total_bytes=total)


# --------------------------------------------------------------------------------------------
# Batch polling


def poll_all(rooms: Sequence[_FerryRoom]) -> list[int]:
    """The :class:`KVPoll` status of every sender or receiver in ``rooms``, in order, with one
    ``poll_many`` per client for those ferryd must be asked about (a scheduler's
    ``poll_and_all_reduce`` input). Each object is updated as its ``poll()`` would be."""
    out: list[Optional[int]] = [None] * len(rooms)
    ask: dict[int, tuple[Client, list[int]]] = {}
    for i, r in enumerate(rooms):
        s = r._current()
        if s is not None:
            out[i] = r._show(s)
            continue
        c = r.kv_mgr.client
        ask.setdefault(id(c), (c, []))[1].append(i)
    for c, idx in ask.values():
        try:
            results = c.poll_many([rooms[i].bootstrap_room for i in idx])
        except FerryError as e:
            for i in idx:
                out[i] = rooms[i]._show(rooms[i]._poll_failed(e))
            continue
        for i, res in zip(idx, results):
            out[i] = rooms[i]._show(rooms[i]._apply(res))
    return [int(s) for s in out]  # type: ignore[arg-type]


__all__ = ["KVPoll", "ABORTED", "FROM_ANOTHER_RANK", "FerryKVTransferError",
           "FerryTransferMetric", "FerryKVReceiver", "FerryKVSender", "poll_all"]
