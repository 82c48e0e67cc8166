"""An engine rank's memory for models with a page-indexed state component, laid out as SGLang
allocates it (test helper, like sglang_engine_memory.py): one memfd per rank holding its tensors
at allocator offsets (not page-aligned), listed as SGLang's ``KVArgs`` lists them, for pools
ferryd's config leaves to the registration (``memory: client`` and nothing else).

- ``swa`` (gpt-oss in SGLang: ``SWAKVPool``): the full-attention layers' K and V are the KV
  pool (``get_contiguous_buf_infos``); the sliding-window layers' K then V, in a pool of their
  own with fewer pages, are the ``swa`` state component (``get_state_buf_infos``: the SWA pool's
  contiguous buffers, K over the SWA layers then V over the same layers; one item is one page
  of one layer's K or V). A request's SWA pages are the window's, in the SWA pool's numbering.
- ``dsa`` (DeepSeek with the DSA/NSA indexer: ``DSATokenToKVPool``): the MLA layers' latent KV
  (one buffer per layer) is the KV pool; the indexer's K-with-scale buffer of each of those
  layers is the ``dsa`` component, indexed by the full KV page id (one item is one page).
- ``minimax_index_k`` (MiniMax's sparse attention): K and V of every layer are the KV pool; the
  sparse layers' index K buffers are the component, indexed by the full KV page id.

:meth:`PagedRank.expect` is the rank's memory as it must be after a room: its bytes before,
with the given items replaced by the source's; :meth:`PagedRank.diff` names the items that
differ from such an image.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from dataclasses import dataclass, field
from ferry.memory import F_ADD_SEALS, F_SEAL_SHRINK, MemoryRegion, address_of, align_up
from ferry.sglang import FerryKVArgs

from sglang_engine_memory import BOOTSTRAP_ROOM, METADATA_ROWS

REGISTERED_POOLS = """pools:
  kv: {memory: client}
  mamba: {memory: client}
  aux: {memory: client}
"""


@dataclass
class PagedModel:
    """``kind`` "swa": full-attention ``kv_layers`` and sliding-window ``state_layers`` with
    ``kv_heads`` heads of ``head_dim``; "dsa": MLA ``kv_layers`` (one latent of ``head_dim``)
    each with an indexer (``state_layers``, the same ids) of ``index_bytes`` per token;
    "minimax_index_k": ``kv_layers`` with K and V, and an index K of ``index_bytes`` per token
    for each of the sparse ``state_layers``."""

    kind: str = "swa"
    mla: bool = False
    kv_layers: list[int] = field(default_factory=lambda: [0, 2, 4])
    state_layers: list[int] = field(default_factory=lambda: [1, 3, 5])
    kv_heads: int = 2
    head_dim: int = 32
    index_bytes: int = 0
    page: int = 2  # tokens per page
    kv_pages: int = 24  # SGLang's size // page, plus the padding page
    swa_pages: int = 12  # the SWA pool's pages (dsa: the KV pool's)
    rows: int = 8

    @property
    def by_full_page(self) -> bool:
        """The component is indexed by the KV pool's page ids (dsa, minimax_index_k)."""
        return self.kind != "swa"


def gpt_oss_like() -> PagedModel:
    return PagedModel()


def deepseek_dsa_like() -> PagedModel:
    return PagedModel(kind="dsa", mla=True, kv_layers=[0, 1, 2], state_layers=[0, 1, 2],
                      kv_heads=1, head_dim=288, index_bytes=132, swa_pages=24)


def minimax_like() -> PagedModel:
    return PagedModel(kind="minimax_index_k", kv_layers=[0, 1, 2, 3], state_layers=[1, 3],
                      index_bytes=64, swa_pages=24)


class PagedRank:
    """One engine rank's tensors in one memfd, at allocator offsets."""

    def __init__(self, m: PagedModel, tp_size: int = 1, tp_rank: int = 0,
                 name: str = "rank") -> None:
        self.m, self.tp_size, self.tp_rank = m, tp_size, tp_rank
        self.heads = 1 if m.mla else max(1, m.kv_heads // tp_size)
        self.kv_item = m.page * self.heads * m.head_dim * 2  # bf16
        self.state_item = m.page * m.index_bytes if m.by_full_page else self.kv_item
        self.state_pages = m.kv_pages if m.by_full_page else m.swa_pages
        self.items: dict[str, tuple[int, int]] = {}  # key -> (item bytes, items)
        for l in m.kv_layers:
            for t in (("KV",) if m.mla else ("K", "V")):
                self.items[f"{t}{l}"] = (self.kv_item, m.kv_pages)
        for t in (("I",) if m.by_full_page else ("sK", "sV")):
            for l in m.state_layers:
                self.items[f"{t}{l}"] = (self.state_item, self.state_pages)
        for i, r in enumerate(METADATA_ROWS):
            self.items[f"meta{i}"] = (r, m.rows)
        self.places: dict[str, int] = {}
        at = 0
        for key, (item, n) in self.items.items():  # 512-byte granularity, a 192-byte header
            at = align_up(at, 512) + 192
            self.places[key] = at
            at += item * n
        self.used, self.size = at, align_up(at)
        self.fd = os.memfd_create(f"ferry-paged-{name}", os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, self.size)
        fcntl.fcntl(self.fd, F_ADD_SEALS, F_SEAL_SHRINK)
        self.map = mmap.mmap(self.fd, self.size)
        self.view = memoryview(self.map)
        self.base = address_of(self.map)

    # --- where things are ----------------------------------------------------------------------

    def kv_keys(self) -> list[str]:
        if self.m.mla:
            return [f"KV{l}" for l in self.m.kv_layers]
        return [f"K{l}" for l in self.m.kv_layers] + [f"V{l}" for l in self.m.kv_layers]

    def state_keys(self) -> list[str]:
        tensors = ("I",) if self.m.by_full_page else ("sK", "sV")
        return [f"{t}{l}" for t in tensors for l in self.m.state_layers]  # tensor-major

    def at(self, key: str, index: int) -> int:
        item, n = self.items[key]
        assert 0 <= index < n, (key, index, n)
        return self.places[key] + index * item

    def item(self, key: str, index: int) -> bytes:
        at = self.at(key, index)
        return bytes(self.view[at:at + self.items[key][0]])

    def set_room(self, row: int, room: int) -> None:
        """SGLang's set_buf of the room id into the bootstrap_room tensor's row."""
        at = self.at(f"meta{BOOTSTRAP_ROOM}", row)
        self.view[at:at + 8] = room.to_bytes(8, "little")

    # --- SGLang's KVArgs ---------------------------------------------------------------------------

    def kv_args(self) -> FerryKVArgs:
        m = self.m
        a = FerryKVArgs(engine_rank=self.tp_rank, page_size=m.page, kv_head_num=self.heads,
                        total_kv_head_num=m.kv_heads)
        a.memory_regions = [MemoryRegion(self.fd, self.base, self.size)]

        def lists(keys: list[str]) -> tuple[list[int], list[int], list[int]]:
            return ([self.base + self.places[k] for k in keys],
                    [self.items[k][0] * self.items[k][1] for k in keys],
                    [self.items[k][0] for k in keys])
        a.kv_data_ptrs, a.kv_data_lens, a.kv_item_lens = lists(self.kv_keys())
        a.kv_layer_ids = list(m.kv_layers) if m.mla else m.kv_layers + m.kv_layers
        ptrs, lens, items = lists(self.state_keys())
        a.state_types = [m.kind]
        a.state_data_ptrs, a.state_data_lens, a.state_item_lens = [ptrs], [lens], [items]
        tensors = len(self.state_keys()) // len(m.state_layers)
        a.state_layer_ids = [list(m.state_layers) * tensors]
        a.state_dim_per_tensor = [[]]  # SGLang gives no slicing facts for these components
        metas = [f"meta{i}" for i in range(len(METADATA_ROWS))]
        a.aux_data_ptrs, a.aux_data_lens, a.aux_item_lens = lists(metas)
        a.bootstrap_room_ptr = a.aux_data_ptrs[BOOTSTRAP_ROOM]
        return a

    # --- bytes ---------------------------------------------------------------------------------

    def fill(self, seed: int) -> None:
        """Every byte a function of its place and ``seed``."""
        pattern = bytes((i * 131 + seed * 17 + (i >> 8)) & 0xFF for i in range(4096))
        for at in range(0, self.used, 4096):
            n = min(4096, self.used - at)
            self.view[at:at + n] = pattern[:n]

    def expect(self, src: "PagedRank", copies: list[tuple[str, int, int]]) -> bytes:
        """This rank's bytes now, with item ``dst_index`` of each ``(key, src_index,
        dst_index)`` replaced by ``src``'s item ``src_index`` of the same key."""
        image = bytearray(self.view)
        for key, si, di in copies:
            at = self.at(key, di)
            image[at:at + self.items[key][0]] = src.item(key, si)
        return bytes(image)

    def diff(self, image: bytes) -> list[str]:
        """The items (and stray bytes) where this rank's memory differs from ``image``."""
        bad: list[str] = []
        now = bytes(self.view)
        for key, (item, n) in self.items.items():
            for i in range(n):
                at = self.places[key] + i * item
                if now[at:at + item] != image[at:at + item]:
                    bad.append(f"{key}[{i}]")
        if not bad and now != image:
            bad.append("bytes outside every tensor")
        return bad

    def close(self) -> None:
        self.view.release()
        self.map.close()
        os.close(self.fd)


def copies_of(keys: list[str], src: list[int], dst: list[int]) -> list[tuple[str, int, int]]:
    """``(key, src index, dst index)`` for every key and every position of the two lists."""
    assert len(src) == len(dst)
    return [(k, s, d) for k in keys for s, d in zip(src, dst)]


__all__ = ["REGISTERED_POOLS", "PagedModel", "PagedRank", "gpt_oss_like", "deepseek_dsa_like",
           "minimax_like", "copies_of"]
