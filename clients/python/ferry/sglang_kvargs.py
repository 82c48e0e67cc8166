"""The SGLang adapter's ``KVArgs`` (see :mod:`ferry.sglang`): an engine rank's buffers under
SGLang's names and order, plus the memfd regions that hold them, which is what
:class:`~ferry.sglang.FerryKVManager` lends to ferryd.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from .memory import MemfdPool, MemoryRegion

MAMBA = "mamba"
"""The one ``state_types`` entry Ferry moves (SGLang's ``StateType.MAMBA`` value)."""


@dataclass
class FerryKVArgs:
    """SGLang's ``KVArgs`` with what Ferry needs to lend the memory to ferryd.

    The per-buffer lists keep SGLang's names and order: ``kv_data_ptrs`` K of every layer then
    V (one per layer for MLA), ``state_data_ptrs`` one list per ``state_types`` component,
    tensor-major then layer (a flat list is taken as the Mamba component), ``aux_data_ptrs`` the
    aux buffers (ferryd's aux pool is one buffer of ``row_bytes`` rows: one entry). ``*_lens``
    are the bytes of each buffer (optional: 0 skips the local size check), ``*_item_lens`` the
    bytes of one item (a page of one layer's K or V, a slot of one state tensor and layer, a
    row). ``kv_layer_ids`` and ``state_layer_ids`` (global layer ids) default to ferryd's.

    For Ferry: ``memory_regions`` are the memfd mappings that hold those buffers (each pointer
    is lent as a range of the memfd whose mapping contains it); :meth:`from_memfd_pools` fills
    pointers and regions from :class:`~ferry.memory.MemfdPool` objects."""

    engine_rank: int = 0
    kv_data_ptrs: List[int] = field(default_factory=list)
    kv_data_lens: List[int] = field(default_factory=list)
    kv_item_lens: List[int] = field(default_factory=list)
    kv_layer_ids: Optional[List[int]] = None
    aux_data_ptrs: List[int] = field(default_factory=list)
    aux_data_lens: List[int] = field(default_factory=list)
    aux_item_lens: List[int] = field(default_factory=list)
    state_types: List[str] = field(default_factory=list)
    state_data_ptrs: List[Any] = field(default_factory=list)
    state_data_lens: List[Any] = field(default_factory=list)
    state_item_lens: List[Any] = field(default_factory=list)
    state_layer_ids: Optional[List[Any]] = None
    page_size: int = 1
    pp_rank: int = 0
    system_dp_rank: int = 0
    gpu_id: int = 0
    ib_device: str = ""
    memory_regions: List[MemoryRegion] = field(default_factory=list)

    @classmethod
    def from_memfd_pools(cls, *, kv: Optional[MemfdPool] = None,
                         state: Optional[MemfdPool] = None, aux: Optional[MemfdPool] = None,
                         page_size: int = 1, engine_rank: int = 0, pp_rank: int = 0
                         ) -> FerryKVArgs:
        """KVArgs whose buffers are the given pools' (their addresses, sizes, item sizes and
        layer ids), with their memfds as the regions."""
        a = cls(engine_rank=engine_rank, page_size=page_size, pp_rank=pp_rank)
        for pool in (kv, state, aux):
            if pool is not None:
                a.memory_regions.extend(pool.regions())
        if kv is not None:
            a.kv_data_ptrs = [kv.address(i) for i in range(len(kv.buffers))]
            a.kv_data_lens = [b.item_bytes * b.items for b in kv.buffers]
            a.kv_item_lens = [b.item_bytes for b in kv.buffers]
            a.kv_layer_ids = [b.layer_id for b in kv.buffers]
        if state is not None:
            a.state_types = [MAMBA]
            a.state_data_ptrs = [[state.address(i) for i in range(len(state.buffers))]]
            a.state_data_lens = [[b.item_bytes * b.items for b in state.buffers]]
            a.state_item_lens = [[b.item_bytes for b in state.buffers]]
            a.state_layer_ids = [[b.layer_id for b in state.buffers]]
        if aux is not None:
            a.aux_data_ptrs = [aux.address(i) for i in range(len(aux.buffers))]
            a.aux_data_lens = [b.item_bytes * b.items for b in aux.buffers]
            a.aux_item_lens = [b.item_bytes for b in aux.buffers]
        return a

    def mamba_component(self) -> Optional[int]:
        """The index of the Mamba entry in ``state_types`` (None: no state component)."""
        names = [getattr(t, "value", t) for t in self.state_types]
        others = [n for n in names if n != MAMBA]
        if others:
            raise ValueError(f"state_types {names}: Ferry moves Mamba state only (one "
                             f"pools.mamba), not {', '.join(map(str, others))}")
        if len(names) > 1:
            raise ValueError(f"state_types {names}: at most one Mamba component")
        return 0 if names else None

    def _pool_lists(self, kind: str
                    ) -> tuple[list[int], list[int], list[int], Optional[list[int]]]:
        """(ptrs, lens, item_lens, layer_ids) of pool ``kind``."""
        if kind == "kv":
            return (list(self.kv_data_ptrs), list(self.kv_data_lens), list(self.kv_item_lens),
                    None if self.kv_layer_ids is None else list(self.kv_layer_ids))
        if kind == "aux":
            return list(self.aux_data_ptrs), list(self.aux_data_lens), \
                list(self.aux_item_lens), None

        def component(given: Any) -> list[int]:
            lists: list[Any] = list(given or [])
            if lists and isinstance(lists[0], (list, tuple)):  # per component
                c = self.mamba_component()
                return list(lists[c]) if c is not None and c < len(lists) else []
            return lists  # the flat, pre-component format
        layers = None if self.state_layer_ids is None else component(self.state_layer_ids)
        return (component(self.state_data_ptrs), component(self.state_data_lens),
                component(self.state_item_lens), layers)


__all__ = ["MAMBA", "FerryKVArgs"]
