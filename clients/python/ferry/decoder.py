"""The client protocol's decoder (docs/protocol.md): a frame body to its message dataclass of
:mod:`ferry.messages`, with the C++ codec's checks and words. Pure, no I/O.

    msg = decode(MessageType.POLL_REPLY, 3, body, version=4) # -> PollReply(...)
    seq, msg = decode_frame(frame, version=4)                 # a whole frame, header included

``decode`` takes the connection's protocol version, since a few bodies differ between versions
(``poll_reply`` and ``event`` carry a ``code`` in v4; ``poll_many``, ``poll_many_reply``,
``register_memory``, ``discover`` and ``discover_reply`` exist only in v4). ``hello`` and
``hello_reply`` carry their own version field and are read by it, whatever the ``version``
argument says.

A body that does not decode raises :class:`~ferry.errors.ProtocolError` with the text the C++
codec (src/core/protocol_decode.cpp) gives, e.g. ``malformed poll_reply frame: truncated at field
'reason': needs 4 bytes, 2 remain``; its ``message_type`` and ``field`` attributes name them.
Strings are decoded as UTF-8 with ``surrogateescape``, so a reason cut in the middle of a
character (poll_many cuts reasons at 1000 bytes) still decodes and re-encodes to the same bytes.
"""

from __future__ import annotations

import struct
from typing import Optional, TypeVar, Union

from .errors import Errc, ProtocolError, to_errc
from .frames import check_flags, split_frame
from .messages import (MAX_LIST_STRINGS, MAX_POLL_MANY, MAX_REGISTER_BUFFERS, MAX_REGISTER_FDS,
                       MAX_SHARD_GROUPS,
                       MAX_STRING_BYTES, NO_INDEX, POOL_KINDS, PROTOCOL_VERSION, Buffer,
                       BufferKind, Cancel, Discover, DiscoveredRank, Drain, SetLogLevel, first_version, DiscoverReply, Error, Event,
                       Hello, HelloReply, Info, InfoReply, InfoTopic, MemoryBuffer, MemoryKind,
                       Message, MessageType, Ok, Poll, PollMany, PollManyReply, PollReply,
                       PollResult, Pool, Prepare, RegisterMemory, Send, StateType, Status, Subscribe,
                       check_version)

_REGISTER_BUFFER_BYTES = 37
"""One buffer entry of register_memory: u32 + 3 x u64 + 2 x u32 + u8."""


def _to_str(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


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
        registered = r.boolean("pool.registered") if m.version >= 7 else False
        pools.append(Pool(present, shm_name, total, tuple(bufs), registered))
    m.pools = (pools[0], pools[1], pools[2])
    if m.version >= 4:
        m.min_version = r.num(2, "min_version")
        m.max_version = r.num(2, "max_version")
    else:
        m.min_version = m.max_version = m.version
    return m


def _decode_info(r: _Reader) -> Info:
    topic = r.num(1, "topic")
    if topic > InfoTopic.TIMELINES:
        raise _Fail(f"field 'topic' must be 0..4, got {topic}", "topic")
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
        if r.version < 7:
            buffers.append(MemoryBuffer(fd_index, fd_offset, item_bytes, items, layer_id, tensor,
                                        BufferKind(kind)))
            continue
        slice_dim, total_dim = r.num(4, "buffer.slice_dim"), r.num(4, "buffer.total_dim")
        outer, ngroups = r.num(8, "buffer.outer"), r.num(2, "buffer.groups")
        if ngroups > MAX_SHARD_GROUPS:
            raise _Fail(f"field 'buffer.groups' has {ngroups} entries, above the limit of "
                        f"{MAX_SHARD_GROUPS}", "buffer.groups")
        groups = tuple(r.num(8, "buffer.group") for _ in range(ngroups))
        units: tuple[int, ...] = ()
        if r.version >= 9:
            nunits = r.num(2, "buffer.units")
            if nunits not in (0, ngroups):
                raise _Fail(f"field 'buffer.units' has {nunits} entries for {ngroups} shard groups "
                            "(0 or one per group)", "buffer.units")
            units = tuple(r.num(8, "buffer.unit") for _ in range(nunits))
        buffers.append(MemoryBuffer(fd_index, fd_offset, item_bytes, items, layer_id, tensor,
                                    BufferKind(kind), slice_dim, total_dim, outer, groups, units))
    page_tokens, room_id_buffer = 0, None
    if r.version >= 7:
        page_tokens = r.num(4, "page_tokens")
        room = r.num(4, "room_id_buffer")
        room_id_buffer = None if room == NO_INDEX else room
    state_type = StateType.MAMBA
    if r.version >= 8:
        value = r.num(1, "state_type")
        if value > StateType.MINIMAX_INDEX_K:
            raise _Fail(f"field 'state_type' is not a state type: {value}", "state_type")
        state_type = StateType(value)
    kind_value: Union[MemoryKind, int] = (MemoryKind(memory_kind)
                                          if memory_kind <= MemoryKind.CUDA_VMM_FD
                                          else memory_kind)
    return RegisterMemory(pool, kind_value, fd_count, buffers, page_tokens, room_id_buffer,
                          state_type)


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
                       r.num(4, "prefix_tokens") if r.version >= 4 else 0,
                       r.int_list(4, "state_pages") if r.version >= 8 else [],
                       r.boolean("checksum") if r.version >= 10 else False)
    if mtype == MessageType.SEND:
        return Send(r.num(8, "room"), r.int_list(4, "src_pages"), r.boolean("last"),
                    r.index("state_slot"), r.index("aux_row"),
                    r.num(4, "first_layer") if r.version >= 6 else 0,
                    r.num(4, "layer_count") if r.version >= 6 else 0,
                    r.int_list(4, "state_pages") if r.version >= 8 else [])
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
    if mtype == MessageType.DRAIN:
        return Drain()
    if mtype == MessageType.SET_LOG_LEVEL:
        return SetLogLevel(r.string("logger"), r.string("level"))
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
    check_version(version)
    try:
        t = MessageType(mtype)
    except ValueError:
        raise ProtocolError(Errc.MALFORMED_FRAME, f"unknown message type {mtype}") from None
    if version < first_version(t):
        raise ProtocolError(Errc.MALFORMED_FRAME,
                            f"{t.wire_name} needs protocol version {first_version(t)}; this "
                            f"connection speaks {version}", message_type=t.wire_name)
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


def decode_frame(frame: bytes, version: int = PROTOCOL_VERSION) -> tuple[int, Message]:
    """``(seq, message)`` of one whole frame, header included; checks length and flags."""
    f = split_frame(frame)
    check_flags(f)
    return f.seq, decode(f.type, f.seq, f.body, version)


__all__ = ["decode", "decode_frame"]
