"""The SGLang adapter's manager (see :mod:`ferry.sglang`): one engine rank's link to its local
ferryd, which lends the rank's memory at construction, tells the bootstrap when a prefill rank
is ready, and reads SGLang's ``state_indices`` as Ferry's state slot (mamba) or state pages (a
page-indexed component) per request for the senders and receivers.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Callable, Optional, Union

from ..client import Client
from ..errors import Errc, FerryError
from ..memory import configured_state_type
from ..protocol import POOL_KINDS, MemoryBuffer, MemoryKind, StateType, state_type_number
from ..reconnect import ConnectionNotice, Reconnect, Reconnected
from .bootstrap import FerryBootstrap
from .http import FerryHTTPBootstrap, register_dp_rank, register_rank
from .aux import AuxShadow, outside_regions
from .kvargs import FerryKVArgs
from .host_memory import host_regions
from .server import FerryPrefillInfo
from .settings import FerrySettings, config_section, host_port
from .state import StateIndices

_DEFAULT: Any = object()  # a keyword left out: the FERRY_* environment variable, else its default

_log = logging.getLogger("ferry")


def _mode_name(mode: Any) -> str:
    name = str(getattr(mode, "value", mode)).lower()
    if name not in ("prefill", "decode"):
        raise ValueError(f"disaggregation_mode must be prefill or decode, got {mode!r}")
    return name


class _Lookup:
    """A prefill instance's parallel info being fetched off the scheduler loop."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.info: Optional[FerryPrefillInfo] = None
        self.error: Optional[BaseException] = None


class FerryKVManager:
    """One engine rank's link to its local ferryd (SGLang's ``KVManager``).

    Connects to ``socket_path`` (v4) and registers, for every pool the daemon marks ``memory:
    client``, the engine's buffers from ``args`` (register_memory), before any request. A
    daemon that is still releasing an earlier registration of the pool (``pool kv is still
    being released``) is asked again until ``register_timeout`` seconds passed. Raises
    :class:`FerryError` when the memory is refused; the message names the buffer.

    **Constructed as SGLang constructs it** (``KVManager(args, disaggregation_mode,
    server_args, is_mla_backend)``, no Ferry keyword): the socket, the bootstrap and the bounds
    come from :class:`~ferry.sglang.settings.FerrySettings` (``FERRY_*`` environment variables,
    the ``KVArgs``' ranks, ``server_args``' bootstrap host and port). A prefill rank then
    registers with the prefill instance's bootstrap server (``PUT /route``: its ferryd's
    control address and its TP/PP/DP position as ferryd's config gives them), and a decode rank
    finds prefill ranks through the request's bootstrap server
    (:class:`~ferry.sglang.http.FerryHTTPBootstrap`). The keywords override: ``socket_path`` or
    ``client``, ``bootstrap`` (a :class:`FerryBootstrap`: a table, ``ready`` store, discovery),
    ``timeout``, ``register_timeout``, ``drain_timeout``, ``reconnect``, ``settings`` (all at
    once). With ``socket_path`` derived from the template, the manager checks that the ferryd
    it reached is this rank's (``tp.rank`` = ``engine_rank``, ``pp.rank`` = ``pp_rank``).

    ``drain_timeout`` bounds how long ``failure_exception()`` of a room no poll has said Failed
    for yet (another rank failed) waits for ferryd to report it terminal (after which its
    pages, slot and row may be reused); ``abort()`` never waits.

    ``reconnect`` (on by default; a :class:`~ferry.reconnect.Reconnect` to tune it, False to
    turn it off) is the client's: when ferryd goes away (a drain and restart, a crash), the
    client connects again by itself and registers this rank's memory again; the requests whose
    rooms lived on the lost connection fail with 302 ``peer_lost`` (the reason says ferryd went
    away) and the scheduler retries them, and new requests work once it is back. A prefill
    rank registers itself with the bootstrap again after each reconnect.

    What SGLang's scheduler reads: ``prefill_info_table[bootstrap_addr]`` (a decode's; a
    :class:`~ferry.sglang.server.FerryPrefillInfo` with ``dp_size`` and
    ``follow_bootstrap_room``, filled by :meth:`try_ensure_parallel_info`), ``kv_args``,
    ``server_args``, ``is_mla_backend``; and the rank's position ``attn_tp_size``,
    ``attn_tp_rank``, ``pp_size``, ``pp_rank``, ``attn_dp_size``, ``attn_dp_rank`` (ferryd's
    ``tp``, ``pp`` and ``dp``)."""

    def __init__(self, args: FerryKVArgs, disaggregation_mode: Any, server_args: Any = None,
                 is_mla_backend: bool = False, *, socket_path: Optional[str] = None,
                 bootstrap: Optional[FerryBootstrap] = None, client: Optional[Client] = None,
                 name: Optional[str] = None, timeout: Optional[float] = _DEFAULT,
                 register_timeout: float = _DEFAULT, drain_timeout: float = _DEFAULT,
                 reconnect: Union[bool, Reconnect] = _DEFAULT,
                 settings: Optional[FerrySettings] = None) -> None:
        self.kv_args = args
        self._lookups: dict[str, _Lookup] = {}
        self._lookups_lock = threading.Lock()
        self._posts: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._poster: Optional[threading.Thread] = None
        self.disaggregation_mode = _mode_name(disaggregation_mode)
        self.server_args = server_args
        self.is_mla_backend = is_mla_backend
        cfg = settings or FerrySettings.derive(args, self.disaggregation_mode, server_args)
        self.settings = cfg
        timeout = cfg.timeout if timeout is _DEFAULT else timeout
        register_timeout = cfg.register_timeout if register_timeout is _DEFAULT \
            else register_timeout
        self.register_timeout = register_timeout
        reconnect = cfg.reconnect if reconnect is _DEFAULT else reconnect
        self.drain_timeout = cfg.drain_timeout if drain_timeout is _DEFAULT else drain_timeout
        if bootstrap is None and self.disaggregation_mode == "decode":
            bootstrap = FerryHTTPBootstrap(timeout=cfg.http_timeout)
        self.bootstrap = bootstrap
        self.prefill_info_table: dict[str, FerryPrefillInfo] = {}
        self.bootstrap_addr = cfg.bootstrap_addr  # where this prefill rank registers
        try:
            self.state_component = args.state_component(mla=bool(is_mla_backend))
        except ValueError as e:  # a state type Ferry cannot move: refused before connecting
            raise FerryError(Errc.INVALID_REQUEST, str(e)) from None
        self.state_type: Optional[StateType] = None if self.state_component is None else \
            state_type_number(args.state_type_names()[self.state_component])
        self.paged_state = self.state_type is not None and self.state_type.paged
        own = client is None
        derived = client is None and socket_path is None
        if client is None:
            client = Client(socket_path or cfg.socket_path,
                            name=name or f"sglang-{self.disaggregation_mode}-"
                                         f"{args.engine_rank}", timeout=timeout,
                            reconnect=reconnect)
        self.client = client
        try:
            self._check_daemon(client, derived)
            self.page_size = client.page_tokens or args.page_size
            self.has_state = client.pools["state"].present
            self.has_aux = client.pools["aux"].present
            self.state_indices = StateIndices(self.has_state, self.state_component,
                                              len(args.state_types), self.state_type)
            if self.has_state and self.state_type is None:
                raise FerryError(Errc.INVALID_REQUEST,
                                 f"ferryd at {client.socket_path} has a state pool (pools.mamba), "
                                 f"but the KVArgs' state_types name no state component")
            if not self.has_state and self.state_type is not None:
                raise FerryError(Errc.INVALID_REQUEST,
                                 f"the KVArgs' state_types name a {self.state_type.wire_name} "
                                 f"component, but ferryd at {client.socket_path} has no state "
                                 f"pool (pools.mamba)")
            state = client.pools["state"]
            configured = configured_state_type(client.config_yaml) or "mamba"
            if self.state_type is not None and state.present and not state.registered and \
                    configured != self.state_type.wire_name:
                raise FerryError(Errc.INVALID_REQUEST,
                                 f"ferryd at {client.socket_path} has a {configured} state pool "
                                 f"(pools.mamba.type), but the KVArgs' state_types name a "
                                 f"{self.state_type.wire_name} component")
            if self.paged_state and client.version < 8:
                assert self.state_type is not None
                raise FerryError(Errc.UNSUPPORTED_VERSION,
                                 f"a {self.state_type.wire_name} state component needs protocol "
                                 f"version 8; ferryd at {client.socket_path} speaks "
                                 f"{client.daemon_versions[0]}..{client.daemon_versions[1]}")
            self.registered: list[str] = []
            if not args.memory_regions:  # SGLang's KVArgs: the allocation hook's memory
                args.memory_regions = host_regions()
            # SGLang's MetadataBuffers in ordinary memory: rows copied through a memfd of ours.
            self.aux_shadow: Optional[AuxShadow] = None
            aux = client.pools["aux"]
            if aux.present and not aux.shm_name and outside_regions(args):
                try:
                    self.aux_shadow = AuxShadow(args.aux_data_ptrs, args.aux_item_lens,
                                                args.aux_data_lens, args.bootstrap_room_ptr,
                                                f"ferry-aux-{self.disaggregation_mode}-"
                                                f"{args.engine_rank}")
                except ValueError as e:
                    raise FerryError(Errc.INVALID_REQUEST, str(e)) from None
            # Every table first: a KVArgs that does not fit lends nothing.
            tables = {kind: self.memory_table(kind) for kind in POOL_KINDS
                      if client.pools[kind].present and not client.pools[kind].shm_name}
            for kind, (table, fds) in tables.items():
                self._register(kind, table, fds, register_timeout)
                self.registered.append(kind)
            self.register_to_bootstrap()
            self._unwatch = client.on_connection(self._on_connection)
        except BaseException:
            if own:
                client.close()
            raise

    def _check_daemon(self, client: Client, derived: bool) -> None:
        """The protocol and role this side needs; the rank's position from ferryd's config;
        with a derived socket, that the ferryd reached is this rank's."""
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
        pp, dp = (config_section(client.config_yaml, k) for k in ("pp", "dp"))
        self.attn_tp_size, self.attn_tp_rank = max(1, client.tp_size), client.tp_rank
        self.pp_size, self.pp_rank = pp.get("size", 1), pp.get("rank", 0)
        self.attn_dp_size, self.attn_dp_rank = dp.get("size", 1), dp.get("rank", 0)
        if not derived:
            return
        args = self.kv_args
        for what, mine, theirs in (("tp.rank", args.engine_rank, self.attn_tp_rank),
                                   ("pp.rank", args.pp_rank, self.pp_rank)):
            if int(mine) != int(theirs):
                raise FerryError(Errc.INVALID_REQUEST,
                                 f"the ferryd at {client.socket_path} (FERRY_SOCKET) is {what} "
                                 f"{theirs}, but this engine rank is {what.split('.')[0]} rank "
                                 f"{mine} (KVArgs): each rank needs its own ferryd, whose "
                                 f"config names the rank")

    # --- registration ---------------------------------------------------------------------------

    def memory_table(self, kind: str) -> tuple[list[MemoryBuffer], list[int]]:
        """The register_memory table and descriptors of pool ``kind``, from the KVArgs: every
        buffer as a range of the memfd whose mapping holds its pointer, with its slicing facts
        (:meth:`FerryKVArgs.entries`). For a pool ferryd's config describes, item counts, tensor
        ids and kinds come from ferryd's layout; for one its config leaves to the registration
        (no layout until the first one), the KVArgs say everything."""
        pool = self.client.pools[kind]
        layout = () if pool.registered else pool.buffers  # registered: our tensors say it
        label = {"kv": "kv_data_ptrs", "state": "state_data_ptrs", "aux": "aux_data_ptrs"}[kind]
        args = self._args_of(kind)
        count = len(args._pool_lists(kind)[0])
        if layout and count != len(layout):
            raise FerryError(Errc.INVALID_REQUEST,
                             f"pool {kind}: the KVArgs list {count} buffers ({label}), "
                             f"ferryd's pool has {len(layout)} (pools.{kind}.memory: client; "
                             f"see the hello_reply's layout)")
        try:
            entries = args.entries(kind, mla=self.is_mla_backend)
        except ValueError as bad:
            raise FerryError(Errc.INVALID_REQUEST, str(bad)) from None
        if not layout and self.client.version < 7:
            raise FerryError(Errc.UNSUPPORTED_VERSION,
                             f"pool {kind} of ferryd at {self.client.socket_path} is described "
                             f"by the registration, which needs protocol version 7; this "
                             f"connection speaks {self.client.version}")
        field_name = label.replace("ptrs", "lens")
        fds: list[int] = []
        table: list[MemoryBuffer] = []
        for i, e in enumerate(entries):
            want = layout[i] if layout else None
            if want is not None:
                items = want.items
                # (an item size that differs from ferryd's is for ferryd to name: it knows why)
                if e.item_len == want.item_bytes and e.length and e.length < items * e.item_len:
                    raise FerryError(Errc.INVALID_REQUEST,
                                     f"pool {kind}: buffer {i} holds {e.length} bytes "
                                     f"({field_name}[{i}]), fewer than ferryd's pool needs "
                                     f"there: {want.items} items of {want.item_bytes} bytes")
            else:
                items = e.length // e.item_len if e.item_len > 0 else 0
                if items == 0:
                    raise FerryError(Errc.INVALID_REQUEST,
                                     f"pool {kind}: buffer {i} holds {e.length} bytes "
                                     f"({field_name}), not one item of {e.item_len}: ferryd's "
                                     f"pool is described by the registration, so every buffer's "
                                     f"length is needed")
            length = e.item_len * items
            region = next((r for r in args.memory_regions
                           if r.contains(e.ptr, max(1, length))), None)
            if region is None:
                region = next((r for r in args.memory_regions
                               if r.contains(e.ptr, 1)), None)
            if region is None:
                raise FerryError(Errc.INVALID_REQUEST,
                                 f"pool {kind}: buffer {i} (address {e.ptr:#x}) lies in no "
                                 f"memory region of the KVArgs: lend memory mapped from a memfd "
                                 f"(memory_regions)")
            if region.fd not in fds:
                fds.append(region.fd)
            layer = e.layer_id if e.layer_id is not None else \
                (want.layer_id if want is not None else None)
            if layer is None:
                raise FerryError(Errc.INVALID_REQUEST,
                                 f"pool {kind}: buffer {i} has no layer id: ferryd's pool is "
                                 f"described by the registration, so the KVArgs must give "
                                 f"{'kv_layer_ids' if kind == 'kv' else 'state_layer_ids'}")
            tensor, bkind = (want.tensor, want.kind) if want is not None else (e.tensor, e.kind)
            table.append(MemoryBuffer(fds.index(region.fd), region.fd_offset(e.ptr), e.item_len,
                                      items, int(layer), tensor, bkind, e.slice_dim,
                                      e.total_dim, e.outer, tuple(e.groups), tuple(e.units)))
        return table, fds

    def _args_of(self, kind: str) -> FerryKVArgs:
        """The KVArgs that list pool ``kind``'s buffers: the engine's, or for aux in ordinary
        memory the memfd copy's (:mod:`ferry.sglang.aux`)."""
        return self.aux_shadow.args if kind == "aux" and self.aux_shadow is not None \
            else self.kv_args

    def _room_id_buffer(self) -> Optional[int]:
        """The aux buffer holding SGLang's ``bootstrap_room`` (found by its address), or None."""
        args = self._args_of("aux")
        ptr = args.bootstrap_room_ptr
        if ptr is None:
            return None
        ptrs = [int(p) for p in args.aux_data_ptrs]
        if int(ptr) not in ptrs:
            raise FerryError(Errc.INVALID_REQUEST,
                             f"pool aux: bootstrap_room_ptr {int(ptr):#x} is none of the "
                             f"aux_data_ptrs")
        return ptrs.index(int(ptr))

    def _register(self, kind: str, table: list[MemoryBuffer], fds: list[int],
                  register_timeout: float) -> None:
        deadline = time.monotonic() + register_timeout
        state_type = self.state_type if kind == "state" else None
        while True:
            try:
                self.client.register_memory(
                    kind, table, fds, MemoryKind.HOST, page_tokens=self.kv_args.page_size,
                    room_id_buffer=self._room_id_buffer() if kind == "aux" else None,
                    state_type=StateType.MAMBA if state_type is None else state_type)
                return
            except FerryError as e:
                if "is still being released" not in e.message or \
                        time.monotonic() >= deadline:
                    raise
            time.sleep(0.05)

    def _on_connection(self, notice: ConnectionNotice) -> None:
        """The client reconnected: with every pool registered again, this rank is ready
        again."""
        if not isinstance(notice, Reconnected):
            return
        if notice.not_registered:
            _log.error("ferry: %s rank %s: ferryd at %s came back, but refused this rank's "
                       "memory again (%s); its rooms will be refused", self.disaggregation_mode,
                       self.kv_args.engine_rank, self.client.socket_path,
                       "; ".join(f"{k}: {e}" for k, e in notice.not_registered.items()))
            return
        # (HTTP may wait up to register_timeout: not on the client's dispatcher thread)
        threading.Thread(target=self._register_again, daemon=True,
                         name="ferry-register-again").start()

    def _register_again(self) -> None:
        try:
            self.register_to_bootstrap()
        except Exception as e:
            _log.error("ferry: prefill rank %s: registering with the bootstrap server again "
                       "after ferryd came back failed: %s", self.kv_args.engine_rank, e)

    def registration(self) -> dict[str, Any]:
        """What this prefill rank registers with the bootstrap server (``PUT /route``): SGLang's
        fields, with its ferryd's control address as ``rank_ip``/``rank_port`` and its position
        as ferryd's config gives it (``tp``, ``pp``, ``dp``)."""
        host, port = host_port(self.settings.control_addr or self.client.control,
                               "the control address")
        if host in ("0.0.0.0", "::", ""):
            raise ValueError(f"ferryd at {self.client.socket_path} listens on "
                             f"{self.client.control} (listen.control), which a decode cannot "
                             f"reach: set FERRY_CONTROL_ADDR to this rank's reachable host:port")
        sa = self.server_args
        dp_attention = bool(getattr(sa, "enable_dp_attention", False))
        return {"attn_tp_size": self.attn_tp_size, "attn_tp_rank": self.attn_tp_rank,
                "attn_cp_size": 1, "attn_cp_rank": 0,
                "attn_dp_size": self.attn_dp_size, "attn_dp_rank": self.attn_dp_rank,
                "pp_size": self.pp_size, "pp_rank": self.pp_rank,
                "system_dp_size": 1 if dp_attention else int(getattr(sa, "dp_size", 1) or 1),
                "system_dp_rank": int(self.kv_args.system_dp_rank or 0),
                "rank_ip": host, "rank_port": port, "page_size": self.page_size,
                "kv_cache_dtype": getattr(sa, "kv_cache_dtype", None),
                "load_balance_method": getattr(sa, "load_balance_method", None)
                or "follow_bootstrap_room",
                "prefill_http_port": getattr(sa, "port", None)}

    def register_to_bootstrap(self) -> None:
        """SGLang's prefill registration with its bootstrap server, once this rank's memory is
        lent (the constructor calls it; so does a reconnect): ``PUT /route`` to the bootstrap
        server (:attr:`bootstrap_addr`, retried until ``register_timeout``; raises
        ``ConnectionError`` naming it when it never answers 200) and, with a
        :class:`FerryBootstrap` ``ready`` store, the mark there under its ferryd's control
        address."""
        if self.disaggregation_mode != "prefill":
            return
        if self.bootstrap_addr is not None:
            register_rank(self.bootstrap_addr, self.registration(),
                          time.monotonic() + self.register_timeout, self.settings.http_timeout)
        if self.bootstrap is not None:
            self.bootstrap.mark_ready(self.client.control)

    def try_ensure_parallel_info(self, bootstrap_addr: str, prefill_dp_rank: int = 0) -> bool:
        """Decode side, as SGLang's: whether the prefill instance at ``bootstrap_addr`` is ready
        for prepares; once it is, its parallel info stays in ``prefill_info_table``. With the
        bootstrap server, ready means every rank registered (``GET /route``); with a
        :class:`FerryBootstrap` table, every rank named is in its ``ready`` store (when it
        tracks readiness); with discovery, at least one rank answers. A scheduler keeps the
        request waiting while this is False; a table that names no rank for the address raises
        ``LookupError``, a prefill whose page size differs from this rank's ``RuntimeError``.

        It never waits on the network: where the answer needs one (the bootstrap server's
        HTTP, ferryd's discover), the first call starts the lookup in a thread of its own and
        answers False; a later call takes its outcome (raising what it raised), and the ranks
        of every DP group are fetched with it, so ``init`` finds them at hand."""
        if bootstrap_addr in self.prefill_info_table:
            return True
        if self.bootstrap is None:
            raise LookupError("a decode manager needs a FerryBootstrap")
        if not (isinstance(self.bootstrap, FerryHTTPBootstrap) or self.bootstrap.discover):
            return self._take_info(bootstrap_addr, self.bootstrap.parallel_info(
                bootstrap_addr, self.client, prefill_dp_rank))
        with self._lookups_lock:
            job = self._lookups.get(bootstrap_addr)
            if job is None:
                job = _Lookup()
                self._lookups[bootstrap_addr] = job
                threading.Thread(target=self._look_up, args=(bootstrap_addr, prefill_dp_rank, job),
                                 daemon=True, name=f"ferry-lookup[{bootstrap_addr}]").start()
                return False
            if not job.done.is_set():
                return False
            del self._lookups[bootstrap_addr]  # the next call after a False looks again
        if job.error is not None:
            raise job.error
        return self._take_info(bootstrap_addr, job.info)

    def _look_up(self, bootstrap_addr: str, prefill_dp_rank: int, job: _Lookup) -> None:
        boot = self.bootstrap
        assert boot is not None
        try:
            job.info = boot.parallel_info(bootstrap_addr, self.client, prefill_dp_rank)
            if job.info is not None:
                for dp in range(max(1, int(job.info.dp_size or 1))):
                    try:  # warm init()'s ranks; init asks again (and says why) if this failed
                        boot.prefill_peers(bootstrap_addr, dp, self.client)
                    except Exception as e:  # noqa: BLE001 - reported by init
                        _log.info("ferry: prefill ranks of %s DP %d not at hand yet: %s",
                                  bootstrap_addr, dp, e)
        except BaseException as e:  # noqa: BLE001 - raised by the next try_ensure_parallel_info
            job.error = e
        finally:
            job.done.set()

    def _take_info(self, bootstrap_addr: str, info: Optional[FerryPrefillInfo]) -> bool:
        if info is None:
            return False
        if info.page_size is not None and info.page_size != self.page_size:
            raise RuntimeError(f"page size mismatch: the prefill at {bootstrap_addr} has "
                               f"page_size={info.page_size}, this decode rank's ferryd "
                               f"{self.page_size} (pools.kv.page_tokens)")
        self.prefill_info_table[bootstrap_addr] = info
        return True

    def forget_prefill(self, bootstrap_addr: str) -> None:
        """Forget what was learned of the prefill instance at ``bootstrap_addr`` (its
        ``prefill_info_table`` entry, its ranks' addresses): the next
        :meth:`try_ensure_parallel_info` and ``init`` ask again, e.g. after the instance was
        restarted on other hosts or with other sizes."""
        self.prefill_info_table.pop(bootstrap_addr, None)
        if self.bootstrap is not None:
            self.bootstrap.forget_ranks(bootstrap_addr)

    def register_room_dp_rank(self, bootstrap_addr: str, room: int,
                              req_has_disagg_prefill_dp_rank: bool) -> Optional[str]:
        """A prefill sender's part in picking the room's prefill DP group, as SGLang's: with
        ``server_args.dp_size`` > 1 and no DP rank chosen for the request, either register this
        rank's DP rank for the room (``POST /register_dp_rank``, when
        ``load_balance_method`` is not ``follow_bootstrap_room``), or check that the room's id
        picks this DP rank. Returns the request's failure text, or None."""
        sa = self.server_args
        dp_size = int(getattr(sa, "dp_size", 1) or 1)
        if dp_size <= 1 or req_has_disagg_prefill_dp_rank:
            return None
        lb = getattr(sa, "load_balance_method", None) or "follow_bootstrap_room"
        force = os.environ.get("SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK", "") \
            .lower() in ("1", "true", "yes", "on")
        if lb == "follow_bootstrap_room" and self.attn_dp_rank == room % dp_size:
            return None
        if lb == "follow_bootstrap_room" and not force:
            return (f"follow_bootstrap_room conflict: dispatched to dp_rank {self.attn_dp_rank} "
                    f"but bootstrap_room {room} implies dp_rank {room % dp_size}. Set "
                    f"SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 to allow mixed "
                    f"routing.")
        self._post_off_loop(lambda: self._register_dp_rank(bootstrap_addr, room))
        return None

    def _register_dp_rank(self, bootstrap_addr: str, room: int) -> None:
        why = register_dp_rank(bootstrap_addr, room, self.attn_dp_rank,
                               self.settings.http_timeout)
        if why is not None:
            _log.error("ferry: failed to register prefill dp_rank of room %d: %s", room, why)

    def _post_off_loop(self, job: Callable[[], None]) -> None:
        """Run ``job`` (an HTTP request whose failure is only logged) on this manager's one
        worker thread, in order, so no call from the scheduler loop waits on the network."""
        with self._lookups_lock:
            if self._poster is None:
                self._poster = threading.Thread(target=self._post_loop, daemon=True,
                                                name="ferry-bootstrap-posts")
                self._poster.start()
        self._posts.put(job)

    def _post_loop(self) -> None:
        while True:
            job = self._posts.get()
            try:
                job()
            except Exception as e:  # noqa: BLE001 - a registration is best effort, as SGLang's
                _log.error("ferry: a bootstrap request failed: %s", e)

    # --- helpers for senders and receivers ------------------------------------------------------

    def state_of(self, state_indices: Any, side: str) -> tuple[Optional[int], list[int]]:
        """What a request's ``state_indices`` put on the wire: ``(state_slot, state_pages)``
        (:class:`~ferry.sglang.state.StateIndices`). Raises ``_RequestFailed`` with the
        request's failure."""
        return self.state_indices.state_of(state_indices, side)

    def close(self) -> None:
        """Close the connection: ferryd cancels this rank's rooms and releases the lent memory
        (after which the pools can be registered again, e.g. by a new manager)."""
        self._unwatch()
        self.client.close()
        if self.aux_shadow is not None:  # ferryd released it with the connection
            self.aux_shadow.close()
            self.aux_shadow = None

    def __enter__(self) -> FerryKVManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["FerryKVManager"]
