"""The Python client's session machine (ferry/session.py) against the cases both clients pass,
tests/conformance/client_session.yaml (the C++ client's machine runs the same file in
tests/core/test_client_session.cpp)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from conftest import REPO
from ferry.errors import FerryError
from ferry.frames import HEADER, split_frame
from ferry.protocol import Error, HelloReply, decode, encode
from ferry.session import (Dropped, Ended, Failed, HelloAccepted, HelloRefused, Pushed, Refused,
                           Reply, Session, hello_outcome)

CASES = yaml.safe_load((REPO / "tests/conformance/client_session.yaml").read_text())["cases"]


def golden(version: int) -> dict[str, bytes]:
    frames = {}
    for line in (REPO / "tests/golden/frames.txt").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        v, name, _seq, hexed = line.split()
        if int(v) == version:
            frames[name] = bytes.fromhex(hexed)
    return frames


def frame_of(step: dict[str, Any], frames: dict[str, bytes], version: int) -> bytes:
    if "receive_error" in step:
        e = step["receive_error"]
        whole = encode(Error(e["code"], e["message"]), 0, version)
    else:
        whole = frames[step["receive"]]
    f = split_frame(whole)
    body = f.body[:step["keep"]] if "keep" in step else f.body
    seq = step.get("seq", f.seq)
    return HEADER.pack(8 + len(body), f.type, step.get("flags", 0), seq) + body


def check(got: Any, step: dict[str, Any]) -> None:
    want = step["outcome"]
    if want == "reply":
        assert isinstance(got, Reply) and got.seq == step["of"], got
    elif want == "refused":
        assert isinstance(got, Refused) and got.seq == step["of"], got
        assert got.error.code == step["code"] and got.draining == step["draining"], got
    elif want == "failed":
        assert isinstance(got, Failed) and got.seq == step["of"], got
        assert (got.error.code, got.error.message) == (step["code"], step["text"])
    elif want == "dropped":
        assert isinstance(got, Dropped) and got.seq == step["of"], got
    elif want == "pushed":
        assert isinstance(got, Pushed) and got.event.room == step["room"], got
    elif want == "ended":
        assert isinstance(got, Ended), got
        assert (got.error.code, got.error.message) == (step["code"], step["text"])
    else:
        raise AssertionError(f"unknown outcome {want}")


def check_hello(got: Any, step: dict[str, Any]) -> None:
    want = step["hello"]
    if want == "accepted":
        assert isinstance(got, HelloAccepted) and got.reply.version == step["version"], got
    elif want == "refused":
        assert isinstance(got, HelloRefused), got
        assert got.error.code == step["code"] and got.retry_v3 == step["retry_v3"], got
    else:
        assert want == "ended" and isinstance(got, Ended), got
        assert (got.error.code, got.error.message) == (step["code"], step["text"])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_session_passes_the_conformance_case(case: dict[str, Any]) -> None:
    version = case.get("version", 10)
    frames = golden(version)
    session = Session(version)
    tokens: dict[int, object] = {}
    for step in case["steps"]:
        if "start" in step:
            request = split_frame(frames[step["start"]])
            msg = decode(request.type, request.seq, request.body, version)
            token = object()
            seq, frame = session.start(msg, token)
            assert seq == step["seq"]
            assert split_frame(frame).seq == seq and split_frame(frame).body == request.body
            tokens[seq] = token
        elif "abandon" in step:
            assert session.abandon(step["abandon"]) == step["result"]
        elif "end" in step:
            failed = session.end()
            assert failed == [tokens[s] for s in step["failed"]]
            assert session.outstanding() == []
        else:
            got = session.on_frame(split_frame(frame_of(step, frames, version)))
            if isinstance(got, (Reply, Refused, Failed)):
                assert got.token is tokens[got.seq]
            if "hello" in step:
                lo, hi = case["hello"]
                check_hello(hello_outcome(got, lo, hi), step)
            else:
                check(got, step)


def test_the_conformance_file_covers_every_outcome() -> None:
    seen = {s.get("outcome") or ("hello " + s["hello"] if "hello" in s else None)
            for c in CASES for s in c["steps"]}
    assert {"reply", "refused", "failed", "dropped", "pushed", "ended", "hello accepted",
            "hello refused", "hello ended"} <= seen
