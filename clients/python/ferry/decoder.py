"""The client protocol's decoder (docs/protocol.md): a frame body to its message dataclass of
:mod:`ferry.messages`, with the C++ codec's checks and words. Pure, no I/O.

    msg = decode(MessageType.POLL_REPLY, 3, body, version=4) # -> PollReply(...)
    seq, msg = decode_frame(frame, version=4)                 # a whole frame, header included

``decode`` takes the connection's protocol version, since a few bodies differ between versions
(``poll_reply`` and ``event`` carry a ``code`` in v4; ``poll_many``, ``poll_many_reply``,
``register_memory``, ``discover`` and ``discover_reply`` exist only in v4). ``hello`` and
``hello_reply`` carry their own version field and are read by it, whatever the ``version``
argument says.

Every body's decoder is generated from the protocol's one description, src/core/wire.yaml
(ferry/_codec.py); this module holds the reader they use and its error texts.

A body that does not decode raises :class:`~ferry.errors.ProtocolError` with the text the C++
codec (src/core/protocol_io.hpp and the same generated checks) gives, e.g. ``malformed poll_reply frame: truncated at field
'reason': needs 4 bytes, 2 remain``; its ``message_type`` and ``field`` attributes name them.
Strings are decoded as UTF-8 with ``surrogateescape``, so a reason cut in the middle of a
character (poll_many cuts reasons at 1000 bytes) still decodes and re-encodes to the same bytes.
"""

from __future__ import annotations

import struct
from typing import Optional

from ._codec import DECODERS
from .errors import Errc, ProtocolError
from .frames import check_flags, split_frame
from .messages import (MAX_STRING_BYTES, NO_INDEX, PROTOCOL_VERSION, Message, MessageType,
                       check_version, first_version)


def _to_str(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


class _Fail(Exception):
    """A decoding failure inside a body: the C++ reader's error text and the field."""

    def __init__(self, text: str, field_name: str) -> None:
        super().__init__(text)
        self.text = text
        self.field = field_name


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

    def fail(self, text: str, field_name: str) -> _Fail:
        """The failure of a check the schema asks for (the generated bodies raise it)."""
        return _Fail(text, field_name)


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
        msg = DECODERS[t](r)
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
