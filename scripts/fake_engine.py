#!/usr/bin/python3
"""A fake disaggregated engine pair that proves Ferry does what it is for.

    /usr/bin/python3 scripts/fake_engine.py --bin-dir build/src [--requests 200] [--seed N]

Standard library only. It starts its own ferryd daemons from configs/prefill.yaml and
configs/decode.yaml (Qwen3-Next-80B-A3B shapes), rewritten into a temporary directory with
``memory: client`` on every pool and its own sockets and ports, then runs two engine processes
through the SGLang-shaped adapter (``ferry.sglang``):

- a **decode engine**: waiting queue -> bootstrap queue (FerryKVReceiver, init, allocate pages /
  state slot / aux row, send_metadata with decode_prefix_len) -> transfer queue, with one
  poll_all (poll_many) of every room in flight per step; it verifies every destination byte of
  every successful request in its own memfd memory;
- a **prefill engine**: bootstrap queue (FerryKVSender, poll until WaitingForInput,
  pop_decode_prefix_len, init(num_pages, aux_index)) -> chunked prefill (one send per chunk,
  the last with the state slot and the aux row) -> transfer queue polled every step.

Both derive the requests (room ids, prompt lengths, chunk sizes, prefix hits, aborts on each
side) from the shared seed; decode_prefix_len reaches the prefill with the room (the decode's
prepare carries it, the prefill's poll answers it), and the prefill ranks' readiness through
FerryBootstrap over a multiprocessing.Manager dict. Each engine owns its memory (MemfdPool lent with register_memory)
and its own allocators, and frees a request's pages, slot and row on Success or Failed. The
bytes are a deterministic per-(room, pool, buffer, page) pattern; the aux row starts with the
room id. A second, smaller phase runs a TP 2 prefill instance (two prefill ferryds, ranks 0 and
1, discovery.instance_ranks listing both, one engine process driving both ranks in lockstep
with SGLang's MIN reduction of poll) into a TP 1 decode, which gathers head-sliced KV and
sliced state.

Exit 0 only when every check passed; the last line is the summary (``fake_engine: PASS ...``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import random
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "clients" / "python"))

from ferry import Client  # noqa: E402
from ferry.memory import MemfdPool  # noqa: E402
from ferry.sglang import (FerryBootstrap, FerryKVArgs, FerryKVManager, FerryKVReceiver,  # noqa: E402
                          FerryKVSender, KVPoll, poll_all)

BOOT = "fake-prefill:8998"
R_BYTES = 16 << 20          # the random block every pattern is a slice of
KV_RANGE = 8 << 20          # KV bases lie below this (8192 pages x 1 KiB fit after them)
IO_TIMEOUT = 30.0
GiB = float(1 << 30)


T0 = time.monotonic()


def log(who: str, msg: str) -> None:
    print(f"{time.monotonic() - T0:6.1f}s [{who}] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# Configs and daemons


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rewrite_config(text: str, *, name: str, control: str, sock: str, tp: tuple[int, int] = (1, 0),
                   instance_ranks: Optional[list[str]] = None, pages: Optional[int] = None) -> str:
    """configs/*.yaml with this run's name, addresses, ``memory: client`` on every pool and,
    for a TP rank of ``tp[0]``, the per-rank shapes of docs/geometry.md section 7."""
    size, rank = tp
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("name:") and line.startswith("  name:"):
            line = f"  name: {name}"
        elif s.startswith("control:"):
            line = f"  control: {control}"
        elif s.startswith("client:"):
            line = f"  client: {sock}"
        elif line.startswith("  size:"):
            line = f"  size: {size}"
        elif line.startswith("  rank:"):
            line = f"  rank: {rank}"
        elif s.startswith("pages:") and pages is not None:
            line = f"    pages: {pages}"
        elif size > 1 and s.startswith("kv_heads:"):
            line = f"    kv_heads: {2 // size}          # 2 KV heads over TP{size}"
        elif size > 1 and s.startswith("shape: [8192, 3]"):
            line = f"        shape: [{8192 // size}, 3]"
        elif size > 1 and s.startswith("shape: [32, 128, 128]"):
            line = f"        shape: [{32 // size}, 128, 128]"
        out.append(line)
        if line in ("  kv:", "  mamba:", "  aux:"):
            out.append("    memory: client")
    if instance_ranks:
        out.append("discovery:")
        out.append(f"  instance_ranks: [{', '.join(instance_ranks)}]")
    return "\n".join(out) + "\n"


class Daemon:
    def __init__(self, bin_dir: Path, work: str, name: str, config_text: str, control: str,
                 sock: str) -> None:
        self.name, self.control, self.sock = name, control, sock
        self.config = os.path.join(work, name + ".yaml")
        self.log = os.path.join(work, name + ".log")
        with open(self.config, "w") as f:
            f.write(config_text)
        chk = subprocess.run([str(bin_dir / "ferryd"), "--check-config", self.config],
                             capture_output=True, text=True, timeout=30)
        if chk.returncode != 0:
            raise RuntimeError(f"{name}: ferryd --check-config refused {self.config}: "
                               f"{chk.stderr.strip() or chk.stdout.strip()}")
        r, w = os.pipe()
        with open(self.log, "w") as lf:
            self.proc = subprocess.Popen([str(bin_dir / "ferryd"), "--config", self.config,
                                          "--ready-fd", str(w)], pass_fds=(w,), stdout=lf,
                                         stderr=lf)
        os.close(w)
        line = b""
        deadline = time.monotonic() + 30
        try:
            while not line.endswith(b"\n") and time.monotonic() < deadline:
                ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    break
                chunk = os.read(r, 64)
                if not chunk:
                    break
                line += chunk
        finally:
            os.close(r)
        if line.strip() != b"ready":
            self.proc.kill()
            self.proc.wait(timeout=15)
            raise RuntimeError(f"{name} did not start; its log:\n{open(self.log).read()[-3000:]}")

    def ferryctl(self, bin_dir: Path, command: str) -> dict[str, Any]:
        """``ferryctl --json COMMAND`` against this daemon: its document (docs/protocol.md,
        "Info documents")."""
        out = subprocess.run([str(bin_dir / "ferryctl"), "-s", self.sock, "--json", command],
                             capture_output=True, text=True, timeout=30)
        doc = json.loads(out.stdout)
        if out.returncode != 0 or "error" in doc:
            raise RuntimeError(f"ferryctl {command} on {self.name} failed: {out.stdout}"
                               f"{out.stderr}")
        return doc

    def stop(self) -> str:
        """SIGTERM and wait (bounded); '' when it exited 0 and its log ends with 'stopped'."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            rc = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)
            return f"{self.name} did not exit within 20 s of SIGTERM (killed)"
        lines = open(self.log).read().strip().splitlines()
        if rc != 0:
            return f"{self.name} exited {rc}; log tail: {lines[-3:]}"
        if not lines or not lines[-1].endswith("[ferryd] stopped"):
            return f"{self.name}'s log does not end with 'stopped': {lines[-3:]}"
        return ""


# --------------------------------------------------------------------------------------------
# The shared schedule and the byte patterns


class Req:
    __slots__ = ("seq", "room", "tokens", "pages", "prefix_pages", "chunk", "chunks",
                 "decode_abort", "prefill_abort_after")

    def __init__(self, **kw: Any) -> None:
        for k, v in kw.items():
            setattr(self, k, v)


def make_schedule(seed: int, n: int, max_tokens: int, page_tokens: int, abort_rate: float,
                  phase: str) -> list[Req]:
    """The requests both engines agree on (the same seed gives the same list)."""
    rng = random.Random(f"{seed}/{phase}/schedule")
    room_base = rng.randrange(1 << 40, 1 << 50)
    reqs = []
    for i in range(n):
        tokens = rng.randint(1, max_tokens)
        pages = -(-tokens // page_tokens)
        prefix_pages = 0
        if rng.random() < 0.3:                     # a radix-cache hit on the decode
            whole = tokens // page_tokens
            if whole >= 1:
                prefix_pages = whole if rng.random() < 0.3 or whole == 1 else \
                    rng.randint(1, whole - 1)
        chunk = rng.choice([256, 512, 1024, 2048, 4096, 8192]) if rng.random() < 0.5 else \
            rng.randint(1, 64) * 64
        chunk = max(page_tokens, chunk // page_tokens * page_tokens)
        chunks = []
        t = 0
        while t < tokens:
            chunks.append(min(chunk, tokens - t))
            t += chunk
        reqs.append(Req(seq=i, room=room_base + i, tokens=tokens, pages=pages,
                        prefix_pages=prefix_pages, chunk=chunk, chunks=chunks,
                        decode_abort=False, prefill_abort_after=0))
    # At least one full prefix hit of several chunks (zero-page chunks, the last one among
    # them) and one partial hit.
    whole = [r for r in reqs if r.tokens % page_tokens == 0]
    multi = [r for r in whole if len(r.chunks) >= 2] or whole
    if multi and not any(r.prefix_pages == r.pages for r in multi):
        r = multi[len(multi) // 2]
        r.prefix_pages = r.pages
    part = [r for r in reqs if r.tokens >= 2 * page_tokens and r.prefix_pages != r.pages]
    if part and not any(0 < r.prefix_pages for r in part):
        r = part[0]
        r.prefix_pages = rng.randint(1, r.tokens // page_tokens - 1)
    # Aborts (a few percent each), early enough (the first 80 %, or half of a short run) for
    # later requests to reuse their memory; both kinds on requests of 2 chunks or more, so the
    # abort comes mid-transfer.
    late = max(2, int(n * (0.8 if n >= 100 else 0.5)))
    cand = [r for r in reqs[1:late]]
    want = max(1, round(n * abort_rate))
    rng.shuffle(cand)
    pa = [r for r in cand if len(r.chunks) >= 2][:want]
    for r in pa:
        r.prefill_abort_after = rng.randint(1, len(r.chunks) - 1)
    da = [r for r in cand if not r.prefill_abort_after and len(r.chunks) >= 2][:want]
    for r in da:
        r.decode_abort = True
    return reqs


class Pattern:
    """The bytes of every (room, pool, buffer, page): slices of one random block both
    processes derive from the seed. A KV buffer's pages of one room are consecutive slices, so
    a contiguous run of pages is one slice; KV bases of consecutive rooms differ modulo the
    page size, so a page left over from another room never matches."""

    def __init__(self, seed: int) -> None:
        self.R = memoryview(random.Random(f"{seed}/bytes").randbytes(R_BYTES))

    @staticmethod
    def _h(*key: Any) -> int:
        return int.from_bytes(hashlib.blake2b("/".join(map(str, key)).encode(),
                                              digest_size=8).digest(), "little")

    def kv_base(self, room: int, b: int, page_bytes: int) -> int:
        return (self._h(room, "kv", b) % (KV_RANGE // page_bytes)) * page_bytes + \
            room % page_bytes

    def kv_run(self, room: int, b: int, page_bytes: int, first: int, n: int) -> memoryview:
        base = self.kv_base(room, b, page_bytes) + first * page_bytes
        return self.R[base:base + n * page_bytes]

    def state(self, room: int, b: int, nbytes: int) -> memoryview:
        base = self._h(room, "state", b) % (R_BYTES - nbytes)
        return self.R[base:base + nbytes]

    def aux(self, room: int, row_bytes: int) -> bytes:
        base = self._h(room, "aux") % (R_BYTES - row_bytes)
        return room.to_bytes(8, "little") + bytes(self.R[base + 8:base + row_bytes])


def runs(pages: list[int]) -> list[tuple[int, int, int]]:
    """(position in the list, first page, count) of each run of consecutive pages."""
    out: list[tuple[int, int, int]] = []
    for i, p in enumerate(pages):
        if out and out[-1][1] + out[-1][2] == p:
            pos, first, n = out[-1]
            out[-1] = (pos, first, n + 1)
        else:
            out.append((i, p, 1))
    return out


# --------------------------------------------------------------------------------------------
# Allocators


class PageAllocator:
    """Free pages as sorted extents; allocation takes the preferred pages first (those of an
    aborted request, so a later request reuses them), then the lowest free ones."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.ext: list[list[int]] = [[0, n]]  # [start, length], sorted, merged
        self.free_count = n

    def alloc(self, n: int, prefer: Optional[set[int]] = None) -> Optional[list[int]]:
        if n > self.free_count:
            return None
        got: list[int] = []
        if prefer:
            for p in sorted(prefer):
                if len(got) == n:
                    break
                if self._take(p):
                    got.append(p)
        i = 0
        while len(got) < n:
            start, length = self.ext[i]
            k = min(length, n - len(got))
            got.extend(range(start, start + k))
            if k == length:
                self.ext.pop(i)
            else:
                self.ext[i] = [start + k, length - k]
        self.free_count -= n
        return got

    def _take(self, p: int) -> bool:
        for i, (s, l) in enumerate(self.ext):
            if s <= p < s + l:
                parts = [[s, p - s], [p + 1, s + l - p - 1]]
                self.ext[i:i + 1] = [x for x in parts if x[1] > 0]
                return True
            if s > p:
                return False
        return False

    def free(self, pages: list[int]) -> None:
        for _, first, n in runs(sorted(pages)):
            self.ext.append([first, n])
        self.free_count += len(pages)
        self.ext.sort()
        merged: list[list[int]] = []
        for s, l in self.ext:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1][1] += l
            elif merged and merged[-1][0] + merged[-1][1] > s:
                raise AssertionError(f"page {s} freed twice")
            else:
                merged.append([s, l])
        self.ext = merged

    @property
    def full(self) -> bool:
        return self.free_count == self.n and self.ext == [[0, self.n]]


class IndexAllocator:
    """State slots or aux rows; a freed index of an aborted request is handed out first."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.free_list = deque(range(n))

    def alloc(self) -> Optional[int]:
        return self.free_list.popleft() if self.free_list else None

    def free(self, i: int, first: bool = False) -> None:
        if i in self.free_list:
            raise AssertionError(f"index {i} freed twice")
        (self.free_list.appendleft if first else self.free_list.append)(i)

    @property
    def full(self) -> bool:
        return sorted(self.free_list) == list(range(self.n))


# --------------------------------------------------------------------------------------------
# Engines


class Rank:
    """One engine rank's memory (MemfdPools as its ferryd lays them out) and manager."""

    def __init__(self, sock: str, mode: str, bootstrap: FerryBootstrap, tag: str) -> None:
        with Client(sock, name=f"{tag}-layout", timeout=IO_TIMEOUT) as c:
            pools = dict(c.pools)
        self.kv = MemfdPool("kv", pools["kv"], name=f"{tag}-kv")
        self.state = MemfdPool("state", pools["state"], name=f"{tag}-state")
        self.aux = MemfdPool("aux", pools["aux"], name=f"{tag}-aux")
        args = FerryKVArgs.from_memfd_pools(kv=self.kv, state=self.state, aux=self.aux)
        self.mgr = FerryKVManager(args, mode, socket_path=sock, bootstrap=bootstrap,
                                  name=tag, timeout=IO_TIMEOUT, drain_timeout=10.0)
        assert self.mgr.registered == ["kv", "state", "aux"], self.mgr.registered
        self.page_tokens = self.mgr.page_size

    def active_rooms(self, side: str) -> int:
        return int(self.mgr.client.info("status")[side]["active"])

    def close(self) -> None:
        self.mgr.close()
        for p in (self.kv, self.state, self.aux):
            p.close()


class Geometry:
    """The full (decode TP 1) shapes from configs/decode.yaml and how a prefill rank of
    ``tp`` slices them (docs/geometry.md section 1)."""

    KV_HEADS, HEAD_DIM, DTYPE = 2, 256, 2
    # per state tensor: (full shape, dtype bytes, slice_axis, shard_groups)
    TENSORS = [((8192, 3), 2, 0, (2048, 2048, 4096)), ((32, 128, 128), 4, 0, (32,))]

    def __init__(self, tp: int, page_tokens: int) -> None:
        self.tp, self.page_tokens = tp, page_tokens
        self.token_bytes = self.KV_HEADS * self.HEAD_DIM * self.DTYPE
        self.page_bytes = page_tokens * self.token_bytes
        self.head_bytes = self.token_bytes // tp  # per rank and token (heads not replicated)

    def state_parts(self, t: int, rank: int) -> list[tuple[int, int]]:
        """(offset in the full slot item, length) of what ``rank`` holds, in its slot order."""
        shape, dt, axis, groups = self.TENSORS[t]
        outer = 1
        for d in shape[:axis]:
            outer *= d
        unit = dt
        for d in shape[axis + 1:]:
            unit *= d
        full = shape[axis]
        parts = []
        for o in range(outer):
            off = 0
            for g in groups:
                parts.append(((o * full + off + rank * g // self.tp) * unit,
                              g // self.tp * unit))
                off += g
        return parts

    def state_full_bytes(self, t: int) -> int:
        shape, dt, _, _ = self.TENSORS[t]
        n = dt
        for d in shape:
            n *= d
        return n


def engine_main(side: str, phase: str, socks: list[str], seed: int, n: int, max_tokens: int,
                abort_rate: float, deadline_s: float, ready_store: Any, peers: list[str],
                result_q: Any) -> None:
    who = f"{phase}/{side}"
    try:
        bootstrap = FerryBootstrap({BOOT: peers}, ready=ready_store)
        ranks = [Rank(s, side, bootstrap, f"{phase}-{side}{i}") for i, s in enumerate(socks)]
        try:
            page_tokens = ranks[0].page_tokens
            reqs = make_schedule(seed, n, max_tokens, page_tokens, abort_rate, phase)
            pat = Pattern(seed)
            deadline = time.monotonic() + deadline_s
            if side == "decode":
                res = DecodeEngine(ranks[0], reqs, pat, who, deadline).run()
            else:
                res = PrefillEngine(ranks, reqs, pat, who, deadline).run()
        finally:
            for r in ranks:
                r.close()
        result_q.put((side, res))
    except BaseException as e:
        result_q.put((side, {"errors": [f"{who}: {e!r}\n{traceback.format_exc()}"]}))


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
                    t[1].abort()  # returns once ferryd reports the room terminal
                    t[5] = True
                    self.stats["decode_aborts"] += 1
                    self.finish(t, failed=True)
                    transfer.remove(t)
                    done += 1
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
                        if r.prefill_abort_after and rcv.failure and rcv.failure[0] != 406:
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
        if self.uncovered_pages or self.uncovered_slots or self.uncovered_rows:
            self.errors.append(
                f"{self.who}: memory of aborted requests never reused by a verified request: "
                f"{len(self.uncovered_pages)} pages, slots {sorted(self.uncovered_slots)}, rows "
                f"{sorted(self.uncovered_rows)}")
        self.stats["ferryd_active"] = active
        self.stats["errors"] = self.errors
        return self.stats

    def finish(self, t: list, failed: bool) -> None:
        r, rcv, pages, slot, row, _ = t
        rcv.clear()
        if failed:  # this memory must be reused, byte-exact, by a later request
            self.uncovered_pages.update(pages)
            self.uncovered_slots.add(slot)
            self.uncovered_rows.add(row)
        self.pages.free(pages)
        self.slots.free(slot, first=failed)
        self.rows.free(row, first=failed)

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
                elif res in ("aborted", "failed"):
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

    def end_failed(self, r: Req, snd: list[FerryKVSender], where: str) -> None:
        for s in snd:  # a rank that saw no failure yet is cancelled and drained
            s.abort()
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
                s.abort()  # returns once ferryd reports the room terminal
            self.stats["prefill_aborts"] += 1
            self.free(q)
            return "aborted"
        return "last" if last else "sent"


# --------------------------------------------------------------------------------------------
# Phases


def run_phase(phase: str, bin_dir: Path, work: str, seed: int, n: int, max_tokens: int,
              abort_rate: float, prefill_tp: int, deadline_s: float) -> tuple[dict, list[str]]:
    """Start the daemons of one phase, run both engines, check and stop the daemons."""
    errors: list[str] = []
    base_p = (REPO / "configs" / "prefill.yaml").read_text()
    base_d = (REPO / "configs" / "decode.yaml").read_text()
    daemons: list[Daemon] = []
    pre_ctrl = [f"127.0.0.1:{free_port()}" for _ in range(prefill_tp)]
    dec_ctrl = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    try:
        pre_socks = []
        for i in range(prefill_tp):
            name = f"{phase}-prefill-{i}"
            sock = os.path.join(work, f"{phase}-p{i}.sock")
            text = rewrite_config(base_p, name=name, control=pre_ctrl[i], sock=sock,
                                  tp=(prefill_tp, i),
                                  instance_ranks=pre_ctrl if prefill_tp > 1 else None)
            daemons.append(Daemon(bin_dir, work, name, text, pre_ctrl[i], sock))
            pre_socks.append(sock)
        dsock = os.path.join(work, f"{phase}-d.sock")
        text = rewrite_config(base_d, name=f"{phase}-decode-0", control=dec_ctrl, sock=dsock)
        daemons.append(Daemon(bin_dir, work, f"{phase}-decode-0", text, dec_ctrl, dsock))
        log(phase, f"{len(daemons)} ferryd daemons ready (prefill TP {prefill_tp}, decode TP 1, "
                   f"memory: client on kv, mamba and aux); {n} requests")
        ctx = mp.get_context("fork")
        with ctx.Manager() as manager:
            ready = manager.dict()  # prefill ranks whose memory is lent (register_to_bootstrap)
            q = ctx.Queue()
            procs = [
                ctx.Process(target=engine_main, name=f"{phase}-decode",
                            args=("decode", phase, [dsock], seed, n, max_tokens, abort_rate,
                                  deadline_s, ready, pre_ctrl, q)),
                ctx.Process(target=engine_main, name=f"{phase}-prefill",
                            args=("prefill", phase, pre_socks, seed, n, max_tokens,
                                  abort_rate, deadline_s, ready, pre_ctrl, q)),
            ]
            for p in procs:
                p.start()
            results: dict[str, dict] = {}
            end = time.monotonic() + deadline_s + 60
            while len(results) < 2 and time.monotonic() < end:
                try:
                    side, res = q.get(timeout=1.0)
                    results[side] = res
                except Exception:
                    if all(not p.is_alive() for p in procs) and q.empty():
                        break
            for p in procs:
                p.join(timeout=max(1.0, end - time.monotonic()))
                if p.is_alive():
                    p.kill()
                    p.join(timeout=10)
                    errors.append(f"{p.name} did not finish in time (killed)")
                elif p.exitcode != 0:
                    errors.append(f"{p.name} exited {p.exitcode}")
        for side in ("decode", "prefill"):
            if side not in results:
                errors.append(f"{phase}/{side} engine reported nothing")
            errors.extend(results.get(side, {}).get("errors", []))
        # after the engines: ferryd itself reports nothing active
        # and holds none of the pools' items for a room
        for d in daemons:
            st = d.ferryctl(bin_dir, "status")
            for side in ("prefill", "decode"):
                if st[side]["active"] != 0:
                    errors.append(f"{d.name}: ferryctl status says {st[side]['active']} "
                                  f"{side} rooms are active")
            for kind, pool in d.ferryctl(bin_dir, "pools").items():
                if pool["in_use"] != 0:
                    errors.append(f"{d.name}: ferryctl pools says {pool['in_use']} items of "
                                  f"pool {kind} are in use")
        results["ferryd"] = {"decode": daemons[-1].ferryctl(bin_dir, "status")["decode"]}
        ok = results.get("decode", {}).get("succeeded")
        if ok is not None and results["ferryd"]["decode"]["succeeded"] < ok:
            errors.append(f"{phase}: ferryd counted {results['ferryd']['decode']['succeeded']}"
                          f" successes, the decode engine verified {ok}")
    finally:
        stop_errors = [why for why in (d.stop() for d in daemons) if why]
        errors += stop_errors
        if daemons and not stop_errors:
            log(phase, f"all {len(daemons)} daemons stopped cleanly (exit 0, log ends "
                       f"'stopped')")
    results["elapsed"] = time.monotonic() - t0
    return results, errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin-dir", default=str(REPO / "build" / "src"),
                    help="directory holding ferryd and ferryctl (default build/src)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--abort-rate", type=float, default=0.04,
                    help="fraction of requests aborted on each side (default 0.04)")
    ap.add_argument("--tp2-requests", type=int, default=16,
                    help="requests of the TP2-prefill -> TP1-decode phase (0 skips it)")
    ap.add_argument("--tp2-max-tokens", type=int, default=1024)
    ap.add_argument("--timeout", type=float, default=240.0,
                    help="bound of the main phase's engines, seconds")
    ap.add_argument("--json", metavar="PATH",
                    help="also write the verdict, errors and every counter as JSON to PATH")
    a = ap.parse_args()
    bin_dir = Path(a.bin_dir).resolve()
    for b in ("ferryd", "ferryctl"):
        if not (bin_dir / b).is_file():
            print(f"fake_engine: no {b} in {bin_dir} (build first, or pass --bin-dir)",
                  file=sys.stderr)
            return 2
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"fake_engine: seed {seed}, {a.requests} requests (prompts 1..{a.max_tokens} tokens), "
          f"TP2 phase {a.tp2_requests} requests", flush=True)
    t0 = time.monotonic()
    work = tempfile.mkdtemp(prefix="ferry-fe-")
    errors: list[str] = []
    tp2: Optional[dict] = None
    try:
        main_res, errs = run_phase("main", bin_dir, work, seed, a.requests, a.max_tokens,
                                   a.abort_rate, 1, a.timeout)
        errors += errs
        if a.tp2_requests > 0:
            tp2, errs2 = run_phase("tp2", bin_dir, work, seed, a.tp2_requests, a.tp2_max_tokens,
                                   a.abort_rate, 2, 120.0)
            errors += errs2
            tp2["ok"] = not errs2
    finally:
        if errors:
            print(f"fake_engine: daemon logs and configs kept in {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    d, p = main_res.get("decode", {}), main_res.get("prefill", {})
    elapsed = time.monotonic() - t0
    for e in errors[:30]:
        print(f"fake_engine: ERROR: {e}", flush=True)
    if tp2 is None:
        tp2_text = "TP2 phase skipped"
    else:
        td = tp2.get("decode", {})
        tp2_text = (f"TP2 phase {'ok' if tp2['ok'] else 'FAILED'} "
                    f"({td.get('succeeded', 0)}/{a.tp2_requests} verified, "
                    f"{td.get('verified_bytes', 0) / GiB:.2f} GiB gathered from 2 prefill ranks)")
    if a.json:
        Path(a.json).write_text(json.dumps({"ok": not errors, "seed": seed, "errors": errors,
                                            "elapsed_s": elapsed, "main": main_res,
                                            "tp2": tp2}, indent=1, default=str) + "\n")
    verdict = "PASS" if not errors else f"FAIL ({len(errors)} errors)"
    print(f"fake_engine: {verdict}: {a.requests} requests, {d.get('succeeded', 0)} succeeded "
          f"and verified ({d.get('verified_bytes', 0) / GiB:.2f} GiB byte-exact), aborted: "
          f"{d.get('decode_aborts', 0)} by decode ({d.get('decode_aborts_transferring', 0)} "
          f"while Transferring; {p.get('decode_abort_raced', 0)} "
          f"lost the race with the commit), "
          f"{p.get('prefill_aborts', 0)} by prefill "
          f"(their memory reused byte-exact by {d.get('reused_after_abort', 0)} later requests), "
          f"{d.get('prefix_hits', 0)} prefix hits ({p.get('zero_page_chunks', 0)} zero-page "
          f"chunks, {p.get('zero_page_last', 0)} of them last), {p.get('chunks_sent', 0)} chunks, 0 rooms active, allocators full; "
          f"{tp2_text}; {elapsed:.1f} s", flush=True)
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
