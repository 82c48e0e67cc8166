"""The fake engine's decode engine (tests/fake_engine/fake_engine.py): SGLang's decode scheduler in
miniature over one or more TP ranks in lockstep (the same requests, pages, state indices and row
on every rank; each rank its own memory and KVReceiver; every poll MIN-reduced over the ranks).

Waiting queue: ``try_ensure_parallel_info(bootstrap_addr)`` (the bootstrap server's ``GET
/route``), ``KVReceiver(mgr=, bootstrap_addr=, bootstrap_room=)``, ``init(prefill_dp_rank)``.
Prealloc queue: pages after the prefix, the state component's indices (a Mamba slot here; the
SWA window's pages in fake_engine_swa.SwaDecodeEngine) and a metadata row, then
``send_metadata(kv_indices (int32), aux_index, [[slot]], decode_prefix_len)``. Transfer queue:
the MIN-reduced poll with the metadata gate (a Success counts once the request's
``bootstrap_room`` entry equals the room on every rank); Failed: ``failure_exception()`` and
release; Success: verify every destination byte (every KV buffer's pages, the draft layer's
too, every state entry at every state index, every metadata row), ``clear()``, zero the room
entry, release. Aborts at the five points of fake_engine_schedule.DECODE_ABORTS; memory an
abort handed back stays poisoned until a later verified request reuses it; at the end nothing
is active on ferryd and every allocator is full again.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from typing import Any

from fake_engine_allocators import IndexAllocator, PageAllocator
from fake_engine_memory import BOOTSTRAP_ROOM, METADATA_ROWS
from fake_engine_rank import GiB, Calls, Geometry, Rank, log, same
from fake_engine_schedule import Pattern, Req, runs
from ferry.sglang import FerryKVTransferError, KVPoll, KVReceiver


class DecodeEngine:
    PREALLOC = 8  # requests between the waiting queue and memory

    def __init__(self, ranks: list[Rank], reqs: list[Req], pat: Pattern, who: str,
                 deadline: float, boot: str) -> None:
        self.ranks, self.reqs, self.pat, self.who, self.deadline = ranks, reqs, pat, who, deadline
        self.boot = boot
        self.tp = len(ranks)
        m = ranks[0].mem.m
        self.m, self.page = m, m.page
        self.geo = Geometry(m)
        self.pages = PageAllocator(m.pages_usable(), first=1)
        self.states = self.state_allocator()
        self.rows = IndexAllocator(m.rows)
        self.calls = Calls()
        self.errors: list[str] = []
        # What aborted (or failed) requests held, until a later verified request reuses it.
        self.uncovered_pages: set[int] = set()
        self.uncovered_states: set[int] = set()
        self.uncovered_rows: set[int] = set()
        self.stats: dict[str, Any] = dict(
            succeeded=0, decode_aborts=0, prefill_aborts_seen=0, abort_missed=0,
            verified_bytes=0, verified_state_bytes=0, verified_state_indices=0,
            prefix_hits=0, zero_page=0, reused_after_abort=0, max_inflight=0,
            gate_waits=0, aborts={p: 0 for p in ("before_init", "before_metadata",
                                                 "after_metadata", "transferring",
                                                 "after_success")})

    def poll(self, group: list[list[Any]]) -> list[int]:
        return [min(self.calls("poll", x.poll) for x in rcv) for rcv in group]

    def each(self, kind: str, rcv: list[Any], *args: Any, **kw: Any) -> None:
        for x in rcv:
            self.calls(kind, getattr(x, kind), *args, **kw)

    def abort(self, t: dict, point: str) -> None:
        self.each("abort", t["rcv"])
        self.stats["decode_aborts"] += 1
        self.stats["aborts"][point] += 1
        t["aborted"] = point

    def run(self) -> dict:
        waiting = deque(self.reqs)
        prealloc: list[dict] = []
        transfer: list[dict] = []
        done = 0
        last_print = time.monotonic()
        while done < len(self.reqs):
            if time.monotonic() > self.deadline:
                self.errors.append(f"{self.who}: deadline passed with {len(self.reqs) - done} "
                                   f"requests unfinished")
                for t in prealloc + transfer:
                    self.each("abort", t["rcv"])
                break
            busy = False
            # waiting -> prealloc, once the prefill instance registered every rank
            while waiting and len(prealloc) < self.PREALLOC and all(
                    self.calls("try_ensure_parallel_info", rk.mgr.try_ensure_parallel_info,
                               self.boot) for rk in self.ranks):
                r = waiting.popleft()
                rcv = [self.calls("KVReceiver", KVReceiver, mgr=rk.mgr,
                                  bootstrap_addr=self.boot, bootstrap_room=r.room)
                       for rk in self.ranks]
                t = {"r": r, "rcv": rcv, "pages": [], "state": None, "row": None,
                     "aborted": ""}
                if r.decode_abort == "before_init":
                    self.abort(t, "before_init")
                    transfer.append(t)
                else:
                    dp = self.ranks[0].mgr.prefill_info_table[self.boot].dp_size
                    self.each("init", rcv, r.room % dp)  # follow_bootstrap_room
                    prealloc.append(t)
                busy = True
            # prealloc: handshake poll, then memory and send_metadata, in order
            while prealloc:
                t = prealloc[0]
                r = t["r"]
                st = self.poll([t["rcv"]])[0]
                if st == KVPoll.Failed:
                    transfer.append(prealloc.pop(0))  # failure_exception and release there
                    continue
                if r.decode_abort == "before_metadata":
                    self.abort(t, "before_metadata")
                    transfer.append(prealloc.pop(0))
                    continue
                need = r.pages - r.prefix_pages
                if need > self.pages.free_count or not self.state_fits(r) or \
                        not self.rows.free_list:
                    break
                t["pages"] = self.pages.alloc(need, self.uncovered_pages)
                t["state"], t["row"] = self.alloc_state(r), self.rows.alloc()
                self.each("send_metadata", t["rcv"], array("i", t["pages"]), t["row"],
                          [t["state"]], r.prefix_pages * self.page)
                if r.prefix_pages:
                    self.stats["prefix_hits"] += 1
                    if need == 0:
                        self.stats["zero_page"] += 1
                if r.decode_abort == "after_metadata":
                    self.abort(t, "after_metadata")
                transfer.append(prealloc.pop(0))
                busy = True
            self.stats["max_inflight"] = max(self.stats["max_inflight"], len(transfer))
            # transfer queue: MIN-reduced polls with the metadata gate
            if transfer:
                keep = []
                for t, st in zip(transfer, self.poll([t["rcv"] for t in transfer])):
                    r = t["r"]
                    if st == KVPoll.Transferring and r.decode_abort == "transferring" and \
                            not t["aborted"]:
                        self.abort(t, "transferring")
                        busy = True
                    if st == KVPoll.Success and not self.gate(t):
                        self.stats["gate_waits"] += 1
                        keep.append(t)
                    elif st == KVPoll.Success:
                        self.succeeded(t)
                        done += 1
                        busy = True
                    elif st == KVPoll.Failed:
                        self.failed(t)
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
        self.end_checks()
        self.stats["errors"] = self.errors
        self.stats["calls"] = self.calls.times
        return self.stats

    def gate(self, t: dict) -> bool:
        """SGLang's metadata gate: the request's bootstrap_room entry holds its room."""
        return all(rk.mem.room_entry(t["row"]) == t["r"].room for rk in self.ranks)

    def succeeded(self, t: dict) -> None:
        r = t["r"]
        if r.decode_abort == "after_success":
            self.abort(t, "after_success")  # SGLang may abort a request that just finished
            if self.poll([t["rcv"]])[0] != KVPoll.Success:
                self.errors.append(f"{self.who}: room {r.room}: an abort after Success "
                                   f"changed the poll to {self.poll([t['rcv']])[0]}")
        elif r.decode_abort and not t["aborted"]:
            self.stats["abort_missed"] += 1  # finished before the abort point came
        elif t["aborted"]:
            self.errors.append(f"{self.who}: room {r.room} succeeded after its abort at "
                               f"{t['aborted']}")
        if r.prefill_abort and r.prefill_abort != "after_last_chunk":
            self.errors.append(f"{self.who}: room {r.room} succeeded, but the prefill aborts "
                               f"it ({r.prefill_abort})")
        self.verify(t)
        self.each("clear", t["rcv"])
        for rk in self.ranks:  # the gate must not pass for the row's next request
            rk.mem.meta_row(BOOTSTRAP_ROOM, t["row"])[:8] = bytes(8)
        self.release(t, failed=False)

    def failed(self, t: dict) -> None:
        r = t["r"]
        for x in t["rcv"]:
            try:
                self.calls("failure_exception", x.failure_exception)
            except FerryKVTransferError:
                pass
        if t["aborted"]:
            pass
        elif r.prefill_abort:
            self.stats["prefill_aborts_seen"] += 1
        else:
            why = "; ".join(f"rank {i}: {x.failure}" for i, x in enumerate(t["rcv"]))
            self.errors.append(f"{self.who}: room {r.room} failed: {why}")
        self.release(t, failed=True)

    def release(self, t: dict, failed: bool) -> None:
        pages, state, row = t["pages"], t["state"], t["row"]
        if state is None:
            return  # aborted before memory was allocated
        if failed:  # ferryd ended the room: no byte may land here from now on
            self.poison(pages, state, row)
            self.uncovered_pages.update(pages)
            self.uncovered_states.update(state)
            self.uncovered_rows.add(row)
        self.pages.free(pages)
        self.free_state(state, failed)
        self.rows.free(row, first=failed)

    # --- the state component: a Mamba slot here (fake_engine_swa.SwaDecodeEngine: pages) ---------

    STATE_NAME = "state slots"

    def state_allocator(self) -> Any:
        return IndexAllocator(self.m.slots)

    def state_fits(self, r: Req) -> bool:
        return bool(self.states.free_list)

    def alloc_state(self, r: Req) -> list[int]:
        """The request's state indices (its entry of ``state_indices``): one Mamba slot."""
        return [self.states.alloc()]

    def free_state(self, state: list[int], failed: bool) -> None:
        self.states.free(state[0], first=failed)

    def want_state(self, r: Req, e: int, j: int, rank: int) -> Any:
        """What state entry ``e`` must hold at the request's ``j``-th state index on decode
        rank ``rank``: rank's share of the room's full slot."""
        full = self.pat.state(r.room, e, self.geo.state_full_bytes(e))
        return self.geo.state_slice(full, e, self.tp, rank)

    # --- checks ----------------------------------------------------------------------------------

    POISON = 0xA5

    def _regions(self, pages: list[int], states: list[int], rows: list[int]):
        """Every (memoryview, what) of the given pages, state indices and metadata rows."""
        for d, rk in enumerate(self.ranks):
            mem = rk.mem
            for b in range(len(mem.kv_keys)):
                for p in pages:
                    yield mem.kv_run(b, p, 1), f"rank {d} kv buffer {b} page {p}"
            for e in range(mem.state_entries):
                for i in states:
                    yield mem.state_item(e, i), f"rank {d} {mem.state_what(e, i)}"
            for i in range(len(METADATA_ROWS)):
                for row in rows:
                    yield mem.meta_row(i, row), f"rank {d} metadata {i} row {row}"

    def poison(self, pages: list[int], states: list[int], row: int) -> None:
        for mv, _ in self._regions(pages, states, [row]):
            mv[:] = bytes([self.POISON]) * len(mv)

    def check_poison(self) -> None:
        bad = [what for mv, what in self._regions(sorted(self.uncovered_pages),
                                                  sorted(self.uncovered_states),
                                                  sorted(self.uncovered_rows))
               if mv.tobytes().count(self.POISON) != len(mv)]
        if bad:
            self.errors.append(f"{self.who}: bytes landed in memory an abort had handed back: "
                               + ", ".join(bad[:5]))

    def end_checks(self) -> None:
        """Nothing active on ferryd, every page, state index and row back, aborts' memory
        untouched since, SGLang's padding page and padding state index never written."""
        for d, rk in enumerate(self.ranks):
            active = rk.active_rooms()
            if active:
                self.errors.append(f"{self.who}: rank {d}'s ferryd reports {active} active "
                                   f"decode rooms")
            mem = rk.mem
            pad = [f"kv buffer {b} page 0" for b in range(len(mem.kv_keys))
                   if mem.kv_run(b, 0, 1).tobytes().count(0) != mem.kv_item]
            pad += [mem.state_what(e, mem.state_pad) for e in range(mem.state_entries)
                    if mem.state_item(e, mem.state_pad).tobytes().count(0) !=
                    mem.state_item_bytes(e)]
            if pad:
                self.errors.append(f"{self.who}: rank {d}: bytes landed in padding: "
                                   + ", ".join(pad[:5]))
        for name, a in (("pages", self.pages), (self.STATE_NAME, self.states),
                        ("rows", self.rows)):
            if not a.full:
                self.errors.append(f"{self.who}: the {name} allocator is not full again")
        self.check_poison()
        self.stats["left_unreused"] = (len(self.uncovered_pages), len(self.uncovered_states),
                                       len(self.uncovered_rows))

    def verify(self, t: dict) -> None:
        r, pages, state, row = t["r"], t["pages"], t["state"], t["row"]
        geo, pat, bad, nbytes = self.geo, self.pat, [], 0
        for d, rk in enumerate(self.ranks):
            mem = rk.mem
            for pos, first, n in runs(pages):
                for b in range(len(mem.kv_keys)):
                    full = pat.kv_run(r.room, b, geo.page_bytes, r.prefix_pages + pos, n)
                    if not same(mem.kv_run(b, first, n), geo.kv_slice(full, self.tp, d)):
                        bad.append(f"rank {d} kv buffer {b} pages {first}..{first + n - 1}")
                    nbytes += n * mem.kv_item
            for e in range(mem.state_entries):
                for j, i in enumerate(state):
                    if not same(mem.state_item(e, i), self.want_state(r, e, j, d)):
                        bad.append(f"rank {d} {mem.state_what(e, i)}")
                    nbytes += mem.state_item_bytes(e)
            for i, rb in enumerate(METADATA_ROWS):
                if not same(mem.meta_row(i, row), pat.meta(r.room, i, rb, i == BOOTSTRAP_ROOM)):
                    bad.append(f"rank {d} metadata {i} row {row}")
                nbytes += rb
        if bad:
            self.errors.append(f"{self.who}: room {r.room}: wrong bytes in " + ", ".join(bad[:5]))
            return
        self.stats["succeeded"] += 1
        self.stats["verified_bytes"] += nbytes
        self.stats["verified_state_indices"] += len(state)
        self.stats["verified_state_bytes"] += self.tp * len(state) * sum(
            self.ranks[0].mem.state_item_bytes(e) for e in range(self.ranks[0].mem.state_entries))
        if self.uncovered_pages.intersection(pages) or \
                self.uncovered_states.intersection(state) or row in self.uncovered_rows:
            self.stats["reused_after_abort"] += 1
        self.uncovered_pages.difference_update(pages)
        self.uncovered_states.difference_update(state)
        self.uncovered_rows.discard(row)
