"""Unit tests of the Python codec (``ferry.protocol``: clients/python/ferry/messages.py,
encoder.py, decoder.py and frames.py): round trips of every message in both versions, the C++
codec's error texts, and the constants the C++ headers define."""

from __future__ import annotations

import dataclasses
import re
import struct
import subprocess
import sys

import pytest
import yaml

from conftest import REPO
from ferry import errors as ferry_errors
from ferry import messages
from ferry._wire import FIELDS
from ferry.errors import EncodeError, Errc, FerryError, ProtocolError, to_errc
from ferry.protocol import (MAX_FRAME_BYTES, MAX_LIST_STRINGS, MAX_POLL_MANY,
                            MAX_REGISTER_BUFFERS, MAX_REGISTER_FDS, MAX_STRING_BYTES,
                            MIN_PROTOCOL_VERSION, NO_INDEX, PROTOCOL_VERSION,
                            POLL_MANY_REASON_BYTES, Buffer, BufferKind, Cancel, Error,
                            Event, FrameReader, Hello, HelloReply, Info, InfoReply, InfoTopic,
                            Discover, DiscoveredRank, DiscoverReply, MemoryBuffer, MemoryKind,
                            Message, MessageType, Ok, Poll, PollMany,
                            PollManyReply, PollReply, PollResult, Pool, Prepare, RegisterMemory,
                            Send, SetLogLevel, Status, Subscribe, Drain, first_version, decode, decode_frame, encode, message_type,
                            pool_number, split_frame, type_name)

U64_MAX = 0xFFFFFFFFFFFFFFFF


def hello_reply(version: int) -> HelloReply:
    kv = Pool(True, "/ferry.decode-0.1a2b.kv", 1 << 20,
              (Buffer(0, 1024, 256, 3, 0, BufferKind.K), Buffer(262144, 1024, 256, 3, 0,
                                                                BufferKind.V)))
    state = Pool(True, "/ferry.decode-0.1a2b.state", 4096,
                 (Buffer(0, 1024, 4, 0, 1, BufferKind.STATE),))
    aux = Pool(False, "", 0, ())
    return HelloReply(version=version, node="decode-0", instance="1a2b", role="decode",
                      control="127.0.0.1:7402", tp_size=4, tp_rank=1, page_tokens=16,
                      config_yaml="role: decode\npools: {}\n", pools=(kv, state, aux),
                      min_version=3 if version >= 4 else version,
                      max_version=version)


def samples(version: int) -> list[Message]:
    """At least one of every message of ``version``, with edge values."""
    code = (lambda c: c) if version >= 4 else (lambda c: None)
    out = [
        Hello(version=version, client_name="sglang-decode-0", cancel_on_disconnect=True,
              min_version=3),
        Hello(version=3, client_name="", cancel_on_disconnect=False, min_version=3),
        Prepare(room=7, prefill_peers=["10.0.0.10:7401", "10.0.0.11:7401"],
                dst_pages=[5, 6, 0xFFFFFFFE], state_slot=2, aux_row=None),
        Prepare(room=U64_MAX, prefill_peers=[], dst_pages=[], state_slot=None, aux_row=0),
        Prepare(room=8, prefill_peers=["a:1"], dst_pages=[1], state_slot=0, aux_row=0,
                prefix_tokens=0xFFFFFFFF if version >= 4 else 0),
        Send(room=9, src_pages=[1, 2, 3], last=False),
        Send(room=9, src_pages=[], last=True, state_slot=0, aux_row=7),
        Poll(room=0), Cancel(room=U64_MAX), Subscribe(room=123456789),
        Info(InfoTopic.STATUS), Info(InfoTopic.ROOMS), Info(InfoTopic.PEERS), Info(InfoTopic.POOLS),
        Ok(),
        Error(Errc.UNKNOWN_ROOM, "room 5 is unknown"), Error(999, "a code this client lacks"),
        hello_reply(version),
        PollReply(room=5, status=Status.Failed, code=code(Errc.TIMED_OUT),
                  reason="timed out in Bootstrapping after 30000 ms"),
        PollReply(room=6, status=Status.Transferring, code=code(Errc.OK), reason=""),
        PollReply(room=6, status=Status.WaitingForInput, code=code(Errc.OK), reason="",
                  prefix_tokens=4096 if version >= 4 else 0),
        InfoReply('{"role":"prefill","prefill":{"active":0}}'), InfoReply("[]"), InfoReply(""),
        Event(room=7, status=Status.Success, code=code(Errc.OK), reason=""),
        Event(room=7, status=Status.Failed, code=code(Errc.CANCELLED),
              reason="cancelled by client \u2014 \u00e9t\u00e9"),
    ]
    if version >= 4:
        out += [
            PollMany(rooms=[]), PollMany(rooms=[1, 2, U64_MAX]),
            PollMany(rooms=list(range(MAX_POLL_MANY))),
            PollManyReply(rooms=[]),
            PollManyReply(rooms=[PollResult(1, Status.Bootstrapping, Errc.OK, "", 64),
                                 PollResult(2, Status.Failed, Errc.UNKNOWN_ROOM,
                                            "room 2 is unknown"),
                                 PollResult(3, Status.Failed, 4242, "x" * 1024)]),
            RegisterMemory(pool=0, memory_kind=MemoryKind.HOST, fd_count=2, buffers=[
                MemoryBuffer(0, 0, 1024, 256, 3, 0, BufferKind.K),
                MemoryBuffer(1, 1 << 40, 1024, 256, 3, 0, BufferKind.V)]),
            RegisterMemory(pool=2, memory_kind=MemoryKind.CUDA_VMM_FD, fd_count=0, buffers=[]),
            Discover("10.0.0.10:7401"), Discover(""),
            DiscoverReply([]),
            DiscoverReply([DiscoveredRank("10.0.0.10:7401", True, "prefill-0", 4, 0, 2, 1, 2,
                                          1, ""),
                           DiscoveredRank("10.0.0.11:7401", False, "", 0, 0, 0, 0, 0, 0,
                                          "cannot connect to 10.0.0.11:7401: refused")]),
            RegisterMemory(pool=1, memory_kind=200, fd_count=MAX_REGISTER_FDS, buffers=[
                MemoryBuffer(63, U64_MAX, U64_MAX, U64_MAX, 0xFFFFFFFF, 0xFFFFFFFF,
                             BufferKind.STATE)] * 3),
        ]
    if version >= 5:
        out += [Drain(), SetLogLevel("peer", "debug"), SetLogLevel("", "off")]
    if version >= 6:
        out += [Send(room=9, src_pages=[4], last=True, state_slot=1, aux_row=2, first_layer=12,
                     layer_count=3),
                Send(room=9, src_pages=[], last=False, first_layer=0xFFFFFFFF,
                     layer_count=0xFFFFFFFF)]
    return out


def sample_ids(version: int) -> list[str]:
    return [f"v{version}-{i}-{type_name(message_type(m))}" for i, m in enumerate(samples(version))]


@pytest.mark.parametrize("version", [3, 4, 5, 6])
def test_every_message_type_has_a_sample(version: int) -> None:
    have = {message_type(m) for m in samples(version)}
    want = {t for t in MessageType if version >= first_version(t)}
    assert have == want


@pytest.mark.parametrize("version", [3, 4, 5, 6])
def test_round_trip(version: int) -> None:
    for i, msg in enumerate(samples(version)):
        frame = encode(msg, 1000 + i, version)
        length, mtype, flags, seq = struct.unpack_from("<IHHI", frame)
        assert (length, mtype, flags, seq) == (len(frame) - 4, message_type(msg), 0, 1000 + i)
        got_seq, got = decode_frame(frame, version)
        assert got_seq == 1000 + i
        assert got == msg, f"{type_name(mtype)} did not survive the round trip"
        assert encode(got, got_seq, version) == frame


def test_decoded_values_are_enums() -> None:
    msg = decode(MessageType.POLL_REPLY, 1, encode(
        PollReply(5, Status.Failed, Errc.PEER_LOST, "peer lost"), 1, 4)[12:], 4)
    assert isinstance(msg, PollReply)
    assert msg.status is Status.Failed and msg.status == 0
    assert msg.code is Errc.PEER_LOST and msg.code == 302
    assert msg.terminal and msg.failed and not msg.succeeded
    unknown = decode(MessageType.ERROR, 1, encode(Error(999, "?"), 1)[12:])
    assert isinstance(unknown, Error) and unknown.code == 999 and not isinstance(unknown.code,
                                                                                  Errc)


def test_version_differences_are_exactly_the_documented_ones() -> None:
    # poll_reply and event: v4 has a u16 code after the status and a u32 prefix_tokens after
    # the reason, nothing else differs.
    for cls in (PollReply, Event):
        v3 = encode(cls(5, Status.Failed, None, "why"), 9, 3)
        v4 = encode(cls(5, Status.Failed, Errc.TIMED_OUT, "why", 32), 9, 4)
        assert len(v4) == len(v3) + 6
        assert v4[12:21] == v3[12:21] and v4[21:23] == struct.pack("<H", 405)
        assert v4[23:-4] == v3[21:] and v4[-4:] == struct.pack("<I", 32)
        assert decode(cls is PollReply and 103 or 105, 9, v3[12:], 3).code is None
    # hello: the trailing min_version is there when (and only when) version >= 4.
    h3, h4 = encode(Hello(3, "c", True, 3), 1, 4), encode(Hello(4, "c", True, 3), 1, 4)
    assert len(h4) == len(h3) + 2 and h4[-2:] == struct.pack("<H", 3)
    assert decode(1, 1, h3[12:], 4) == Hello(3, "c", True, 3)  # a v3 hello speaks only v3
    # hello and hello_reply are laid out by their own version field, not the connection's.
    assert encode(Hello(4, "c", True, 3), 1, 3) == h4
    assert encode(hello_reply(3), 1, 4) == encode(hello_reply(3), 1, 3)
    assert len(encode(hello_reply(4), 1, 3)) == len(encode(hello_reply(3), 1, 3)) + 4
    # prepare: v4 adds a trailing u32 prefix_tokens.
    p3, p4 = encode(Prepare(7, ["a:1"], [1], 2, 3, 0), 3, 3), encode(Prepare(7, ["a:1"], [1], 2,
                                                                             3, 16), 3, 4)
    assert len(p4) == len(p3) + 4 and p4[12:-4] == p3[12:] and p4[-4:] == struct.pack("<I", 16)
    # other requests than hello and prepare are the same in both versions.
    for msg in (Send(7, [1], True, 1, 1), Poll(1), Info(1)):
        assert encode(msg, 3, 3) == encode(msg, 3, 4)


def test_no_index_is_none() -> None:
    frame = encode(Prepare(7, ["a:1"], [1], None, None), 2, 4)
    assert frame[-12:-4] == struct.pack("<II", NO_INDEX, NO_INDEX)
    _, msg = decode_frame(frame, 4)
    assert isinstance(msg, Prepare) and msg.state_slot is None and msg.aux_row is None


def test_a_reason_cut_inside_a_character_round_trips() -> None:
    # poll_many cuts reasons at 1024 bytes, possibly in the middle of a UTF-8 sequence.
    raw = ("\u00e9" * 600).encode()[:POLL_MANY_REASON_BYTES - 1]
    body = struct.pack("<IQBHI", 1, 5, 0, 406, len(raw)) + raw + struct.pack("<I", 0)
    msg = decode(MessageType.POLL_MANY_REPLY, 3, body, 4)
    assert isinstance(msg, PollManyReply)
    assert encode(msg, 3, 4)[12:] == body


# --- decoding errors: the C++ codec's texts, naming the type and the field ---------------------

def malformed(mtype: int, body: bytes, version: int = 4) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode(mtype, 1, body, version)
    assert info.value.code == Errc.MALFORMED_FRAME
    return info.value


@pytest.mark.parametrize("version", [3, 4, 5, 6])
def test_every_truncation_names_the_type_and_a_field(version: int) -> None:
    for msg in samples(version):
        body = encode(msg, 1, version)[12:]
        name = type_name(message_type(msg))
        for cut in range(len(body)):
            e = malformed(message_type(msg), body[:cut], version)
            assert e.message_type == name and e.field
            assert e.message.startswith(f"malformed {name} frame: "), e.message
            assert f"field '{e.field}'" in e.message, e.message
            if len(body) > 2000:  # the long poll_many: a few cuts are enough
                break


@pytest.mark.parametrize("mtype,body,version,text", [
    (MessageType.POLL_REPLY, struct.pack("<QBHH", 5, 0, 405, 0), 4,
     "malformed poll_reply frame: truncated at field 'reason': needs 4 bytes, 2 remain"),
    (MessageType.POLL_REPLY, struct.pack("<QB", 5, 0), 4,
     "malformed poll_reply frame: truncated at field 'code': needs 2 bytes, 0 remain"),
    (MessageType.POLL_REPLY, struct.pack("<QB", 5, 0), 3,
     "malformed poll_reply frame: truncated at field 'reason': needs 4 bytes, 0 remain"),
    (MessageType.SEND, struct.pack("<QIBII", 5, 0, 1, NO_INDEX, NO_INDEX) + b"\0" * 4, 4,
     "malformed send frame: 4 unexpected bytes after the last field"),
    (MessageType.SEND, struct.pack("<QIBII", 5, 0, 2, NO_INDEX, NO_INDEX), 4,
     "malformed send frame: field 'last' must be 0 or 1, got 2"),
    (MessageType.PREPARE, struct.pack("<QI", 7, 300), 4,
     "malformed prepare frame: field 'prefill_peers' has 300 entries, above the limit of 256"),
    (MessageType.PREPARE, struct.pack("<QII", 7, 0, 3) + b"\0" * 8, 4,
     "malformed prepare frame: field 'dst_pages' claims 3 entries but only 8 bytes remain"),
    (MessageType.POLL_MANY, struct.pack("<I", MAX_POLL_MANY + 1), 4,
     "malformed poll_many frame: field 'rooms' has 16385 entries, above the limit of 16384"),
    (MessageType.POLL_MANY, struct.pack("<IQ", 3, 1), 4,
     "malformed poll_many frame: field 'rooms' claims 3 entries but only 8 bytes remain"),
    (MessageType.POLL_MANY_REPLY, struct.pack("<I", 100) + b"\0" * 15, 4,
     "malformed poll_many_reply frame: field 'rooms' claims 100 entries, too many for the frame"),
    (MessageType.EVENT, struct.pack("<QBHI", 7, 5, 0, 0), 4,
     "malformed event frame: field 'status' is not a status: 5"),
    (MessageType.INFO, b"\x05", 4, "malformed info frame: field 'topic' must be 0..4, got 5"),
    (MessageType.HELLO, struct.pack("<HIBH", 4, 0, 1, 5), 4,
     "malformed hello frame: field 'min_version' is 5, above 'version' 4"),
    (MessageType.HELLO, struct.pack("<HIB", 4, 0, 1), 3,
     "malformed hello frame: truncated at field 'min_version': needs 2 bytes, 0 remain"),
    (MessageType.ERROR, struct.pack("<HI", 400, MAX_STRING_BYTES + 1), 4,
     "malformed error frame: field 'message' is 65537 bytes, above the limit of 65536"),
    (MessageType.HELLO_REPLY, struct.pack("<HIIIIIIII", 3, 0, 0, 0, 0, 1, 0, 0, 0)
     + struct.pack("<BIQI", 1, 0, 0, 2) + b"\0" * 40, 3,
     "malformed hello_reply frame: field 'pool.buffers' claims 2 entries, too many for the frame"),
    (MessageType.HELLO_REPLY, struct.pack("<HIIIIIIII", 3, 0, 0, 0, 0, 1, 0, 0, 0)
     + struct.pack("<BIQI", 2, 0, 0, 0), 3,
     "malformed hello_reply frame: field 'pool.present' must be 0 or 1, got 2"),
    (MessageType.OK, b"\0", 3, "malformed ok frame: 1 unexpected bytes after the last field"),
    (MessageType.REGISTER_MEMORY, struct.pack("<BBII", 0, 0, 65, 0), 4,
     "malformed register_memory frame: field 'fd_count' is 65, above the limit of 64"),
    (MessageType.REGISTER_MEMORY, struct.pack("<BBII", 0, 0, 1, 4097), 4,
     "malformed register_memory frame: field 'buffers' has 4097 entries, above the limit of 4096"),
    (MessageType.REGISTER_MEMORY, struct.pack("<BBII", 3, 0, 1, 0), 4,
     "malformed register_memory frame: field 'pool' must be 0..2, got 3"),
    (MessageType.REGISTER_MEMORY, struct.pack("<BBII", 0, 0, 1, 2) + b"\0" * 37, 4,
     "malformed register_memory frame: field 'buffers' claims 2 entries, too many for the frame"),
    (MessageType.REGISTER_MEMORY, struct.pack("<BBII", 0, 0, 1, 1)
     + struct.pack("<IQQQIIB", 0, 0, 64, 1, 0, 0, 5), 4,
     "malformed register_memory frame: field 'buffer.kind' is not a buffer kind: 5"),
    (MessageType.DISCOVER_REPLY, struct.pack("<I", 257), 4,
     "malformed discover_reply frame: field 'ranks' has 257 entries, above the limit of 256"),
    (MessageType.DISCOVER_REPLY, struct.pack("<II", 1, 1) + b"a" + b"\x02", 4,
     "malformed discover_reply frame: field 'rank.up' must be 0 or 1, got 2"),
    (MessageType.REGISTER_MEMORY, struct.pack("<BB", 0, 0), 4,
     "malformed register_memory frame: truncated at field 'fd_count': needs 4 bytes, 0 remain"),
])
def test_decoding_errors_are_the_cpp_texts(mtype: int, body: bytes, version: int,
                                           text: str) -> None:
    e = malformed(mtype, body, version)
    assert e.message == text
    assert str(e) == f"[310] {text}"


def test_hello_reply_v4_needs_its_version_range() -> None:
    body = encode(hello_reply(4), 1, 4)[12:]
    e = malformed(MessageType.HELLO_REPLY, body[:-2], 4)
    assert e.message == ("malformed hello_reply frame: truncated at field 'max_version': needs 2 "
                         "bytes, 0 remain")


def test_unknown_and_v4_only_types() -> None:
    assert malformed(13, b"").message == "unknown message type 13"
    assert malformed(108, b"").message == "unknown message type 108"
    for mtype in (MessageType.POLL_MANY, MessageType.POLL_MANY_REPLY):
        e = malformed(mtype, struct.pack("<I", 0), 3)
        assert e.message == (f"{type_name(mtype)} needs protocol version 4; this connection "
                             f"speaks 3")
    for mtype in (MessageType.DRAIN, MessageType.SET_LOG_LEVEL):
        e = malformed(mtype, b"", 4)
        assert e.message == (f"{type_name(mtype)} needs protocol version 5; this connection "
                             f"speaks 4")


def test_framing_errors() -> None:
    r = FrameReader()
    r.feed(struct.pack("<I", MAX_FRAME_BYTES + 1))
    with pytest.raises(ProtocolError) as big:
        r.next()
    assert big.value.code == Errc.FRAME_TOO_LARGE and big.value.framing_lost
    assert big.value.message == "frame of 16777217 bytes exceeds the limit of 16777216 bytes"
    r = FrameReader()
    r.feed(struct.pack("<I", 7))
    with pytest.raises(ProtocolError) as short:
        r.next()
    assert short.value.code == Errc.MALFORMED_FRAME and short.value.framing_lost
    assert short.value.message == "frame length 7 is shorter than the 12-byte header"
    frame = bytearray(encode(Ok(), 5, 4))
    frame[6] = 1
    with pytest.raises(ProtocolError) as flags:
        decode_frame(bytes(frame), 4)
    assert flags.value.message == "frame flags must be 0, got 0x0001"
    with pytest.raises(ProtocolError):
        split_frame(encode(Ok(), 5, 4) + b"\0")


def test_frame_reader_splits_a_byte_stream() -> None:
    msgs = [m for m in samples(4) if not isinstance(m, PollMany)]
    stream = b"".join(encode(m, i + 1, 4) for i, m in enumerate(msgs))
    r = FrameReader()
    got = []
    for b in range(0, len(stream), 7):  # fed in pieces that cut every field somewhere
        r.feed(stream[b:b + 7])
        while (f := r.next()) is not None:
            got.append((f.seq, decode(f.type, f.seq, f.body, 4)))
    assert got == [(i + 1, m) for i, m in enumerate(msgs)]
    assert r.buffered() == 0


# --- encoding errors ----------------------------------------------------------------------------

@pytest.mark.parametrize("msg,version,field,text", [
    (Prepare(7, ["a:1"], [1, -1]), 4, "dst_pages", "must be a u32, got -1"),
    (Prepare(7, ["a:1"], [1 << 32]), 4, "dst_pages", "must be a u32, got 4294967296"),
    (Prepare(-1, ["a:1"], [1]), 4, "room", "must be a u64, got -1"),
    (Prepare(7, "a:1", [1]), 4, "prefill_peers", "must be a list of strings, got a str"),
    (Prepare(7, ["a:1"] * (MAX_LIST_STRINGS + 1), [1]), 4, "prefill_peers",
     "has 257 entries, above the limit of 256"),
    (Send(7, [1], last=2), 4, "last", "must be a bool, got 2"),
    (Send(7, [1], True, state_slot=1 << 32), 4, "state_slot", "must be a u32, got 4294967296"),
    (Info(topic=300), 4, "topic", "must be a u8, got 300"),
    (Error(7, "x" * (MAX_STRING_BYTES + 1)), 4, "message",
     "is 65537 bytes, above the limit of 65536"),
    (PollMany(list(range(MAX_POLL_MANY + 1))), 4, "rooms",
     "has 16385 entries, above the limit of 16384"),
    (Poll("5"), 4, "room", "must be an integer, got '5'"),  # type: ignore[arg-type]
    (RegisterMemory(0, 0, MAX_REGISTER_FDS + 1, []), 4, "fd_count",
     "is 65, above the limit of 64"),
    (RegisterMemory(0, 0, 1, [MemoryBuffer(0, 0, 1, 1, 0, 0, 0)] * (MAX_REGISTER_BUFFERS + 1)), 4,
     "buffers", "has 4097 entries, above the limit of 4096"),
    (RegisterMemory(3, 0, 1, []), 4, "pool", "must be 0..2, got 3"),
    (RegisterMemory(0, 256, 1, []), 4, "memory_kind", "must be a u8, got 256"),
    (RegisterMemory(0, 0, 1, [MemoryBuffer(0, -1, 1, 1, 0, 0, 0)]), 4, "buffer.fd_offset",
     "must be a u64, got -1"),
    (RegisterMemory(0, 0, 1, [MemoryBuffer(0, 0, 1, 1, 0, 0, 9)]), 4, "buffer.kind",
     "is not a buffer kind: 9"),
])
def test_encoding_errors_name_the_field(msg: object, version: int, field: str, text: str) -> None:
    with pytest.raises(EncodeError) as info:
        encode(msg, 1, version)  # type: ignore[arg-type]
    e = info.value
    name = type_name(message_type(msg))  # type: ignore[arg-type]
    assert e.field == field and e.message_type == name
    assert e.message == f"cannot encode {name}: field '{field}' {text}"
    assert isinstance(e, ValueError) and isinstance(e, FerryError)
    assert e.code == Errc.INVALID_REQUEST


def test_v4_only_messages_do_not_encode_in_v3() -> None:
    for msg in (PollMany([1]), PollManyReply([]), RegisterMemory(0, 0, 0, [])):
        with pytest.raises(EncodeError) as info:
            encode(msg, 1, 3)
        assert "needs protocol version 4; this connection speaks 3" in info.value.message
    for msg in (Drain(), SetLogLevel("peer", "debug")):
        with pytest.raises(EncodeError) as info:
            encode(msg, 1, 4)
        assert "needs protocol version 5; this connection speaks 4" in info.value.message
    with pytest.raises(ValueError):
        encode(Ok(), 1, PROTOCOL_VERSION + 1)
    with pytest.raises(TypeError):
        encode(object(), 1, 4)  # type: ignore[arg-type]


# --- constants shared with the C++ sources ------------------------------------------------------

def cpp_enum(path: str, enum: str) -> dict[str, int]:
    text = (REPO / path).read_text()
    m = re.search(r"enum class " + enum + r"\s*:\s*\w+\s*\{(.*?)\};", text, re.S)
    assert m, f"enum {enum} not found in {path}"
    body = re.sub(r"//[^\n]*", "", m.group(1))
    return {k: int(v) for k, v in re.findall(r"(\w+)\s*=\s*(\d+)", body)}


def test_errc_matches_errors_hpp() -> None:
    cpp = cpp_enum("src/core/errors.hpp", "errc")
    assert {e.wire_name: int(e) for e in Errc} == cpp
    assert to_errc(406) is Errc.CANCELLED and to_errc(4242) == 4242
    assert Errc.UNSUPPORTED_VERSION.wire_name == "unsupported_version"


def test_status_matches_status_hpp() -> None:
    cpp = cpp_enum("src/core/status.hpp", "room_status")
    py = {"failed": Status.Failed, "bootstrapping": Status.Bootstrapping,
          "waiting_for_input": Status.WaitingForInput, "transferring": Status.Transferring,
          "success": Status.Success}
    assert {k: int(v) for k, v in py.items()} == cpp
    assert Status.FAILED is Status.Failed and Status.SUCCESS is Status.Success
    assert [int(s) for s in Status] == [0, 1, 2, 3, 4]  # KVPoll's values
    assert Status.Success.terminal and not Status.Transferring.terminal


def test_the_generated_modules_are_what_wire_yaml_generates() -> None:
    r = subprocess.run([sys.executable, str(REPO / "scripts/gen_wire.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_every_class_has_the_fields_wire_yaml_lists_in_its_order() -> None:
    for name, fields in FIELDS.items():
        cls = getattr(messages, name)
        have = tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) \
            else cls._fields
        assert have == fields, name


def test_versions_and_limits_are_the_schemas() -> None:
    schema = yaml.safe_load((REPO / "src/core/wire.yaml").read_text())["client"]
    assert (MIN_PROTOCOL_VERSION, PROTOCOL_VERSION) == (schema["min_version"],
                                                        schema["max_version"]) == (3, 10)
    assert MAX_FRAME_BYTES == 16 << 20 and MAX_STRING_BYTES == 64 << 10
    assert (MAX_POLL_MANY, MAX_REGISTER_FDS, MAX_REGISTER_BUFFERS) == (16384, 64, 4096)
    assert {t.wire_name: int(t) for t in MessageType} == \
        {m["name"]: m["type"] for m in schema["messages"]}


def test_docs_protocol_md_lists_every_message_of_wire_yaml_with_its_type() -> None:
    schema = yaml.safe_load((REPO / "src/core/wire.yaml").read_text())["client"]
    text = (REPO / "docs/protocol.md").read_text().split("## Info documents")[0]
    rows = {name: int(num) for num, name in re.findall(r"^\| (\d+) \| (\w+) \|", text, re.M)}
    assert rows == {m["name"]: m["type"] for m in schema["messages"]}


def test_ferry_error() -> None:
    e = FerryError(402, "room 5 is unknown")
    assert e.code is Errc.UNKNOWN_ROOM and e.code == 402 and e.name == "unknown_room"
    assert str(e) == "[402] room 5 is unknown"
    assert FerryError(999, "?").code == 999 and FerryError(999, "?").name == "code 999"
    import pickle
    assert pickle.loads(pickle.dumps(e)).message == e.message
    p = ProtocolError(310, "bad", message_type="poll", field="room")
    q = pickle.loads(pickle.dumps(p))
    assert isinstance(q, ProtocolError) and q.field == "room"
    c = p.copy()
    assert type(c) is ProtocolError and c.field == "room" and c is not p and str(c) == str(p)
    assert ferry_errors.__all__


def test_register_memory_layout() -> None:
    """The body is u8 pool, u8 memory_kind, u32 fd_count, u32 n, n x 37-byte buffers, as
    docs/protocol.md lays it out; v4 only."""
    msg = RegisterMemory(1, MemoryKind.HOST, 2, [MemoryBuffer(1, 8192, 48, 4, 7, 2,
                                                              BufferKind.STATE)])
    frame = encode(msg, 77, 4)
    assert struct.unpack_from("<IHHI", frame) == (len(frame) - 4, 9, 0, 77)
    assert frame[12:] == struct.pack("<BBII", 1, 0, 2, 1) + struct.pack("<IQQQIIB", 1, 8192, 48,
                                                                      4, 7, 2, 3)
    assert len(frame) == 12 + 10 + 37
    seq, got = decode_frame(frame, 4)
    assert got == msg and isinstance(got, RegisterMemory)
    assert got.buffers[0].kind is BufferKind.STATE and got.memory_kind is MemoryKind.HOST
    # a memory kind this codec does not know decodes (ferryd refuses it by name), as an int
    odd = decode(9, 1, struct.pack("<BBII", 0, 9, 0, 0), 4)
    assert isinstance(odd, RegisterMemory) and odd.memory_kind == 9
    # buffers given as plain tuples encode like MemoryBuffer
    assert encode(RegisterMemory(1, 0, 2, [tuple(msg.buffers[0])]), 77, 4) == frame
    e = malformed(MessageType.REGISTER_MEMORY, frame[12:], 3)
    assert e.message == "register_memory needs protocol version 4; this connection speaks 3"


def test_pool_numbers() -> None:
    assert [pool_number(k) for k in ("kv", "state", "aux", "mamba", 0, 1, 2)] == \
        [0, 1, 2, 1, 0, 1, 2]
    for bad in ("pool", 3, -1, True, None):
        with pytest.raises(ValueError):
            pool_number(bad)  # type: ignore[arg-type]


def test_errc_matches_the_cpp_vocabulary():
    """Every ``ferry::errc`` value has the same number and name in ``Errc``, and no other."""
    header = (REPO / "src/core/errors.hpp").read_text()
    body = header[header.index("enum class errc") : header.index("};", header.index("enum class errc"))]
    cpp = {name: int(num) for name, num in re.findall(r"^\s+(\w+) = (\d+),", body, re.M)}
    assert cpp, "no errc values found in src/core/errors.hpp"
    assert {e.wire_name: int(e) for e in Errc} == cpp


def test_a_layer_range_is_on_the_wire_from_version_6_only() -> None:
    """v6 appends ``first_layer`` and ``layer_count`` to a send; an older connection cannot carry
    a range, so encoding one there fails instead of sending a whole chunk."""
    s = Send(room=9, src_pages=[1, 2], first_layer=8, layer_count=4)
    assert len(encode(s, 1, 6)) == len(encode(Send(room=9, src_pages=[1, 2]), 1, 5)) + 8
    assert decode_frame(encode(s, 1, 6), 6)[1] == s
    assert decode_frame(encode(Send(room=9, src_pages=[1, 2]), 1, 5), 5)[1].layer_count == 0
    with pytest.raises(EncodeError) as info:
        encode(s, 1, 5)
    assert info.value.message == ("a layer range needs protocol version 6; this connection "
                                  "speaks 5")
