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
from ferry.protocol import (MessageType, SUPPORTED_VERSIONS, V4_ONLY, decode_frame, encode,
                            message_type, split_frame, type_name)

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
            assert g.version in SUPPORTED_VERSIONS, f"version {g.version} is not 3 or 4"
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
            if v >= 4 or t not in V4_ONLY}
    assert not want - have, f"missing from {GOLDEN.name}: {sorted(want - have)}"


def test_v4_only_messages_are_golden_in_version_4_only() -> None:
    """poll_many, register_memory, discover and their replies exist only in v4: a golden frame of
    one in version 3 would mean the codecs disagree on what v3 is."""
    v4_only = {t.wire_name for t in V4_ONLY}
    bad = [f"{GOLDEN.name}:{g.line} ({g.version} {g.name})" for g in load(GOLDEN)
           if g.version != 4 and type_of_case(g.name) in v4_only]
    assert not bad, bad
    assert {"register_memory", "discover", "discover_reply"} <= v4_only


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
