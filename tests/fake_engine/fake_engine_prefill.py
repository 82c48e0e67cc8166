"""The fake engine's prefill engine (tests/fake_engine/fake_engine.py): SGLang's prefill scheduler in
miniature over one or more TP ranks in lockstep (the same requests and chunks; each rank its own
memory and KVSender; every poll MIN-reduced over the ranks, as SGLang's all-reduce).

Bootstrap queue: ``KVSender(mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks, pp_rank)``
per rank; Bootstrapping waits, Failed calls ``failure_exception()``; otherwise a metadata row,
``pop_decode_prefix_len()``, ``init(ceil((len - prefix) / page_size), aux_index)``. Chunked
prefill: a non-last chunk's end is rounded down to a page and the chunk skipped when that leaves
no page; the last chunk writes the final Mamba state and the metadata rows (SGLang's
``set_buf``) and sends ``send(kv_indices, [[slot]])`` (fake_engine_swa.SwaPrefillEngine: SWA
pages written chunk by chunk, ``[window_pages]``). Inflight queue: Success reads
``get_transfer_metric()`` (its bytes must be what this rank sent), releases and ``clear()``s;
Failed calls ``failure_exception()`` then releases. Aborts at the five points of
fake_engine_schedule.PREFILL_ABORTS; at the end nothing is active on ferryd and every allocator
is full again.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Optional

from fake_engine_allocators import IndexAllocator, PageAllocator
from fake_engine_memory import BOOTSTRAP_ROOM, METADATA_ROWS
from fake_engine_rank import Calls, Geometry, Rank, log
from fake_engine_schedule import Pattern, Req, runs
from ferry.sglang import FerryKVTransferError, KVPoll, KVSender

# Failures the decode's aborts cause here: before its prepare the room times out in
# Bootstrapping; after it, the decode's cancel reaches this side
DECODE_ABORTS_SEEN_HERE = ("before_init", "before_metadata", "after_metadata", "transferring")


class PrefillEngine:
    WINDOW = 6  # requests polled while the decode has not prepared them yet

    def __init__(self, ranks: list[Rank], reqs: list[Req], pat: Pattern, who: str,
                 deadline: float, boot: str) -> None:
        self.ranks, self.reqs, self.pat, self.who, self.deadline = ranks, reqs, pat, who, deadline
        self.boot = boot
        self.tp = len(ranks)
        m = ranks[0].mem.m
        self.m, self.page = m, m.page
        self.geo = Geometry(m)
        # The ranks allocate in lockstep, so one allocator serves them all (page 0 is padding).
        self.pages = PageAllocator(m.pages_usable(), first=1)
        self.states = self.state_allocator()
        self.rows = IndexAllocator(m.rows)
        self.calls = Calls()
        self.errors: list[str] = []
        self.stats: dict[str, Any] = dict(
            succeeded=0, prefill_aborts=0, decode_aborts_seen=0, abort_raced=0,
            chunks_sent=0, chunks_skipped=0, zero_page_last=0, source_bytes=0, metric_bytes=0,
            aborts={p: 0 for p in ("before_bootstrap", "waiting_for_input",
                                   "before_first_chunk", "mid_chunks", "after_last_chunk")})

    # --- the adapter, as SGLang's scheduler calls it -------------------------------------------

    def poll(self, group: list[list[Any]]) -> list[int]:
        """Every sender's poll(), MIN-reduced over the ranks (SGLang's poll_and_all_reduce)."""
        return [min(self.calls("poll", s.poll) for s in snd) for snd in group]

    def each(self, kind: str, snd: list[Any], *args: Any) -> None:
        for s in snd:
            self.calls(kind, getattr(s, kind), *args)

    def drain(self, snd: list[Any]) -> None:
        """failure_exception() on every rank once the MIN-reduced poll says Failed."""
        for s in snd:
            try:
                self.calls("failure_exception", s.failure_exception)
            except FerryKVTransferError:
                pass

    def abort(self, q: dict, point: str) -> None:
        self.each("abort", q["snd"])  # returns at once: poll() says Failed once ferryd drained
        self.stats["prefill_aborts"] += 1
        self.stats["aborts"][point] += 1
        q["aborted"] = point

    # --- the scheduler ------------------------------------------------------------------------

    def run(self) -> dict:
        pending = deque(self.reqs)
        boot: list[dict] = []
        waiting: deque = deque()
        running: Optional[dict] = None
        inflight: list[dict] = []
        done = 0
        last_print = time.monotonic()
        while done < len(self.reqs):
            if time.monotonic() > self.deadline:
                self.errors.append(f"{self.who}: deadline passed with {len(self.reqs) - done} "
                                   f"requests unfinished")
                break
            busy = False
            while pending and len(boot) < self.WINDOW:
                r = pending.popleft()
                snd = [self.calls("KVSender", KVSender, rk.mgr, self.boot, r.room,
                                  [rk.mem.tp_rank], 0) for rk in self.ranks]
                q = {"r": r, "snd": snd, "row": None, "state": None, "pages": [], "token": 0,
                     "chunk": 0, "sent": 0, "aborted": ""}
                if r.prefill_abort == "before_bootstrap":
                    self.abort(q, "before_bootstrap")
                    inflight.append(q)
                else:
                    boot.append(q)
            # bootstrap queue
            if boot:
                keep = []
                for q, st in zip(boot, self.poll([q["snd"] for q in boot])):
                    r = q["r"]
                    if st == KVPoll.Failed:
                        self.end_failed(q, "bootstrap")
                        done += 1
                        busy = True
                    elif st == KVPoll.WaitingForInput and r.prefill_abort == "waiting_for_input":
                        self.abort(q, "waiting_for_input")
                        inflight.append(q)
                        busy = True
                    elif st == KVPoll.WaitingForInput and self.rows.free_list:
                        q["row"] = self.rows.alloc()
                        prefix = [self.calls("pop_decode_prefix_len", s.pop_decode_prefix_len)
                                  for s in q["snd"]]
                        want = r.prefix_pages * self.page
                        if prefix != [want] * self.tp:
                            self.errors.append(f"{self.who}: room {r.room}: decode_prefix_len "
                                               f"{prefix}, the schedule says {want}")
                        q["start"] = q["sent"] = prefix[0] // self.page
                        self.each("init", q["snd"], -(-(r.tokens - prefix[0]) // self.page),
                                  q["row"])
                        if r.prefill_abort == "before_first_chunk":
                            self.abort(q, "before_first_chunk")
                            inflight.append(q)
                        else:
                            waiting.append(q)
                        busy = True
                    else:
                        keep.append(q)
                boot = keep
            # chunked prefill: one chunk per step of the running request
            if running is None and waiting and self.start_state(waiting[0]):
                running = waiting.popleft()
            if running is not None:
                res = self.step_chunk(running)
                if res != "wait":
                    busy = True
                if res in ("last", "aborted"):
                    inflight.append(running)
                    running = None
                elif res == "failed":
                    done += 1
                    running = None
            # inflight queue: polled every step
            if inflight:
                keep2 = []
                for q, st in zip(inflight, self.poll([q["snd"] for q in inflight])):
                    if st == KVPoll.Success:
                        self.stats["succeeded"] += 1
                        if q["aborted"]:
                            self.stats["abort_raced"] += 1  # after the last chunk: committed
                        metric = [self.calls("get_transfer_metric", s.get_transfer_metric)
                                  for s in q["snd"]]
                        mem = self.ranks[0].mem
                        want = (q["sent"] - q["start"]) * mem.kv_item * len(mem.kv_keys) + \
                            len(q["state"]) * sum(mem.state_item_bytes(e)
                                                  for e in range(mem.state_entries))
                        if metric[0].transfer_total_bytes != want:
                            self.errors.append(f"{self.who}: room {q['r'].room}: "
                                               f"get_transfer_metric says "
                                               f"{metric[0].transfer_total_bytes} bytes, rank 0 "
                                               f"sent {want}")
                        self.stats["metric_bytes"] += want
                        self.each("clear", q["snd"])
                        self.free(q)
                    elif st == KVPoll.Failed:
                        self.end_failed(q, "transfer")
                        self.free(q)
                    else:
                        keep2.append(q)
                        continue
                    done += 1
                    busy = True
                inflight = keep2
            if time.monotonic() - last_print > 5 or done == len(self.reqs):
                last_print = time.monotonic()
                log(self.who, f"{done}/{len(self.reqs)} done: {self.stats['succeeded']} "
                              f"succeeded, {self.stats['chunks_sent']} chunks sent, "
                              f"{self.stats['prefill_aborts']} aborted here, "
                              f"{self.stats['decode_aborts_seen']} aborted by the decode")
            if not busy:
                time.sleep(0.002)
        for i, rk in enumerate(self.ranks):
            active = rk.active_rooms()
            if active:
                self.errors.append(f"{self.who}: rank {i}'s ferryd reports {active} active "
                                   f"prefill rooms")
        for name, a in (("pages", self.pages), (self.STATE_NAME, self.states),
                        ("rows", self.rows)):
            if not a.full:
                self.errors.append(f"{self.who}: the {name} allocator is not full again")
        self.stats["errors"] = self.errors
        self.stats["calls"] = self.calls.times
        return self.stats

    def end_failed(self, q: dict, where: str) -> None:
        self.drain(q["snd"])
        r = q["r"]
        if r.decode_abort in DECODE_ABORTS_SEEN_HERE:
            self.stats["decode_aborts_seen"] += 1
        elif not q["aborted"]:
            why = "; ".join(f"rank {i}: {s.failure}" for i, s in enumerate(q["snd"]))
            self.errors.append(f"{self.who}: room {r.room} failed in {where}: {why}")

    def free(self, q: dict) -> None:
        if q["pages"]:
            self.pages.free(q["pages"])
        self.free_state(q)
        if q["row"] is not None:
            self.rows.free(q["row"])

    # --- the state component: a Mamba slot here (fake_engine_swa.SwaPrefillEngine: pages) ----

    STATE_NAME = "state slots"

    def state_allocator(self) -> Any:
        return IndexAllocator(self.m.slots)

    def start_state(self, q: dict) -> bool:
        """A request starts its chunks: its Mamba slot (False: none free, it waits)."""
        if not self.states.free_list:
            return False
        q["state"] = [self.states.alloc()]
        return True

    def chunk_state(self, q: dict, t0: int, t1: int) -> bool:
        """The state of a chunk's tokens t0..t1 (False: no memory, the chunk waits); a Mamba
        slot holds the state after the last token only (:meth:`write_last`)."""
        return True

    def last_state(self, q: dict) -> list[int]:
        """The request's entry of ``state_indices`` on its last chunk."""
        return q["state"]

    def free_state(self, q: dict) -> None:
        if q["state"] is not None:
            self.states.free(q["state"][0])

    # --- what the model computes -----------------------------------------------------------------

    def write_kv(self, r: Req, src: list[int], first_pos: int) -> None:
        """The source pages of positions first_pos.. on every rank: the rank's heads of the
        full page pattern, in every KV buffer (the draft layer's too)."""
        for rank, rk in enumerate(self.ranks):
            for pos, first, n in runs(src):
                for b in range(len(rk.mem.kv_keys)):
                    full = self.pat.kv_run(r.room, b, self.geo.page_bytes, first_pos + pos, n)
                    rk.mem.kv_run(b, first, n)[:] = self.geo.kv_slice(full, self.tp, rank)
                self.stats["source_bytes"] += n * rk.mem.kv_item * len(rk.mem.kv_keys)

    def write_last(self, q: dict) -> None:
        """The last chunk: the request's final Mamba state in its slot, and the metadata rows
        (SGLang's ``set_buf``)."""
        r, row = q["r"], q["row"]
        for rank, rk in enumerate(self.ranks):
            for e in range(rk.mem.state_entries):
                for slot in q["state"]:
                    full = self.pat.state(r.room, e, self.geo.state_full_bytes(e))
                    rk.mem.state_item(e, slot)[:] = self.geo.state_slice(full, e, self.tp, rank)
                    self.stats["source_bytes"] += rk.mem.state_item_bytes(e)
            self.write_metadata(rk, r, row)

    def write_metadata(self, rk: Rank, r: Req, row: int) -> None:
        for i, rb in enumerate(METADATA_ROWS):  # SGLang's set_buf on the last chunk
            rk.mem.meta_row(i, row)[:] = self.pat.meta(r.room, i, rb, i == BOOTSTRAP_ROOM)

    STALL_S = 30.0

    def step_chunk(self, q: dict) -> str:
        r, snd = q["r"], q["snd"]
        if any(s.conclude_state == KVPoll.Failed for s in snd):
            self.end_failed(q, "prefill")
            self.free(q)
            return "failed"
        if r.decode_abort == "transferring" and q["sent"] > q["start"] and \
                time.monotonic() < q.setdefault("stall_until", time.monotonic() + self.STALL_S):
            # a long prompt's next chunk takes a while to compute: the decode sees the room
            # Transferring and aborts it meanwhile (bounded: after STALL_S it goes on)
            if self.poll([snd])[0] == KVPoll.Failed:
                self.end_failed(q, "prefill")
                self.free(q)
                return "failed"
            return "wait"
        t0 = q["token"]
        t1 = t0 + r.chunks[q["chunk"]]
        need = -(-t1 // self.page) - len(q["pages"])  # KV for every token computed
        if need > self.pages.free_count or not self.chunk_state(q, t0, t1):
            return "wait"  # no free pages: a transfer in flight frees some
        new = self.pages.alloc(need)
        q["pages"].extend(new)
        q["token"] = t1
        q["chunk"] += 1
        last = q["chunk"] == len(r.chunks)
        # the pages after the decode's prefix not sent yet; a non-last chunk ends at a page
        end = len(q["pages"]) if last else t1 // self.page
        send = q["pages"][q["sent"]:end] if end > q["sent"] else []
        if not send and not last:
            self.stats["chunks_skipped"] += 1  # SGLang skips a chunk with no whole page
        else:
            if send:
                self.write_kv(r, send, q["sent"])
            if last:
                self.write_last(q)
                if not send:
                    self.stats["zero_page_last"] += 1
            self.each("send", snd, send, [self.last_state(q)] if last else None)
            q["sent"] += len(send)
            self.stats["chunks_sent"] += 1
        if any(s.conclude_state == KVPoll.Failed for s in snd):
            self.end_failed(q, "send")
            self.free(q)
            return "failed"
        if last and r.prefill_abort == "after_last_chunk":
            self.abort(q, "after_last_chunk")
            return "aborted"
        if not last and r.prefill_abort == "mid_chunks" and q["chunk"] == r.prefill_abort_after:
            self.abort(q, "mid_chunks")
            return "aborted"
        return "last" if last else "sent"
