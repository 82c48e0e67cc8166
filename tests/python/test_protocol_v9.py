"""Unit tests of protocol v9 in the Python codec (issue 31 item 1, replicated shard groups): a
register_memory buffer's ``units`` follow its ``groups`` as a u16 count (0 or one per group)
and that many u64, only from v9 on, and are refused before v9 rather than dropped."""

from __future__ import annotations

import os
import struct

import pytest

from conftest import FakeConn, FakeDaemon
from ferry import Client
from ferry.errors import EncodeError, ProtocolError
from ferry.memory import create_memfd
from ferry.protocol import (PROTOCOL_VERSION, SUPPORTED_VERSIONS, BufferKind, MemoryBuffer,
                            MemoryKind, Ok, RegisterMemory, decode_frame, encode)


def conv(units: tuple[int, ...]) -> MemoryBuffer:
    # Mamba2 n_groups 1 at TP 2: conv [x | B | C] = 4096 + 128 + 128 channels of 6 bytes
    return MemoryBuffer(0, 0, 4352 * 6, 4, 0, 0, BufferKind.STATE, 4352, 0, 1,
                        (8192, 128, 128), units)


def test_v9_is_supported() -> None:
    assert PROTOCOL_VERSION >= 9 and 9 in SUPPORTED_VERSIONS


def test_units_follow_the_groups() -> None:
    msg = RegisterMemory(1, MemoryKind.HOST, 1, [conv((128, 1, 1))], 0, None)
    frame = encode(msg, 7, 9)
    without = encode(RegisterMemory(1, MemoryKind.HOST, 1, [conv(())], 0, None), 7, 9)
    units = struct.pack("<HQQQ", 3, 128, 1, 1)
    # the buffer table's last field, then page_tokens, room_id_buffer and state_type
    assert frame[12:] == without[12:-9 - 2] + units + without[-9:]
    assert decode_frame(frame, 9)[1] == msg
    # no units: a zero count, and the buffer decodes with none
    assert decode_frame(without, 9)[1].buffers[0].units == ()


def test_units_are_refused_before_v9_not_dropped() -> None:
    msg = RegisterMemory(1, MemoryKind.HOST, 1, [conv((128, 1, 1))], 0, None)
    with pytest.raises(EncodeError) as info:
        encode(msg, 7, 8)
    assert info.value.message == "shard units need protocol version 9; this connection speaks 8"
    assert info.value.field == "buffer.units"
    # without units a v8 frame is what it was
    assert decode_frame(encode(RegisterMemory(1, MemoryKind.HOST, 1, [conv(())], 0, None), 7, 8),
                        8)[1].buffers[0].units == ()


def test_a_units_count_other_than_the_groups_is_refused_both_ways() -> None:
    with pytest.raises(EncodeError) as info:
        encode(RegisterMemory(1, MemoryKind.HOST, 1, [conv((128, 1))], 0, None), 7, 9)
    assert "has 2 entries for 3 shard groups (0 or one per group)" in info.value.message
    good = encode(RegisterMemory(1, MemoryKind.HOST, 1, [conv((128, 1, 1))], 0, None), 7, 9)
    at = good.index(struct.pack("<HQQQ", 3, 128, 1, 1))
    bad = good[:at] + struct.pack("<H", 2) + good[at + 2:]
    with pytest.raises(ProtocolError) as refused:
        decode_frame(bad, 9)
    assert "field 'buffer.units' has 2 entries for 3 shard groups" in str(refused.value)


def test_the_client_takes_a_buffer_given_as_a_tuple_of_every_field(fake: FakeDaemon) -> None:
    """register_memory's table may list plain tuples, the groups and units included; a field
    of the wrong type is the codec's to refuse, not coerced."""
    got: list = []

    def serve(c: FakeConn) -> None:
        c.hello(speaks=(3, 9))
        c.version = 9
        seq, msg = c.recv()
        got.append(msg)
        c.close_fds()
        c.send(Ok(), seq)
        c.wait_closed()
    fake.serve(serve)
    entry = (0, 0, 4352 * 6, 4, 0, 0, BufferKind.STATE, 4352, 8704, 1, (8192, 128, 128),
             (128, 1, 1))
    fd = create_memfd("ferry-v9", 4352 * 6 * 4)
    try:
        with Client(fake.path, name="v9") as c:
            c.register_memory("state", [entry], [fd])
            with pytest.raises(EncodeError):
                c.register_memory("state", [(0, 0, 64.5, 4, 0, 0, BufferKind.STATE)], [fd])
    finally:
        os.close(fd)
    fake.join()
    assert got[0].buffers == [MemoryBuffer(*entry)]
