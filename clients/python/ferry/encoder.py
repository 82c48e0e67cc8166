"""The client protocol's encoder (docs/protocol.md): a message dataclass of
:mod:`ferry.messages` to its complete frame, header included. Pure, no I/O.

    frame = encode(Poll(room=7), seq=3, version=4)          # bytes, 12-byte header included

Every body's encoder is generated from the protocol's one description, src/core/wire.yaml
(ferry/_codec.py); this module holds the writer they use. A few bodies differ between versions
(``prepare``, ``poll_reply`` and ``event`` carry more in v4), so ``encode`` takes the
connection's version; ``hello`` and ``hello_reply`` are laid out
by their own ``version`` field. A message that cannot be encoded (a field outside its wire
range or limit, a frame above 16 MiB, a v4-only message in version 3, a v8 field that is not
empty or zero in an earlier version) raises
:class:`~ferry.errors.EncodeError` naming the message and the field. Strings travel as UTF-8
with ``surrogateescape``, so what the decoder read re-encodes to the same bytes.
"""

from __future__ import annotations

import struct
from typing import Any, Iterable, Optional, Sequence

from ._codec import ENCODERS
from .errors import EncodeError
from .frames import HEADER
from .messages import (HEADER_BYTES, MAX_FRAME_BYTES, MAX_STRING_BYTES, NO_INDEX,
                       PROTOCOL_VERSION, Message, MessageType, check_version, first_version,
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

    def int_value(self, value: object, width: int, field_name: str) -> int:
        """``value`` as an int that fits ``width`` bytes, or EncodeError."""
        if isinstance(value, bool) or not isinstance(value, int):
            try:
                value = int(value.__index__())  # type: ignore[attr-defined]
            except (AttributeError, TypeError):
                raise self.fail(field_name, f"must be an integer, got {value!r}") from None
        if not 0 <= value <= _LIMITS[width]:
            raise self.fail(field_name, f"must be a {_WIDTH_NAME[width]}, got {value}")
        return value

    def num(self, value: object, width: int, field_name: str) -> None:
        v = self.int_value(value, width, field_name)
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

    def str_list(self, values: Sequence[str], field_name: str,
                 limit: Optional[int] = None) -> None:
        if isinstance(values, str):
            raise self.fail(field_name, "must be a list of strings, got a str")
        values = self.items(values, field_name, limit)
        self.parts.append(_U32.pack(len(values)))
        for v in values:
            self.string(v, field_name)

    def int_list(self, values: Sequence[int], width: int, field_name: str,
                 limit: Optional[int] = None) -> None:
        values = list(values)
        if limit is not None and len(values) > limit:
            raise self.fail(field_name, f"has {len(values)} entries, above the limit of {limit}")
        checked = [self.int_value(v, width, field_name) for v in values]
        self.parts.append(_U32.pack(len(checked)))
        self.parts.append(struct.pack(f"<{len(checked)}{'I' if width == 4 else 'Q'}", *checked))

    def items(self, values: Iterable[Any], field_name: str,
              limit: Optional[int] = None) -> list[Any]:
        """The entries of a list field, at most ``limit`` of them."""
        values = list(values)
        if limit is not None and len(values) > limit:
            raise self.fail(field_name, f"has {len(values)} entries, above the limit of {limit}")
        return values

    def record(self, value: Any, cls: type, field_name: str) -> Any:
        """An entry of a list of ``cls`` (a tuple of its fields is taken too)."""
        if isinstance(value, cls):
            return value
        try:
            return cls(*value)
        except TypeError:
            raise self.fail(field_name, f"entries must be {cls.__name__}, got {value!r}") from None

    def too_old(self, what: str, since: int, field_name: str) -> EncodeError:
        """A value this connection's version cannot carry (an older daemon would ignore it):
        ``what`` says it, with its verb ("a checked room needs")."""
        return EncodeError(f"{what} protocol version {since}; this connection speaks "
                           f"{self.version}", message_type=self.name, field=field_name)


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
    seq = w.int_value(seq, 4, "seq")
    ENCODERS[type(msg)](w, msg)
    body = b"".join(w.parts)
    length = HEADER_BYTES - 4 + len(body)
    if length > MAX_FRAME_BYTES:
        raise EncodeError(f"cannot encode {mtype.wire_name}: the frame would be {length} bytes, "
                          f"above the limit of {MAX_FRAME_BYTES} bytes",
                          message_type=mtype.wire_name)
    return HEADER.pack(length, int(mtype), 0, seq) + body


__all__ = ["encode"]
