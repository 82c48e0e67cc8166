"""Ferry's error codes (docs/protocol.md, "Error codes"; src/core/errors.hpp) and exceptions.

Every failure the client reports is a :class:`FerryError` carrying a numeric ``code`` (an
:class:`Errc` member when the number is known, else the plain int) and a ``message``:

- an ``error`` reply from ferryd: the daemon's code and text, unchanged;
- a frame the client cannot accept (undecodable body, a reply whose seq matches no request):
  :class:`ProtocolError`, code 310 ``malformed_frame`` (311 ``frame_too_large`` for a length
  field above the limit), worded as the C++ codec words it;
- a value that cannot be put on the wire (a negative page index, a string above 64 KiB, a
  request the connection's protocol version lacks): :class:`EncodeError`, which is also a
  ``ValueError``;
- local conditions: ``timed_out`` (405) for a reply that did not come in time, ``peer_lost``
  (302) when ferryd closed the connection, ``cancelled`` (406) when this client was closed while
  a request waited.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class Errc(IntEnum):
    """The error codes of docs/protocol.md, numerically identical to ``ferry::errc``.

    ``Errc.X.wire_name`` is the C++ name (``"malformed_frame"``).
    """

    OK = 0
    # config (100s)
    CONFIG_INVALID = 100
    # fabric (200s)
    FABRIC_UNAVAILABLE = 200
    FABRIC_WRITE_FAILED = 201
    FABRIC_ERROR = 202
    CHECKSUM_MISMATCH = 203
    # peer / protocol (300s)
    PEER_UNREACHABLE = 300
    PEER_INCOMPATIBLE = 301
    PEER_LOST = 302
    MALFORMED_FRAME = 310
    FRAME_TOO_LARGE = 311
    UNSUPPORTED_VERSION = 312
    ACCESS_DENIED = 313
    # request (400s)
    INVALID_REQUEST = 400
    DUPLICATE_ROOM = 401
    UNKNOWN_ROOM = 402
    ROOM_FINISHED = 403
    WRONG_ROLE = 404
    TIMED_OUT = 405
    CANCELLED = 406
    DRAINING = 407
    # internal (500s)
    INTERNAL = 500
    SYSTEM_ERROR = 501

    @property
    def wire_name(self) -> str:
        """The code's stable lower-case name, as ``ferry::to_string(errc)`` gives it."""
        return self.name.lower()


def to_errc(code: int) -> Errc | int:
    """``Errc(code)`` when the number is a known code, else ``code`` itself (a newer daemon may
    send codes this client does not know; they must not be lost)."""
    try:
        return Errc(code)
    except ValueError:
        return int(code)


class FerryError(Exception):
    """An error reply from ferryd (code as in docs/protocol.md) or a local failure.

    ``code`` is an :class:`Errc` when known (it compares equal to the plain int), ``message``
    the text. ``str(error)`` is ``"[code] message"``.
    """

    code: Errc | int
    message: str

    def __init__(self, code: int, message: str) -> None:
        self.code = to_errc(int(code))
        self.message = message
        super().__init__(f"[{int(self.code)}] {message}")

    @property
    def name(self) -> str:
        """The code's lower-case name (``"unknown_room"``), or ``"code N"`` for an unknown one."""
        return self.code.wire_name if isinstance(self.code, Errc) else f"code {self.code}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (FerryError, (int(self.code), self.message))

    def copy(self) -> FerryError:
        """A fresh exception of the same class, code and message (for raising one failure in
        several threads without sharing a traceback)."""
        err = FerryError.__new__(type(self))
        err.__dict__.update(self.__dict__)
        Exception.__init__(err, *self.args)
        return err


class ProtocolError(FerryError):
    """ferryd sent something this client cannot accept: a frame that does not decode (the
    message names the type and the field), a reply whose seq matches no outstanding request, a
    reply of the wrong type. Code 310 (``malformed_frame``) unless given.

    ``message_type`` and ``field`` name what failed to decode, when that is what happened;
    ``framing_lost`` is true when the byte stream cannot be resynchronised (the connection is
    then closed).
    """

    def __init__(self, code: int, message: str, *, message_type: str | None = None,
                 field: str | None = None, framing_lost: bool = False) -> None:
        super().__init__(code, message)
        self.message_type = message_type
        self.field = field
        self.framing_lost = framing_lost

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_protocol_error, (int(self.code), self.message, self.message_type,
                                          self.field, self.framing_lost))


def _rebuild_protocol_error(code: int, message: str, message_type: str | None,
                            field: str | None, framing_lost: bool) -> ProtocolError:
    return ProtocolError(code, message, message_type=message_type, field=field,
                         framing_lost=framing_lost)


class EncodeError(FerryError, ValueError):
    """A message that cannot be encoded: a field out of its wire range, a string or list above
    its limit, or a message the protocol version lacks. Nothing was sent. Code 400
    (``invalid_request``); ``field`` names the field when one is at fault."""

    def __init__(self, message: str, *, message_type: str | None = None,
                 field: str | None = None) -> None:
        super().__init__(Errc.INVALID_REQUEST, message)
        self.message_type = message_type
        self.field = field

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_encode_error, (self.message, self.message_type, self.field))


def _rebuild_encode_error(message: str, message_type: str | None,
                          field: str | None) -> EncodeError:
    return EncodeError(message, message_type=message_type, field=field)


__all__ = ["Errc", "to_errc", "FerryError", "ProtocolError", "EncodeError"]
