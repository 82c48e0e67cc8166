"""The SGLang adapter's ``KVArgs`` (see :mod:`ferry.sglang`): an engine rank's buffers under
SGLang's names and order, plus the memfd regions that hold them, which is what
:class:`~ferry.sglang.FerryKVManager` lends to ferryd.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from ..memory import MemfdPool, MemoryRegion
from ..protocol import BufferKind

MAMBA = "mamba"
"""SGLang's ``StateType.MAMBA`` value: a slot-indexed component (one slot per request)."""

PAGED = ("swa", "dsa", "minimax_index_k")
"""SGLang's page-indexed ``StateType`` values Ferry moves (protocol v8): each comes with its own
page list per request (``swa`` the sliding window's pages, ``dsa`` and ``minimax_index_k`` every
page of the request)."""

MOVED = (MAMBA, *PAGED)
"""The ``state_types`` entries Ferry moves, one per rank."""

NOT_MOVED = {
    "swa_ring": "DeepSeek-V4's SWA ring: a row-indexed component whose row lists must match "
                "exactly",
    "c128_state": "DeepSeek-V4's C128 compressor state: a row-indexed component whose row "
                  "lists must match exactly",
}
"""SGLang's other ``StateType`` values, which the adapter refuses at construction, and what
each is (row-indexed: not moved yet)."""

DSA_NEEDS_MLA = "DSA is MLA-only"
"""Why a ``dsa`` component without MLA KV is refused (SGLang registers DSA state for MLA
pools only)."""


@dataclass
class FerryKVArgs:
    """SGLang's ``KVArgs`` with what Ferry needs to lend the memory to ferryd.

    The per-buffer lists keep SGLang's names and order: ``kv_data_ptrs`` K of every layer then
    V (one per layer for MLA), ``state_data_ptrs`` one list per ``state_types`` component,
    tensor-major then layer (a flat list is taken as the one component), ``aux_data_ptrs`` the
    aux buffers (SGLang's MetadataBuffers: one entry per tensor, each its own row size). ``*_lens``
    are the bytes of each buffer (optional: 0 skips the local size check), ``*_item_lens`` the
    bytes of one item (a page of one layer's K or V, a slot of one Mamba tensor and layer, a
    page of one paged state tensor and layer, a row). ``kv_layer_ids`` and ``state_layer_ids``
    (global layer ids) default to ferryd's.

    ``state_types`` names at most one component (:meth:`state_component`): ``mamba``
    (slot-indexed: conv then temporal state, each over the Mamba layers), or a page-indexed
    ``swa`` (SGLang's SWA pool: K over the sliding-window layers, then V over the same layers),
    ``dsa`` (the DSA indexer's K-with-scale buffer of each MLA layer) or ``minimax_index_k``;
    a page-indexed component is registered unsliced (``slice_dim`` 0).

    ``bootstrap_room_ptr``: the address of the aux buffer whose rows start with the room id
    (SGLang's ``MetadataBuffers.bootstrap_room``), so ferryd checks the row before it sends it;
    None: no check.

    The slicing facts keep SGLang's names too: ``kv_head_num`` (KV heads at this rank),
    ``total_kv_head_num``, and per state entry ``state_dim_per_tensor`` (the TP-sliced axis'
    length), ``state_slice_outer_counts`` (dims before it) and ``state_conv_shard_groups`` (full
    group sizes, or None), plus Ferry's ``state_conv_shard_units`` (each group's units, or None:
    the groups ranks hold whole when there are fewer units than TP ranks, as Mamba2's B and C
    with ``n_groups`` below TP; docs/geometry.md). A pool ferryd's config leaves to the
    registration (``memory: client`` and nothing else) is described by them (:meth:`entries`).

    A draft model's K and V buffers (EAGLE, MTP) follow the target's in ``kv_data_ptrs``, as
    SGLang appends them: ``draft_kv_buffers`` says how many there are (K and V together), or,
    when ``kv_layer_ids`` are given, the ids tell (the target's K ids, the same again for V,
    then the draft's twice). Draft layers are their own layer set: ids that collide with the
    target's (attention or Mamba) are moved past them, the same way on both sides.

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
    kv_head_num: int = 0
    total_kv_head_num: int = 0
    state_dim_per_tensor: List[Any] = field(default_factory=list)
    state_slice_outer_counts: List[Any] = field(default_factory=list)
    state_conv_shard_groups: List[Any] = field(default_factory=list)
    state_conv_shard_units: List[Any] = field(default_factory=list)
    draft_kv_buffers: Optional[int] = None
    bootstrap_room_ptr: Optional[int] = None
    pp_rank: int = 0
    system_dp_rank: int = 0
    gpu_id: int = 0
    ib_device: str = ""
    memory_regions: List[MemoryRegion] = field(default_factory=list)

    @classmethod
    def from_memfd_pools(cls, *, kv: Optional[MemfdPool] = None,
                         state: Optional[MemfdPool] = None, aux: Optional[MemfdPool] = None,
                         page_size: int = 1, engine_rank: int = 0, pp_rank: int = 0,
                         state_type: str = MAMBA) -> FerryKVArgs:
        """KVArgs whose buffers are the given pools' (their addresses, sizes, item sizes and
        layer ids), with their memfds as the regions; the state pool as one component of
        ``state_type``."""
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
            a.state_types = [state_type]
            a.state_data_ptrs = [[state.address(i) for i in range(len(state.buffers))]]
            a.state_data_lens = [[b.item_bytes * b.items for b in state.buffers]]
            a.state_item_lens = [[b.item_bytes for b in state.buffers]]
            a.state_layer_ids = [[b.layer_id for b in state.buffers]]
        if aux is not None:
            a.aux_data_ptrs = [aux.address(i) for i in range(len(aux.buffers))]
            a.aux_data_lens = [b.item_bytes * b.items for b in aux.buffers]
            a.aux_item_lens = [b.item_bytes for b in aux.buffers]
            a.bootstrap_room_ptr = aux.address(0)  # ferryd's aux rows start with the room id
        return a

    def state_type_names(self) -> list[str]:
        """``state_types`` as SGLang's values (``"mamba"``, ``"swa"``...), lower case."""
        return [str(getattr(t, "value", t)).lower() for t in self.state_types]

    def state_component(self, mla: Optional[bool] = None) -> Optional[int]:
        """The index of the one state component in ``state_types`` (None: no state component).

        Raises ``ValueError`` naming the types for what Ferry cannot move: an unknown type, a
        row-indexed one (:data:`NOT_MOVED`), two or more components (Ferry has one state pool
        per rank), and, when ``mla`` is False, a ``dsa`` component (DSA is MLA-only)."""
        names = self.state_type_names()
        for n in names:
            if n in MOVED:
                continue
            why = NOT_MOVED.get(n)
            if why is None:
                raise ValueError(f"state_types {names}: unknown state type {n!r} (SGLang's are "
                                 f"{', '.join([*MOVED, *NOT_MOVED])})")
            raise ValueError(f"state_types {names}: Ferry cannot move {n} yet ({why}); Ferry "
                             f"moves one {', '.join(MOVED[:-1])} or {MOVED[-1]} component "
                             f"(docs/integration.md)")
        if len(names) > 1:
            raise ValueError(f"state_types {names}: one state component per rank; got "
                             f"{len(names)} ({', '.join(names)}): Ferry has one state pool "
                             f"(pools.mamba)")
        if names == ["dsa"] and mla is False:
            raise ValueError(f"state_types {names}: a dsa component needs MLA KV, and this "
                             f"backend is not MLA (is_mla_backend false): {DSA_NEEDS_MLA}")
        return 0 if names else None

    def state_type(self) -> Optional[str]:
        """The one state component's type (``"mamba"``, ``"swa"``, ``"dsa"``,
        ``"minimax_index_k"``), or None; raises as :meth:`state_component`."""
        c = self.state_component()
        return None if c is None else self.state_type_names()[c]

    def mamba_component(self) -> Optional[int]:
        """The state component's index (the name before paged components moved); see
        :meth:`state_component`."""
        return self.state_component()

    def _pool_lists(self, kind: str
                    ) -> tuple[list[int], list[int], list[int], Optional[list[int]]]:
        """(ptrs, lens, item_lens, layer_ids) of pool ``kind``."""
        if kind == "kv":  # (SGLang gives [] with a draft model: as good as none)
            return (list(self.kv_data_ptrs), list(self.kv_data_lens), list(self.kv_item_lens),
                    list(self.kv_layer_ids) if self.kv_layer_ids else None)
        if kind == "aux":
            return list(self.aux_data_ptrs), list(self.aux_data_lens), \
                list(self.aux_item_lens), None

        def component(given: Any) -> list[int]:
            lists: list[Any] = list(given or [])
            if lists and isinstance(lists[0], (list, tuple)):  # per component
                c = self.state_component()
                return list(lists[c]) if c is not None and c < len(lists) else []
            return lists  # the flat, pre-component format
        layers = None if self.state_layer_ids is None else component(self.state_layer_ids)
        return (component(self.state_data_ptrs), component(self.state_data_lens),
                component(self.state_item_lens), layers)


    # --- the pools a registration describes ---------------------------------------------------

    def entries(self, kind: str, mla: bool = False) -> list[Entry]:
        """Every buffer of pool ``kind`` as the registration lists it (ferryd's order: K of
        every layer then V, draft layers after the target's within each half; state
        tensor-major then layer; aux in SGLang's order), each with its slicing facts."""
        ptrs, lens, item_lens, layer_ids = self._pool_lists(kind)
        if len(item_lens) != len(ptrs):
            raise ValueError(f"pool {kind}: the KVArgs give {len(item_lens)} item sizes for "
                             f"{len(ptrs)} buffers")
        lens = [int(x) for x in lens] + [0] * (len(ptrs) - len(lens))
        if kind == "kv":
            return self._kv_entries(ptrs, lens, item_lens, layer_ids, mla)
        if kind == "aux":
            return [Entry(int(p), int(i), n, 0, 0, BufferKind.AUX)
                    for p, i, n in zip(ptrs, item_lens, lens)]
        return self._state_entries(ptrs, lens, item_lens, layer_ids)

    def draft_split(self, n: int, layer_ids: Optional[list[int]]) -> int:
        """How many of the ``n`` KV buffers are the target's (the rest are a draft model's)."""
        if self.draft_kv_buffers is not None:
            d = int(self.draft_kv_buffers)
            if d < 0 or d % 2 or d > n:
                raise ValueError(f"draft_kv_buffers {d}: expected an even count of at most "
                                 f"the {n} KV buffers")
            return n - d
        if not layer_ids or n % 2:
            return n
        half = layer_ids.index(layer_ids[0], 1) if layer_ids[0] in layer_ids[1:] else n // 2
        target = 2 * half
        if layer_ids[half:target] != layer_ids[:half]:
            return n  # not K-then-V by ids: ferryd names what is wrong
        rest = layer_ids[target:]
        if rest and (len(rest) % 2 or rest[:len(rest) // 2] != rest[len(rest) // 2:]):
            raise ValueError(f"pool kv: kv_layer_ids {layer_ids}: after the target's {target} buffers "
                             f"(K then V of layers {layer_ids[:half]}) come {len(rest)} that "
                             f"are not a draft model's K then V of the same layers")
        return target

    def _kv_entries(self, ptrs: list[int], lens: list[int], item_lens: list[int],
                    layer_ids: Optional[list[int]], mla: bool) -> list[Entry]:
        n = len(ptrs)
        ids: list[Optional[int]] = list(layer_ids) if layer_ids is not None else [None] * n
        if mla:
            return [Entry(int(p), int(i), m, lid, 0, BufferKind.KV, 1, 0)
                    for p, i, m, lid in zip(ptrs, item_lens, lens, ids)]
        target = self.draft_split(n, layer_ids)
        th, dh = target // 2, (n - target) // 2
        if layer_ids is not None and dh:
            state_ids = self._pool_lists("state")[3] or []
            taken = {int(x) for x in ids[:th] if x is not None} | {int(x) for x in state_ids}
            draft = ids[target:target + dh]
            if taken & set(draft):  # a draft of its own layer set, the same on both sides
                top = max(taken) + 1
                moved = [top + j for j in range(dh)]
                ids[target:] = moved + moved
        order = list(range(th)) + list(range(target, target + dh)) + \
            list(range(th, target)) + list(range(target + dh, n))
        out = []
        for pos, i in enumerate(order):
            k = BufferKind.K if pos < th + dh else BufferKind.V
            out.append(Entry(int(ptrs[i]), int(item_lens[i]), lens[i], ids[i], 0, k,
                             int(self.kv_head_num), int(self.total_kv_head_num)))
        return out

    def _state_entries(self, ptrs: list[int], lens: list[int], item_lens: list[int],
                       layer_ids: Optional[list[int]]) -> list[Entry]:
        def facts(given: Any, nested: bool = False) -> list[Any]:
            """The state component's entries of a per-component list (SGLang's format), or the
            list itself (the flat, pre-component format). ``nested``: entries are lists."""
            lists: list[Any] = list(given or [])
            first = lists[0] if lists else None
            per_component = isinstance(first, (list, tuple)) and (
                not nested or not first or first[0] is None or
                isinstance(first[0], (list, tuple)))
            if per_component:
                c = self.state_component()
                return list(lists[c]) if c is not None and c < len(lists) else []
            return lists
        if self.state_type() in PAGED:  # pages of replicated tensors: not sliced (slice_dim 0)
            dims: list[Any] = []
            outers: list[Any] = []
            groups: list[Any] = []
            units: list[Any] = []
        else:
            dims = facts(self.state_dim_per_tensor)
            outers = facts(self.state_slice_outer_counts)
            groups = facts(self.state_conv_shard_groups, nested=True)
            units = facts(self.state_conv_shard_units, nested=True)
        layers = len(set(layer_ids)) if layer_ids else 0
        out = []
        for i, (p, item, n) in enumerate(zip(ptrs, item_lens, lens)):
            g = groups[i] if i < len(groups) else None
            u = units[i] if i < len(units) else None
            out.append(Entry(int(p), int(item), n, None if layer_ids is None else layer_ids[i],
                             i // layers if layers else 0, BufferKind.STATE,
                             int(dims[i]) if i < len(dims) and dims[i] else 0, 0,
                             int(outers[i]) if i < len(outers) and outers[i] else 0,
                             tuple(int(x) for x in g) if g else (),
                             tuple(int(x) for x in u) if u else ()))
        return out


@dataclass
class Entry:
    """One buffer as a registration lists it: its address, item size, length in bytes (0:
    unknown), layer id (None: unknown), tensor index, kind and slicing facts."""

    ptr: int
    item_len: int
    length: int
    layer_id: Optional[int]
    tensor: int
    kind: int
    slice_dim: int = 0
    total_dim: int = 0
    outer: int = 0
    groups: tuple = ()
    units: tuple = ()


__all__ = ["MAMBA", "PAGED", "MOVED", "NOT_MOVED", "DSA_NEEDS_MLA", "FerryKVArgs", "Entry"]
