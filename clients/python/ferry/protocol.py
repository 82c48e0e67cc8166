"""The client protocol's codec (docs/protocol.md): pure functions, no I/O.

    frame = encode(Poll(room=7), seq=3, version=4)          # bytes, 12-byte header included
    msg = decode(MessageType.POLL_REPLY, 3, body, version=4) # -> PollReply(...)

Every message of versions 3 to 10 is a dataclass, importable from here. ``encode`` and
``decode`` take the connection's protocol version, since a few bodies differ between versions
(``poll_reply`` and ``event`` carry a ``code`` in v4; ``poll_many``, ``poll_many_reply``,
``register_memory``, ``discover`` and ``discover_reply`` exist from v4 on, ``drain`` and
``set_log_level`` from v5 on; ``prepare``, ``send`` and ``register_memory`` carry a paged state
pool's ``state_pages`` and ``state_type`` from v8 on).
``hello`` and ``hello_reply`` carry their own version field and are laid out by it, whatever the
``version`` argument says (they are what settles the connection's version).

A body that does not decode raises :class:`~ferry.errors.ProtocolError` with the text the C++
codec (src/core/protocol_decode.cpp) gives, e.g. ``malformed poll_reply frame: truncated at field
'reason': needs 4 bytes, 2 remain``; its ``message_type`` and ``field`` attributes name them.
A message that cannot be encoded raises :class:`~ferry.errors.EncodeError`.

Strings travel as bytes; they are decoded as UTF-8 with ``surrogateescape``, so a reason cut in
the middle of a character (poll_many cuts reasons at 1000 bytes) still decodes and re-encodes
to the same bytes.

This module is the codec's one name; each part lives in its own module: :mod:`ferry.messages`
(versions, limits, enums and the message dataclasses), :mod:`ferry.encoder` (``encode``),
:mod:`ferry.decoder` (``decode``, ``decode_frame``) and :mod:`ferry.frames` (``Frame``,
``FrameReader``, ``split_frame``, ``check_flags``).
"""

from __future__ import annotations

from .decoder import decode, decode_frame
from .encoder import encode
from .frames import Frame, FrameReader, check_flags, split_frame
from .messages import (HEADER_BYTES, MAX_FRAME_BYTES, MAX_LIST_STRINGS, MAX_POLL_MANY,
                       MAX_REGISTER_BUFFERS, MAX_REGISTER_FDS, MAX_STRING_BYTES,
                       MESSAGE_CLASSES, MIN_PROTOCOL_VERSION, NO_INDEX, POLL_MANY_REASON_BYTES,
                       POOL_KINDS, PROTOCOL_VERSION, SUPPORTED_VERSIONS, V4_ONLY, V5_ONLY, Buffer,
                       BufferKind, Cancel, Discover, DiscoveredRank, DiscoverReply, Drain, Error, Event,
                       Hello, HelloReply, Info, InfoReply, InfoTopic, MemoryBuffer, MemoryKind,
                       Message, MessageType, Ok, Poll, PollMany, PollManyReply, PollReply,
                       PollResult, Pool, Prepare, RegisterMemory, Send, SetLogLevel, StateType,
                       Status, Subscribe, first_version, message_type, pool_number,
                       state_type_number, type_name)

__all__ = [
    "PROTOCOL_VERSION", "MIN_PROTOCOL_VERSION", "SUPPORTED_VERSIONS", "NO_INDEX",
    "MAX_FRAME_BYTES", "HEADER_BYTES", "MAX_STRING_BYTES", "MAX_LIST_STRINGS", "MAX_POLL_MANY",
    "POLL_MANY_REASON_BYTES", "MAX_REGISTER_FDS", "MAX_REGISTER_BUFFERS", "MessageType",
    "V4_ONLY", "V5_ONLY", "first_version", "Drain", "SetLogLevel", "type_name", "Status", "InfoTopic", "BufferKind", "Buffer", "Pool", "POOL_KINDS",
    "MemoryKind", "StateType", "state_type_number", "pool_number", "MemoryBuffer", "RegisterMemory", "Discover", "DiscoveredRank",
    "DiscoverReply", "Hello", "Prepare", "Send",
    "Poll", "Cancel", "Subscribe", "Info", "PollMany", "Ok", "Error", "HelloReply", "PollResult",
    "PollReply",
    "Event", "InfoReply", "PollManyReply", "Message", "MESSAGE_CLASSES", "message_type",
    "encode", "decode", "Frame", "FrameReader", "check_flags", "split_frame", "decode_frame",
]
