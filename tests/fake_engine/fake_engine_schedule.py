"""The fake engine's shared schedule and byte patterns (tests/fake_engine/fake_engine.py): both engine
processes derive the same requests (room ids, prompt lengths, chunks, prefix hits, aborts) and
the same bytes of every (room, pool, buffer, page) from the seed, so the decode can verify what
the prefill wrote without any channel between them but ferryd.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

R_BYTES = 20 << 20          # the random block every pattern is a slice of
KV_RANGE = 8 << 20          # KV bases lie below this (8192 tokens x 1 KiB fit after them)


# Where a request is aborted (both engines derive it from the schedule), in the order a request
# reaches them. Prefill: right after its KVSender is made (before the bootstrap); once the
# MIN-reduced poll says WaitingForInput (before init); after init, before the first chunk;
# after a non-last chunk; right after the last chunk, before Success (it may lose the race
# with the commit). Decode: right after its KVReceiver is made (before init); after init,
# before memory is allocated and send_metadata; right after send_metadata; once the
# MIN-reduced poll says Transferring (the prefill stalls such a request after its first chunk,
# as a long prompt's compute would; it may still finish first); once the poll says Success,
# before clear (the abort must change nothing: the request stays verified).
PREFILL_ABORTS = ("before_bootstrap", "waiting_for_input", "before_first_chunk", "mid_chunks",
                  "after_last_chunk")
DECODE_ABORTS = ("before_init", "before_metadata", "after_metadata", "transferring",
                 "after_success")


class Req:
    __slots__ = ("seq", "room", "tokens", "pages", "prefix_pages", "chunk", "chunks",
                 "decode_abort", "prefill_abort", "prefill_abort_after")

    def __init__(self, **kw: Any) -> None:
        for k, v in kw.items():
            setattr(self, k, v)


def make_schedule(seed: int, n: int, max_tokens: int, page_tokens: int, abort_rate: float,
                  phase: str) -> list[Req]:
    """The requests both engines agree on (the same seed gives the same list). Chunk sizes
    are token counts, not page multiples (the prefill rounds non-last chunk ends down to a
    page), and prefixes are whole pages."""
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
        chunk = rng.choice([256, 512, 1024, 2048, 4096, 8192]) if rng.random() < 0.4 else \
            rng.randint(max(1, page_tokens // 2), 3000)
        chunks = []
        t = 0
        while t < tokens:
            chunks.append(min(chunk, tokens - t))
            t += chunk
        reqs.append(Req(seq=i, room=room_base + i, tokens=tokens, pages=pages,
                        prefix_pages=prefix_pages, chunk=chunk, chunks=chunks,
                        decode_abort="", prefill_abort="", prefill_abort_after=0))
    # At least one full prefix hit of several chunks (skipped chunks, a zero-page last one)
    # and one partial hit.
    whole = [r for r in reqs if r.tokens % page_tokens == 0 and r.tokens > page_tokens]
    multi = [r for r in whole if len(r.chunks) >= 2] or whole
    if multi and not any(r.prefix_pages == r.pages for r in multi):
        r = multi[len(multi) // 2]
        r.prefix_pages = r.pages
    part = [r for r in reqs if r.tokens >= 2 * page_tokens and r.prefix_pages != r.pages]
    if part and not any(0 < r.prefix_pages for r in part):
        r = part[0]
        r.prefix_pages = rng.randint(1, r.tokens // page_tokens - 1)
    # Aborts: every point of both sides at least once (a few percent of the requests in all),
    # early enough (the first 80 %, or half of a short run) for later requests to reuse their
    # memory; mid-chunk and while-Transferring aborts on requests of several chunks.
    late = max(2, int(n * (0.8 if n >= 100 else 0.5)))
    cand = [r for r in reqs[1:late] if r.prefix_pages < r.pages]
    rng.shuffle(cand)
    per_point = max(1, round(n * abort_rate / len(PREFILL_ABORTS)))
    for points, attr in ((PREFILL_ABORTS, "prefill_abort"), (DECODE_ABORTS, "decode_abort")):
        for point in points:
            # mid-chunk aborts want several chunks, the first with a whole page to send
            multi_chunk = point in ("mid_chunks", "transferring")
            fit = [r for r in cand if not r.prefill_abort and not r.decode_abort and
                   (not multi_chunk or (len(r.chunks) >= 3 and r.prefix_pages == 0 and
                                        r.chunk >= page_tokens))]
            if not fit and multi_chunk:  # a short run: cut one request into three chunks
                long = [r for r in cand if not r.prefill_abort and not r.decode_abort and
                        r.tokens >= 3 * page_tokens]
                if long:
                    r = long[0]
                    r.prefix_pages, r.chunk = 0, r.tokens // 3
                    r.chunks = [r.chunk, r.chunk, r.tokens - 2 * r.chunk]
                    fit = [r]
            for r in fit[:per_point]:
                setattr(r, attr, point)
                if point == "mid_chunks":
                    r.prefill_abort_after = rng.randint(1, len(r.chunks) - 1)
    return reqs


class Pattern:
    """The bytes of every (room, pool, buffer, page): slices of one random block both
    processes derive from the seed. A KV buffer's pages of one room are consecutive slices, so
    a contiguous run of pages is one slice; KV bases of consecutive rooms differ modulo the
    page size, so a page left over from another room never matches."""

    def __init__(self, seed: int) -> None:
        # (a bytearray: its slices are writable buffers, which the decode compares with memcmp)
        self.R = memoryview(bytearray(random.Random(f"{seed}/bytes").randbytes(R_BYTES)))

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

    def meta(self, room: int, i: int, row_bytes: int, room_tensor: bool) -> bytes:
        """Row of metadata tensor ``i``; SGLang's ``bootstrap_room`` row starts with the
        room id."""
        base = self._h(room, "aux", i) % (R_BYTES - row_bytes)
        if room_tensor:
            return room.to_bytes(8, "little") + bytes(self.R[base + 8:base + row_bytes])
        return bytes(self.R[base:base + row_bytes])


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
