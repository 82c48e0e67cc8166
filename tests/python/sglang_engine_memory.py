"""Engine memory laid out the way SGLang allocates it (test helper): one memfd per rank holding
its tensors at the offsets an allocator gives (not page-aligned), KV as per-layer tensors of the
target model followed by an EAGLE draft layer's, Mamba components as ``[layers, size + 1, ...]``
tensors whose per-layer views start anywhere, and MetadataBuffers (ten tensors, each its own row
size, ``bootstrap_room`` not last), in the memfd or, as SGLang allocates them, in ordinary
memory (``aux_memory="ordinary"``: an anonymous mapping, which the adapter copies rows through). :meth:`SGLangRank.kv_args` lists them as SGLang's ``KVArgs``
does (``kv_data_ptrs`` target K, target V, draft K, draft V; state tensor-major then layer, with
``state_dim_per_tensor`` and ``state_conv_shard_groups``), for pools ferryd's config leaves to the
registration (``memory: client`` and nothing else)."""

from __future__ import annotations

import fcntl
import mmap
import os
from dataclasses import dataclass, field
from typing import Optional

from ferry.memory import F_ADD_SEALS, F_SEAL_SHRINK, MemoryRegion, address_of, align_up
from ferry.sglang import FerryKVArgs, host_buffer

REGISTERED_POOLS = """pools:
  kv: {memory: client}
  mamba: {memory: client}
  aux: {memory: client}
"""

# SGLang's MetadataBuffers (utils.py): row bytes of each tensor, bootstrap_room at index 7
METADATA_ROWS = [64, 64, 64, 20, 320, 320, 4096, 64, 64, 128]  # 20: 5 top logprobs
BOOTSTRAP_ROOM = 7


@dataclass
class Model:
    """A small hybrid model: attention layers with KV heads, Mamba layers with a GDN-like conv
    (shard groups) and a temporal state, one EAGLE draft layer."""

    kv_layers: list[int] = field(default_factory=lambda: [3, 7])
    draft_layer: Optional[int] = 0  # SGLang's draft model numbers its own layers from 0
    kv_heads: int = 2
    head_dim: int = 64
    page: int = 1
    tokens: int = 64  # KV token slots (SGLang's size)
    mamba_layers: list[int] = field(default_factory=lambda: [0, 1])
    conv_groups: list[int] = field(default_factory=lambda: [256, 256, 512])
    # Each conv group's units (Ferry's state_conv_shard_units), or None: every group sliced.
    # Mamba2 with n_groups 1 is [heads, 1, 1]: B and C are held whole by every rank.
    conv_units: Optional[list[int]] = None
    conv_k: int = 3
    ssm_heads: int = 4
    ssm: tuple[int, int] = (16, 16)
    slots: int = 4  # SGLang's size; the tensors hold size + 1
    rows: int = 8


def conv_share(m: Model, g: int, tp_size: int, tp_rank: int) -> tuple[int, int]:
    """(first channel, channels) of conv group ``g`` that TP rank ``tp_rank`` holds: an equal
    share of the group's units, or (fewer units than ranks) the one unit it holds whole."""
    size = m.conv_groups[g]
    units = m.conv_units[g] if m.conv_units is not None else size
    unit = size // units
    if units >= tp_size:
        return tp_rank * (units // tp_size) * unit, units // tp_size * unit
    return tp_rank // (tp_size // units) * unit, unit


class SGLangRank:
    """One engine rank's tensors in one memfd, at allocator offsets."""

    def __init__(self, m: Model, tp_size: int = 1, tp_rank: int = 0, name: str = "rank",
                 aux_memory: str = "memfd", hook: bool = False) -> None:
        """``hook``: the tensors come from ``ferry.sglang.host_buffer`` (SGLang's allocation
        hook) and the KVArgs name no memory_regions, as SGLang's do."""
        self.m, self.tp_size, self.tp_rank = m, tp_size, tp_rank
        heads = max(1, m.kv_heads // tp_size)
        self.token_bytes = heads * m.head_dim * 2  # bf16
        self.kv_item = self.token_bytes * m.page
        self.kv_pages = (m.tokens + m.page) // m.page
        conv_dim = sum(conv_share(m, g, tp_size, 0)[1] for g in range(len(m.conv_groups)))
        self.conv_dim, self.ssm_heads = conv_dim, m.ssm_heads // tp_size
        self.conv_item = conv_dim * (m.conv_k - 1) * 2
        self.ssm_item = self.ssm_heads * m.ssm[0] * m.ssm[1] * 4  # fp32
        self.heads = heads
        self._at = 0
        self.places: dict[str, int] = {}
        layers = len(m.mamba_layers)
        plan = [(f"K{l}", self.kv_item * self.kv_pages) for l in m.kv_layers]
        plan += [(f"V{l}", self.kv_item * self.kv_pages) for l in m.kv_layers]
        if m.draft_layer is not None:
            plan += [("Kd", self.kv_item * self.kv_pages), ("Vd", self.kv_item * self.kv_pages)]
        plan += [("conv", layers * (m.slots + 1) * self.conv_item),
                 ("ssm", layers * (m.slots + 1) * self.ssm_item)]
        metas = [(f"meta{i}", r * m.rows) for i, r in enumerate(METADATA_ROWS)]
        self.ordinary_aux = aux_memory == "ordinary"
        if not self.ordinary_aux:
            plan += metas
        for key, nbytes in plan:  # 512-byte allocator granularity, then a 192-byte header
            self._at = align_up(self._at, 512) + 192
            self.places[key] = self._at
            self._at += nbytes
        # SGLang's MetadataBuffers are ordinary CPU tensors: an anonymous mapping, no memfd
        self.meta_places, at = {}, 0
        for key, nbytes in metas:
            at = align_up(at, 512) + 192
            self.meta_places[key] = at
            at += nbytes
        self.meta_size = align_up(at)
        self.size = align_up(self._at)
        self.hook = hook
        if hook:
            self.fd, self.map = -1, None
            self.view = host_buffer(self.size, f"ferry-sglang-{name}")
            self.base = address_of(self.view)
        else:
            self.fd = os.memfd_create(f"ferry-sglang-{name}", os.MFD_ALLOW_SEALING)
            os.ftruncate(self.fd, self.size)
            fcntl.fcntl(self.fd, F_ADD_SEALS, F_SEAL_SHRINK)
            self.map = mmap.mmap(self.fd, self.size)
            self.view = memoryview(self.map)
            self.base = address_of(self.map)
        if self.ordinary_aux:
            self.meta_map = mmap.mmap(-1, self.meta_size)
            self.meta_view = memoryview(self.meta_map)
            self.meta_base = address_of(self.meta_map)
        else:
            self.meta_places = {k: self.places[k] for k, _ in metas}
            self.meta_view, self.meta_base = self.view, self.base

    # --- where things are ------------------------------------------------------------------------

    def kv_at(self, key: str, page: int) -> int:
        return self.places[key] + page * self.kv_item

    def state_at(self, tensor: str, layer_index: int, slot: int) -> int:
        item = self.conv_item if tensor == "conv" else self.ssm_item
        return self.places[tensor] + (layer_index * (self.m.slots + 1) + slot) * item

    def meta_at(self, i: int, row: int) -> int:
        """Offset in ``meta_view`` of row ``row`` of metadata tensor ``i``."""
        return self.meta_places[f"meta{i}"] + row * METADATA_ROWS[i]

    def kv_keys(self) -> list[str]:
        keys = [f"K{l}" for l in self.m.kv_layers] + [f"V{l}" for l in self.m.kv_layers]
        return keys + (["Kd", "Vd"] if self.m.draft_layer is not None else [])

    # --- SGLang's KVArgs ---------------------------------------------------------------------------

    def kv_args(self) -> FerryKVArgs:
        m = self.m
        a = FerryKVArgs(engine_rank=self.tp_rank, page_size=m.page, kv_head_num=self.heads,
                        total_kv_head_num=m.kv_heads)
        if not self.hook:
            a.memory_regions = [MemoryRegion(self.fd, self.base, self.size)]
        keys = self.kv_keys()
        a.kv_data_ptrs = [self.base + self.places[k] for k in keys]
        a.kv_data_lens = [self.kv_item * self.kv_pages] * len(keys)
        a.kv_item_lens = [self.kv_item] * len(keys)
        ids = m.kv_layers + m.kv_layers
        if m.draft_layer is not None:
            ids = ids + [m.draft_layer, m.draft_layer]
        a.kv_layer_ids = ids
        layers = len(m.mamba_layers)
        ptrs, lens, items, lids, dims, groups = [], [], [], [], [], []
        for t, item, dim, g in (("conv", self.conv_item, self.conv_dim, list(m.conv_groups)),
                                ("ssm", self.ssm_item, self.ssm_heads, None)):
            for li in range(layers):
                ptrs.append(self.base + self.state_at(t, li, 0))
                lens.append((m.slots + 1) * item)
                items.append(item)
                lids.append(m.mamba_layers[li])
                dims.append(dim)
                groups.append(g)
        a.state_types = ["mamba"]
        a.state_data_ptrs, a.state_data_lens, a.state_item_lens = [ptrs], [lens], [items]
        a.state_layer_ids, a.state_dim_per_tensor = [lids], [dims]
        a.state_slice_outer_counts = [[1] * len(ptrs)]
        a.state_conv_shard_groups = [groups]
        if m.conv_units is not None:
            a.state_conv_shard_units = [[list(m.conv_units) if g else None for g in groups]]
        a.aux_data_ptrs = [self.meta_base + self.meta_places[f"meta{i}"]
                           for i in range(len(METADATA_ROWS))]
        a.aux_data_lens = [r * m.rows for r in METADATA_ROWS]
        a.aux_item_lens = list(METADATA_ROWS)
        a.bootstrap_room_ptr = a.aux_data_ptrs[BOOTSTRAP_ROOM]
        return a

    def fill(self, seed: int) -> None:
        """Every byte of the rank's tensors a function of its place and ``seed``."""
        n = self._at
        pattern = bytes((i * 131 + seed * 17 + (i >> 8)) & 0xFF for i in range(4096))
        for at in range(0, n, 4096):
            self.view[at:min(n, at + 4096)] = pattern[:min(4096, n - at)]
        if self.ordinary_aux:
            for at in range(0, self.meta_size, 4096):
                self.meta_view[at:at + 4096] = bytes(reversed(pattern))

    def close(self) -> None:
        self.view.release()
        if self.map is not None:  # the hook's memory lives as long as the process
            self.map.close()
            os.close(self.fd)
        if self.ordinary_aux:
            self.meta_view.release()
            self.meta_map.close()
