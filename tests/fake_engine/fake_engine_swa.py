"""The fake engine's SWA phase (tests/fake_engine/fake_engine.py): a gpt-oss-shaped model whose state
component is ``swa``, its memory held as SGLang holds it and both engines' state handling as
SGLang's schedulers do it. TP 1 -> TP 1 only: SGLang refuses SWA state under a TP mismatch for
non-MLA models, and so does ferryd (tests/python/test_sglang_paged_e2e.py checks that refusal).

- Memory (:class:`SwaRankMemory`, SGLang's ``SWAKVPool``): the full-attention layers' K then V
  are the KV pool (``get_contiguous_buf_infos``), one ``[size + page_size, heads, head_dim]``
  tensor per layer; the sliding-window layers' K then V are a pool of their own,
  ``[size_swa + page_size, heads, head_dim]`` per layer with ``size_swa`` =
  ``swa_full_tokens_ratio`` (SGLang's default 0.8) x ``size`` in whole pages, listed as the
  ``swa`` state component (``get_state_buf_infos``: K over the SWA layers, then V; one item is
  one page of one layer's K or V). Page 0 of both pools is SGLang's padding page.
- The window: the pages holding the prompt's last ``window`` tokens (128, gpt-oss's
  ``sliding_window``), the start floored to a page, over the whole prompt whatever the decode's
  prefix (SGLang's ``_swa_payload`` on both sides): :meth:`SwaModel.window`.
- Prefill (:class:`SwaPrefillEngine`): each chunk's tokens get SWA pages from the SWA pool's own
  allocator next to their KV pages (SGLang's ``alloc_extend`` allocates in both pools), the
  model writes every SWA layer's K and V there, and pages that slid out of the window for good
  go back to the SWA allocator (SGLang's SWA eviction), so the window's SWA pages are neither
  the KV pages nor in the KV pages' order. The last ``send(kv_indices, [window_pages])``.
- Decode (:class:`SwaDecodeEngine`): the window's pages from its own SWA page allocator
  (aborted requests' pages first), ``send_metadata(kv_indices, aux_index, [window_pages],
  decode_prefix_len)``; on Success every window page of every SWA buffer is verified (besides
  the KV pages and metadata rows), on failure poisoned like the rest; at the end the SWA
  allocator is full and the SWA padding page untouched.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Optional

from fake_engine_allocators import PageAllocator
from fake_engine_decode import DecodeEngine
from fake_engine_memory import RankMemory
from fake_engine_prefill import PrefillEngine
from fake_engine_schedule import Req
from ferry.sglang import FerryKVArgs


@dataclass
class SwaModel:
    """gpt-oss-20b's attention: 24 layers alternating sliding-window (even ids) and full
    attention (odd ids), 8 KV heads of 64 (bf16), a 128-token window; sizes in SGLang's terms
    (``size`` token slots, ``size_swa`` from ``swa_full_tokens_ratio``, metadata rows)."""

    kv_layers: list[int] = field(default_factory=lambda: list(range(1, 24, 2)))
    swa_layers: list[int] = field(default_factory=lambda: list(range(0, 24, 2)))
    draft_layer: Optional[int] = None
    kv_heads: int = 8
    head_dim: int = 64
    page: int = 16
    tokens: int = 16384
    swa_full_tokens_ratio: float = 0.8
    window_tokens: int = 128
    rows: int = 64

    @property
    def swa_tokens(self) -> int:
        """SGLang's ``size_swa``: a whole number of pages."""
        return int(self.tokens * self.swa_full_tokens_ratio) // self.page * self.page

    def pages_usable(self) -> int:
        """KV pages an allocator hands out (page 0 is SGLang's padding page)."""
        return self.tokens // self.page

    def swa_pages_usable(self) -> int:
        return self.swa_tokens // self.page

    def window(self, tokens: int) -> tuple[int, int]:
        """(first token page, page count) of a ``tokens``-token prompt's window: the pages
        holding its last ``window_tokens`` tokens, the start floored to a page."""
        first = max(0, tokens - self.window_tokens) // self.page
        return first, -(-tokens // self.page) - first


class SwaRankMemory(RankMemory):
    """One engine rank's tensors for :class:`SwaModel` (TP 1): the KV pool, the SWA pool and
    the MetadataBuffers (in ordinary memory or the memfd, as RankMemory's)."""

    def state_plan(self) -> list[tuple[str, int]]:
        m = self.m
        self.swa_item = self.token_bytes * m.page
        self.swa_items = (m.swa_tokens + m.page) // m.page
        self.state_keys = [f"sK{l}" for l in m.swa_layers] + [f"sV{l}" for l in m.swa_layers]
        return [(k, self.swa_item * self.swa_items) for k in self.state_keys]

    @property
    def state_entries(self) -> int:
        return len(self.state_keys)

    def state_what(self, e: int, i: int) -> str:
        return f"swa buffer {e} ({self.state_keys[e][1:]}) page {i}"

    @property
    def state_pad(self) -> int:
        return 0  # the SWA pool's padding page

    def state_item_bytes(self, e: int) -> int:
        return self.swa_item

    def state_item(self, e: int, page: int) -> memoryview:
        """Page ``page`` (the SWA pool's numbering) of SWA buffer ``e`` (K then V)."""
        at = self.places[self.state_keys[e]] + page * self.swa_item
        return self.view[at:at + self.swa_item]

    def state_args(self, a: FerryKVArgs) -> None:
        """``get_state_buf_infos``: the SWA pool's contiguous buffers, as the swa component."""
        a.state_types = ["swa"]
        a.state_data_ptrs = [[self.base + self.places[k] for k in self.state_keys]]
        a.state_data_lens = [[self.swa_item * self.swa_items] * len(self.state_keys)]
        a.state_item_lens = [[self.swa_item] * len(self.state_keys)]
        a.state_layer_ids = [self.m.swa_layers * 2]
        a.state_dim_per_tensor = [[]]  # SGLang gives no slicing facts for SWA


def with_short_prompts(reqs: list[Req], seed: int, m: SwaModel, every: int = 8) -> list[Req]:
    """The SWA phase's schedule: every ``every``-th request that no side aborts and that is
    not a full prefix hit (the zero-page last chunk that carries only the window) gets a prompt
    no longer than the window (1..``window_tokens`` tokens, the first one page at most; one
    chunk, no prefix), so whole-prompt windows down to a single page are moved too, not only
    the tails of longer prompts. Both engines derive the same list."""
    rng = random.Random(f"{seed}/swa/short")
    for i, r in enumerate([r for r in reqs if not r.decode_abort and not r.prefill_abort and
                           r.prefix_pages < r.pages][::every]):
        r.tokens = rng.randint(1, m.page if i == 0 else m.window_tokens)
        r.pages, r.prefix_pages = -(-r.tokens // m.page), 0
        r.chunk, r.chunks = r.tokens, [r.tokens]
    return reqs


def swa_pattern_key(e: int) -> str:
    """The Pattern buffer key of SWA buffer ``e`` (apart from every KV buffer's)."""
    return f"swa{e}"


class SwaDecodeEngine(DecodeEngine):
    """The decode scheduler with an SWA component: a request's state indices are its
    window's pages, from the SWA pool's own allocator."""

    STATE_NAME = "SWA pages"

    def state_allocator(self) -> Any:
        return PageAllocator(self.m.swa_pages_usable(), first=1)

    def state_fits(self, r: Req) -> bool:
        return self.m.window(r.tokens)[1] <= self.states.free_count

    def alloc_state(self, r: Req) -> list[int]:
        first, n = self.m.window(r.tokens)
        # what the windows cover: the whole prompt (no longer than the window) or its tail;
        # pages the decode's prefix already holds (SGLang moves the whole window anyway)
        key = "windows_of_a_tail" if first else "windows_of_the_whole_prompt"
        self.stats[key] = self.stats.get(key, 0) + 1
        if first < r.prefix_pages:
            self.stats["windows_in_prefix"] = self.stats.get("windows_in_prefix", 0) + 1
        return self.states.alloc(n, self.uncovered_states)

    def free_state(self, state: list[int], failed: bool) -> None:
        self.states.free(state)

    def want_state(self, r: Req, e: int, j: int, rank: int) -> Any:
        """The room's bytes of SWA buffer ``e`` at the ``j``-th window page."""
        first = self.m.window(r.tokens)[0]
        return self.pat.kv_run(r.room, swa_pattern_key(e), self.geo.page_bytes, first + j, 1)


class SwaPrefillEngine(PrefillEngine):
    """The prefill scheduler with an SWA component: SWA pages next to the KV pages of every
    chunk, evicted once out of the window, the window's pages on the last send."""

    STATE_NAME = "SWA pages"

    def state_allocator(self) -> Any:
        return PageAllocator(self.m.swa_pages_usable(), first=1)

    def start_state(self, q: dict) -> bool:
        q["swa"] = {}  # token page -> SWA page, for the pages still held
        q["swa_next"] = 0  # the next token page without an SWA page
        return True

    def chunk_state(self, q: dict, t0: int, t1: int) -> bool:
        m, held = self.m, q["swa"]
        end = -(-t1 // m.page)
        new = self.states.alloc(end - q["swa_next"])
        if new is None:
            return False  # no free SWA page: a transfer in flight frees some
        held.update(zip(range(q["swa_next"], end), new))
        q["swa_next"] = end
        # the forward pass writes every SWA layer's K and V of the tokens it computed
        r = q["r"]
        for k in range(t0 // m.page, end):
            for rk in self.ranks:
                for e in range(rk.mem.state_entries):
                    rk.mem.state_item(e, held[k])[:] = self.pat.kv_run(
                        r.room, swa_pattern_key(e), self.geo.page_bytes, k, 1)
                self.stats["source_bytes"] += rk.mem.state_entries * rk.mem.swa_item
        # pages out of every later window (it starts at max(0, L - window) >= t1 - window)
        gone = [k for k in held if k < max(0, t1 - m.window_tokens) // m.page]
        if gone:
            self.states.free([held.pop(k) for k in gone])
            self.stats["swa_evicted"] = self.stats.get("swa_evicted", 0) + len(gone)
        return True

    def write_last(self, q: dict) -> None:
        for rk in self.ranks:  # the SWA pages were written chunk by chunk
            self.write_metadata(rk, q["r"], q["row"])

    def last_state(self, q: dict) -> list[int]:
        first, n = self.m.window(q["r"].tokens)
        q["state"] = [q["swa"][k] for k in range(first, first + n)]
        return q["state"]

    def free_state(self, q: dict) -> None:
        if q.get("swa"):
            self.states.free(list(q["swa"].values()))
            q["swa"] = {}
