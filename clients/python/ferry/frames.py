"""The client protocol's frames (docs/protocol.md, "Framing"): a 12-byte header (u32 length of
what follows it, u16 type, u16 flags, u32 seq, little-endian) and a body. This module cuts a
byte stream or one whole frame into header fields and body and checks the header as the C++
``frame_reader`` does; it never decodes a body (:mod:`ferry.decoder` does).

A length field above 16 MiB or below the header loses the framing: the stream cannot be
resynchronised, and the :class:`~ferry.errors.ProtocolError` says so (``framing_lost``).
"""

from __future__ import annotations

import struct
from typing import NamedTuple, Optional

from .errors import Errc, ProtocolError
from .messages import HEADER_BYTES, MAX_FRAME_BYTES, type_name

HEADER = struct.Struct("<IHHI")
"""The header's layout: length, type, flags, seq."""
_U32 = struct.Struct("<I")


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
        _, mtype, flags, seq = HEADER.unpack_from(self._buf, self._pos)
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
    length, mtype, flags, seq = HEADER.unpack_from(frame)
    _check_length(length)
    if length != len(frame) - 4:
        raise ProtocolError(Errc.MALFORMED_FRAME, f"frame length field says {length} bytes, "
                                                  f"{len(frame) - 4} follow it")
    return Frame(mtype, flags, seq, bytes(frame[HEADER_BYTES:]))


__all__ = ["HEADER", "Frame", "FrameReader", "check_flags", "split_frame"]
