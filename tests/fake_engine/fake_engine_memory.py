"""The fake engine's memory (tests/fake_engine/fake_engine.py), allocated the way SGLang allocates it:
one memfd per rank holding the rank's tensors at the offsets a caching allocator hands out
(512-byte granularity plus a header: not page-aligned), and :meth:`RankMemory.kv_args` listing
them as SGLang's ``KVArgs`` does, for pools ferryd's config leaves to the registration.

- KV: one ``[size + page_size, heads, head_dim]`` tensor per full-attention layer for K, then
  for V (``kv_data_ptrs`` K of every layer then V), then an EAGLE draft layer's K and V appended
  after the target's with the draft model's own layer id (0), as SGLang appends them.
- Mamba: each component one ``[layers, size + 1, ...]`` tensor (conv ``[conv_dim / tp,
  kernel - 1]`` bf16 with shard groups, temporal ``[heads / tp, 128, 128]`` fp32), listed per
  layer (views at arbitrary offsets), tensor-major then layer, with ``state_dim_per_tensor``,
  ``state_slice_outer_counts`` and ``state_conv_shard_groups``.
- No SWA pool: Qwen3-Next has no sliding-window layers, and a rank has one state component
  (Mamba here). The gpt-oss-shaped SWA phase has memory of its own (fake_engine_swa.py).
- MetadataBuffers: ten tensors with SGLang's row sizes, ``bootstrap_room`` at index 7 (not
  last), in ordinary memory (one anonymous mmap per tensor, as torch's CPU allocations:
  ``--aux-memory ordinary``) or inside the rank's memfd (``--aux-memory memfd``). Ordinary
  memory lies outside ``memory_regions``: the adapter copies those rows through a memfd of its
  own (:mod:`ferry.sglang.aux`).
"""

from __future__ import annotations

import fcntl
import mmap
import os
from dataclasses import dataclass, field
from typing import Optional

import fake_engine_rank  # puts this tree's clients/python first on sys.path
from ferry.memory import F_ADD_SEALS, F_SEAL_SHRINK, MemoryRegion, address_of, align_up
from ferry.sglang import FerryKVArgs

del fake_engine_rank

MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14

# SGLang's MetadataBuffers (utils.py), in its order: row bytes of each tensor
METADATA = [("output_ids", 64), ("cached_tokens", 64), ("output_token_logprobs_val", 64),
            ("output_token_logprobs_idx", 64), ("output_top_logprobs_val", 320),
            ("output_top_logprobs_idx", 320), ("output_hidden_states", 4096),
            ("bootstrap_room", 64), ("output_topk_p", 64), ("output_topk_index", 128)]
BOOTSTRAP_ROOM = 7
METADATA_ROWS = [r for _, r in METADATA]


@dataclass
class Model:
    """Qwen3-Next-80B-A3B's shapes (configs/decode.yaml's comments) plus an EAGLE draft layer;
    sizes in SGLang's terms (token slots, Mamba ``size``, metadata rows)."""

    kv_layers: list[int] = field(default_factory=lambda: list(range(3, 48, 4)))
    draft_layer: Optional[int] = 0
    kv_heads: int = 2
    head_dim: int = 256
    page: int = 16
    tokens: int = 20480
    mamba_layers: list[int] = field(default_factory=lambda: [l for l in range(48) if l % 4 != 3])
    conv_groups: tuple[int, ...] = (2048, 2048, 4096)
    conv_k: int = 4
    ssm_heads: int = 32
    ssm: tuple[int, int] = (128, 128)
    slots: int = 8
    rows: int = 64

    def pages_usable(self) -> int:
        """Pages an allocator hands out (page 0 is SGLang's padding page)."""
        return self.tokens // self.page


def populate(mp: mmap.mmap) -> None:
    """Map every page now (a kernel before 5.14 lacks the advice: they come at first touch)."""
    try:
        mp.madvise(MADV_POPULATE_WRITE)
    except OSError:
        pass


class RankMemory:
    """One engine rank's tensors (TP rank ``tp_rank`` of ``tp_size``)."""

    def __init__(self, m: Model, tp_size: int, tp_rank: int, aux_memory: str, name: str) -> None:
        if aux_memory not in ("memfd", "ordinary"):
            raise ValueError(f"aux memory {aux_memory!r}: memfd or ordinary")
        self.m, self.tp_size, self.tp_rank, self.aux_memory = m, tp_size, tp_rank, aux_memory
        self.heads = max(1, m.kv_heads // tp_size)
        self.token_bytes = self.heads * m.head_dim * 2  # bf16
        self.kv_item = self.token_bytes * m.page
        self.kv_pages = (m.tokens + m.page) // m.page
        keys = [f"K{l}" for l in m.kv_layers] + [f"V{l}" for l in m.kv_layers]
        if m.draft_layer is not None:
            keys += ["Kd", "Vd"]
        self.kv_keys = keys
        plan = [(k, self.kv_item * self.kv_pages) for k in keys] + self.state_plan()
        if aux_memory == "memfd":
            plan += [(f"meta{i}", r * m.rows) for i, r in enumerate(METADATA_ROWS)]
        self.places: dict[str, int] = {}
        at = 0
        for key, nbytes in plan:  # a caching allocator's 512-byte blocks after a 192-byte header
            at = align_up(at, 512) + 192
            self.places[key] = at
            at += nbytes
        self.size = align_up(at)
        self.fd = os.memfd_create(f"ferry-fe-{name}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, self.size)
        fcntl.fcntl(self.fd, F_ADD_SEALS, F_SEAL_SHRINK)
        # SGLang's pools are torch.zeros: every page exists (and is zero) before the first
        # request, so neither the engine's first write nor ferryd's lands on a page fault
        os.posix_fallocate(self.fd, 0, self.size)
        self.map = mmap.mmap(self.fd, self.size)
        populate(self.map)
        self.view = memoryview(self.map)
        self.base = address_of(self.map)
        # MetadataBuffers: views (and addresses) of each tensor
        self._aux_maps: list[mmap.mmap] = []
        self.meta: list[memoryview] = []
        self.meta_ptrs: list[int] = []
        for i, r in enumerate(METADATA_ROWS):
            n = r * m.rows
            if aux_memory == "memfd":
                at = self.places[f"meta{i}"]
                self.meta.append(self.view[at:at + n])
                self.meta_ptrs.append(self.base + at)
            else:  # ordinary memory: an anonymous private mapping, like a CPU tensor's
                mp = mmap.mmap(-1, n)
                populate(mp)
                self._aux_maps.append(mp)
                self.meta.append(memoryview(mp))
                self.meta_ptrs.append(address_of(mp))

    def state_plan(self) -> list[tuple[str, int]]:
        """The state component's tensors (key, bytes), after the KV's: the Mamba pool's conv
        and temporal ``[layers, size + 1, ...]`` tensors."""
        m, tp = self.m, self.tp_size
        self.conv_dim = sum(m.conv_groups) // tp
        self.ssm_heads = m.ssm_heads // tp
        self.conv_item = self.conv_dim * (m.conv_k - 1) * 2
        self.ssm_item = self.ssm_heads * m.ssm[0] * m.ssm[1] * 4
        nl = len(m.mamba_layers)
        return [("conv", nl * (m.slots + 1) * self.conv_item),
                ("ssm", nl * (m.slots + 1) * self.ssm_item)]

    # --- where things are ------------------------------------------------------------------------

    def kv_run(self, b: int, first: int, n: int) -> memoryview:
        """Pages first..first+n-1 of KV buffer ``b`` (kv_data_ptrs order)."""
        at = self.places[self.kv_keys[b]] + first * self.kv_item
        return self.view[at:at + n * self.kv_item]

    @property
    def state_entries(self) -> int:
        return 2 * len(self.m.mamba_layers)

    def state_what(self, e: int, i: int) -> str:
        """Index ``i`` of state entry ``e``, named for a report."""
        return f"state entry {e} slot {i}"

    @property
    def state_pad(self) -> int:
        """SGLang's padding slot (the ``+ 1`` of ``size + 1``): never written."""
        return self.m.slots

    def state_item_bytes(self, e: int) -> int:
        return self.conv_item if e < len(self.m.mamba_layers) else self.ssm_item

    def state_item(self, e: int, slot: int) -> memoryview:
        """Slot ``slot`` of state entry ``e`` (tensor-major then layer)."""
        nl = len(self.m.mamba_layers)
        t, li = divmod(e, nl)
        item = self.state_item_bytes(e)
        at = self.places["conv" if t == 0 else "ssm"] + (li * (self.m.slots + 1) + slot) * item
        return self.view[at:at + item]

    def meta_row(self, i: int, row: int) -> memoryview:
        r = METADATA_ROWS[i]
        return self.meta[i][row * r:(row + 1) * r]

    def room_entry(self, row: int) -> int:
        """SGLang's ``bootstrap_room[row, 0]``: what the decode's metadata gate reads."""
        return int.from_bytes(self.meta_row(BOOTSTRAP_ROOM, row)[:8], "little")

    # --- SGLang's KVArgs -------------------------------------------------------------------------

    def kv_args(self) -> FerryKVArgs:
        m = self.m
        a = FerryKVArgs(engine_rank=self.tp_rank, page_size=m.page, kv_head_num=self.heads,
                        total_kv_head_num=m.kv_heads, gpu_id=self.tp_rank)
        a.memory_regions = [MemoryRegion(self.fd, self.base, self.size)]
        a.kv_data_ptrs = [self.base + self.places[k] for k in self.kv_keys]
        a.kv_data_lens = [self.kv_item * self.kv_pages] * len(self.kv_keys)
        a.kv_item_lens = [self.kv_item] * len(self.kv_keys)
        ids = m.kv_layers + m.kv_layers
        if m.draft_layer is not None:
            ids = ids + [m.draft_layer, m.draft_layer]
        a.kv_layer_ids = ids
        self.state_args(a)
        a.aux_data_ptrs = list(self.meta_ptrs)
        a.aux_data_lens = [r * m.rows for r in METADATA_ROWS]
        a.aux_item_lens = list(METADATA_ROWS)
        a.bootstrap_room_ptr = a.aux_data_ptrs[BOOTSTRAP_ROOM]
        return a

    def state_args(self, a: FerryKVArgs) -> None:
        """The KVArgs' state fields: the Mamba component, per-layer views tensor-major, with
        the slicing facts."""
        m = self.m
        ptrs, lens, items, lids, dims, groups = [], [], [], [], [], []
        for e in range(self.state_entries):
            nl = len(m.mamba_layers)
            t, li = divmod(e, nl)
            item = self.state_item_bytes(e)
            ptrs.append(self.base + self.places["conv" if t == 0 else "ssm"] +
                        li * (m.slots + 1) * item)
            lens.append((m.slots + 1) * item)
            items.append(item)
            lids.append(m.mamba_layers[li])
            dims.append(self.conv_dim if t == 0 else self.ssm_heads)
            groups.append(list(m.conv_groups) if t == 0 else None)
        a.state_types = ["mamba"]
        a.state_data_ptrs, a.state_data_lens, a.state_item_lens = [ptrs], [lens], [items]
        a.state_layer_ids, a.state_dim_per_tensor = [lids], [dims]
        a.state_slice_outer_counts = [[1] * len(ptrs)]
        a.state_conv_shard_groups = [groups]

    def close(self) -> None:
        for v in self.meta:
            v.release()
        self.meta = []
        for mp in self._aux_maps:
            mp.close()
        self.view.release()
        self.map.close()
        os.close(self.fd)
