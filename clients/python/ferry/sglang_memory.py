"""Host memory an SGLang rank can lend ferryd: the allocation hook (see :mod:`ferry.sglang`).

ferryd maps what an engine lends, so the engine's KV and state tensors must live in memory a
descriptor names: a memfd. SGLang allocates its host pools with torch's ordinary allocator; the
hook is one line in its memory pool, where a buffer is allocated::

    buf = torch.frombuffer(ferry.sglang.host_buffer(nbytes), dtype=torch.uint8)

(then viewed with the pool's dtype and shape, as SGLang views its own). Every such buffer is a
memfd mapping recorded here, and a :class:`~ferry.sglang.FerryKVManager` whose ``KVArgs`` name
no ``memory_regions`` lends from these: SGLang's ``kv_data_ptrs`` and ``state_data_ptrs`` then
fall in them, at whatever offsets SGLang's views start. The memory lives as long as the process.
SGLang's MetadataBuffers need no hook (:mod:`ferry.sglang_aux` copies their rows).
"""

from __future__ import annotations

import mmap
import threading

from .memory import MemoryRegion, address_of, align_up, create_memfd

_lock = threading.Lock()
_regions: list[MemoryRegion] = []
_maps: list[mmap.mmap] = []  # kept alive with the process: the engine's tensors live in them


def host_buffer(nbytes: int, name: str = "ferry-sglang-host") -> memoryview:
    """``nbytes`` of zeroed, writable memory in a new memfd mapping (sealed against shrinking),
    recorded in :func:`host_regions`."""
    if nbytes <= 0:
        raise ValueError(f"host_buffer of {nbytes} bytes: expected at least one")
    size = align_up(nbytes)
    fd = create_memfd(name, size)
    m = mmap.mmap(fd, size)
    with _lock:
        _regions.append(MemoryRegion(fd, address_of(m), size))
        _maps.append(m)
    return memoryview(m)[:nbytes]


def host_regions() -> list[MemoryRegion]:
    """Every mapping :func:`host_buffer` made in this process."""
    with _lock:
        return list(_regions)


__all__ = ["host_buffer", "host_regions"]
