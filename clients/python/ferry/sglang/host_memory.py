"""Host memory an SGLang rank can lend ferryd: the allocation hook (see :mod:`ferry.sglang`).

ferryd maps what an engine lends, so the engine's KV and state tensors must live in memory a
descriptor names: a memfd. SGLang allocates its KV and Mamba pools with torch (one tensor per
layer for K and for V, ``[layers, size + 1, ...]`` for each Mamba state tensor); the hook is
one line where those tensors are allocated::

    buf = torch.frombuffer(ferry.sglang.host_buffer(nbytes), dtype=torch.uint8)

(then viewed with the pool's dtype and shape, as SGLang views its own). Every buffer is carved
from a process-wide arena: a sparse memfd of ``FERRY_HOST_ARENA_BYTES`` (default 256 GiB of
address space; pages exist only once touched), a new one only when a buffer does not fit. So a
model's hundreds of per-layer tensors lie in one or a few descriptors (a registration takes at
most 64), and ferryd maps only the pages each registered buffer touches. A
:class:`~ferry.sglang.FerryKVManager` whose ``KVArgs`` name no ``memory_regions`` lends from
these arenas: SGLang's ``kv_data_ptrs`` and ``state_data_ptrs`` then fall in them, at whatever
offsets SGLang's views start. The memory lives as long as the process. SGLang's
MetadataBuffers (CPU tensors) need no hook: :mod:`ferry.sglang.aux` copies their rows.
"""

from __future__ import annotations

import mmap
import os
import threading

from ..memory import MemoryRegion, address_of, align_up, create_memfd

ARENA_BYTES = int(os.environ.get("FERRY_HOST_ARENA_BYTES", str(256 << 30)))
"""The address space of one arena (sparse: only touched pages use memory)."""
ALIGN = 512
"""Every buffer starts at a multiple of this (as torch's CPU allocator aligns)."""

_lock = threading.Lock()
_regions: list[MemoryRegion] = []
_maps: list[mmap.mmap] = []  # kept alive with the process: the engine's tensors live in them
_free = [0]  # the next free offset in the last arena


def host_buffer(nbytes: int, name: str = "ferry-sglang-host") -> memoryview:
    """``nbytes`` of zeroed, writable memory in a memfd arena (sealed against shrinking),
    recorded in :func:`host_regions`."""
    if nbytes <= 0:
        raise ValueError(f"host_buffer of {nbytes} bytes: expected at least one")
    with _lock:
        if not _maps or align_up(_free[0], ALIGN) + nbytes > len(_maps[-1]):
            size = align_up(max(nbytes, ARENA_BYTES))
            fd = create_memfd(name, size)
            m = mmap.mmap(fd, size)
            _regions.append(MemoryRegion(fd, address_of(m), size))
            _maps.append(m)
            _free[0] = 0
        at = align_up(_free[0], ALIGN)
        _free[0] = at + nbytes
        return memoryview(_maps[-1])[at:at + nbytes]


def host_regions() -> list[MemoryRegion]:
    """Every arena :func:`host_buffer` made in this process."""
    with _lock:
        return list(_regions)


__all__ = ["ARENA_BYTES", "host_buffer", "host_regions"]
