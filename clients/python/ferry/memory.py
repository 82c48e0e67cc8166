"""Engine-owned memory for ``memory: client`` pools (docs/protocol.md, register_memory).

A pool the daemon's config marks ``memory: client`` has no shm object: the engine lends ferryd
its own memory, as memfds, and ferryd's fabric writes land there. :class:`MemfdPool` is that
memory for one pool, laid out as the daemon's ``hello_reply`` says:

    with Client(sock) as c, MemfdPool.for_client(c, "kv") as kv:
        kv.register(c)                       # register_memory with the pool's memfd(s)
        kv.item(0, 5)[:] = page_bytes        # K of the first layer, page 5
        ...

- ``per_buffer=False`` (the default): one memfd for the whole pool, each buffer at a
  4096-aligned offset (the daemon's own offsets, which are aligned, so ``Client.item`` offsets
  are offsets into :meth:`MemfdPool.view`);
- ``per_buffer=True``: one memfd per buffer at offset 0, as an engine with one tensor per layer
  holds it.

Every memfd is created with ``MFD_CLOEXEC | MFD_ALLOW_SEALING``, sized, sealed with
``F_SEAL_SHRINK`` (ferryd refuses a descriptor that could shrink under its mapping), and mapped
read-write here. Closing the pool unmaps and closes them; ferryd keeps its own mapping for as
long as the registering connection lives.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence, Union

from .protocol import POOL_KINDS, Buffer, MemoryBuffer, MemoryKind, Pool

if TYPE_CHECKING:
    from .client import Client

PAGE = 4096
"""ferryd's alignment of a buffer's offset in its descriptor."""
F_ADD_SEALS: int = getattr(fcntl, "F_ADD_SEALS", 1033)
F_GET_SEALS: int = getattr(fcntl, "F_GET_SEALS", 1034)
F_SEAL_SHRINK: int = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)


def align_up(n: int, a: int = PAGE) -> int:
    return (n + a - 1) // a * a


def create_memfd(name: str, size: int) -> int:
    """A new memfd of ``size`` bytes, sealed against shrinking; the caller owns the fd."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def seals(fd: int) -> int:
    """The seals of memfd ``fd`` (``F_GET_SEALS``)."""
    return fcntl.fcntl(fd, F_GET_SEALS)


def address_of(buf: Union[mmap.mmap, bytearray, memoryview]) -> int:
    """The address of a writable buffer's first byte in this process (an engine's
    ``data_ptr``)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def configured_state_type(config_yaml: str) -> Optional[str]:
    """``pools.mamba.type`` of ferryd's effective config (the hello's ``config_yaml``, as
    ``ferryd --check-config`` prints it): ``"swa"``, ``"dsa"``, ``"minimax_index_k"``; None
    where it names none (a mamba pool, the default, or a pool its registration describes)."""
    section = sub = ""
    for line in config_yaml.splitlines():
        text = line.split("#")[0].rstrip()
        if not text.strip():
            continue
        if not text.startswith(" "):
            section = text.strip()
            continue
        if section != "pools:":
            continue
        if re.fullmatch(r"  \S.*", text):
            sub = text.strip()
            continue
        m = re.fullmatch(r"    type: *(\w+)", text)
        if m and sub == "mamba:":
            return m.group(1)
    return None


@dataclass(frozen=True)
class MemoryRegion:
    """A mapping of a descriptor in this process: bytes ``[offset, offset + length)`` of ``fd``
    are mapped at ``address``. It lets an engine that knows its buffers by address (SGLang's
    ``kv_data_ptrs``) name them to ferryd as ranges of descriptors."""

    fd: int
    address: int
    length: int
    offset: int = 0

    def contains(self, address: int, length: int) -> bool:
        return self.address <= address and address + length <= self.address + self.length

    def fd_offset(self, address: int) -> int:
        return self.offset + (address - self.address)


class MemfdPool:
    """One pool's memory in memfds, mapped here, with the register_memory table that lends it.

    ``layout`` is the pool as hello_reply describes it (``client.pools[kind]``, or its
    buffers). Attributes: ``kind``, ``buffers`` (the layout), ``fds`` (owned; closed by
    :meth:`close`), ``table`` (the :class:`~ferry.protocol.MemoryBuffer` entries, in layout
    order), ``sizes`` (bytes of each memfd)."""

    def __init__(self, kind: str, layout: Union[Pool, Sequence[Buffer]], *,
                 per_buffer: bool = False, name: Optional[str] = None) -> None:
        if kind == "mamba":
            kind = "state"
        if kind not in POOL_KINDS:
            raise ValueError(f"kind must be one of {', '.join(POOL_KINDS)}, got {kind!r}")
        buffers = tuple(layout.buffers if isinstance(layout, Pool) else layout)
        if not buffers:
            raise ValueError(f"pool {kind} has no buffers (is it present on the daemon?)")
        self.kind = kind
        self.buffers: tuple[Buffer, ...] = buffers
        self.per_buffer = per_buffer
        self.fds: list[int] = []
        self.sizes: list[int] = []
        self.table: list[MemoryBuffer] = []
        self._maps: list[mmap.mmap] = []
        self._place: list[tuple[int, int]] = []  # per buffer: (memfd index, offset in it)
        base = name or f"ferry-{kind}"
        try:
            if per_buffer:
                for i, b in enumerate(buffers):
                    self._add_memfd(f"{base}-{i}", b.item_bytes * b.items)
                    self._place.append((i, 0))
            else:
                offsets = self._offsets(buffers)
                end = max(o + b.item_bytes * b.items for o, b in zip(offsets, buffers))
                self._add_memfd(base, end)
                self._place = [(0, o) for o in offsets]
        except BaseException:
            self.close()
            raise
        self.table = [MemoryBuffer(fd, off, b.item_bytes, b.items, b.layer_id, b.tensor, b.kind)
                      for (fd, off), b in zip(self._place, buffers)]
        self.state_type = "mamba"
        """(a state pool) What :meth:`register` says it holds unless told: the config's
        ``pools.mamba.type`` for a pool made by :meth:`for_client`, else mamba."""

    @classmethod
    def for_client(cls, client: Client, kind: str, *, per_buffer: bool = False,
                   name: Optional[str] = None) -> MemfdPool:
        """The memory of pool ``kind`` of ``client``'s daemon, laid out as its hello_reply
        says."""
        kind = "state" if kind == "mamba" else kind
        pool = client.pools[kind]
        if not pool.present:
            raise ValueError(f"the daemon has no {kind} pool")
        made = cls(kind, pool, per_buffer=per_buffer,
                   name=name or f"ferry-{client.node}-{kind}")
        if kind == "state":
            made.state_type = configured_state_type(client.config_yaml) or "mamba"
        return made

    @staticmethod
    def _offsets(buffers: Sequence[Buffer]) -> list[int]:
        """The layout's offsets when they are 4096-aligned and disjoint (ferryd's are), else
        the buffers packed in order at aligned offsets."""
        given = [b.offset for b in buffers]
        spans = sorted((b.offset, b.offset + b.item_bytes * b.items) for b in buffers)
        if all(o % PAGE == 0 for o in given) and \
                all(a[1] <= b[0] for a, b in zip(spans, spans[1:])):
            return given
        out, at = [], 0
        for b in buffers:
            out.append(at)
            at = align_up(at + b.item_bytes * b.items)
        return out

    def _add_memfd(self, name: str, nbytes: int) -> None:
        size = max(PAGE, align_up(nbytes))
        fd = create_memfd(name, size)
        self.fds.append(fd)
        self.sizes.append(size)
        self._maps.append(mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))

    # --- access --------------------------------------------------------------------------------

    def _check(self, b: int) -> None:
        if not 0 <= b < len(self.buffers):
            raise IndexError(f"pool {self.kind} has {len(self.buffers)} buffers, no buffer {b}")
        if not self._maps:
            raise ValueError(f"the memory of pool {self.kind} was closed")

    def view(self, b: Optional[int] = None) -> memoryview:
        """Buffer ``b`` read-write (all of its items); with no ``b`` and one memfd, the whole
        memfd (the pool's address range as the daemon lays it out)."""
        if b is None:
            if len(self._maps) != 1:
                raise ValueError(f"pool {self.kind} is in {len(self._maps)} memfds; view one "
                                 f"buffer at a time")
            return memoryview(self._maps[0])
        self._check(b)
        m, off = self._place[b]
        buf = self.buffers[b]
        return memoryview(self._maps[m])[off:off + buf.item_bytes * buf.items]

    def item(self, b: int, i: int) -> memoryview:
        """Item ``i`` of buffer ``b`` read-write (a KV page of one layer's K or V, one state
        slot of one tensor and layer, one aux row)."""
        self._check(b)
        buf = self.buffers[b]
        if not 0 <= i < buf.items:
            raise IndexError(f"{self.kind} buffer {b} has {buf.items} items, no item {i}")
        m, off = self._place[b]
        start = off + i * buf.item_bytes
        return memoryview(self._maps[m])[start:start + buf.item_bytes]

    def address(self, b: int) -> int:
        """The address of buffer ``b`` in this process (what SGLang calls its data_ptr)."""
        self._check(b)
        m, off = self._place[b]
        return address_of(self._maps[m]) + off

    def regions(self) -> list[MemoryRegion]:
        """One :class:`MemoryRegion` per memfd (for a table of buffer addresses, e.g.
        :class:`ferry.sglang.FerryKVArgs`)."""
        return [MemoryRegion(fd, address_of(m), size)
                for fd, m, size in zip(self.fds, self._maps, self.sizes)]

    # --- registration ---------------------------------------------------------------------------

    def register(self, client: Client, *, timeout: Optional[float] = None,
                 state_type: Union[str, int, None] = None) -> None:
        """Lend this memory to ``client``'s daemon (register_memory); it stays registered as long
        as that connection. ``state_type`` (v8, a state pool): what it holds, ``"mamba"``
        (slot-indexed) or a page-indexed ``"swa"``, ``"dsa"``, ``"minimax_index_k"``; None:
        :attr:`state_type` (the config's, for a pool made by :meth:`for_client`)."""
        if self.kind != "state":
            state_type = "mamba"
        client.register_memory(self.kind, self.table, self.fds, MemoryKind.HOST, timeout=timeout,
                               state_type=self.state_type if state_type is None else state_type)

    def close(self) -> None:
        """Unmap and close the memfds. A mapping still viewed (a memoryview outstanding) is
        unmapped with its last view. ferryd's own mapping is unaffected."""
        for m in self._maps:
            try:
                m.close()
            except BufferError:
                pass
        self._maps = []
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []

    def __enter__(self) -> MemfdPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<ferry.MemfdPool {self.kind}: {len(self.buffers)} buffers in "
                f"{len(self.sizes)} memfd(s), {sum(self.sizes)} bytes>")


__all__ = ["PAGE", "F_ADD_SEALS", "F_GET_SEALS", "F_SEAL_SHRINK", "align_up", "create_memfd",
           "seals", "address_of", "configured_state_type", "MemoryRegion", "MemfdPool"]
