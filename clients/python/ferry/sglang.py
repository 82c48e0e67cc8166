"""An SGLang-shaped adapter over Ferry: SGLang's disaggregation connector names and call order
(``python/sglang/srt/disaggregation/base/conn.py``), each call mapped onto the local ferryd.

One :class:`FerryKVManager` per engine rank holds one :class:`~ferry.client.Client` to that
rank's ferryd and, at construction, lends it the engine's memory for every pool the daemon's
config marks ``memory: client`` (register_memory). Per request (``bootstrap_room``):

===============================================  ================================================
SGLang (decode side)                             Ferry
===============================================  ================================================
``KVReceiver(mgr, bootstrap_addr, room)``        local only; :meth:`~FerryKVReceiver.poll` says
                                                 Bootstrapping
``receiver.init(prefill_dp_rank)``               :class:`FerryBootstrap` names the control
                                                 addresses of every rank of the prefill
                                                 instance; WaitingForInput (local)
``receiver.send_metadata(page_indices,           **one** ``prepare(room, those addresses,
aux_index, state_indices, decode_prefix_len)``   dst_pages=page_indices, state_slot, aux_row,
                                                 prefix_tokens=decode_prefix_len)``;
                                                 ferryd picks the ranks the geometry needs
``receiver.poll()``                              ``poll`` (or :func:`poll_all`: ``poll_many``)
``receiver.abort()``                             ``cancel``, then wait until ferryd reports the
                                                 room terminal (its writes drained)
===============================================  ================================================

===============================================  ================================================
SGLang (prefill side)                            Ferry
===============================================  ================================================
``KVSender(mgr, bootstrap_addr, room,            local only; :meth:`~FerryKVSender.poll` asks
dest_tp_ranks, pp_rank)``                        ferryd, which answers Bootstrapping until the
                                                 decode's prepare arrived, then WaitingForInput
``sender.pop_decode_prefix_len()``               the decode's ``decode_prefix_len`` for this
                                                 room: the ``prefix_tokens`` of the last poll
``sender.init(num_pages, aux_index)``            local: the pages the room will send, its aux row
``sender.send(page_indices, state_indices)``     one ``send`` per chunk; the chunk that brings
                                                 the pages sent to ``num_pages`` is the last one
                                                 (``last=1``, with the state slot and aux row);
                                                 a last chunk may have zero pages: then it is
                                                 the one with ``state_indices`` (or
                                                 ``last_chunk=True``)
``sender.poll()`` / ``abort()``                  ``poll`` / ``cancel``
===============================================  ================================================

``failure_exception()`` raises :class:`FerryKVTransferError` (a :class:`~ferry.errors.FerryError`
whose ``code`` is ferryd's error code, e.g. 302 ``peer_lost``), as SGLang's ``KVTransferError``
carries ``bootstrap_room``, ``failure_reason`` and ``is_from_another_rank``. ``poll()`` returns
:class:`KVPoll` values (SGLang's numbers: Failed 0 .. Success 4). An error ferryd answers to a
request (``prepare``, ``send``) or a local rule broken by one request fails **that** request only:
its ``poll()`` turns Failed, its ``failure_exception()`` raises the reason and code; other
requests, and the manager, go on.

**state_indices.** SGLang passes, on the last chunk and in ``send_metadata``, one entry per state
component of ``KVArgs.state_types`` (``[[slot]]`` for a model whose only component is Mamba);
the Mamba entry is a list holding exactly one index. Ferry has one state pool (``pools.mamba``)
and one slot per request on the wire (``state_slot``), so that entry must have exactly one
element, which is what goes on the wire as the scalar slot. Any other length, or no entry
(``None``) while ferryd has a state pool, fails the request alone with SGLang's words
``PD state transfer failed: mamba requires single state index, got src=N, dst=M``. Each side
sees only its own indices: the prefill names its count as ``src`` and the decode its count as
``dst``, and the other side's count is given as 1, which is what any request that reaches the
wire carries (each side refuses anything else before it leaves, and ferryd refuses a prepare
without exactly one slot). A flat ``[slot]`` (SGLang's format before the per-component lists)
is taken as the Mamba entry. Non-last chunks carry no state (their ``state_indices`` are
ignored, as SGLang passes None there).

**decode_prefix_len.** SGLang's decode may already hold a prefix of the prompt (its radix cache);
it allocates and names only the pages of tokens ``[decode_prefix_len, len(prompt))`` and tells
the prefill ``decode_prefix_len``, whose scheduler, on WaitingForInput, calls
``pop_decode_prefix_len()``, sets ``start_send_idx`` to it and computes ``num_pages`` from the
rest before ``sender.init``: the prefix's pages are never sent. In Ferry the decode's ``prepare``
carries exactly that page list (``dst_pages`` = ``page_indices``, the pages after the prefix),
and the prefill's chunks fill it by position, so the only thing the prefill engine must learn is
the number. It travels with the room: :meth:`FerryKVReceiver.send_metadata` puts it in the
prepare (``prefix_tokens``, protocol v4), the decode's ferryd hands it to every prefill rank
with its part of the prepare, and a prefill ferryd answers it in every poll from WaitingForInput
on, which is when SGLang's scheduler calls :meth:`FerryKVSender.pop_decode_prefix_len`. No store
is shared between the engines. (Should a prefill engine send from token 0 anyway, ferryd refuses
the chunk that goes beyond the decode's page list: the request fails, nothing is written out of
place; decode ranks of one room that name different prefixes fail it too.)
``decode_prefix_len`` must be a multiple of the page size (ferryd's ``page_tokens``), as a
radix-cache match on pages is.

**Bootstrap.** What SGLang's bootstrap server provides (the prefill instance's rank addresses,
and whether its ranks are ready) sits behind :class:`FerryBootstrap`: a table (or a callable) of
every prefill rank's control address per bootstrap address, or, with ``discover=True``, one
seed address per instance and ferryd's ``discover`` for the rest.
"""

from __future__ import annotations

import operator
import threading
import time
from dataclasses import dataclass, field
from typing import (Any, Callable, Iterable, List, Mapping, MutableMapping, Optional, Sequence,
                    Union)

from .client import Client
from .errors import Errc, FerryError
from .memory import MemfdPool, MemoryRegion
from .protocol import POOL_KINDS, MemoryBuffer, MemoryKind, PollResult, Status

KVPoll = Status
"""SGLang's ``KVPoll``: Failed 0, Bootstrapping 1, WaitingForInput 2, Transferring 3,
Success 4 (``KVPoll.Failed`` etc. are ints)."""

MAMBA = "mamba"
"""The one ``state_types`` entry Ferry moves (SGLang's ``StateType.MAMBA`` value)."""

ABORTED = "Aborted by AbortReq."
"""SGLang's failure reason of an aborted request."""
FROM_ANOTHER_RANK = "Failed due to an unknown reason from another rank"
"""SGLang's reason when this rank saw no failure but another rank did."""


class FerryKVTransferError(FerryError):
    """A failed request, as SGLang's ``KVTransferError``: ``bootstrap_room``, ``failure_reason``,
    ``is_from_another_rank``, plus ferryd's error ``code`` (an :class:`Errc`)."""

    def __init__(self, bootstrap_room: int, failure_reason: str, code: int = Errc.INTERNAL,
                 is_from_another_rank: bool = False) -> None:
        super().__init__(code, failure_reason)
        self.bootstrap_room = bootstrap_room
        self.failure_reason = failure_reason
        self.is_from_another_rank = is_from_another_rank

    def __str__(self) -> str:
        return (f"KVTransferError(bootstrap_room={self.bootstrap_room}): "
                f"[{int(self.code)}] {self.failure_reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (FerryKVTransferError, (self.bootstrap_room, self.failure_reason, int(self.code),
                                       self.is_from_another_rank))


# --------------------------------------------------------------------------------------------
# Bootstrap


PrefillRanks = Union[Mapping[str, Sequence[str]], Callable[[str, int], Sequence[str]]]


class FerryBootstrap:
    """Where a decode rank learns about a prefill instance, in place of SGLang's bootstrap
    server.

    ``prefill_ranks``: a dict from a bootstrap address (what SGLang's requests carry as
    ``bootstrap_host:bootstrap_port``) to the ``"host:port"`` control addresses of every rank of
    that prefill instance's ferryds, or a callable ``(bootstrap_addr, prefill_dp_rank) ->
    addresses``. Naming every rank is fine: ferryd uses the ranks the geometry needs.

    With ``discover=True`` the addresses given are seeds instead: the decode's ferryd is asked
    (protocol v4 ``discover``) for every rank of the instance behind the first seed that
    answers, as the prefill daemons' ``discovery.instance_ranks`` list them, and the ranks that
    are up in the request's attention DP group (``prefill_dp_rank``; the ranks' ``dp.rank``) are
    named. Answers are kept ``discover_ttl`` seconds per bootstrap address.

    ``ready``: where prefill ranks say their memory is registered (SGLang's
    ``register_to_bootstrap``), any mutable mapping both sides reach (a dict when both run in
    one process, a ``multiprocessing.Manager`` dict, a key-value store), keyed by the rank's
    control address. With it, a decode's
    :meth:`FerryKVManager.try_ensure_parallel_info` answers False until every named rank is
    there, as SGLang's decode waits for a prefill to register with its bootstrap server (a
    prepare reaching a ferryd whose engine has not lent its memory yet fails with
    ``peer_unreachable``). Without it readiness is not tracked. Discovery needs no store: a rank
    whose memory is not registered refuses the handshake and is reported down."""

    def __init__(self, prefill_ranks: PrefillRanks, *, discover: bool = False,
                 discover_ttl: float = 30.0,
                 ready: Optional[MutableMapping[str, Any]] = None) -> None:
        self._ranks = prefill_ranks
        self._ready = ready
        self.discover = discover
        self.discover_ttl = discover_ttl
        self._discovered: dict[tuple[str, int], tuple[float, list[str]]] = {}
        self._lock = threading.Lock()

    def prefill_peers(self, bootstrap_addr: str, prefill_dp_rank: int = 0,
                      client: Optional[Client] = None) -> list[str]:
        """The control addresses of the prefill instance at ``bootstrap_addr``; raises
        ``LookupError`` naming the address when there are none. ``client`` (the asking rank's)
        serves discovery."""
        seeds = self._given(bootstrap_addr, prefill_dp_rank)
        if not self.discover:
            return seeds
        key = (bootstrap_addr, prefill_dp_rank)
        with self._lock:
            hit = self._discovered.get(key)
        if hit is not None and time.monotonic() - hit[0] < self.discover_ttl:
            return list(hit[1])
        if client is None:
            raise LookupError("discovery needs the asking rank's ferry client")
        why: list[str] = []
        for seed in seeds:
            try:
                ranks = client.discover(seed)
            except FerryError as e:
                why.append(f"{seed}: {e.message}")
                continue
            alive = [r for r in ranks if r.up]
            # With attention DP a room's KV lives in one group: name that group's ranks only.
            up = [r.address for r in alive if r.dp_rank == prefill_dp_rank]
            if up:
                with self._lock:
                    self._discovered[key] = (time.monotonic(), up)
                return up
            if alive:
                groups = sorted({f"{r.dp_rank} of {r.dp_size}" for r in alive})
                why.append(f"{seed}: no rank up in DP group {prefill_dp_rank} (up: DP "
                           f"{', '.join(groups)})")
                continue
            why.append("; ".join(f"{r.address}: {r.reason}" for r in ranks) or f"{seed}: no ranks")
        raise LookupError(f"no prefill rank of bootstrap_addr {bootstrap_addr} is up ("
                          f"{'; '.join(why)})")

    def mark_ready(self, control: str) -> None:
        """A prefill rank (its ferryd's control address) has lent its memory and takes
        prepares."""
        if self._ready is not None:
            self._ready[control] = True

    def unready(self, peers: Sequence[str]) -> list[str]:
        """Those of ``peers`` that have not said they are ready (none when not tracked)."""
        if self._ready is None:
            return []
        return [p for p in peers if p not in self._ready]

    def forget_ranks(self, bootstrap_addr: str) -> None:
        """Drop what discovery learned about ``bootstrap_addr`` (asked again at next use)."""
        with self._lock:
            for key in [k for k in self._discovered if k[0] == bootstrap_addr]:
                del self._discovered[key]

    def _given(self, bootstrap_addr: str, prefill_dp_rank: int) -> list[str]:
        found: Union[Sequence[str], str, None]
        if callable(self._ranks):
            found = self._ranks(bootstrap_addr, prefill_dp_rank)
        else:
            found = self._ranks.get(bootstrap_addr)
        peers = [found] if isinstance(found, str) else list(found or [])
        if not peers:
            raise LookupError(f"no prefill ranks are known for bootstrap_addr {bootstrap_addr}")
        return peers


# --------------------------------------------------------------------------------------------
# KVArgs and the manager


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


def _mode_name(mode: Any) -> str:
    name = str(getattr(mode, "value", mode)).lower()
    if name not in ("prefill", "decode"):
        raise ValueError(f"disaggregation_mode must be prefill or decode, got {mode!r}")
    return name


class FerryKVManager:
    """One engine rank's link to its local ferryd (SGLang's ``KVManager``).

    Connects to ``socket_path`` (v4) and registers, for every pool the daemon marks ``memory:
    client``, the engine's buffers from ``args`` (register_memory), before any request. A
    daemon that is still releasing an earlier registration of the pool (``pool kv is still
    being released``) is asked again until ``register_timeout`` seconds passed. Raises
    :class:`FerryError` when the memory is refused; the message names the buffer.

    ``bootstrap`` (a :class:`FerryBootstrap`) is needed by receivers, and by senders for
    ``pop_decode_prefix_len``. ``drain_timeout`` bounds how long ``abort()`` and
    ``failure_exception()`` wait for ferryd to report a cancelled room terminal (after which
    its pages, slot and row may be reused). Pass ``client`` to use a connected client instead
    of ``socket_path``."""

    def __init__(self, args: FerryKVArgs, disaggregation_mode: Any, server_args: Any = None,
                 is_mla_backend: bool = False, *, socket_path: Optional[str] = None,
                 bootstrap: Optional[FerryBootstrap] = None, client: Optional[Client] = None,
                 name: Optional[str] = None, timeout: Optional[float] = 30.0,
                 register_timeout: float = 30.0, drain_timeout: float = 10.0) -> None:
        self.kv_args = args
        self.disaggregation_mode = _mode_name(disaggregation_mode)
        self.server_args = server_args
        self.is_mla_backend = is_mla_backend
        self.bootstrap = bootstrap
        self.drain_timeout = drain_timeout
        self.mamba_component = args.mamba_component()
        own = client is None
        if client is None:
            if socket_path is None:
                raise ValueError("FerryKVManager needs socket_path (the local ferryd's client "
                                 "socket) or a client")
            client = Client(socket_path, name=name or f"sglang-{self.disaggregation_mode}-"
                                                      f"{args.engine_rank}", timeout=timeout)
        self.client = client
        try:
            if client.version < 4:
                raise FerryError(Errc.UNSUPPORTED_VERSION,
                                 f"the SGLang adapter needs protocol version 4; ferryd at "
                                 f"{client.socket_path} speaks {client.daemon_versions[0]}.."
                                 f"{client.daemon_versions[1]}")
            roles = {"prefill": ("prefill", "both"), "decode": ("decode", "both")}
            if client.role not in roles[self.disaggregation_mode]:
                raise FerryError(Errc.WRONG_ROLE,
                                 f"a {self.disaggregation_mode} engine rank needs a ferryd whose "
                                 f"role is {self.disaggregation_mode} or both; the one at "
                                 f"{client.socket_path} is {client.role}")
            self.page_size = client.page_tokens or args.page_size
            self.has_state = client.pools["state"].present
            self.has_aux = client.pools["aux"].present
            if self.has_state and self.mamba_component is None:
                raise FerryError(Errc.INVALID_REQUEST,
                                 f"ferryd at {client.socket_path} has a state pool (pools.mamba), "
                                 f"but the KVArgs' state_types name no mamba component")
            if not self.has_state and self.mamba_component is not None:
                raise FerryError(Errc.INVALID_REQUEST,
                                 f"the KVArgs' state_types name a mamba component, but ferryd at "
                                 f"{client.socket_path} has no state pool (pools.mamba)")
            self.registered: list[str] = []
            # Every table first: a KVArgs that does not fit lends nothing.
            tables = {kind: self.memory_table(kind) for kind in POOL_KINDS
                      if client.pools[kind].present and not client.pools[kind].shm_name}
            for kind, (table, fds) in tables.items():
                self._register(kind, table, fds, register_timeout)
                self.registered.append(kind)
            self.register_to_bootstrap()
        except BaseException:
            if own:
                client.close()
            raise

    # --- registration ---------------------------------------------------------------------------

    def memory_table(self, kind: str) -> tuple[list[MemoryBuffer], list[int]]:
        """The register_memory table and descriptors of pool ``kind``, from the KVArgs: every
        buffer as a range of the memfd whose mapping holds its pointer; item sizes from the
        KVArgs, item counts, tensor ids and kinds from ferryd's layout."""
        layout = self.client.pools[kind].buffers
        ptrs, lens, item_lens, layer_ids = self.kv_args._pool_lists(kind)
        label = {"kv": "kv_data_ptrs", "state": "state_data_ptrs", "aux": "aux_data_ptrs"}[kind]
        if len(ptrs) != len(layout):
            raise FerryError(Errc.INVALID_REQUEST,
                             f"pool {kind}: the KVArgs list {len(ptrs)} buffers ({label}), "
                             f"ferryd's pool has {len(layout)} (pools.{kind}.memory: client; "
                             f"see the hello_reply's layout)")
        if len(item_lens) != len(ptrs):
            raise FerryError(Errc.INVALID_REQUEST,
                             f"pool {kind}: the KVArgs give {len(item_lens)} item sizes for "
                             f"{len(ptrs)} buffers")
        fds: list[int] = []
        table: list[MemoryBuffer] = []
        for i, (ptr, item_len, want) in enumerate(zip(ptrs, item_lens, layout)):
            length = int(item_len) * want.items
            # (an item size that differs from ferryd's is for ferryd to name: it knows why)
            if int(item_len) == want.item_bytes and i < len(lens) and lens[i] and \
                    int(lens[i]) < length:
                field_name = label.replace("ptrs", "lens")
                raise FerryError(Errc.INVALID_REQUEST,
                                 f"pool {kind}: buffer {i} holds {int(lens[i])} bytes "
                                 f"({field_name}[{i}]), fewer than ferryd's pool needs there: "
                                 f"{want.items} items of {want.item_bytes} bytes")
            region = next((r for r in self.kv_args.memory_regions
                           if r.contains(int(ptr), max(1, length))), None)
            if region is None:
                region = next((r for r in self.kv_args.memory_regions
                               if r.contains(int(ptr), 1)), None)
            if region is None:
                raise FerryError(Errc.INVALID_REQUEST,
                                 f"pool {kind}: buffer {i} (address {int(ptr):#x}) lies in no "
                                 f"memory region of the KVArgs: lend memory mapped from a memfd "
                                 f"(memory_regions)")
            if region.fd not in fds:
                fds.append(region.fd)
            layer = want.layer_id if layer_ids is None or i >= len(layer_ids) else \
                int(layer_ids[i])
            table.append(MemoryBuffer(fds.index(region.fd), region.fd_offset(int(ptr)),
                                      int(item_len), want.items, layer, want.tensor, want.kind))
        return table, fds

    def _register(self, kind: str, table: list[MemoryBuffer], fds: list[int],
                  register_timeout: float) -> None:
        deadline = time.monotonic() + register_timeout
        while True:
            try:
                self.client.register_memory(kind, table, fds, MemoryKind.HOST)
                return
            except FerryError as e:
                if "is still being released" not in e.message or \
                        time.monotonic() >= deadline:
                    raise
            time.sleep(0.05)

    def register_to_bootstrap(self) -> None:
        """SGLang's prefill registration with its bootstrap server: once this rank's memory is
        lent (the constructor did it), say so in the bootstrap's ``ready`` store under its
        ferryd's control address. The constructor of a prefill manager calls it."""
        if self.disaggregation_mode == "prefill" and self.bootstrap is not None:
            self.bootstrap.mark_ready(self.client.control)

    def try_ensure_parallel_info(self, bootstrap_addr: str, prefill_dp_rank: int = 0) -> bool:
        """Decode side, as SGLang's: whether the prefill instance at ``bootstrap_addr`` is ready
        for prepares (every rank named has registered, when the bootstrap tracks it; with
        discovery, at least one rank answers). A scheduler keeps the request waiting while this
        is False; an address that names no rank raises ``LookupError``."""
        if self.bootstrap is None:
            raise LookupError("a decode manager needs a FerryBootstrap")
        try:
            peers = self.bootstrap.prefill_peers(bootstrap_addr, prefill_dp_rank, self.client)
        except LookupError:
            if self.bootstrap.discover:
                return False  # no rank up yet: asked again on the next call
            raise
        return not self.bootstrap.unready(peers)

    # --- helpers for senders and receivers ------------------------------------------------------

    def state_slot(self, state_indices: Any, side: str) -> Optional[int]:
        """The scalar slot of ``state_indices`` (module docstring), or None without a state
        pool. Raises :class:`_RequestFailed` with SGLang's text when the Mamba entry does not
        hold exactly one index."""
        if not self.has_state:
            if _entries(state_indices):
                raise _RequestFailed(Errc.INVALID_REQUEST,
                                     "state_indices were given, but this ferryd has no state "
                                     "pool (pools.mamba)")
            return None
        entry = _mamba_entry(state_indices, self.mamba_component, len(self.kv_args.state_types))
        n = 0 if entry is None else len(entry)
        if n != 1:
            src, dst = (n, 1) if side == "src" else (1, n)
            raise _RequestFailed(Errc.INVALID_REQUEST,
                                 f"PD state transfer failed: mamba requires single state index, "
                                 f"got src={src}, dst={dst}")
        assert entry is not None
        slot = _as_index(entry[0])
        if slot is None or slot < 0:
            raise _RequestFailed(Errc.INVALID_REQUEST,
                                 f"PD state transfer failed: state index {entry[0]!r} is not a "
                                 f"slot number")
        return slot

    def close(self) -> None:
        """Close the connection: ferryd cancels this rank's rooms and releases the lent memory
        (after which the pools can be registered again, e.g. by a new manager)."""
        self.client.close()

    def __enter__(self) -> FerryKVManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RequestFailed(Exception):
    """One request's failure found locally: its code and reason."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _as_index(v: Any) -> Optional[int]:
    try:
        return operator.index(v)
    except TypeError:
        pass
    try:  # a one-element array
        f = float(v)
        return int(f) if f.is_integer() else None
    except (TypeError, ValueError):
        return None


def _is_sequence(v: Any) -> bool:
    if isinstance(v, (str, bytes)):
        return False
    try:
        len(v)
        return True
    except TypeError:  # ints, numpy 0-d arrays
        return False


def _entries(state_indices: Any) -> int:
    """How many state indices a request names at all (any component)."""
    if state_indices is None:
        return 0
    items = list(state_indices)
    if items and all(_is_sequence(x) or x is None for x in items):
        return sum(len(x) for x in items if x is not None)
    return len(items)


def _mamba_entry(state_indices: Any, component: Optional[int], n_types: int
                 ) -> Optional[list[Any]]:
    """The Mamba component's indices: ``state_indices[component]`` of the per-component form,
    or the flat list itself."""
    if state_indices is None:
        return None
    items = list(state_indices)
    if not items:
        return []
    if all(_is_sequence(x) or x is None for x in items):  # one entry per component
        if n_types and len(items) != n_types:
            raise _RequestFailed(Errc.INVALID_REQUEST,
                                 f"PD state transfer failed: state_indices has {len(items)} "
                                 f"components, the KVArgs' state_types {n_types}")
        entry = items[component if component is not None else 0]
        return None if entry is None else list(entry)
    return items  # the flat format: the Mamba indices themselves


# --------------------------------------------------------------------------------------------
# Senders and receivers


@dataclass
class FerryTransferMetric:
    """SGLang's ``KVTransferMetric``: latencies are not measured here (None)."""

    transfer_latency_s: Optional[float] = None
    alloc_latency_s: Optional[float] = None
    transfer_total_bytes: Optional[int] = None


class _FerryRoom:
    """What senders and receivers share: the room's status as ferryd reports it, a local
    failure, and the terminal status once seen."""

    _local_status: Status

    def __init__(self, mgr: FerryKVManager, bootstrap_addr: str,
                 bootstrap_room: Optional[int]) -> None:
        if bootstrap_room is None:
            raise ValueError("Ferry needs a bootstrap_room (the room id) for every request")
        self.kv_mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.bootstrap_room = int(bootstrap_room)
        self.conclude_state: Optional[Status] = None
        self.failure: Optional[tuple[int, str]] = None  # (code, reason)
        self.last_result: Optional[PollResult] = None
        self._cancel_sent = False
        self._lock = threading.Lock()

    # whether ferryd knows (or may know) the room and is asked for its status
    def _daemon_room(self) -> bool:
        raise NotImplementedError

    def _fail(self, code: int, reason: str) -> None:
        with self._lock:
            if self.failure is None:
                self.failure = (int(code), reason)

    def _needs_daemon_poll(self) -> bool:
        return self.conclude_state is None and self.failure is None and self._daemon_room()

    def _apply(self, r: PollResult) -> Status:
        """Take ferryd's answer for this room."""
        self.last_result = r
        status = Status(r.status)
        if status == Status.Failed:
            self._fail(Errc.INTERNAL if not r.code else int(r.code), r.reason)
        if status.terminal:
            self.conclude_state = status
        return status

    def _current(self) -> Optional[Status]:
        """The status when ferryd need not be asked."""
        if self.conclude_state is not None:
            return self.conclude_state
        if self.failure is not None:
            self.conclude_state = Status.Failed
            return Status.Failed
        if not self._daemon_room():
            return self._local_status
        return None

    def poll(self) -> int:
        """The room's :class:`KVPoll` status; Failed and Success are final."""
        s = self._current()
        if s is not None:
            return s
        try:
            r = self.kv_mgr.client.poll(self.bootstrap_room)
        except FerryError as e:
            self._fail(e.code, f"polling room {self.bootstrap_room} failed: {e.message}")
            self.conclude_state = Status.Failed
            return Status.Failed
        return self._apply(r)

    def _cancel_and_drain(self) -> None:
        """Cancel the room on ferryd and wait (bounded) until it reports it terminal, so its
        memory may be reused."""
        c = self.kv_mgr.client
        if not self._send_cancel():
            return
        deadline = time.monotonic() + self.kv_mgr.drain_timeout
        while time.monotonic() < deadline:
            try:
                r = c.poll(self.bootstrap_room)
            except FerryError:
                return
            self.last_result = r
            if Status(r.status).terminal:
                return
            time.sleep(0.01)

    def _send_cancel(self) -> bool:
        """Cancel the room on ferryd (once); False when ferryd has no live room to wait for."""
        if self._cancel_sent:
            return True
        self._cancel_sent = True
        c = self.kv_mgr.client
        try:
            c.cancel(self.bootstrap_room)
        except FerryError as e:
            if e.code in (Errc.UNKNOWN_ROOM, Errc.ROOM_FINISHED) or c.closed:
                return False
        return True

    def failure_exception(self) -> None:
        """Raise the request's failure (:class:`FerryKVTransferError`, with ferryd's code); a
        rank that saw no failure itself (the request failed on another rank) raises SGLang's
        'from another rank' text. A room ferryd has not reported terminal is cancelled first
        and waited for (bounded), since the engine reuses its memory next."""
        from_other = self.failure is None
        if from_other:
            self._fail(Errc.CANCELLED, FROM_ANOTHER_RANK)
        seen_terminal = self.last_result is not None and Status(self.last_result.status).terminal
        if self._daemon_room() and not seen_terminal:
            self._cancel_and_drain()  # the engine reuses the room's memory once this returns
        self.conclude_state = Status.Failed
        assert self.failure is not None
        code, reason = self.failure
        raise FerryKVTransferError(self.bootstrap_room, reason, code, from_other)

    def abort(self) -> None:
        """Fail the request (``Aborted by AbortReq.``) and cancel its room on ferryd, which tells
        the peer; returns once ferryd reports the room terminal (bounded by the manager's
        ``drain_timeout``), so its pages, slot and row may be reused."""
        if self.conclude_state is not None:
            return
        self._fail(Errc.CANCELLED, ABORTED)
        self.conclude_state = Status.Failed
        if self._daemon_room():
            self._cancel_and_drain()

    def clear(self) -> None:
        """Nothing is held per request beyond this object."""

    def get_transfer_metric(self) -> FerryTransferMetric:
        return FerryTransferMetric()


class FerryKVReceiver(_FerryRoom):
    """Decode side of one request (SGLang's ``KVReceiver``); see the module docstring."""

    def __init__(self, mgr: FerryKVManager, bootstrap_addr: str,
                 bootstrap_room: Optional[int] = None, **_: Any) -> None:
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        self._local_status = Status.Bootstrapping
        self.prefill_peers: Optional[list[str]] = None
        self.prefill_dp_rank: Optional[int] = None
        self.prepared = False
        self.decode_prefix_len = 0

    def _daemon_room(self) -> bool:
        return self.prepared

    def init(self, prefill_dp_rank: int = 0) -> None:
        """Resolve the prefill instance's ranks (:class:`FerryBootstrap`); WaitingForInput."""
        if self.conclude_state is not None or self.failure is not None:
            return
        self.prefill_dp_rank = prefill_dp_rank
        boot = self.kv_mgr.bootstrap
        try:
            if boot is None:
                raise LookupError("the FerryKVManager has no FerryBootstrap")
            self.prefill_peers = boot.prefill_peers(self.bootstrap_addr, prefill_dp_rank,
                                                    self.kv_mgr.client)
        except Exception as e:
            self._fail(Errc.PEER_UNREACHABLE,
                       f"Could not fetch bootstrap info for bootstrap_addr {self.bootstrap_addr} "
                       f"(prefill_dp_rank {prefill_dp_rank}): {e}")
            return
        self._local_status = Status.WaitingForInput

    def send_metadata(self, kv_indices: Iterable[int], aux_index: Optional[int] = None,
                      state_indices: Any = None, decode_prefix_len: Optional[int] = None,
                      **_: Any) -> None:
        """One ``prepare`` of the room: ``kv_indices`` (the pages after the decode's prefix,
        in token order) as ``dst_pages``, the Mamba slot, the aux row, naming every prefill
        rank's control address. A refusal fails this request alone."""
        if self.conclude_state is not None or self.failure is not None:
            return
        try:
            if self.prefill_peers is None:
                raise _RequestFailed(Errc.INVALID_REQUEST,
                                     f"send_metadata of room {self.bootstrap_room} before "
                                     f"init(prefill_dp_rank)")
            if self.prepared:
                raise _RequestFailed(Errc.INVALID_REQUEST,
                                     f"send_metadata of room {self.bootstrap_room} twice")
            pages = [int(p) for p in kv_indices]
            prefix = int(decode_prefix_len or 0)
            page = self.kv_mgr.page_size
            if prefix < 0 or prefix % page:
                raise _RequestFailed(Errc.INVALID_REQUEST,
                                     f"decode_prefix_len {prefix} of room {self.bootstrap_room} "
                                     f"is not a multiple of the page size {page}")
            slot = self.kv_mgr.state_slot(state_indices, "dst")
            row = None
            if self.kv_mgr.has_aux:
                row = _as_index(aux_index) if aux_index is not None else None
                if row is None or row < 0:
                    raise _RequestFailed(Errc.INVALID_REQUEST,
                                         f"room {self.bootstrap_room}: aux_index {aux_index!r} "
                                         f"is not an aux row (this ferryd has an aux pool)")
        except _RequestFailed as e:
            self._fail(e.code, e.reason)
            return
        self.decode_prefix_len = prefix
        try:
            self.kv_mgr.client.prepare(self.bootstrap_room, self.prefill_peers, pages,
                                       state_slot=slot, aux_row=row, prefix_tokens=prefix)
        except FerryError as e:  # refused: no room was created by it
            self._fail(e.code, e.message)
            return
        self.prepared = True

    def clear(self) -> None:
        """SGLang's cleanup hook: ferryd forgets a terminal room by itself."""


class FerryKVSender(_FerryRoom):
    """Prefill side of one request (SGLang's ``KVSender``); see the module docstring."""

    def __init__(self, mgr: FerryKVManager, bootstrap_addr: str, bootstrap_room: int,
                 dest_tp_ranks: Optional[Sequence[int]] = None, pp_rank: int = 0,
                 req_has_disagg_prefill_dp_rank: bool = False, **_: Any) -> None:
        super().__init__(mgr, bootstrap_addr, bootstrap_room)
        self._local_status = Status.Bootstrapping
        self.dest_tp_ranks = list(dest_tp_ranks or [])
        self.pp_rank = pp_rank
        self.num_kv_indices: Optional[int] = None
        self.aux_index: Optional[int] = None
        self.curr_idx = 0
        self.sent_last = False
        self.chunks_sent = 0

    def _daemon_room(self) -> bool:
        return True  # a prefill ferryd answers Bootstrapping for a room it has not seen yet

    def pop_decode_prefix_len(self) -> int:
        """The decode's ``decode_prefix_len`` for this room, as the last poll of ferryd
        answered it (``prefix_tokens``; 0 before WaitingForInput)."""
        r = self.last_result
        return 0 if r is None else int(r.prefix_tokens)

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None) -> None:
        """The number of pages this room sends (after the decode's prefix) and its aux row."""
        self.num_kv_indices = int(num_kv_indices)
        self.aux_index = aux_index

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        """A chunk with pages, or the last one (which carries state and aux even with none)."""
        return num_pages > 0 or last_chunk

    def send(self, kv_indices: Iterable[int], state_indices: Any = None,
             token_position_offset: int = 0, last_chunk: Optional[bool] = None,
             **_: Any) -> None:
        """One chunk: ``send(room, pages, last, state_slot, aux_row)``. The chunk that brings
        the pages sent to ``num_pages`` (of :meth:`init`) is the last one and carries the Mamba
        slot (the one element of ``state_indices``' Mamba entry) and the aux row; a zero-page
        chunk that is not the last is skipped. A refusal fails this request alone (and cancels
        its room, so the decode learns at once).

        When every page is already sent (or there is none: a full prefix hit on the decode),
        counting pages cannot tell a zero-page chunk from the last one. SGLang passes
        ``state_indices`` only with the last chunk, so with a state pool a zero-page chunk
        without them is not the last; ``last_chunk`` (the scheduler's own flag) settles it
        outright and is the only way to tell on a model without state."""
        if self.conclude_state is not None or self.failure is not None:
            return
        pages = [int(p) for p in kv_indices]
        try:
            if self.num_kv_indices is None:
                raise _RequestFailed(Errc.INVALID_REQUEST,
                                     f"send of room {self.bootstrap_room} before "
                                     f"init(num_pages, aux_index)")
            if self.sent_last:
                raise _RequestFailed(Errc.INVALID_REQUEST,
                                     f"room {self.bootstrap_room}: a chunk of {len(pages)} pages "
                                     f"after the last one")
            end = self.curr_idx + len(pages)
            if end > self.num_kv_indices:
                raise _RequestFailed(Errc.INVALID_REQUEST,
                                     f"room {self.bootstrap_room}: chunk of {len(pages)} pages "
                                     f"at position {self.curr_idx} goes beyond the "
                                     f"{self.num_kv_indices} pages of init()")
            if last_chunk is None:
                last = end == self.num_kv_indices and (
                    bool(pages) or state_indices is not None or not self.kv_mgr.has_state)
            else:
                last = bool(last_chunk)
                if last and end != self.num_kv_indices:
                    raise _RequestFailed(Errc.INVALID_REQUEST,
                                         f"room {self.bootstrap_room}: the last chunk ends at "
                                         f"page {end} of the {self.num_kv_indices} of init()")
            if not pages and not last:
                return
            slot = row = None
            if last:
                slot = self.kv_mgr.state_slot(state_indices, "src")
                if self.kv_mgr.has_aux:
                    row = _as_index(self.aux_index) if self.aux_index is not None else None
                    if row is None or row < 0:
                        raise _RequestFailed(Errc.INVALID_REQUEST,
                                             f"room {self.bootstrap_room}: aux_index "
                                             f"{self.aux_index!r} is not an aux row (this "
                                             f"ferryd has an aux pool)")
        except _RequestFailed as e:
            self._fail_and_cancel(e.code, e.reason)
            return
        try:
            self.kv_mgr.client.send(self.bootstrap_room, pages, last, state_slot=slot,
                                    aux_row=row)
        except FerryError as e:
            self._fail_and_cancel(e.code, e.message)
            return
        self.curr_idx = end
        self.sent_last = last
        self.chunks_sent += 1

    def _fail_and_cancel(self, code: int, reason: str) -> None:
        """Fail the request here and cancel its room on ferryd (best effort; a room ferryd
        does not know is fine)."""
        self._fail(code, reason)
        self.conclude_state = Status.Failed
        self._send_cancel()

    def get_transfer_metric(self) -> FerryTransferMetric:
        args = self.kv_mgr.kv_args
        return FerryTransferMetric(transfer_total_bytes=self.curr_idx * sum(args.kv_item_lens))


# --------------------------------------------------------------------------------------------
# Batch polling


def poll_all(rooms: Sequence[_FerryRoom]) -> list[int]:
    """The :class:`KVPoll` status of every sender or receiver in ``rooms``, in order, with one
    ``poll_many`` per client for those ferryd must be asked about (a scheduler's
    ``poll_and_all_reduce`` input). Each object is updated as its ``poll()`` would be."""
    out: list[Optional[int]] = [None] * len(rooms)
    ask: dict[int, tuple[Client, list[int]]] = {}
    for i, r in enumerate(rooms):
        s = r._current()
        if s is not None:
            out[i] = s
            continue
        c = r.kv_mgr.client
        ask.setdefault(id(c), (c, []))[1].append(i)
    for c, idx in ask.values():
        try:
            results = c.poll_many([rooms[i].bootstrap_room for i in idx])
        except FerryError as e:
            for i in idx:
                rooms[i]._fail(e.code, f"polling room {rooms[i].bootstrap_room} failed: "
                                       f"{e.message}")
                rooms[i].conclude_state = Status.Failed
                out[i] = Status.Failed
            continue
        for i, res in zip(idx, results):
            out[i] = rooms[i]._apply(res)
    return [int(s) for s in out]  # type: ignore[arg-type]


__all__ = ["KVPoll", "MAMBA", "ABORTED", "FROM_ANOTHER_RANK", "FerryKVTransferError",
           "FerryBootstrap", "FerryKVArgs", "FerryKVManager", "FerryKVReceiver", "FerryKVSender",
           "FerryTransferMetric", "poll_all"]
