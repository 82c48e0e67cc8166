"""Unit tests of protocol v10 in the Python codec and client (issue 31 item 5, a room checked
end to end on request): ``prepare.checksum`` is one byte after ``state_pages``, on the wire only
from v10 on, and a checked room is refused before v10 rather than sent unchecked."""

from __future__ import annotations

import pytest

from conftest import FakeDaemon
from ferry import Client, Errc, FerryError
from ferry.errors import EncodeError, ProtocolError
from ferry.protocol import (PROTOCOL_VERSION, SUPPORTED_VERSIONS, Prepare, decode,
                            decode_frame, encode)


def test_v10_is_the_highest_version() -> None:
    assert PROTOCOL_VERSION == 10 and SUPPORTED_VERSIONS == (3, 4, 5, 6, 7, 8, 9, 10)


def test_the_checksum_byte_follows_the_state_pages() -> None:
    checked = Prepare(77, ["h:1"], [5, 6], 2, 3, 16, [], True)
    frame = encode(checked, 7, 10)
    unchecked = encode(Prepare(77, ["h:1"], [5, 6], 2, 3, 16), 7, 10)
    assert frame[12:] == unchecked[12:-1] + b"\x01" and unchecked[-1:] == b"\x00"
    assert decode_frame(frame, 10)[1] == checked
    # v9's frame is v10's without the byte
    assert encode(Prepare(77, ["h:1"], [5, 6], 2, 3, 16), 7, 9)[12:] == unchecked[12:-1]


def test_a_checksum_byte_other_than_0_or_1_is_refused() -> None:
    body = bytearray(encode(Prepare(77, ["h:1"], [5], 2, 3, 0, [], True), 7, 10)[12:])
    body[-1] = 2
    with pytest.raises(ProtocolError) as info:
        decode(2, 7, bytes(body), 10)
    assert "field 'checksum' must be 0 or 1, got 2" in info.value.message
    with pytest.raises(ProtocolError) as info:
        decode(2, 7, bytes(body[:-1]), 10)
    assert info.value.message.startswith("malformed prepare frame: truncated at field 'checksum'")


def test_a_checked_room_is_refused_before_v10_not_sent_unchecked() -> None:
    with pytest.raises(EncodeError) as info:
        encode(Prepare(77, ["h:1"], [5], 2, 3, 0, [], True), 7, 9)
    assert info.value.message == "a checked room needs protocol version 10; this connection " \
                                 "speaks 9"
    assert info.value.field == "checksum"


def test_the_client_asks_for_a_checked_room_in_v10(fake: FakeDaemon) -> None:
    got: list = []
    fake.serve_ok(10, got)
    with Client(fake.path, name="v10") as c:
        assert c.version == 10
        c.prepare(3, "h:1", [1, 2], 0, 0, checksum=True)
        c.prepare(4, "h:1", [1, 2], 0, 0)
    fake.join()
    assert [m.checksum for m in got] == [True, False]


def test_the_client_refuses_a_checked_room_on_an_older_connection(fake: FakeDaemon) -> None:
    got: list = []
    fake.serve_ok(9, got)
    with Client(fake.path, name="v9") as c:
        assert c.version == 9
        with pytest.raises(FerryError) as info:
            c.prepare(3, "h:1", [1], 0, checksum=True)
        assert info.value.code == Errc.UNSUPPORTED_VERSION
        assert info.value.message == "a checked room needs protocol version 10; this " \
                                     "connection speaks 9"
        c.prepare(3, "h:1", [1], 0)
    fake.join()
    assert got == [Prepare(3, ["h:1"], [1], 0)]
