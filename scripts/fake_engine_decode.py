"""The fake engine's decode engine (scripts/fake_engine.py): SGLang's decode scheduler in
miniature over one rank. Waiting queue -> bootstrap queue (a FerryKVReceiver per request, init,
then pages after the prefix, a state slot and an aux row with send_metadata) -> transfer queue,
with one poll_all (poll_many) of every room in flight per step; aborts some rooms mid-transfer;
verifies every destination byte of every successful request; and checks at the end that
nothing is active on ferryd and every allocator is full again.
"""

from __future__ import annotations

import time
from collections import deque

from fake_engine_allocators import IndexAllocator, PageAllocator
from fake_engine_rank import BOOT, GiB, Geometry, Rank, log
from fake_engine_schedule import Pattern, Req, runs
from ferry.sglang import FerryKVReceiver, KVPoll, poll_all


class DecodeEngine:
    def __init__(self, rank: Rank, reqs: list[Req], pat: Pattern, who: str,
                 deadline: float) -> None:
        self.rank, self.reqs, self.pat, self.who, self.deadline = rank, reqs, pat, who, deadline
        self.mgr = rank.mgr
        self.geo = Geometry(1, rank.page_tokens)
        kvb = rank.kv.buffers
        assert kvb[0].item_bytes == self.geo.page_bytes, (kvb[0].item_bytes, self.geo.page_bytes)
        self.pages = PageAllocator(kvb[0].items)
        self.slots = IndexAllocator(rank.state.buffers[0].items)
        self.rows = IndexAllocator(rank.aux.buffers[0].items)
        self.errors: list[str] = []
        # What aborted (or failed) requests held, until a later verified request reuses it.
        self.uncovered_pages: set[int] = set()
        self.uncovered_slots: set[int] = set()
        self.uncovered_rows: set[int] = set()
        self.prefill_ready = False
        self.stats = dict(succeeded=0, decode_aborts=0, prefill_aborts_seen=0,
                          abort_missed=0, decode_aborts_transferring=0, verified_bytes=0, prefix_hits=0, zero_page=0,
                          reused_after_abort=0, max_inflight=0)

    def run(self) -> dict:
        waiting = deque(self.reqs)
        boot: list[tuple[Req, FerryKVReceiver]] = []
        transfer: list[list] = []  # [req, receiver, pages, slot, row, aborted]
        done = 0
        last_print = time.monotonic()
        while done < len(self.reqs):
            if time.monotonic() > self.deadline:
                self.errors.append(f"{self.who}: deadline passed with {len(self.reqs) - done} "
                                   f"requests unfinished")
                for t in transfer:
                    t[1].abort()
                break
            busy = False
            # waiting -> bootstrap: a receiver per request, init (resolves the prefill ranks),
            # once the prefill engine has lent its memory (its register_to_bootstrap)
            if not self.prefill_ready:
                self.prefill_ready = self.mgr.try_ensure_parallel_info(BOOT)
            while self.prefill_ready and waiting and len(boot) < 4:
                r = waiting.popleft()
                rcv = FerryKVReceiver(self.mgr, BOOT, r.room)
                rcv.init(0)
                boot.append((r, rcv))
                busy = True
            # bootstrap -> transfer: allocate pages (after the prefix), a slot, a row; in order
            while boot:
                r, rcv = boot[0]
                st = rcv.poll()
                if st == KVPoll.Failed:
                    self.errors.append(f"{self.who}: room {r.room} failed at bootstrap: "
                                       f"{rcv.failure}")
                    boot.pop(0)
                    done += 1
                    continue
                need = r.pages - r.prefix_pages
                if need > self.pages.free_count or not self.slots.free_list or \
                        not self.rows.free_list:
                    break
                pages = self.pages.alloc(need, self.uncovered_pages)
                slot, row = self.slots.alloc(), self.rows.alloc()
                assert pages is not None and slot is not None and row is not None
                rcv.send_metadata(pages, aux_index=row, state_indices=[[slot]],
                                  decode_prefix_len=r.prefix_pages * self.rank.page_tokens)
                if r.prefix_pages:
                    self.stats["prefix_hits"] += 1
                    if need == 0:
                        self.stats["zero_page"] += 1
                transfer.append([r, rcv, pages, slot, row, False])
                boot.pop(0)
                busy = True
            self.stats["max_inflight"] = max(self.stats["max_inflight"], len(transfer))
            # aborts first, on a fresh status: the decode aborts a room mid-transfer, once
            # ferryd reports that the prefill accepted it (WaitingForInput: the prefill engine
            # is bootstrapping or chunking it) or that its writes started (Transferring)
            for t in [t for t in transfer if t[0].decode_abort and not t[5]]:
                st = t[1].poll()
                if st in (KVPoll.WaitingForInput, KVPoll.Transferring):
                    if st == KVPoll.Transferring:
                        self.stats["decode_aborts_transferring"] += 1
                    t[1].abort()  # returns at once: poll() says Failed once ferryd drained it
                    t[5] = True
                    self.stats["decode_aborts"] += 1
                    busy = True
            # transfer queue: one poll_many for every room in flight
            if transfer:
                got = poll_all([t[1] for t in transfer])
                keep = []
                for t, st in zip(transfer, got):
                    r, rcv, pages, slot, row, aborted = t
                    if st == KVPoll.Success:
                        if r.decode_abort and not aborted:
                            self.stats["abort_missed"] += 1  # finished before the abort
                        if r.prefill_abort_after:
                            self.errors.append(f"{self.who}: room {r.room} succeeded, but the "
                                               f"prefill aborts it after chunk "
                                               f"{r.prefill_abort_after}")
                        self.verify(r, pages, slot, row)
                        self.finish(t, failed=False)
                        done += 1
                        busy = True
                    elif st == KVPoll.Failed:
                        if aborted:
                            pass  # aborted here: its memory is free to reuse only now
                        elif r.prefill_abort_after and rcv.failure and rcv.failure[0] != 406:
                            self.errors.append(f"{self.who}: room {r.room}, aborted by the "
                                               f"prefill, failed with {rcv.failure} (want 406)")
                        elif r.prefill_abort_after:
                            self.stats["prefill_aborts_seen"] += 1
                        else:
                            self.errors.append(f"{self.who}: room {r.room} failed: "
                                               f"{rcv.failure}")
                        self.finish(t, failed=True)
                        done += 1
                        busy = True
                    else:
                        keep.append(t)
                transfer = keep
            if time.monotonic() - last_print > 5 or done == len(self.reqs):
                last_print = time.monotonic()
                log(self.who, f"{done}/{len(self.reqs)} done: {self.stats['succeeded']} "
                              f"verified ({self.stats['verified_bytes'] / GiB:.2f} GiB), "
                              f"{self.stats['decode_aborts']} aborted here, "
                              f"{self.stats['prefill_aborts_seen']} aborted by the prefill")
            if not busy:
                time.sleep(0.002)
        # the end: nothing active on ferryd, every page, slot and row back, aborts' memory reused
        active = self.rank.active_rooms("decode")
        if active:
            self.errors.append(f"{self.who}: ferryd reports {active} active decode rooms")
        for name, a in (("pages", self.pages), ("slots", self.slots), ("rows", self.rows)):
            if not a.full:
                self.errors.append(f"{self.who}: the {name} allocator is not full again")
        # memory an abort handed back and no later verified request reused: once ferryd ended
        # the room, no byte may land in it, so it must still hold the poison finish() wrote
        self.check_poison()
        self.stats["left_unreused"] = (len(self.uncovered_pages), len(self.uncovered_slots),
                                       len(self.uncovered_rows))
        self.stats["ferryd_active"] = active
        self.stats["errors"] = self.errors
        return self.stats

    def finish(self, t: list, failed: bool) -> None:
        r, rcv, pages, slot, row, _ = t
        rcv.clear()
        if failed:  # ferryd ended the room: no byte may land here from now on
            self.poison(pages, slot, row)
            self.uncovered_pages.update(pages)
            self.uncovered_slots.add(slot)
            self.uncovered_rows.add(row)
        self.pages.free(pages)
        self.slots.free(slot, first=failed)
        self.rows.free(row, first=failed)

    POISON = 0xA5

    def _regions(self, pages, slots, rows):
        """Every (memoryview, what) of the given pages, state slots and aux rows."""
        pb = self.geo.page_bytes
        for b in range(len(self.rank.kv.buffers)):
            view = self.rank.kv.view(b)
            for p in pages:
                yield view[p * pb:(p + 1) * pb], f"kv buffer {b} page {p}"
        for b in range(len(self.rank.state.buffers)):
            for s in slots:
                yield self.rank.state.item(b, s), f"state buffer {b} slot {s}"
        for i in rows:
            yield self.rank.aux.item(0, i), f"aux row {i}"

    def poison(self, pages: list[int], slot: int, row: int) -> None:
        for mv, _ in self._regions(pages, [slot], [row]):
            mv[:] = bytes([self.POISON]) * len(mv)

    def check_poison(self) -> None:
        bad = [what for mv, what in self._regions(sorted(self.uncovered_pages),
                                                  sorted(self.uncovered_slots),
                                                  sorted(self.uncovered_rows))
               if mv.tobytes().count(self.POISON) != len(mv)]
        if bad:
            self.errors.append(f"{self.who}: bytes landed in memory an abort had handed back: "
                               + ", ".join(bad[:5]))

    def verify(self, r: Req, pages: list[int], slot: int, row: int) -> None:
        geo, kv, bad = self.geo, self.rank.kv, []
        nbytes = 0
        for pos, first, n in runs(pages):
            pos += r.prefix_pages
            for b in range(len(kv.buffers)):
                got = kv.view(b)[first * geo.page_bytes:(first + n) * geo.page_bytes]
                if got != self.pat.kv_run(r.room, b, geo.page_bytes, pos, n):
                    bad.append(f"kv buffer {b} pages {first}..{first + n - 1}")
                nbytes += n * geo.page_bytes
        st = self.rank.state
        for b, buf in enumerate(st.buffers):
            if st.item(b, slot) != self.pat.state(r.room, b, buf.item_bytes):
                bad.append(f"state buffer {b} slot {slot}")
            nbytes += buf.item_bytes
        aux = self.rank.aux
        if bytes(aux.item(0, row)) != self.pat.aux(r.room, aux.buffers[0].item_bytes):
            bad.append(f"aux row {row}")
        nbytes += aux.buffers[0].item_bytes
        if bad:
            self.errors.append(f"{self.who}: room {r.room}: wrong bytes in " + ", ".join(bad[:5]))
            return
        self.stats["succeeded"] += 1
        self.stats["verified_bytes"] += nbytes
        reused = (self.uncovered_pages.intersection(pages) or slot in self.uncovered_slots or
                  row in self.uncovered_rows)
        if reused:
            self.stats["reused_after_abort"] += 1
        self.uncovered_pages.difference_update(pages)
        self.uncovered_slots.discard(slot)
        self.uncovered_rows.discard(row)

