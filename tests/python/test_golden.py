"""The golden frames of the C++ codec (tests/golden/frames.txt) decode with the Python codec and
re-encode to the same bytes, so the two codecs cannot drift (docs/protocol.md, "Versions").

File format: one frame a line, ``VERSION NAME SEQ HEX`` (HEX: the whole frame, 12-byte header
included); ``#`` starts a comment. NAME is the message type's name (``poll_reply``) or a case of
it (``poll_reply_failed``: the type's name, ``_``, a suffix). A missing file is a failure, not a
skip."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import pytest

from conftest import REPO
from ferry.protocol import (MessageType, SUPPORTED_VERSIONS, V4_ONLY, V5_ONLY, decode_frame,
                            encode, first_version, message_type, split_frame, type_name)

# FERRY_GOLDEN_FRAMES may name another copy (e.g. one just generated from a C++ build).
GOLDEN = Path(os.environ.get("FERRY_GOLDEN_FRAMES", str(REPO / "tests" / "golden" / "frames.txt")))


class Golden(NamedTuple):
    line: int
    version: int
    name: str
    seq: int
    frame: bytes


def type_of_case(name: str) -> str:
    """The message type a NAME is a case of: the longest type name that NAME is or begins with
    followed by ``_`` (``poll_many_reply_x`` is a poll_many_reply, not a poll_many)."""
    names = [t.wire_name for t in MessageType
             if name == t.wire_name or name.startswith(t.wire_name + "_")]
    return max(names, key=len) if names else f"no message type ({name})"


def load(path: Path) -> list[Golden]:
    if not path.is_file():
        pytest.fail(f"{path} is missing: it is generated from the C++ codec and must be "
                    f"committed (docs/protocol.md, 'Versions')")
    out = []
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        parts = text.split()
        assert len(parts) == 4, f"{path.name}:{n}: expected 'VERSION NAME SEQ HEX', got {raw!r}"
        version, name, seq, hexa = parts
        out.append(Golden(n, int(version), name, int(seq), bytes.fromhex(hexa)))
    assert out, f"{path} holds no frames"
    return out


def test_every_golden_frame_round_trips() -> None:
    failures = []
    for g in load(GOLDEN):
        where = f"{GOLDEN.name}:{g.line} ({g.version} {g.name} {g.seq})"
        try:
            assert g.version in SUPPORTED_VERSIONS, f"version {g.version} is not one of {SUPPORTED_VERSIONS}"
            header = split_frame(g.frame)
            assert type_name(header.type) == type_of_case(g.name), \
                f"the header's type {header.type} is {type_name(header.type)}, not " \
                f"{type_of_case(g.name)}"
            seq, msg = decode_frame(g.frame, g.version)
            assert seq == g.seq, f"the header's seq is {seq}, not {g.seq}"
            assert type_name(message_type(msg)) == type_of_case(g.name)
            again = encode(msg, seq, g.version)
            assert again == g.frame, f"re-encoded as {again.hex()}"
        except Exception as e:  # collect them all: one report names every drifted frame
            failures.append(f"{where}: {type(e).__name__}: {e}")
    assert not failures, "\n".join(failures)


def test_golden_frames_cover_every_message_in_both_versions() -> None:
    have = {(g.version, type_of_case(g.name)) for g in load(GOLDEN)}
    want = {(v, t.wire_name) for v in SUPPORTED_VERSIONS for t in MessageType
            if v >= first_version(t)}
    assert not want - have, f"missing from {GOLDEN.name}: {sorted(want - have)}"


def test_newer_messages_are_golden_only_from_their_first_version() -> None:
    """poll_many, register_memory, discover and their replies exist from v4 on, drain and
    set_log_level from v5 on: a golden frame of one in an earlier version would mean the codecs
    disagree on what that version is."""
    first = {t.wire_name: first_version(t) for t in MessageType}
    bad = [f"{GOLDEN.name}:{g.line} ({g.version} {g.name})" for g in load(GOLDEN)
           if g.version < first[type_of_case(g.name)]]
    assert not bad, bad
    assert {"register_memory", "discover", "discover_reply"} <= {t.wire_name for t in V4_ONLY}
    assert {t.wire_name for t in V5_ONLY} == {"drain", "set_log_level"}


def test_case_names() -> None:
    assert type_of_case("poll_reply") == "poll_reply"
    assert type_of_case("poll_reply_failed") == "poll_reply"
    assert type_of_case("poll_many_reply") == "poll_many_reply"
    assert type_of_case("poll_many_big") == "poll_many"
    assert type_of_case("send_last") == "send"
    assert type_of_case("register_memory") == "register_memory"
    assert type_of_case("register_memory_per_layer") == "register_memory"
    assert type_of_case("discover_reply_down") == "discover_reply"
    assert type_of_case("bogus").startswith("no message type")
