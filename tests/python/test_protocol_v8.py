"""Unit tests of protocol v8 in the Python codec and client (issue 29 item 3, paged state
components): ``prepare.state_pages``, ``send.state_pages`` and ``register_memory.state_type``,
laid out byte by byte as /work/notes/paged-state-spec.md (docs/protocol.md) says, present only
from v8 on, and refused before v8 unless empty or zero."""

from __future__ import annotations

import os
import struct

import pytest

from conftest import FakeDaemon
from ferry import Client, Errc, FerryError
from ferry.errors import EncodeError, ProtocolError
from ferry.memory import create_memfd
from ferry.protocol import (PROTOCOL_VERSION, SUPPORTED_VERSIONS, BufferKind, HelloReply,
                            MemoryBuffer, MemoryKind, Prepare, RegisterMemory, Send,
                            StateType, decode, decode_frame, encode, state_type_number)


def u32_list(values: list[int]) -> bytes:
    return struct.pack(f"<I{len(values)}I", len(values), *values)


def peers(names: list[str]) -> bytes:
    out = struct.pack("<I", len(names))
    for n in names:
        out += struct.pack("<I", len(n)) + n.encode()
    return out


def test_v8_is_spoken() -> None:
    assert PROTOCOL_VERSION >= 8 and 8 in SUPPORTED_VERSIONS


def test_state_types_are_sglangs() -> None:
    assert [(t.wire_name, int(t)) for t in StateType] == \
        [("mamba", 0), ("swa", 1), ("dsa", 2), ("minimax_index_k", 3)]
    assert [t.paged for t in StateType] == [False, True, True, True]
    assert [state_type_number(x) for x in ("mamba", "SWA", "dsa", "minimax_index_k", 0, 3)] == \
        [StateType.MAMBA, StateType.SWA, StateType.DSA, StateType.MINIMAX_INDEX_K,
         StateType.MAMBA, StateType.MINIMAX_INDEX_K]

    class SGLangStateType:  # SGLang's members are str enums: their value is the name
        value = "dsa"
    assert state_type_number(SGLangStateType()) is StateType.DSA
    for bad in ("swa_ring", "c128_state", 4, -1, True, None):
        with pytest.raises(ValueError, match="state_type must be one of mamba, swa, dsa, "
                                             "minimax_index_k"):
            state_type_number(bad)  # type: ignore[arg-type]


def test_prepare_carries_state_pages_after_prefix_tokens() -> None:
    msg = Prepare(9, ["h:1"], [4, 5], None, 2, 16, [30, 31, 32])
    frame = encode(msg, 5, 8)
    body = (struct.pack("<Q", 9) + peers(["h:1"]) + u32_list([4, 5]) +
            struct.pack("<III", 0xFFFFFFFF, 2, 16) + u32_list([30, 31, 32]))
    assert frame[12:] == body
    assert struct.unpack_from("<IHHI", frame) == (len(frame) - 4, 2, 0, 5)
    assert decode_frame(frame, 8) == (5, msg)
    # empty: a u32 zero, still on the wire in v8
    assert encode(Prepare(9, ["h:1"], [4, 5], 1, 2, 16), 5, 8)[12:] == \
        body[:-len(u32_list([30, 31, 32]))].replace(struct.pack("<I", 0xFFFFFFFF),
                                                     struct.pack("<I", 1)) + u32_list([])


def test_send_carries_state_pages_after_the_layer_range() -> None:
    msg = Send(9, [1, 2], True, None, 3, 0, 0, [7, 8, 9])
    frame = encode(msg, 6, 8)
    assert frame[12:] == (struct.pack("<Q", 9) + u32_list([1, 2]) + b"\x01" +
                          struct.pack("<IIII", 0xFFFFFFFF, 3, 0, 0) + u32_list([7, 8, 9]))
    assert decode_frame(frame, 8) == (6, msg)
    assert decode_frame(encode(Send(9, [1], False), 6, 8), 8)[1].state_pages == []


def test_register_memory_carries_the_state_type_last() -> None:
    b = MemoryBuffer(0, 4096, 256, 10, 5, 1, BufferKind.STATE)
    msg = RegisterMemory(1, MemoryKind.HOST, 1, [b], 16, None, StateType.SWA)
    frame = encode(msg, 7, 8)
    v7 = encode(RegisterMemory(1, MemoryKind.HOST, 1, [b], 16, None), 7, 7)
    assert frame[12:] == v7[12:] + b"\x01"  # u8 state_type after room_id_buffer
    seq, got = decode_frame(frame, 8)
    assert got == msg and got.state_type is StateType.SWA
    assert decode_frame(encode(RegisterMemory(0, 0, 0, []), 1, 8), 8)[1].state_type \
        is StateType.MAMBA


def test_v8_fields_are_not_on_the_wire_before_v8() -> None:
    for v in (4, 6, 7):
        assert decode_frame(encode(Prepare(1, ["h:1"], [2], 0, 0), 1, v), v)[1] == \
            Prepare(1, ["h:1"], [2], 0, 0)
        assert encode(Send(1, [2], True, 0, 0), 1, v) == \
            encode(Send(1, [2], True, 0, 0, state_pages=[]), 1, v)
    for msg in (Prepare(1, ["h:1"], [2], None, 0, 0, [5]), Send(1, [2], True, None, 0, 0, 0, [5])):
        with pytest.raises(EncodeError) as info:
            encode(msg, 1, 7)
        assert info.value.message == "state pages need protocol version 8; this connection " \
                                     "speaks 7"
        assert info.value.field == "state_pages"
    with pytest.raises(EncodeError) as info:
        encode(RegisterMemory(1, 0, 0, [], 0, None, StateType.DSA), 1, 7)
    assert info.value.message == "state type dsa needs protocol version 8; this connection " \
                                 "speaks 7"
    # a v7 register_memory (no state_type byte) decodes as mamba; in v8 the byte is required
    v7 = encode(RegisterMemory(1, 0, 0, []), 1, 7)[12:]
    assert decode(9, 1, v7, 7).state_type is StateType.MAMBA
    with pytest.raises(ProtocolError) as perr:
        decode(9, 1, v7, 8)
    assert perr.value.message == ("malformed register_memory frame: truncated at field "
                                  "'state_type': needs 1 bytes, 0 remain")


def test_an_unknown_state_type_is_refused_both_ways() -> None:
    with pytest.raises(EncodeError) as info:
        encode(RegisterMemory(1, 0, 0, [], 0, None, 4), 1, 8)
    assert info.value.message == "cannot encode register_memory: field 'state_type' is not a " \
                                 "state type: 4"
    body = encode(RegisterMemory(1, 0, 0, []), 1, 8)[12:-1] + b"\x04"
    with pytest.raises(ProtocolError) as perr:
        decode(9, 1, body, 8)
    assert perr.value.message == ("malformed register_memory frame: field 'state_type' is not "
                                  "a state type: 4")
    assert perr.value.field == "state_type"


def test_truncated_state_pages_name_the_field() -> None:
    body = encode(Send(1, [2], True, None, 0, 0, 0, [5, 6]), 1, 8)[12:]
    with pytest.raises(ProtocolError) as perr:
        decode(3, 1, body[:-4], 8)
    assert perr.value.message == ("malformed send frame: field 'state_pages' claims 2 entries "
                                  "but only 4 bytes remain")


# --- the client ------------------------------------------------------------------------------

def test_the_client_sends_state_pages_and_the_state_type_in_v8(fake: FakeDaemon) -> None:
    got: list = []
    fake.serve_ok(8, got)
    fd = create_memfd("ferry-v8", 4096)
    try:
        with Client(fake.path, name="v8") as c:
            assert c.version == 8
            c.prepare(3, "h:1", [1, 2], aux_row=0, state_pages=[10, 11])
            c.send(3, [4, 5], True, aux_row=1, state_pages=(20, 21))
            c.register_memory("state", [MemoryBuffer(0, 0, 64, 4, 0, 0, BufferKind.STATE)],
                              [fd], state_type="minimax_index_k")
    finally:
        os.close(fd)
    fake.join()
    assert got[0] == Prepare(3, ["h:1"], [1, 2], None, 0, 0, [10, 11])
    assert got[1] == Send(3, [4, 5], True, None, 1, 0, 0, [20, 21])
    assert got[2].state_type is StateType.MINIMAX_INDEX_K and got[2].pool == 1


def test_the_client_refuses_v8_fields_on_an_older_connection(fake: FakeDaemon) -> None:
    got: list = []
    fake.serve_ok(7, got)
    with Client(fake.path, name="v7") as c:
        assert c.version == 7
        for call in (lambda: c.prepare(3, "h:1", [1], state_pages=[2]),
                     lambda: c.send(3, [1], True, state_pages=[2])):
            with pytest.raises(FerryError) as info:
                call()
            assert info.value.code == Errc.UNSUPPORTED_VERSION
            assert info.value.message == "state_pages need protocol version 8; this " \
                                         "connection speaks 7"
        with pytest.raises(FerryError) as info:
            c.register_memory("state", [], [], state_type="swa")
        assert info.value.code == Errc.UNSUPPORTED_VERSION
        assert info.value.message == "state type swa needs protocol version 8; this " \
                                     "connection speaks 7"
        c.prepare(3, "h:1", [1], 0, state_pages=[])  # empty is what v7 means anyway
    fake.join()
    assert got == [Prepare(3, ["h:1"], [1], 0)]


def test_hello_reply_is_unchanged_in_v8() -> None:
    """v8 adds nothing to hello_reply: its v8 body is its v7 body with the version field."""
    a = encode(HelloReply(version=7, max_version=7), 1, 7)[12:]
    b = encode(HelloReply(version=8, max_version=8), 1, 8)[12:]
    assert a[2:-2] == b[2:-2]
