"""SGLang's MetadataBuffers in ordinary memory (see :mod:`ferry.sglang`): the path that moves
them without lending them.

SGLang allocates its metadata tensors (output ids, cached tokens, logprobs, hidden states,
``bootstrap_room``, ...) with ordinary CPU allocators, which ferryd cannot map. When the
``KVArgs``' aux buffers lie outside ``memory_regions``, the manager lends ferryd a memfd of its
own with the same buffers (one per metadata tensor, the same row sizes and counts) and copies
one request's row: on the prefill into the memfd just before the last chunk is handed to
ferryd (SGLang writes the row with ``set_buf`` before that ``send``), on the decode out of it
into the engine's tensors when a poll first sees Success, before Success is reported (so
SGLang's metadata gate reads its room id as before). A row is a few KiB: the copies cost
microseconds (docs/performance.md §7), and no SGLang patch is needed.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Optional, Sequence

from ..memory import MemoryRegion, address_of, align_up, create_memfd
from .kvargs import FerryKVArgs


class AuxShadow:
    """A memfd copy of the engine's aux buffers that ferryd can map: ``args`` lists it as
    ``KVArgs`` aux fields (what the manager registers); :meth:`stage` and :meth:`deliver` copy
    one row in and out."""

    def __init__(self, ptrs: Sequence[int], item_lens: Sequence[int], lens: Sequence[int],
                 bootstrap_room_ptr: Optional[int], name: str) -> None:
        self.ptrs = [int(p) for p in ptrs]
        self.items = [int(i) for i in item_lens]
        if any(i <= 0 for i in self.items) or len(self.items) != len(self.ptrs):
            raise ValueError(f"pool aux: item sizes {self.items} for {len(self.ptrs)} buffers")
        counts = [int(n) // i for n, i in zip(lens, self.items) if int(n) > 0]
        if len(counts) != len(self.ptrs) or min(counts, default=0) == 0:
            raise ValueError("pool aux: the aux buffers lie outside memory_regions, so the "
                             "manager copies their rows through a memfd of its own; that needs "
                             "aux_data_lens (every buffer's bytes)")
        self.rows = min(counts)
        self.offsets, at = [], 0
        for item in self.items:
            self.offsets.append(at)
            at = align_up(at + item * self.rows, 64)
        self.size = align_up(max(at, 1))
        self.fd = create_memfd(name, self.size)
        self.map = mmap.mmap(self.fd, self.size)
        self.base = address_of(self.map)
        self.args = FerryKVArgs(aux_data_ptrs=[self.base + o for o in self.offsets],
                                aux_data_lens=[i * self.rows for i in self.items],
                                aux_item_lens=list(self.items),
                                memory_regions=[MemoryRegion(self.fd, self.base, self.size)])
        if bootstrap_room_ptr is not None:
            if int(bootstrap_room_ptr) not in self.ptrs:
                raise ValueError(f"pool aux: bootstrap_room_ptr {int(bootstrap_room_ptr):#x} is "
                                 f"none of the aux_data_ptrs")
            self.args.bootstrap_room_ptr = \
                self.args.aux_data_ptrs[self.ptrs.index(int(bootstrap_room_ptr))]

    def _check(self, row: int) -> None:
        if not 0 <= row < self.rows:
            raise IndexError(f"aux row {row} is outside the {self.rows} rows of the metadata "
                             f"buffers")

    def stage(self, row: int) -> None:
        """Prefill: the engine's row ``row`` of every buffer into the memfd."""
        self._check(row)
        for ptr, off, item in zip(self.ptrs, self.offsets, self.items):
            ctypes.memmove(self.base + off + row * item, ptr + row * item, item)

    def deliver(self, row: int) -> None:
        """Decode: the memfd's row ``row`` of every buffer into the engine's tensors."""
        self._check(row)
        for ptr, off, item in zip(self.ptrs, self.offsets, self.items):
            ctypes.memmove(ptr + row * item, self.base + off + row * item, item)

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:  # a view is still alive: unmapped with it
            pass
        os.close(self.fd)


def outside_regions(args: FerryKVArgs) -> bool:
    """Whether every aux buffer of ``args`` lies outside its memory regions (ordinary memory
    that ferryd cannot map). Some inside and some outside is refused by the manager's table."""
    ptrs = [int(p) for p in args.aux_data_ptrs]
    return bool(ptrs) and not any(r.contains(p, 1) for p in ptrs for r in args.memory_regions)


__all__ = ["AuxShadow", "outside_regions"]
