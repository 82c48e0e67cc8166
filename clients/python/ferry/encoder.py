"""The client protocol's encoder (docs/protocol.md): a message dataclass of
:mod:`ferry.messages` to its complete frame, header included. Pure, no I/O.

    frame = encode(Poll(room=7), seq=3, version=4)          # bytes, 12-byte header included

A few bodies differ between versions (``prepare``, ``poll_reply`` and ``event`` carry more in
v4), so ``encode`` takes the connection's version; ``hello`` and ``hello_reply`` are laid out
by their own ``version`` field. A message that cannot be encoded (a field outside its wire
range or limit, a frame above 16 MiB, a v4-only message in version 3, a v8 field that is not
empty or zero in an earlier version) raises
:class:`~ferry.errors.EncodeError` naming the message and the field. Strings travel as UTF-8
with ``surrogateescape``, so what the decoder read re-encodes to the same bytes.
"""

from __future__ import annotations

import struct
from typing import Optional, Sequence

from .errors import EncodeError
from .frames import HEADER
from .messages import (HEADER_BYTES, MAX_FRAME_BYTES, MAX_LIST_STRINGS, MAX_POLL_MANY,
                       MAX_REGISTER_BUFFERS, MAX_REGISTER_FDS, MAX_SHARD_GROUPS, MAX_STRING_BYTES, NO_INDEX,
                       POOL_KINDS, PROTOCOL_VERSION, BufferKind, Cancel, Discover, Drain, SetLogLevel, first_version,
                       DiscoverReply, Error, Event, Hello, HelloReply, Info, InfoReply,
                       MemoryBuffer, Message, MessageType, Ok, Poll, PollMany, PollManyReply,
                       PollReply, Prepare, RegisterMemory, Send, StateType, Subscribe, check_version,
                       message_type)

_U32 = struct.Struct("<I")
_LIMITS = {1: 0xFF, 2: 0xFFFF, 4: 0xFFFFFFFF, 8: 0xFFFFFFFFFFFFFFFF}
_WIDTH_NAME = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}


def _to_bytes(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


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
        _state_pages(w, m.state_pages)
        if w.version >= 10:
            w.boolean(m.checksum, "checksum")
        elif m.checksum:
            # An older daemon would not check the room, and its Success would claim it was.
            raise EncodeError(f"a checked room needs protocol version 10; this connection "
                              f"speaks {w.version}", message_type=w.name, field="checksum")
    elif isinstance(m, Send):
        w.num(m.room, 8, "room")
        w.int_list(m.src_pages, 4, "src_pages")
        w.boolean(m.last, "last")
        w.index(m.state_slot, "state_slot")
        w.index(m.aux_row, "aux_row")
        if w.version >= 6:
            w.num(m.first_layer, 4, "first_layer")
            w.num(m.layer_count, 4, "layer_count")
        elif m.first_layer or m.layer_count:
            raise EncodeError(f"a layer range needs protocol version 6; this connection speaks "
                              f"{w.version}", message_type="send")
        _state_pages(w, m.state_pages)
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
    elif isinstance(m, Drain):
        pass
    elif isinstance(m, SetLogLevel):
        w.string(m.logger, "logger")
        w.string(m.level, "level")
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


def _state_pages(w: _Writer, pages: Sequence[int]) -> None:
    """(v8) ``u32_list state_pages`` after the fields of earlier versions; before v8 only an
    empty list can be encoded (it is not on the wire)."""
    if w.version >= 8:
        w.int_list(pages, 4, "state_pages")
    elif len(list(pages)):
        raise EncodeError(f"state pages need protocol version 8; this connection speaks "
                          f"{w.version}", message_type=w.name, field="state_pages")


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
        if w.version >= 7:
            w.num(b.slice_dim, 4, "buffer.slice_dim")
            w.num(b.total_dim, 4, "buffer.total_dim")
            w.num(b.outer, 8, "buffer.outer")
            groups = list(b.groups)
            if len(groups) > MAX_SHARD_GROUPS:
                raise w.fail("buffer.groups", f"has {len(groups)} entries, above the limit of "
                                              f"{MAX_SHARD_GROUPS}")
            w.num(len(groups), 2, "buffer.groups")
            for g in groups:
                w.num(g, 8, "buffer.group")
            units = list(b.units)
            if units and len(units) != len(groups):
                raise w.fail("buffer.units", f"has {len(units)} entries for {len(groups)} shard "
                                             "groups (0 or one per group)")
            if w.version >= 9:
                w.num(len(units), 2, "buffer.units")
                for u in units:
                    w.num(u, 8, "buffer.unit")
            elif units:
                # An older daemon would slice the groups every rank holds whole.
                raise EncodeError(f"shard units need protocol version 9; this connection speaks "
                                  f"{w.version}", message_type=w.name, field="buffer.units")
    if w.version >= 7:
        w.num(m.page_tokens, 4, "page_tokens")
        w.num(NO_INDEX if m.room_id_buffer is None else m.room_id_buffer, 4, "room_id_buffer")
    state_type = w._int(m.state_type, 1, "state_type")
    if state_type > StateType.MINIMAX_INDEX_K:
        raise w.fail("state_type", f"is not a state type: {state_type}")
    if w.version >= 8:
        w.num(state_type, 1, "state_type")
    elif state_type != StateType.MAMBA:
        raise EncodeError(f"state type {StateType(state_type).wire_name} needs protocol version "
                          f"8; this connection speaks {w.version}", message_type=w.name,
                          field="state_type")


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
        if m.version >= 7:
            w.boolean(p.registered, "pool.registered")
    if m.version >= 4:
        w.num(m.min_version, 2, "min_version")
        w.num(m.max_version, 2, "max_version")


def encode(msg: Message, seq: int, version: int = PROTOCOL_VERSION) -> bytes:
    """The complete frame (12-byte header + body) of ``msg`` with ``seq``, in protocol
    ``version`` (the connection's).

    Raises :class:`EncodeError` for a field outside its wire range or limit, for a frame above
    16 MiB, and for a v4-only message in version 3."""
    check_version(version)
    mtype = message_type(msg)
    if version < first_version(mtype):
        raise EncodeError(f"{mtype.wire_name} needs protocol version {first_version(mtype)}; "
                          f"this connection speaks {version}", message_type=mtype.wire_name)
    w = _Writer(mtype, version)
    seq = w._int(seq, 4, "seq")
    _encode_body(w, msg)
    body = b"".join(w.parts)
    length = HEADER_BYTES - 4 + len(body)
    if length > MAX_FRAME_BYTES:
        raise EncodeError(f"cannot encode {mtype.wire_name}: the frame would be {length} bytes, "
                          f"above the limit of {MAX_FRAME_BYTES} bytes",
                          message_type=mtype.wire_name)
    return HEADER.pack(length, int(mtype), 0, seq) + body


__all__ = ["encode"]
