"""The fake engine's prefill engine (scripts/fake_engine.py): SGLang's prefill scheduler in
miniature over one or more TP ranks in lockstep. Bootstrap queue (a FerryKVSender per rank and
request, polled until WaitingForInput, pop_decode_prefix_len, init) -> chunked prefill (the
source bytes written, one send per chunk, the last with the state slot and the aux row) ->
transfer queue polled every step; aborts some rooms after a chunk; and checks at the end that
nothing is active on ferryd and every allocator is full again.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Optional

from fake_engine_allocators import IndexAllocator, PageAllocator
from fake_engine_rank import BOOT, Geometry, Rank, log
from fake_engine_schedule import Pattern, Req, runs
from ferry.sglang import FerryKVSender, FerryKVTransferError, KVPoll, poll_all


class PrefillEngine:
    """One prefill engine over one or more TP ranks driven in lockstep (the same chunks, each
    rank from its own pages, slot and row; poll reduced with MIN, as SGLang's all-reduce)."""

    WINDOW = 6  # requests polled while the decode has not prepared them yet

    def __init__(self, ranks: list[Rank], reqs: list[Req], pat: Pattern, who: str,
                 deadline: float) -> None:
        self.ranks, self.reqs, self.pat, self.who, self.deadline = ranks, reqs, pat, who, deadline
        self.tp = len(ranks)
        self.page_tokens = ranks[0].page_tokens
        self.geo = Geometry(self.tp, self.page_tokens)
        kvb = ranks[0].kv.buffers
        assert kvb[0].item_bytes == self.geo.page_bytes // self.tp
        # The ranks allocate in lockstep, so one allocator serves them all.
        self.pages = PageAllocator(kvb[0].items)
        self.slots = IndexAllocator(ranks[0].state.buffers[0].items)
        self.rows = IndexAllocator(ranks[0].aux.buffers[0].items)
        self.errors: list[str] = []
        self.stats = dict(succeeded=0, prefill_aborts=0, decode_aborts_seen=0,
                          decode_abort_raced=0, chunks_sent=0, zero_page_last=0, zero_page_chunks=0,
                          source_bytes=0)

    def poll(self, group: list[list[FerryKVSender]]) -> list[int]:
        flat = [s for g in group for s in g]
        got = poll_all(flat) if flat else []
        return [min(got[i * self.tp:(i + 1) * self.tp]) for i in range(len(group))]

    def run(self) -> dict:
        pending = deque(self.reqs)
        boot: list[tuple[Req, list[FerryKVSender]]] = []
        waiting: deque = deque()   # [req, senders, row, prefix]
        running: Optional[dict] = None
        transfer: list[dict] = []
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
                boot.append((r, [FerryKVSender(rk.mgr, BOOT, r.room, [0], 0)
                                 for rk in self.ranks]))
            # bootstrap queue: poll; WaitingForInput -> prefix, init(num_pages, aux_index)
            if boot:
                keep = []
                for (r, snd), st in zip(boot, self.poll([s for _, s in boot])):
                    if st == KVPoll.Failed:
                        self.end_failed(r, snd, "bootstrap")
                        done += 1
                        busy = True
                    elif st == KVPoll.WaitingForInput and self.rows.free_list:
                        prefix = snd[0].pop_decode_prefix_len()
                        if prefix != r.prefix_pages * self.page_tokens:
                            self.errors.append(f"{self.who}: room {r.room}: decode_prefix_len "
                                               f"{prefix} through FerryBootstrap, the schedule "
                                               f"says {r.prefix_pages * self.page_tokens}")
                        start = prefix // self.page_tokens
                        row = self.rows.alloc()
                        for rk, s in zip(self.ranks, snd):
                            s.init(r.pages - start, row)
                            rk.aux.item(0, row)[:] = self.pat.aux(r.room,
                                                                  rk.aux.buffers[0].item_bytes)
                        waiting.append({"r": r, "snd": snd, "row": row, "start": start,
                                        "pages": [], "slot": None, "token": 0, "chunk": 0})
                        busy = True
                    else:
                        keep.append((r, snd))
                boot = keep
            # chunked prefill: one chunk per step of the running request
            if running is None and waiting and self.slots.free_list:
                running = waiting.popleft()
                running["slot"] = self.slots.alloc()
            if running is not None:
                res = self.step_chunk(running)
                if res != "wait":
                    busy = True
                if res == "last":
                    transfer.append(running)
                    running = None
                elif res == "aborted":  # its memory is freed once poll says Failed
                    transfer.append(running)
                    running = None
                elif res == "failed":
                    done += 1
                    running = None
            # transfer queue: polled every step
            if transfer:
                keep2 = []
                for q, st in zip(transfer, self.poll([q["snd"] for q in transfer])):
                    r = q["r"]
                    if st == KVPoll.Success:
                        self.stats["succeeded"] += 1
                        if r.decode_abort:
                            self.stats["decode_abort_raced"] += 1
                        self.free(q)
                        done += 1
                        busy = True
                    elif st == KVPoll.Failed and q.get("aborted"):
                        self.drain(q["snd"])  # the MIN says Failed once one rank drained
                        self.free(q)  # drained on every rank: the memory may be reused
                        done += 1
                        busy = True
                    elif st == KVPoll.Failed:
                        self.end_failed(r, q["snd"], "transfer")
                        self.free(q)
                        done += 1
                        busy = True
                    else:
                        keep2.append(q)
                transfer = keep2
            if time.monotonic() - last_print > 5 or done == len(self.reqs):
                last_print = time.monotonic()
                log(self.who, f"{done}/{len(self.reqs)} done: {self.stats['succeeded']} "
                              f"succeeded, {self.stats['chunks_sent']} chunks sent, "
                              f"{self.stats['prefill_aborts']} aborted here, "
                              f"{self.stats['decode_aborts_seen']} aborted by the decode")
            if not busy:
                time.sleep(0.002)
        for i, rk in enumerate(self.ranks):
            active = rk.active_rooms("prefill")
            if active:
                self.errors.append(f"{self.who}: rank {i}'s ferryd reports {active} active "
                                   f"prefill rooms")
        for name, a in (("pages", self.pages), ("slots", self.slots), ("rows", self.rows)):
            if not a.full:
                self.errors.append(f"{self.who}: the {name} allocator is not full again")
        self.stats["errors"] = self.errors
        return self.stats

    @staticmethod
    def drain(snd: list[FerryKVSender]) -> None:
        """SGLang's failure_exception() on every rank once the MIN-reduced poll says Failed: a
        rank whose room is not drained yet is cancelled and waited for (bounded)."""
        for s in snd:
            try:
                s.failure_exception()
            except FerryKVTransferError:
                pass

    def end_failed(self, r: Req, snd: list[FerryKVSender], where: str) -> None:
        self.drain(snd)
        if r.decode_abort:
            self.stats["decode_aborts_seen"] += 1
        else:
            why = "; ".join(f"rank {i}: {s.failure}" for i, s in enumerate(snd))
            self.errors.append(f"{self.who}: room {r.room} failed in {where}: {why}")

    def free(self, q: dict) -> None:
        if q["pages"]:
            self.pages.free(q["pages"])
        if q["slot"] is not None:
            self.slots.free(q["slot"])
        self.rows.free(q["row"])

    def write_kv(self, r: Req, src: list[int], first_pos: int) -> None:
        """The source pages of positions first_pos.. on every rank: the rank's head slice of
        the full page pattern."""
        geo = self.geo
        rank_page = geo.page_bytes // self.tp
        for rank, rk in enumerate(self.ranks):
            for pos, first, n in runs(src):
                pos += first_pos
                for b in range(len(rk.kv.buffers)):
                    full = self.pat.kv_run(r.room, b, geo.page_bytes, pos, n)
                    dst = rk.kv.view(b)[first * rank_page:(first + n) * rank_page]
                    if self.tp == 1:
                        dst[:] = full
                    else:
                        tb, hb = geo.token_bytes, geo.head_bytes
                        for t in range(n * geo.page_tokens):
                            dst[t * hb:(t + 1) * hb] = full[t * tb + rank * hb:
                                                            t * tb + (rank + 1) * hb]
                self.stats["source_bytes"] += n * rank_page * len(rk.kv.buffers)

    def write_state(self, r: Req, slot: int) -> None:
        for rank, rk in enumerate(self.ranks):
            nl = len(rk.state.buffers) // len(Geometry.TENSORS)
            for b, buf in enumerate(rk.state.buffers):
                t = b // nl
                full = self.pat.state(r.room, b, self.geo.state_full_bytes(t))
                item = rk.state.item(b, slot)
                if self.tp == 1:
                    item[:] = full
                else:
                    at = 0
                    for off, n in self.geo.state_parts(t, rank):
                        item[at:at + n] = full[off:off + n]
                        at += n
                    assert at == buf.item_bytes, (at, buf.item_bytes)
                self.stats["source_bytes"] += buf.item_bytes

    def step_chunk(self, q: dict) -> str:
        r, snd = q["r"], q["snd"]
        if any(s.conclude_state == KVPoll.Failed for s in snd):
            self.end_failed(r, snd, "prefill")
            self.free(q)
            return "failed"
        tokens = r.chunks[q["chunk"]]
        lo_page = q["token"] // self.page_tokens
        hi_page = -(-(q["token"] + tokens) // self.page_tokens)
        new = self.pages.alloc(hi_page - len(q["pages"]))
        if new is None:
            return "wait"  # no free pages: a transfer in flight frees some
        q["pages"].extend(new)
        q["token"] += tokens
        q["chunk"] += 1
        last = q["chunk"] == len(r.chunks)
        # the pages of this chunk after the decode's prefix are sent (SGLang's start_send_idx)
        first = max(lo_page, q["start"])
        send = q["pages"][first:hi_page] if hi_page > first else []
        if send:
            self.write_kv(r, send, first)
        if last:
            self.write_state(r, q["slot"])
            if not send:
                self.stats["zero_page_last"] += 1
        # every chunk goes to the adapter, also one with no page to send (a chunk inside the
        # decode's prefix): SGLang's state_indices ride only on the last chunk, which is how the
        # adapter tells a zero-page chunk from a zero-page last one
        for s in snd:
            s.send(send, [[q["slot"]]] if last else None)
        self.stats["chunks_sent"] += 1
        if not send and not last:
            self.stats["zero_page_chunks"] += 1
        if any(s.conclude_state == KVPoll.Failed for s in snd):
            self.end_failed(r, snd, "send")
            self.free(q)
            return "failed"
        if r.prefill_abort_after and q["chunk"] == r.prefill_abort_after:
            for s in snd:
                s.abort()  # returns at once: poll() says Failed once ferryd drained it
            self.stats["prefill_aborts"] += 1
            q["aborted"] = True
            return "aborted"
        return "last" if last else "sent"
