"""The client protocol's codec (docs/protocol.md): pure functions, no I/O.

    frame = encode(Poll(room=7), seq=3, version=4)          # bytes, 12-byte header included
    msg = decode(MessageType.POLL_REPLY, 3, body, version=4) # -> PollReply(...)

Every message of versions 3 and 4 is a dataclass below. ``encode`` and ``decode`` take the
connection's protocol version, since a few bodies differ between versions (``poll_reply`` and
``event`` carry a ``code`` in v4; ``poll_many``, ``poll_many_reply``, ``register_memory``,
``discover`` and ``discover_reply`` exist only in v4).
``hello`` and ``hello_reply`` carry their own version field and are laid out by it, whatever the
``version`` argument says (they are what settles the connection's version).

A body that does not decode raises :class:`~ferry.errors.ProtocolError` with the text the C++
codec (src/core/protocol_decode.cpp) gives, e.g. ``malformed poll_reply frame: truncated at field
'reason': needs 4 bytes, 2 remain``; its ``message_type`` and ``field`` attributes name them.
A message that cannot be encoded raises :class:`~ferry.errors.EncodeError`.

Strings travel as bytes; they are decoded as UTF-8 with ``surrogateescape``, so a reason cut in
the middle of a character (poll_many cuts reasons at 1000 bytes) still decodes and re-encodes
to the same bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple, Optional, Sequence, TypeVar, Union

from .errors import EncodeError, Errc, ProtocolError, to_errc

PROTOCOL_VERSION = 4
"""The highest protocol version this codec speaks."""
MIN_PROTOCOL_VERSION = 3
"""The lowest protocol version this codec speaks."""
SUPPORTED_VERSIONS = (3, 4)

NO_INDEX = 0xFFFFFFFF
"""``no_index``: the wire value of an absent state slot or aux row (``None`` in Python)."""
MAX_FRAME_BYTES = 16 << 20
"""Limit on a frame's length field (bytes after it)."""
HEADER_BYTES = 12
"""length + type + flags + seq."""
MAX_STRING_BYTES = 64 << 10
MAX_LIST_STRINGS = 256
"""Entries of a string list (the prefill peers of one prepare)."""
MAX_POLL_MANY = 16384
"""Rooms in one poll_many."""
POLL_MANY_REASON_BYTES = 1000
"""poll_many_reply cuts each reason there."""
MAX_REGISTER_FDS = 64
"""File descriptors with one register_memory."""
MAX_REGISTER_BUFFERS = 4096
"""Buffers in one register_memory."""
_REGISTER_BUFFER_BYTES = 37
"""One buffer entry of register_memory: u32 + 3 x u64 + 2 x u32 + u8."""


class MessageType(IntEnum):
    """Frame types; ``MessageType.X.wire_name`` is the name the C++ codec and the golden frames
    use (``"poll_many_reply"``)."""

    HELLO = 1
    PREPARE = 2
    SEND = 3
    POLL = 4
    CANCEL = 5
    SUBSCRIBE = 6
    INFO = 7
    POLL_MANY = 8  # v4
    REGISTER_MEMORY = 9  # v4
    DISCOVER = 10  # v4
    OK = 100
    ERROR = 101
    HELLO_REPLY = 102
    POLL_REPLY = 103
    INFO_REPLY = 104
    EVENT = 105
    POLL_MANY_REPLY = 106  # v4
    DISCOVER_REPLY = 107  # v4

    @property
    def wire_name(self) -> str:
        return self.name.lower()


V4_ONLY = frozenset({MessageType.POLL_MANY, MessageType.POLL_MANY_REPLY,
                     MessageType.REGISTER_MEMORY, MessageType.DISCOVER,
                     MessageType.DISCOVER_REPLY})


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
    """One of the daemon's pools (kv, state, aux) as hello_reply describes it."""

    present: bool
    shm_name: str
    total_bytes: int
    buffers: tuple[Buffer, ...]


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


@dataclass
class Send:
    """Prefill side: one chunk of a room; only the last carries the state slot and aux row."""

    room: int = 0
    src_pages: list[int] = field(default_factory=list)
    last: bool = False
    state_slot: Optional[int] = None
    aux_row: Optional[int] = None


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
    byte ``fd_offset`` (a multiple of 4096) of the frame's descriptor number ``fd_index``, and
    what the buffer is (``layer_id``, ``tensor``, ``kind``, as the pool's layout in hello_reply
    lists it)."""

    fd_index: int
    fd_offset: int
    item_bytes: int
    items: int
    layer_id: int
    tensor: int
    kind: int  # a BufferKind when known


@dataclass
class RegisterMemory:
    """(v4) Lend ferryd the client's own memory for a ``memory: client`` pool.

    ``pool``: 0 kv, 1 state, 2 aux. ``memory_kind``: 0 host (1..3 reserved, see
    :class:`MemoryKind`). ``fd_count`` descriptors ride as SCM_RIGHTS on the frame's first byte
    (at most 64); ``buffers`` (at most 4096) list every buffer of the pool in the pool's layout
    order, each as a range of one of those descriptors."""

    pool: int = 0
    memory_kind: int = MemoryKind.HOST
    fd_count: int = 0
    buffers: list[MemoryBuffer] = field(default_factory=list)


@dataclass
class Discover:
    """(v4) Every rank of an engine instance, from the control address ("host:port") of one of
    them: ferryd handshakes with it and with the ranks its config lists."""

    address: str = ""


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
                DiscoverReply]

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
}
_TYPE_OF: dict[type, MessageType] = {cls: t for t, cls in MESSAGE_CLASSES.items()}


def message_type(msg: Union[Message, type]) -> MessageType:
    """The frame type of a message object or message class."""
    cls = msg if isinstance(msg, type) else type(msg)
    try:
        return _TYPE_OF[cls]
    except KeyError:
        raise TypeError(f"not a ferry protocol message: {cls.__name__}") from None


def _check_version(version: int) -> None:
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"protocol version {version} is not one this codec speaks "
                         f"({MIN_PROTOCOL_VERSION}..{PROTOCOL_VERSION})")


# --------------------------------------------------------------------------------------------
# Encoding

_U8, _U16, _U32, _U64 = (struct.Struct(f) for f in ("<B", "<H", "<I", "<Q"))
_LIMITS = {1: 0xFF, 2: 0xFFFF, 4: 0xFFFFFFFF, 8: 0xFFFFFFFFFFFFFFFF}
_WIDTH_NAME = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}
_HEADER = struct.Struct("<IHHI")


def _to_bytes(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


def _to_str(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


class _Writer:
    """Appends fields; every check names the message and the field it failed on."""

    def __init__(self, mtype: MessageType, version: int) -> None:
        self.name = mtype.wire_name
        self.version = version
        self.parts: list[bytes] = []

    def fail(self, field_name: str, what: str) -> EncodeError:
        return EncodeError(f"cannot encode {self.name}: field '{field_name}' {what}",
                           message_type=self.name, field=field_name)

    def _int(self, value: object, width: int, field_name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            try:
                value = int(value.__index__())  # type: ignore[attr-defined]
            except (AttributeError, TypeError):
                raise self.fail(field_name, f"must be an integer, got {value!r}") from None
        if not 0 <= value <= _LIMITS[width]:
            raise self.fail(field_name, f"must be a {_WIDTH_NAME[width]}, got {value}")
        return value

    def num(self, value: object, width: int, field_name: str) -> None:
        v = self._int(value, width, field_name)
        self.parts.append(v.to_bytes(width, "little"))

    def index(self, value: Optional[int], field_name: str) -> None:
        """A u32 index field; None travels as no_index."""
        self.num(NO_INDEX if value is None else value, 4, field_name)

    def boolean(self, value: object, field_name: str) -> None:
        if value not in (True, False, 0, 1):
            raise self.fail(field_name, f"must be a bool, got {value!r}")
        self.parts.append(b"\x01" if value else b"\x00")

    def string(self, value: str, field_name: str) -> None:
        if not isinstance(value, str):
            raise self.fail(field_name, f"must be a str, got {type(value).__name__}")
        b = _to_bytes(value)
        if len(b) > MAX_STRING_BYTES:
            raise self.fail(field_name, f"is {len(b)} bytes, above the limit of {MAX_STRING_BYTES}")
        self.parts.append(_U32.pack(len(b)))
        self.parts.append(b)

    def str_list(self, values: Sequence[str], field_name: str) -> None:
        if isinstance(values, str):
            raise self.fail(field_name, "must be a list of strings, got a str")
        values = list(values)
        if len(values) > MAX_LIST_STRINGS:
            raise self.fail(field_name,
                            f"has {len(values)} entries, above the limit of {MAX_LIST_STRINGS}")
        self.parts.append(_U32.pack(len(values)))
        for v in values:
            self.string(v, field_name)

    def int_list(self, values: Sequence[int], width: int, field_name: str,
                 limit: Optional[int] = None) -> None:
        values = list(values)
        if limit is not None and len(values) > limit:
            raise self.fail(field_name, f"has {len(values)} entries, above the limit of {limit}")
        checked = [self._int(v, width, field_name) for v in values]
        self.parts.append(_U32.pack(len(checked)))
        self.parts.append(struct.pack(f"<{len(checked)}{'I' if width == 4 else 'Q'}", *checked))

    def status(self, room: int, status: int, code: Optional[int], reason: str,
               prefix_tokens: int = 0) -> None:
        """``u64 room, u8 status, (v4) u16 code, string reason, (v4) u32 prefix_tokens``."""
        self.num(room, 8, "room")
        self.num(status, 1, "status")
        if self.version >= 4:
            self.num(0 if code is None else code, 2, "code")
        self.string(reason, "reason")
        if self.version >= 4:
            self.num(prefix_tokens, 4, "prefix_tokens")


def _encode_body(w: _Writer, m: Message) -> None:
    if isinstance(m, Hello):
        w.num(m.version, 2, "version")
        w.string(m.client_name, "client_name")
        w.boolean(m.cancel_on_disconnect, "cancel_on_disconnect")
        if m.version >= 4:
            w.num(m.min_version, 2, "min_version")
    elif isinstance(m, Prepare):
        w.num(m.room, 8, "room")
        w.str_list(m.prefill_peers, "prefill_peers")
        w.int_list(m.dst_pages, 4, "dst_pages")
        w.index(m.state_slot, "state_slot")
        w.index(m.aux_row, "aux_row")
        if w.version >= 4:
            w.num(m.prefix_tokens, 4, "prefix_tokens")
    elif isinstance(m, Send):
        w.num(m.room, 8, "room")
        w.int_list(m.src_pages, 4, "src_pages")
        w.boolean(m.last, "last")
        w.index(m.state_slot, "state_slot")
        w.index(m.aux_row, "aux_row")
    elif isinstance(m, (Poll, Cancel, Subscribe)):
        w.num(m.room, 8, "room")
    elif isinstance(m, Info):
        w.num(m.topic, 1, "topic")
    elif isinstance(m, PollMany):
        w.int_list(m.rooms, 8, "rooms", MAX_POLL_MANY)
    elif isinstance(m, RegisterMemory):
        _encode_register_memory(w, m)
    elif isinstance(m, Discover):
        w.string(m.address, "address")
    elif isinstance(m, DiscoverReply):
        ranks = list(m.ranks)
        if len(ranks) > MAX_LIST_STRINGS:
            raise w.fail("ranks", f"has {len(ranks)} entries, above the limit of "
                                  f"{MAX_LIST_STRINGS}")
        w.num(len(ranks), 4, "ranks")
        for rank in ranks:
            w.string(rank.address, "rank.address")
            w.boolean(rank.up, "rank.up")
            w.string(rank.node, "rank.node")
            w.num(rank.tp_size, 4, "rank.tp_size")
            w.num(rank.tp_rank, 4, "rank.tp_rank")
            w.num(rank.pp_size, 4, "rank.pp_size")
            w.num(rank.pp_rank, 4, "rank.pp_rank")
            w.num(rank.dp_size, 4, "rank.dp_size")
            w.num(rank.dp_rank, 4, "rank.dp_rank")
            w.string(rank.reason, "rank.reason")
    elif isinstance(m, Ok):
        pass
    elif isinstance(m, Error):
        w.num(m.code, 2, "code")
        w.string(m.message, "message")
    elif isinstance(m, HelloReply):
        _encode_hello_reply(w, m)
    elif isinstance(m, (PollReply, Event)):
        w.status(m.room, m.status, m.code, m.reason, m.prefix_tokens)
    elif isinstance(m, InfoReply):
        w.string(m.text, "text")
    elif isinstance(m, PollManyReply):
        w.num(len(m.rooms), 4, "rooms")
        for r in m.rooms:
            w.status(r.room, r.status, r.code, r.reason, r.prefix_tokens)
    else:  # pragma: no cover - message_type() refused it already
        raise TypeError(type(m).__name__)


def _encode_register_memory(w: _Writer, m: RegisterMemory) -> None:
    pool = w._int(m.pool, 1, "pool")
    if pool >= len(POOL_KINDS):
        raise w.fail("pool", f"must be 0..{len(POOL_KINDS) - 1}, got {pool}")
    w.num(pool, 1, "pool")
    w.num(m.memory_kind, 1, "memory_kind")
    fd_count = w._int(m.fd_count, 4, "fd_count")
    if fd_count > MAX_REGISTER_FDS:
        raise w.fail("fd_count", f"is {fd_count}, above the limit of {MAX_REGISTER_FDS}")
    w.num(fd_count, 4, "fd_count")
    buffers = list(m.buffers)
    if len(buffers) > MAX_REGISTER_BUFFERS:
        raise w.fail("buffers", f"has {len(buffers)} entries, above the limit of "
                                f"{MAX_REGISTER_BUFFERS}")
    w.num(len(buffers), 4, "buffers")
    for b in buffers:
        if not isinstance(b, MemoryBuffer):
            try:
                b = MemoryBuffer(*b)
            except TypeError:
                raise w.fail("buffers", f"entries must be MemoryBuffer, got {b!r}") from None
        w.num(b.fd_index, 4, "buffer.fd_index")
        w.num(b.fd_offset, 8, "buffer.fd_offset")
        w.num(b.item_bytes, 8, "buffer.item_bytes")
        w.num(b.items, 8, "buffer.items")
        w.num(b.layer_id, 4, "buffer.layer_id")
        w.num(b.tensor, 4, "buffer.tensor")
        kind = w._int(b.kind, 1, "buffer.kind")
        if kind > BufferKind.AUX:
            raise w.fail("buffer.kind", f"is not a buffer kind: {kind}")
        w.num(kind, 1, "buffer.kind")


def _encode_hello_reply(w: _Writer, m: HelloReply) -> None:
    w.num(m.version, 2, "version")
    w.string(m.node, "node")
    w.string(m.instance, "instance")
    w.string(m.role, "role")
    w.string(m.control, "control")
    w.num(m.tp_size, 4, "tp_size")
    w.num(m.tp_rank, 4, "tp_rank")
    w.num(m.page_tokens, 4, "page_tokens")
    w.string(m.config_yaml, "config_yaml")
    if len(m.pools) != len(POOL_KINDS):
        raise w.fail("pools", f"must hold {len(POOL_KINDS)} pools (kv, state, aux), "
                              f"got {len(m.pools)}")
    for p in m.pools:
        w.boolean(p.present, "pool.present")
        w.string(p.shm_name, "pool.shm_name")
        w.num(p.total_bytes, 8, "pool.total_bytes")
        w.num(len(p.buffers), 4, "pool.buffers")
        for b in p.buffers:
            w.num(b.offset, 8, "buffer.offset")
            w.num(b.item_bytes, 8, "buffer.item_bytes")
            w.num(b.items, 8, "buffer.items")
            w.num(b.layer_id, 4, "buffer.layer_id")
            w.num(b.tensor, 4, "buffer.tensor")
            w.num(b.kind, 1, "buffer.kind")
    if m.version >= 4:
        w.num(m.min_version, 2, "min_version")
        w.num(m.max_version, 2, "max_version")


def encode(msg: Message, seq: int, version: int = PROTOCOL_VERSION) -> bytes:
    """The complete frame (12-byte header + body) of ``msg`` with ``seq``, in protocol
    ``version`` (the connection's).

    Raises :class:`EncodeError` for a field outside its wire range or limit, for a frame above
    16 MiB, and for a v4-only message in version 3."""
    _check_version(version)
    mtype = message_type(msg)
    if mtype in V4_ONLY and version < 4:
        raise EncodeError(f"{mtype.wire_name} needs protocol version 4; this connection "
                          f"speaks {version}", message_type=mtype.wire_name)
    w = _Writer(mtype, version)
    seq = w._int(seq, 4, "seq")
    _encode_body(w, msg)
    body = b"".join(w.parts)
    length = HEADER_BYTES - 4 + len(body)
    if length > MAX_FRAME_BYTES:
        raise EncodeError(f"cannot encode {mtype.wire_name}: the frame would be {length} bytes, "
                          f"above the limit of {MAX_FRAME_BYTES} bytes",
                          message_type=mtype.wire_name)
    return _HEADER.pack(length, int(mtype), 0, seq) + body


# --------------------------------------------------------------------------------------------
# Decoding


class _Fail(Exception):
    """A decoding failure inside a body: the C++ reader's error text and the field."""

    def __init__(self, text: str, field_name: str) -> None:
        super().__init__(text)
        self.text = text
        self.field = field_name


_R = TypeVar("_R", bound="PollResult")


class _Reader:
    """Bounds-checked reader with the C++ reader's error texts."""

    def __init__(self, data: bytes, version: int) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.version = version

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def _truncated(self, field_name: str, need: int) -> _Fail:
        return _Fail(f"truncated at field '{field_name}': needs {need} bytes, "
                     f"{self.remaining()} remain", field_name)

    def num(self, width: int, field_name: str) -> int:
        if self.remaining() < width:
            raise self._truncated(field_name, width)
        v = int.from_bytes(self.data[self.pos:self.pos + width], "little")
        self.pos += width
        return v

    def boolean(self, field_name: str) -> bool:
        v = self.num(1, field_name)
        if v > 1:
            raise _Fail(f"field '{field_name}' must be 0 or 1, got {v}", field_name)
        return v == 1

    def index(self, field_name: str) -> Optional[int]:
        v = self.num(4, field_name)
        return None if v == NO_INDEX else v

    def string(self, field_name: str) -> str:
        n = self.num(4, field_name)
        if n > MAX_STRING_BYTES:
            raise _Fail(f"field '{field_name}' is {n} bytes, above the limit of "
                        f"{MAX_STRING_BYTES}", field_name)
        if self.remaining() < n:
            raise self._truncated(field_name, n)
        s = _to_str(bytes(self.data[self.pos:self.pos + n]))
        self.pos += n
        return s

    def str_list(self, field_name: str) -> list[str]:
        n = self.num(4, field_name)
        if n > MAX_LIST_STRINGS:
            raise _Fail(f"field '{field_name}' has {n} entries, above the limit of "
                        f"{MAX_LIST_STRINGS}", field_name)
        return [self.string(field_name) for _ in range(n)]

    def int_list(self, width: int, field_name: str, limit: Optional[int] = None) -> list[int]:
        n = self.num(4, field_name)
        if limit is not None and n > limit:
            raise _Fail(f"field '{field_name}' has {n} entries, above the limit of {limit}",
                        field_name)
        if self.remaining() // width < n:
            raise _Fail(f"field '{field_name}' claims {n} entries but only {self.remaining()} "
                        f"bytes remain", field_name)
        vals = list(struct.unpack_from(f"<{n}{'I' if width == 4 else 'Q'}", self.data, self.pos))
        self.pos += n * width
        return vals

    def status(self, field_name: str) -> Status:
        v = self.num(1, field_name)
        if v > Status.Success:
            raise _Fail(f"field '{field_name}' is not a status: {v}", field_name)
        return Status(v)

    def code(self, field_name: str) -> Union[Errc, int]:
        return to_errc(self.num(2, field_name))

    def room_status(self, cls: type[_R]) -> _R:
        """``u64 room, u8 status, (v4) u16 code, string reason, (v4) u32 prefix_tokens``."""
        room = self.num(8, "room")
        status = self.status("status")
        code = self.code("code") if self.version >= 4 else None
        reason = self.string("reason")
        prefix = self.num(4, "prefix_tokens") if self.version >= 4 else 0
        return cls(room, status, code, reason, prefix)


def _decode_hello(r: _Reader) -> Hello:
    version = r.num(2, "version")
    name = r.string("client_name")
    cancel = r.num(1, "cancel_on_disconnect") != 0
    min_version = version  # a v3 hello speaks only its own version
    if version >= 4:
        min_version = r.num(2, "min_version")
        if min_version > version:
            raise _Fail(f"field 'min_version' is {min_version}, above 'version' {version}",
                        "min_version")
    return Hello(version, name, cancel, min_version)


def _decode_hello_reply(r: _Reader) -> HelloReply:
    m = HelloReply(version=r.num(2, "version"), node=r.string("node"), instance=r.string("instance"),
                   role=r.string("role"), control=r.string("control"), tp_size=r.num(4, "tp_size"),
                   tp_rank=r.num(4, "tp_rank"), page_tokens=r.num(4, "page_tokens"),
                   config_yaml=r.string("config_yaml"))
    pools: list[Pool] = []
    for _ in POOL_KINDS:
        present = r.boolean("pool.present")
        shm_name = r.string("pool.shm_name")
        total = r.num(8, "pool.total_bytes")
        n = r.num(4, "pool.buffers")
        if r.remaining() // 33 < n:
            raise _Fail(f"field 'pool.buffers' claims {n} entries, too many for the frame",
                        "pool.buffers")
        bufs = []
        for _ in range(n):
            offset, item_bytes, items = (r.num(8, "buffer.offset"), r.num(8, "buffer.item_bytes"),
                                         r.num(8, "buffer.items"))
            layer_id, tensor = r.num(4, "buffer.layer_id"), r.num(4, "buffer.tensor")
            kind = r.num(1, "buffer.kind")
            bufs.append(Buffer(offset, item_bytes, items, layer_id, tensor,
                               BufferKind(kind) if kind <= BufferKind.AUX else kind))
        pools.append(Pool(present, shm_name, total, tuple(bufs)))
    m.pools = (pools[0], pools[1], pools[2])
    if m.version >= 4:
        m.min_version = r.num(2, "min_version")
        m.max_version = r.num(2, "max_version")
    else:
        m.min_version = m.max_version = m.version
    return m


def _decode_info(r: _Reader) -> Info:
    topic = r.num(1, "topic")
    if topic > InfoTopic.POOLS:
        raise _Fail(f"field 'topic' must be 0..3, got {topic}", "topic")
    return Info(InfoTopic(topic))


def _decode_poll_many_reply(r: _Reader) -> PollManyReply:
    n = r.num(4, "rooms")
    # Each entry takes at least 19 bytes (room, status, code, an empty reason's length, prefix).
    if r.remaining() // 19 < n:
        raise _Fail(f"field 'rooms' claims {n} entries, too many for the frame", "rooms")
    return PollManyReply([r.room_status(PollResult) for _ in range(n)])


def _decode_register_memory(r: _Reader) -> RegisterMemory:
    # The C++ codec reads the four fixed fields first, then checks them in this order.
    pool = r.num(1, "pool")
    memory_kind = r.num(1, "memory_kind")
    fd_count = r.num(4, "fd_count")
    n = r.num(4, "buffers")
    if pool >= len(POOL_KINDS):
        raise _Fail(f"field 'pool' must be 0..{len(POOL_KINDS) - 1}, got {pool}", "pool")
    if fd_count > MAX_REGISTER_FDS:
        raise _Fail(f"field 'fd_count' is {fd_count}, above the limit of {MAX_REGISTER_FDS}",
                    "fd_count")
    if n > MAX_REGISTER_BUFFERS:
        raise _Fail(f"field 'buffers' has {n} entries, above the limit of "
                    f"{MAX_REGISTER_BUFFERS}", "buffers")
    if r.remaining() // _REGISTER_BUFFER_BYTES < n:
        raise _Fail(f"field 'buffers' claims {n} entries, too many for the frame", "buffers")
    buffers = []
    for _ in range(n):
        fd_index, fd_offset = r.num(4, "buffer.fd_index"), r.num(8, "buffer.fd_offset")
        item_bytes, items = r.num(8, "buffer.item_bytes"), r.num(8, "buffer.items")
        layer_id, tensor = r.num(4, "buffer.layer_id"), r.num(4, "buffer.tensor")
        kind = r.num(1, "buffer.kind")
        if kind > BufferKind.AUX:
            raise _Fail(f"field 'buffer.kind' is not a buffer kind: {kind}", "buffer.kind")
        buffers.append(MemoryBuffer(fd_index, fd_offset, item_bytes, items, layer_id, tensor,
                                    BufferKind(kind)))
    kind_value: Union[MemoryKind, int] = (MemoryKind(memory_kind)
                                          if memory_kind <= MemoryKind.CUDA_VMM_FD
                                          else memory_kind)
    return RegisterMemory(pool, kind_value, fd_count, buffers)


def _decode_discover_reply(r: _Reader) -> DiscoverReply:
    n = r.num(4, "ranks")
    if n > MAX_LIST_STRINGS:
        raise _Fail(f"field 'ranks' has {n} entries, above the limit of {MAX_LIST_STRINGS}",
                    "ranks")
    return DiscoverReply([DiscoveredRank(r.string("rank.address"), r.boolean("rank.up"),
                                         r.string("rank.node"), r.num(4, "rank.tp_size"),
                                         r.num(4, "rank.tp_rank"), r.num(4, "rank.pp_size"),
                                         r.num(4, "rank.pp_rank"), r.num(4, "rank.dp_size"),
                                         r.num(4, "rank.dp_rank"), r.string("rank.reason"))
                          for _ in range(n)])


def _decode_body(mtype: MessageType, r: _Reader) -> Message:
    if mtype == MessageType.HELLO:
        return _decode_hello(r)
    if mtype == MessageType.PREPARE:
        return Prepare(r.num(8, "room"), r.str_list("prefill_peers"), r.int_list(4, "dst_pages"),
                       r.index("state_slot"), r.index("aux_row"),
                       r.num(4, "prefix_tokens") if r.version >= 4 else 0)
    if mtype == MessageType.SEND:
        return Send(r.num(8, "room"), r.int_list(4, "src_pages"), r.boolean("last"),
                    r.index("state_slot"), r.index("aux_row"))
    if mtype == MessageType.POLL:
        return Poll(r.num(8, "room"))
    if mtype == MessageType.CANCEL:
        return Cancel(r.num(8, "room"))
    if mtype == MessageType.SUBSCRIBE:
        return Subscribe(r.num(8, "room"))
    if mtype == MessageType.INFO:
        return _decode_info(r)
    if mtype == MessageType.POLL_MANY:
        return PollMany(r.int_list(8, "rooms", MAX_POLL_MANY))
    if mtype == MessageType.REGISTER_MEMORY:
        return _decode_register_memory(r)
    if mtype == MessageType.DISCOVER:
        return Discover(r.string("address"))
    if mtype == MessageType.DISCOVER_REPLY:
        return _decode_discover_reply(r)
    if mtype == MessageType.OK:
        return Ok()
    if mtype == MessageType.ERROR:
        return Error(r.code("code"), r.string("message"))
    if mtype == MessageType.HELLO_REPLY:
        return _decode_hello_reply(r)
    if mtype == MessageType.POLL_REPLY:
        return r.room_status(PollReply)
    if mtype == MessageType.INFO_REPLY:
        return InfoReply(r.string("text"))
    if mtype == MessageType.EVENT:
        return r.room_status(Event)
    if mtype == MessageType.POLL_MANY_REPLY:
        return _decode_poll_many_reply(r)
    raise AssertionError(mtype)  # pragma: no cover


def decode(mtype: int, seq: int, body: bytes, version: int = PROTOCOL_VERSION) -> Message:
    """Decode one frame body (header excluded) of type ``mtype`` in protocol ``version``.

    ``seq`` is not part of the message (the caller keeps it); it is taken for symmetry with
    the C++ ``decode``. Raises :class:`ProtocolError` (code 310) naming the message type and
    the field, in the C++ codec's words."""
    _check_version(version)
    try:
        t = MessageType(mtype)
    except ValueError:
        raise ProtocolError(Errc.MALFORMED_FRAME, f"unknown message type {mtype}") from None
    if t in V4_ONLY and version < 4:
        raise ProtocolError(Errc.MALFORMED_FRAME,
                            f"{t.wire_name} needs protocol version 4; this connection "
                            f"speaks {version}", message_type=t.wire_name)
    r = _Reader(body, version)
    try:
        msg = _decode_body(t, r)
    except _Fail as e:
        raise ProtocolError(Errc.MALFORMED_FRAME, f"malformed {t.wire_name} frame: {e.text}",
                            message_type=t.wire_name, field=e.field) from None
    if r.remaining() != 0:
        raise ProtocolError(Errc.MALFORMED_FRAME,
                            f"malformed {t.wire_name} frame: {r.remaining()} unexpected bytes "
                            f"after the last field", message_type=t.wire_name)
    return msg


# --------------------------------------------------------------------------------------------
# Framing


class Frame(NamedTuple):
    """One frame split from a byte stream, body not yet decoded."""

    type: int
    flags: int
    seq: int
    body: bytes


def _check_length(length: int) -> None:
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(Errc.FRAME_TOO_LARGE, f"frame of {length} bytes exceeds the limit of "
                                                  f"{MAX_FRAME_BYTES} bytes", framing_lost=True)
    if length < HEADER_BYTES - 4:
        raise ProtocolError(Errc.MALFORMED_FRAME, f"frame length {length} is shorter than the "
                                                  f"{HEADER_BYTES}-byte header", framing_lost=True)


def check_flags(frame: Frame) -> None:
    """Raise the C++ codec's error for a frame whose flags are not 0."""
    if frame.flags != 0:
        raise ProtocolError(Errc.MALFORMED_FRAME, f"frame flags must be 0, got {frame.flags:#06x}",
                            message_type=type_name(frame.type))


class FrameReader:
    """Splits a byte stream into frames (the C++ ``frame_reader`` without the decoding).

    A length field above 16 MiB or below the header raises :class:`ProtocolError` with
    ``framing_lost`` set: the stream cannot be resynchronised and must be closed."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        """Append received bytes."""
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    def buffered(self) -> int:
        """Bytes received and not yet returned as frames."""
        return len(self._buf) - self._pos

    def next(self) -> Optional[Frame]:
        """The next complete frame, or None when more bytes are needed."""
        if self.buffered() < 4:
            return None
        (length,) = _U32.unpack_from(self._buf, self._pos)
        _check_length(length)
        if self.buffered() < 4 + length:
            return None
        _, mtype, flags, seq = _HEADER.unpack_from(self._buf, self._pos)
        body = bytes(self._buf[self._pos + HEADER_BYTES:self._pos + 4 + length])
        self._pos += 4 + length
        if self._pos > (1 << 20) and self._pos * 2 > len(self._buf):
            del self._buf[:self._pos]
            self._pos = 0
        return Frame(mtype, flags, seq, body)


def split_frame(frame: bytes) -> Frame:
    """The header fields and body of one whole frame (exactly one, nothing after it)."""
    if len(frame) < HEADER_BYTES:
        raise ProtocolError(Errc.MALFORMED_FRAME, f"a frame of {len(frame)} bytes is shorter "
                                                  f"than the {HEADER_BYTES}-byte header")
    length, mtype, flags, seq = _HEADER.unpack_from(frame)
    _check_length(length)
    if length != len(frame) - 4:
        raise ProtocolError(Errc.MALFORMED_FRAME, f"frame length field says {length} bytes, "
                                                  f"{len(frame) - 4} follow it")
    return Frame(mtype, flags, seq, bytes(frame[HEADER_BYTES:]))


def decode_frame(frame: bytes, version: int = PROTOCOL_VERSION) -> tuple[int, Message]:
    """``(seq, message)`` of one whole frame, header included; checks length and flags."""
    f = split_frame(frame)
    check_flags(f)
    return f.seq, decode(f.type, f.seq, f.body, version)


__all__ = [
    "PROTOCOL_VERSION", "MIN_PROTOCOL_VERSION", "SUPPORTED_VERSIONS", "NO_INDEX",
    "MAX_FRAME_BYTES", "HEADER_BYTES", "MAX_STRING_BYTES", "MAX_LIST_STRINGS", "MAX_POLL_MANY",
    "POLL_MANY_REASON_BYTES", "MAX_REGISTER_FDS", "MAX_REGISTER_BUFFERS", "MessageType",
    "V4_ONLY", "type_name", "Status", "InfoTopic", "BufferKind", "Buffer", "Pool", "POOL_KINDS",
    "MemoryKind", "pool_number", "MemoryBuffer", "RegisterMemory", "Discover", "DiscoveredRank",
    "DiscoverReply", "Hello", "Prepare", "Send",
    "Poll", "Cancel", "Subscribe", "Info", "PollMany", "Ok", "Error", "HelloReply", "PollResult",
    "PollReply",
    "Event", "InfoReply", "PollManyReply", "Message", "MESSAGE_CLASSES", "message_type",
    "encode", "decode", "Frame", "FrameReader", "check_flags", "split_frame", "decode_frame",
]
