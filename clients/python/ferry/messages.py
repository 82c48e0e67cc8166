"""The client protocol's vocabulary (docs/protocol.md): versions and limits, frame types, enums,
and one dataclass per message of versions 3 to 10. Versions, limits and frame types come from
the protocol's one description, src/core/wire.yaml (ferry/_wire.py is generated from it).

Pure data: :mod:`ferry.encoder` turns these messages into frames, :mod:`ferry.decoder` reads
them back and :mod:`ferry.frames` cuts a byte stream into frames; :mod:`ferry.protocol` gathers
all of it under one name, which is where code imports it from.

``MessageType.X.wire_name`` is the name the C++ codec and the golden frames use;
:func:`message_type` maps a message (or its class) to its frame type, :data:`MESSAGE_CLASSES`
the other way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple, Optional, Union

from .errors import Errc

from ._wire import (FIRST_VERSION, HEADER_BYTES, MAX_FRAME_BYTES, MAX_LIST_STRINGS, MAX_POLL_MANY,
                    MAX_REGISTER_BUFFERS, MAX_REGISTER_FDS, MAX_SHARD_GROUPS, MAX_STRING_BYTES,
                    MIN_PROTOCOL_VERSION, POLL_MANY_REASON_BYTES, PROTOCOL_VERSION, MessageType)

# Versions, limits and frame types are generated from src/core/wire.yaml (ferry/_wire.py), as
# is every body's codec (ferry/_codec.py).
SUPPORTED_VERSIONS = tuple(range(MIN_PROTOCOL_VERSION, PROTOCOL_VERSION + 1))

NO_INDEX = 0xFFFFFFFF
"""``no_index``: the wire value of an absent state slot or aux row (``None`` in Python)."""

V4_ONLY = frozenset(t for t, v in FIRST_VERSION.items() if v == 4)
V5_ONLY = frozenset(t for t, v in FIRST_VERSION.items() if v == 5)


def first_version(mtype: MessageType) -> int:
    """The first protocol version that has message type ``mtype``."""
    return FIRST_VERSION[mtype]


def type_name(mtype: int) -> str:
    """The wire name of frame type ``mtype`` (``"poll_reply"``), or ``"unknown"``."""
    try:
        return MessageType(mtype).wire_name
    except ValueError:
        return "unknown"


class Status(IntEnum):
    """A room's status, numerically identical to SGLang's ``KVPoll`` (``Failed`` = 0 ..
    ``Success`` = 4). Upper-case aliases (``Status.FAILED``) name the same members."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4
    FAILED = 0
    BOOTSTRAPPING = 1
    WAITING_FOR_INPUT = 2
    TRANSFERRING = 3
    SUCCESS = 4

    @property
    def terminal(self) -> bool:
        """Success or Failed: the room's pages, slot and row may be reused."""
        return self in (Status.Failed, Status.Success)


class InfoTopic(IntEnum):
    """The ``topic`` of an ``info`` request."""

    STATUS = 0
    ROOMS = 1
    PEERS = 2
    POOLS = 3
    TIMELINES = 4


class BufferKind(IntEnum):
    """The ``kind`` of a pool buffer."""

    K = 0
    V = 1
    KV = 2  # MLA
    STATE = 3
    AUX = 4


class Buffer(NamedTuple):
    """One buffer of a pool: item ``i`` is at ``offset + i * item_bytes`` of the pool."""

    offset: int
    item_bytes: int
    items: int
    layer_id: int
    tensor: int
    kind: int  # a BufferKind when known


class Pool(NamedTuple):
    """One of the daemon's pools (kv, state, aux) as hello_reply describes it. ``registered``
    (v7): described by its registration (``memory: client`` and nothing else in the config), so
    a client registers it from its own tensors; ``buffers`` are then the first registration's
    (empty before it)."""

    present: bool
    shm_name: str
    total_bytes: int
    buffers: tuple[Buffer, ...]
    registered: bool = False


POOL_KINDS = ("kv", "state", "aux")
"""hello_reply's pools, in order (also register_memory's ``pool`` numbers: 0 kv, 1 state,
2 aux)."""


class MemoryKind(IntEnum):
    """register_memory's ``memory_kind``: what the lent descriptors are. This release registers
    host memory (memfds) only; the others are reserved (docs/gpu.md)."""

    HOST = 0
    CUDA_DMABUF = 1
    CUDA_IPC = 2
    CUDA_VMM_FD = 3

    @property
    def wire_name(self) -> str:
        return self.name.lower()


class StateType(IntEnum):
    """(v8) register_memory's ``state_type``: what a state pool holds, as SGLang's ``StateType``
    names it. ``MAMBA`` is slot-indexed (one ``state_slot`` per room); the others are
    page-indexed (``state_pages`` in prepare and in the last send). ``StateType.X.wire_name``
    is SGLang's value (``"minimax_index_k"``)."""

    MAMBA = 0
    SWA = 1
    DSA = 2
    MINIMAX_INDEX_K = 3

    @property
    def wire_name(self) -> str:
        return self.name.lower()

    @property
    def paged(self) -> bool:
        """Page-indexed (every type but mamba)."""
        return self != StateType.MAMBA


def state_type_number(state_type: Union[str, int]) -> StateType:
    """The :class:`StateType` of ``"mamba"``/``"swa"``/``"dsa"``/``"minimax_index_k"`` (any
    case; SGLang's ``StateType`` members too, by their value) or of 0..3."""
    value = getattr(state_type, "value", state_type)
    if isinstance(value, str):
        for t in StateType:
            if t.wire_name == value.lower():
                return t
    elif isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 3:
        return StateType(value)
    raise ValueError(f"state_type must be one of mamba, swa, dsa, minimax_index_k (or 0..3), "
                     f"got {state_type!r}")


def pool_number(pool: Union[str, int]) -> int:
    """register_memory's pool number of ``"kv"``/``"state"``/``"aux"`` (or of 0..2, unchanged);
    ``"mamba"`` (the config's name of the state pool) is accepted too."""
    if isinstance(pool, str):
        name = "state" if pool == "mamba" else pool
        if name not in POOL_KINDS:
            raise ValueError(f"pool must be one of kv, state, aux (or 0..2), got {pool!r}")
        return POOL_KINDS.index(name)
    if isinstance(pool, bool) or not isinstance(pool, int) or not 0 <= pool < len(POOL_KINDS):
        raise ValueError(f"pool must be one of kv, state, aux (or 0..2), got {pool!r}")
    return int(pool)
_NO_POOLS = (Pool(False, "", 0, ()), Pool(False, "", 0, ()), Pool(False, "", 0, ()))

# --------------------------------------------------------------------------------------------
# Messages


@dataclass
class Hello:
    """The first request of a connection: the range of versions the client speaks.

    ``version`` is the highest; ``min_version`` (on the wire only when ``version`` >= 4) the
    lowest. A decoded v3 hello has ``min_version == version``."""

    version: int = PROTOCOL_VERSION
    client_name: str = ""
    cancel_on_disconnect: bool = True
    min_version: int = MIN_PROTOCOL_VERSION


@dataclass
class Prepare:
    """Decode side: where a room's bytes land. ``state_slot``/``aux_row`` None = absent."""

    room: int = 0
    prefill_peers: list[str] = field(default_factory=list)
    dst_pages: list[int] = field(default_factory=list)
    state_slot: Optional[int] = None
    aux_row: Optional[int] = None
    prefix_tokens: int = 0
    """v4: tokens the decode already holds (SGLang's decode_prefix_len), which the prefill's
    poll answers; not on the wire in v3."""
    state_pages: list[int] = field(default_factory=list)
    """v8: the destination pages of a page-indexed state pool (swa, dsa, minimax_index_k),
    each once; empty for a mamba pool (which takes ``state_slot``). Not on the wire before
    v8."""
    checksum: bool = False
    """v10: check this room end to end (its Success only once the landed bytes digest as the
    prefill's did, as on a decode with ``integrity.checksums``). Refused before v10."""


@dataclass
class Send:
    """Prefill side: one chunk of a room, or (v6) the layers ``[first_layer, first_layer +
    layer_count)`` of one chunk (``layer_count`` 0: every layer); the last chunk's sends carry
    the state slot and aux row (docs/protocol.md, "Layer-wise sends")."""

    room: int = 0
    src_pages: list[int] = field(default_factory=list)
    last: bool = False
    state_slot: Optional[int] = None
    aux_row: Optional[int] = None
    first_layer: int = 0
    """v6: the first global layer id of the range; not on the wire before v6."""
    layer_count: int = 0
    """v6: layers in the range (0: every layer of the daemon's rank)."""
    state_pages: list[int] = field(default_factory=list)
    """v8, the last send only: the source pages of a page-indexed state pool, as many as the
    decode's ``state_pages``; empty otherwise. Not on the wire before v8."""


@dataclass
class Poll:
    room: int = 0


@dataclass
class Cancel:
    room: int = 0


@dataclass
class Subscribe:
    room: int = 0


@dataclass
class Info:
    topic: int = InfoTopic.STATUS


@dataclass
class PollMany:
    """(v4) The status of many rooms (at most 16384) in one round trip."""

    rooms: list[int] = field(default_factory=list)


class MemoryBuffer(NamedTuple):
    """One buffer of a register_memory table: ``items`` items of ``item_bytes`` bytes starting at
    byte ``fd_offset`` of the frame's descriptor number ``fd_index``, and what the buffer is
    (``layer_id``, ``tensor``, ``kind``). For a pool its config describes, the table follows the
    pool's layout in hello_reply and offsets are multiples of 4096; for a pool the registration
    describes (v7; ``memory: client`` and nothing else in the config) the table *is* the layout
    and offsets are any byte.

    (v7) How the buffer is sliced across TP ranks, as SGLang's ``KVArgs`` says it (0 and empty
    where it does not apply): ``slice_dim`` the KV heads at this rank (``kv_head_num``) or a
    state tensor's sliced axis (``state_dim_per_tensor``), ``total_dim`` the model's KV heads
    (``total_kv_head_num``; 0: ``slice_dim`` x TP), ``outer`` the product of a state slot's dims
    before its sliced axis (``state_slice_outer_counts``; 0 taken as 1), ``groups`` the full
    group sizes along it (``state_conv_shard_groups``).

    (v9) ``units``: how many units each group has, for groups that ranks hold whole when there
    are fewer units than TP ranks (Mamba2's B and C with ``n_groups`` below TP; the config's
    ``shard_units``); empty: every group's units are its elements."""

    fd_index: int
    fd_offset: int
    item_bytes: int
    items: int
    layer_id: int
    tensor: int
    kind: int  # a BufferKind when known
    slice_dim: int = 0
    total_dim: int = 0
    outer: int = 0
    groups: tuple[int, ...] = ()
    units: tuple[int, ...] = ()


@dataclass
class RegisterMemory:
    """(v4) Lend ferryd the client's own memory for a ``memory: client`` pool.

    ``pool``: 0 kv, 1 state, 2 aux. ``memory_kind``: 0 host (1..3 reserved, see
    :class:`MemoryKind`). ``fd_count`` descriptors ride as SCM_RIGHTS on the frame's first byte
    (at most 64); ``buffers`` (at most 4096) list every buffer of the pool in the pool's layout
    order, each as a range of one of those descriptors. (v7) ``page_tokens``: a kv pool's tokens
    per page; ``room_id_buffer``: an aux pool's buffer whose rows start with the room id
    (``None``: no such check). (v8) ``state_type``: what a state pool holds
    (:class:`StateType`; 0 mamba for the other pools); not on the wire before v8."""

    pool: int = 0
    memory_kind: int = MemoryKind.HOST
    fd_count: int = 0
    buffers: list[MemoryBuffer] = field(default_factory=list)
    page_tokens: int = 0
    room_id_buffer: Optional[int] = None
    state_type: int = StateType.MAMBA


@dataclass
class Discover:
    """(v4) Every rank of an engine instance, from the control address ("host:port") of one of
    them: ferryd handshakes with it and with the ranks its config lists."""

    address: str = ""


@dataclass
class Drain:
    """(v5) Start the daemon's drain, as a SIGTERM does: no new rooms, the accepted ones run to
    their end, then ferryd exits. Answered ``Ok``, again ``Ok`` while the drain runs."""


@dataclass
class SetLogLevel:
    """(v5) Set the level of one of ferryd's loggers (``logger``: ferryd, scheduler, room, peer,
    client, transport), or of all of them (``logger`` empty): trace, debug, info, warn, error or
    off."""

    logger: str = ""
    level: str = "info"


@dataclass
class Ok:
    pass


@dataclass
class Error:
    """An error reply; with seq 0 it is about the connection itself."""

    code: Union[Errc, int] = Errc.INTERNAL
    message: str = ""


@dataclass
class HelloReply:
    """The daemon, its position and its pools; ``version`` is the connection's version from now
    on. ``min_version``/``max_version`` are the daemon's range (v4; equal to ``version`` in a
    decoded v3 reply)."""

    version: int = PROTOCOL_VERSION
    node: str = ""
    instance: str = ""
    role: str = ""
    control: str = ""
    tp_size: int = 1
    tp_rank: int = 0
    page_tokens: int = 0
    config_yaml: str = ""
    pools: tuple[Pool, Pool, Pool] = field(default_factory=lambda: _NO_POOLS)
    min_version: int = MIN_PROTOCOL_VERSION
    max_version: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class PollResult:
    """A room's status: what ``poll`` answers, one entry of ``poll_many``'s answer, and (as
    :class:`Event`) what a subscription pushes.

    ``code`` is the v4 error code (``Errc.OK`` unless Failed; a Failed room always has a
    non-zero one), ``None`` on a v3 connection, which has no code. ``reason`` is the text of a
    failure."""

    room: int = 0
    status: Union[Status, int] = Status.Failed
    code: Union[Errc, int, None] = None
    reason: str = ""
    prefix_tokens: int = 0
    """v4, prefill side: the decode's ``prefix_tokens`` once every decode rank prepared the
    room (WaitingForInput and after); 0 before, on a decode, and in v3."""

    @property
    def terminal(self) -> bool:
        """Success or Failed."""
        return self.status in (Status.Failed, Status.Success)

    @property
    def succeeded(self) -> bool:
        return self.status == Status.Success

    @property
    def failed(self) -> bool:
        return self.status == Status.Failed


@dataclass(frozen=True)
class PollReply(PollResult):
    """The reply to ``poll``."""


@dataclass(frozen=True)
class Event(PollResult):
    """A status pushed to a subscriber (seq 0)."""


@dataclass
class InfoReply:
    text: str = ""


class DiscoveredRank(NamedTuple):
    """One rank of a discovered instance: ``up`` with its node name and TP/PP/DP position, or
    down with the ``reason``."""

    address: str
    up: bool
    node: str = ""
    tp_size: int = 0
    tp_rank: int = 0
    pp_size: int = 0
    pp_rank: int = 0
    dp_size: int = 0
    dp_rank: int = 0
    reason: str = ""


@dataclass
class DiscoverReply:
    """(v4) One entry per rank (at most 256): the rank asked about first, then the others in
    its config's order."""

    ranks: list[DiscoveredRank] = field(default_factory=list)


@dataclass
class PollManyReply:
    """(v4) One entry per room asked, in the order asked."""

    rooms: list[PollResult] = field(default_factory=list)


Message = Union[Hello, Prepare, Send, Poll, Cancel, Subscribe, Info, PollMany, RegisterMemory,
                Discover, Ok, Error, HelloReply, PollReply, InfoReply, Event, PollManyReply,
                DiscoverReply, Drain, SetLogLevel]

MESSAGE_CLASSES: dict[MessageType, type] = {
    MessageType.HELLO: Hello,
    MessageType.PREPARE: Prepare,
    MessageType.SEND: Send,
    MessageType.POLL: Poll,
    MessageType.CANCEL: Cancel,
    MessageType.SUBSCRIBE: Subscribe,
    MessageType.INFO: Info,
    MessageType.POLL_MANY: PollMany,
    MessageType.REGISTER_MEMORY: RegisterMemory,
    MessageType.DISCOVER: Discover,
    MessageType.OK: Ok,
    MessageType.ERROR: Error,
    MessageType.HELLO_REPLY: HelloReply,
    MessageType.POLL_REPLY: PollReply,
    MessageType.INFO_REPLY: InfoReply,
    MessageType.EVENT: Event,
    MessageType.POLL_MANY_REPLY: PollManyReply,
    MessageType.DISCOVER_REPLY: DiscoverReply,
    MessageType.DRAIN: Drain,
    MessageType.SET_LOG_LEVEL: SetLogLevel,
}
_TYPE_OF: dict[type, MessageType] = {cls: t for t, cls in MESSAGE_CLASSES.items()}


def message_type(msg: Union[Message, type]) -> MessageType:
    """The frame type of a message object or message class."""
    cls = msg if isinstance(msg, type) else type(msg)
    try:
        return _TYPE_OF[cls]
    except KeyError:
        raise TypeError(f"not a ferry protocol message: {cls.__name__}") from None


def check_version(version: int) -> None:
    """Raise ``ValueError`` unless this codec speaks protocol ``version``."""
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"protocol version {version} is not one this codec speaks "
                         f"({MIN_PROTOCOL_VERSION}..{PROTOCOL_VERSION})")


__all__ = [
    "PROTOCOL_VERSION", "MIN_PROTOCOL_VERSION", "SUPPORTED_VERSIONS", "NO_INDEX",
    "MAX_FRAME_BYTES", "HEADER_BYTES", "MAX_STRING_BYTES", "MAX_LIST_STRINGS", "MAX_POLL_MANY",
    "POLL_MANY_REASON_BYTES", "MAX_REGISTER_FDS", "MAX_REGISTER_BUFFERS", "MessageType",
    "V4_ONLY", "V5_ONLY", "first_version", "Drain", "SetLogLevel", "type_name", "Status", "InfoTopic", "BufferKind", "Buffer", "Pool", "POOL_KINDS",
    "MemoryKind", "StateType", "state_type_number", "pool_number", "MemoryBuffer", "MAX_SHARD_GROUPS", "RegisterMemory", "Discover", "DiscoveredRank",
    "DiscoverReply", "Hello", "Prepare", "Send", "Poll", "Cancel", "Subscribe", "Info",
    "PollMany", "Ok", "Error", "HelloReply", "PollResult", "PollReply", "Event", "InfoReply",
    "PollManyReply", "Message", "MESSAGE_CLASSES", "message_type",
]
