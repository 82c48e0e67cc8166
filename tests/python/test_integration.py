"""The client against real ferryd processes (FERRY_BIN_DIR, default build/src) on loopback.

These tests need a ferryd that speaks protocol version 4; against an older one they fail and
say so (they do not skip)."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import pytest

from conftest import (BIN_DIR, IO_TIMEOUT, KV_ONLY_POOLS, MAMBA_POOLS, REPO, Daemon, start_daemon,
                      start_pair)
from ferry import Client, Errc, FerryError, ProtocolError, Status
from ferry.protocol import (PROTOCOL_VERSION, Error, FrameReader, Hello, HelloReply, MessageType, PollMany,
                            PollManyReply, decode, encode)

T = 60.0  # a room's whole transfer on a loaded 2-core machine


def client(d: Daemon, name: str, **kw: object) -> Client:
    c = Client(d.sock, name=name, timeout=IO_TIMEOUT * 3, **kw)  # type: ignore[arg-type]
    if kw.get("version_range") is None and c.version != PROTOCOL_VERSION:
        c.close()
        pytest.fail(f"{BIN_DIR / 'ferryd'} answered a hello offering versions 3.."
                    f"{PROTOCOL_VERSION} in version {c.version} (it speaks "
                    f"{c.daemon_versions[0]}..{c.daemon_versions[1]}): these tests need a ferryd "
                    f"that speaks protocol version {PROTOCOL_VERSION}; rebuild it")
    return c


@pytest.fixture(scope="module")
def tmpdir_short() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="ferry-it-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def stop_all(daemons: list[Daemon]) -> None:
    codes = [(d.log, d.stop()) for d in daemons]
    bad = [f"{log}: exit {rc}\n{open(log).read()[-3000:]}" for log, rc in codes if rc != 0]
    assert not bad, "ferryd did not exit cleanly:\n" + "\n".join(bad)


@pytest.fixture(scope="module")
def mamba_pair(tmpdir_short: str) -> Iterator[tuple[Daemon, Daemon]]:
    """A prefill and a decode ferryd with kv, mamba state and aux pools."""
    p, d = start_pair(tmpdir_short, "prefill-m", "decode-m", MAMBA_POOLS)
    yield p, d
    stop_all([p, d])


@pytest.fixture(scope="module")
def kv_pair(tmpdir_short: str) -> Iterator[tuple[Daemon, Daemon]]:
    """A prefill and a decode ferryd with only a kv pool of 2048 pages (so 1000 rooms fit)."""
    p, d = start_pair(tmpdir_short, "prefill-k", "decode-k", KV_ONLY_POOLS)
    yield p, d
    stop_all([p, d])


def test_the_daemons_speak_v4_and_v3(mamba_pair: tuple[Daemon, Daemon]) -> None:
    pd, dd = mamba_pair
    with client(pd, "it-v4") as p:
        assert p.version == PROTOCOL_VERSION and not p.fell_back_to_v3
        assert p.daemon_versions == (3, PROTOCOL_VERSION)
        assert p.role == "prefill" and p.control == pd.control
        assert p.pools["kv"].present and len(p.pools["kv"].buffers) == 4
    with client(dd, "it-v3", version_range=(3, 3)) as d:
        assert d.version == 3 and d.role == "decode"
        with pytest.raises(FerryError) as info:
            d.poll_many([1])
        assert info.value.code == Errc.UNSUPPORTED_VERSION


def test_rooms_end_to_end_from_several_threads(mamba_pair: tuple[Daemon, Daemon]) -> None:
    """Four rooms at once (one per mamba slot), each driven by its own thread through the same
    two clients; every KV page, the state slot and the aux row land where they should."""
    pd, dd = mamba_pair
    with client(pd, "it-prefill") as p, client(dd, "it-decode") as d:
        kv, st, ax = p.pool("kv"), p.pool("state"), p.pool("aux")
        dkv, dst_state, dax = d.pool("kv"), d.pool("state"), d.pool("aux")
        n_state = len(p.pools["state"].buffers)

        def room_flow(i: int) -> list[str]:
            room = 4200 + i
            src = [10 + 20 * i + k for k in range(6)]
            dst = [100 + 30 * i + k for k in range(6)]
            expect: dict[tuple, bytes] = {}
            for b in range(4):
                for pos, page in enumerate(src):
                    off, n = p.item("kv", b, page)
                    kv[off:off + n] = expect[("kv", b, pos)] = os.urandom(n)
            for b in range(n_state):
                off, n = p.item("state", b, i)
                st[off:off + n] = expect[("state", b)] = os.urandom(n)
            off, n = p.item("aux", 0, i)
            ax[off:off + n] = expect[("aux",)] = room.to_bytes(8, "little") + os.urandom(n - 8)

            d.prepare(room, [pd.control], dst, state_slot=i, aux_row=4 + i)
            d.subscribe(room)
            p.send(room, src[:2])
            p.subscribe(room)  # the prefill knows the room from its prepare or first chunk
            assert p.poll(room).status != Status.Failed  # Bootstrapping until the prepare came
            p.send(room, src[2:4])
            p.send(room, src[4:], last=True, state_slot=i, aux_row=i)
            ev = d.wait_terminal(room, timeout=T)
            assert (ev.status, ev.code, ev.reason) == (Status.Success, Errc.OK, ""), ev
            pev = p.wait_terminal(room, timeout=T)
            assert (pev.status, pev.code) == (Status.Success, Errc.OK), pev
            bad = []
            for b in range(4):
                for pos, page in enumerate(dst):
                    o, n = d.item("kv", b, page)
                    if bytes(dkv[o:o + n]) != expect[("kv", b, pos)]:
                        bad.append(f"room {room}: kv buffer {b} position {pos}")
            for b in range(n_state):
                o, n = d.item("state", b, i)
                if bytes(dst_state[o:o + n]) != expect[("state", b)]:
                    bad.append(f"room {room}: state buffer {b}")
            o, n = d.item("aux", 0, 4 + i)
            if bytes(dax[o:o + n]) != expect[("aux",)]:
                bad.append(f"room {room}: aux row")
            return bad

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(room_flow, i) for i in range(4)]
            bad = [x for f in futures for x in f.result(timeout=4 * T)]
        assert not bad, bad
        polled = d.poll_many([4200, 4201, 4202, 4203])
        assert [(r.room, r.status, r.code) for r in polled] == \
            [(4200 + i, Status.Success, Errc.OK) for i in range(4)]
        with pytest.raises(FerryError) as info:
            p.send(4200, [], last=True, state_slot=0, aux_row=0)
        assert info.value.code == Errc.ROOM_FINISHED
        for view in (kv, st, ax, dkv, dst_state, dax):
            view.release()


def test_a_room_sent_layer_by_layer(mamba_pair: tuple[Daemon, Daemon]) -> None:
    """(v6) Two chunks, each sent one layer range at a time (out of order): the same bytes land
    as a whole send would put there, and a layer sent twice, a range outside the rank's layers
    and a range on a v5 connection are refused with their reasons."""
    pd, dd = mamba_pair
    with client(pd, "it-layers") as p, client(dd, "it-layers-d") as d, \
            client(pd, "it-layers-v5", version_range=(3, 5)) as p5:
        assert p.layers == [0, 1, 3, 7]
        kv, st, ax = p.pool("kv"), p.pool("state"), p.pool("aux")
        dkv, dst_state, dax = d.pool("kv"), d.pool("state"), d.pool("aux")
        room, slot = 4300, 3
        src, dst = [40 + k for k in range(6)], [150 + k for k in range(6)]
        expect: dict[tuple, bytes] = {}
        for b in range(4):
            for pos, page in enumerate(src):
                off, n = p.item("kv", b, page)
                kv[off:off + n] = expect[("kv", b, pos)] = os.urandom(n)
        for b in range(len(p.pools["state"].buffers)):
            off, n = p.item("state", b, slot)
            st[off:off + n] = expect[("state", b)] = os.urandom(n)
        off, n = p.item("aux", 0, slot)
        ax[off:off + n] = expect[("aux",)] = room.to_bytes(8, "little") + os.urandom(n - 8)
        d.prepare(room, [pd.control], dst, state_slot=slot, aux_row=slot)
        d.subscribe(room)
        with pytest.raises(FerryError) as old:
            p5.send(room, src[:3], first_layer=7, layer_count=1)
        assert old.value.code == Errc.UNSUPPORTED_VERSION
        assert old.value.message == ("a layer range needs protocol version 6; this connection "
                                     "speaks 5")
        p.send(room, src[:3], first_layer=7, layer_count=1)
        p.send(room, src[:3], first_layer=0, layer_count=4)  # 0, 1, 3: chunk 0 complete
        p.send(room, src[3:], True, slot, slot, first_layer=0, layer_count=2)  # 0, 1
        with pytest.raises(FerryError) as again:
            p.send(room, src[3:], True, slot, slot, first_layer=1, layer_count=1)
        assert again.value.code == Errc.INVALID_REQUEST
        assert again.value.message == f"room {room}: layer 1 of chunk 1 was already sent"
        with pytest.raises(FerryError) as outside:
            p.send(room, src[3:], True, slot, slot, first_layer=6, layer_count=4)
        assert outside.value.message == (f"room {room}: layers [6, 10) reach outside this "
                                         f"rank's layers 0..7")
        p.send(room, src[3:], True, slot, slot, first_layer=3, layer_count=5)  # 3, 7: the end
        ev = d.wait_terminal(room, timeout=T)
        assert (ev.status, ev.code, ev.reason) == (Status.Success, Errc.OK, ""), ev
        bad = [f"kv {b} {pos}" for b in range(4) for pos, page in enumerate(dst)
               if bytes(dkv[slice(*_span(d.item("kv", b, page)))]) != expect[("kv", b, pos)]]
        bad += [f"state {b}" for b in range(len(p.pools["state"].buffers))
                if bytes(dst_state[slice(*_span(d.item("state", b, slot)))])
                != expect[("state", b)]]
        if bytes(dax[slice(*_span(d.item("aux", 0, slot)))]) != expect[("aux",)]:
            bad.append("aux row")
        assert not bad, bad
        for view in (kv, st, ax, dkv, dst_state, dax):
            view.release()


def _span(item: tuple[int, int]) -> tuple[int, int]:
    """(offset, length) of an item as the bounds of a slice."""
    return item[0], item[0] + item[1]


def test_info_documents_follow_a_room(mamba_pair: tuple[Daemon, Daemon]) -> None:
    """info("pools"), "rooms", "status" and "peers" as documents: a prepared room holds its
    destination page, slot and row (in_use) and is listed; once it succeeded the decode's
    counters moved by exactly its bytes, no room is listed and every item is free again."""
    pd, dd = mamba_pair
    with client(pd, "it-info-prefill") as p, client(dd, "it-info-decode") as d:
        kinds = ("kv", "state", "aux")
        pools = d.info("pools")
        assert list(pools) == list(kinds), pools
        for kind in kinds:
            got, hello = pools[kind], d.pools[kind]
            assert (got["memory"], got["registered"], got["state"]) == \
                ("daemon", True, "registered"), got
            assert (got["shm_name"], got["bytes"]) == (hello.shm_name, hello.total_bytes), got
            assert got["item_bytes"] == sum(b.item_bytes for b in hello.buffers), got
            assert (got["in_use"], got["free"]) == (0, got["items"]), got
        assert [pools[k]["items"] for k in kinds] == [256, 4, 8]
        assert d.info(3) == pools  # by number as by name
        before = d.info("status")

        # An id no other test of this module's pair used: a send for a reused id is refused
        # until the decode's new prepare has reached the prefill (docs/protocol.md), and the
        # layer-wise test's 4300 raced that under ctest -j2.
        room, src, dst = 4400, [200, 201, 202], [220, 221, 222]
        ax = p.pool("aux")
        off, _ = p.item("aux", 0, 2)
        ax[off:off + 8] = room.to_bytes(8, "little")  # the aux row carries the room id
        d.prepare(room, [pd.control], dst, state_slot=2, aux_row=2)
        d.subscribe(room)
        held = d.info("pools")
        assert [held[k]["in_use"] for k in kinds] == [3, 1, 1], held
        assert [held[k]["free"] for k in kinds] == [253, 3, 7], held
        listed = d.info("rooms")
        assert [(r["room"], r["side"], r["peer"]) for r in listed] == \
            [(room, "decode", pd.control)], listed
        assert listed[0]["status"] in ("Bootstrapping", "WaitingForInput"), listed
        p.send(room, src, last=True, state_slot=2, aux_row=2)
        p.subscribe(room)  # known here once sent (a finished room's outcome is pushed too)
        ev = d.wait_terminal(room, timeout=T)
        assert (ev.status, ev.code) == (Status.Success, Errc.OK), ev
        pev = p.wait_terminal(room, timeout=T)
        assert (pev.status, pev.code) == (Status.Success, Errc.OK), pev

        # Every milestone of the room, on each daemon's clock, in the order it must happen.
        for c, side in ((d, "decode"), (p, "prefill")):
            tl = c.info("timelines")
            assert tl["unit"] == "us", tl
            rows = [r for r in tl[side]["rooms"] if r[0] == room]
            assert len(rows) == 1, tl
            marks = dict(zip(tl[side]["marks"], rows[0][1:]))
            assert all(isinstance(v, int) and v >= 0 for v in marks.values()), marks
            if side == "decode":
                assert marks["prepared"] == 0, marks
                assert marks["acknowledged"] <= marks["announced"] <= marks["success"], marks
                assert marks["landed"] <= marks["success"], marks
            else:
                assert marks["opened"] == 0, marks
                assert marks["sent"] <= marks["announced"] <= marks["success"], marks
                assert marks["prepared"] <= marks["announced"], marks
                assert marks["written"] <= marks["success"], marks

        after = d.info("status")
        assert after["role"] == "decode" and after["listen"]["control"] == dd.control
        assert after["decode"]["succeeded"] == before["decode"]["succeeded"] + 1
        assert after["decode"]["failed"] == before["decode"]["failed"]
        room_bytes = 3 * pools["kv"]["item_bytes"] + pools["state"]["item_bytes"] + \
            pools["aux"]["item_bytes"]
        assert after["decode"]["bytes"] - before["decode"]["bytes"] == room_bytes
        assert after["decode"]["active"] == 0 and after["stray_writes"] == 0
        assert d.info("rooms") == []
        freed = d.info("pools")
        assert [(freed[k]["in_use"], freed[k]["free"]) for k in kinds] == \
            [(0, 256), (0, 4), (0, 8)], freed
        peers = [x for x in d.info("peers") if x["address"] == pd.control]
        assert len(peers) == 1, d.info("peers")
        assert (peers[0]["state"], peers[0]["node"], peers[0]["tp"], peers[0]["pp"]) == \
            ("connected", "prefill-m", {"rank": 0, "size": 1}, {"rank": 0, "size": 1}), peers
        ax.release()


def test_poll_many_of_1000_rooms_in_one_round_trip(kv_pair: tuple[Daemon, Daemon]) -> None:
    pd, dd = kv_pair
    rooms = list(range(50_000, 51_000))
    with client(dd, "it-decode-many") as d:
        def prepare(chunk: list[int]) -> None:
            for room in chunk:
                d.prepare(room, pd.control, [room - 50_000])
        with ThreadPoolExecutor(8) as pool:  # eight threads share the one connection
            for f in [pool.submit(prepare, rooms[i::8]) for i in range(8)]:
                f.result(timeout=T)
        unknown = 9_999_999
        asked = rooms + [unknown]
        reply = d.request(PollMany(asked))  # one frame out, one back
        assert isinstance(reply, PollManyReply)
        assert [r.room for r in reply.rooms] == asked
        live = {Status.Bootstrapping, Status.WaitingForInput}
        for r in reply.rooms[:-1]:
            assert r.status in live and r.code == Errc.OK, r
        last = reply.rooms[-1]
        assert (last.status, last.code) == (Status.Failed, Errc.UNKNOWN_ROOM), last
        results = d.poll_many(asked)  # the same through the convenience method
        assert [r.room for r in results] == asked
        for room in (rooms[0], rooms[500], rooms[-1]):
            assert d.poll(room).status in live
        # eight threads polling at once through the one connection: every reply is its own
        def polls(k: int) -> list[str]:
            wrong = []
            for room in rooms[k::8][:60]:
                r = d.poll(room)
                if r.room != room:
                    wrong.append(f"poll({room}) answered for room {r.room}")
                try:
                    d.poll(unknown + k)
                    wrong.append(f"poll({unknown + k}) did not fail")
                except FerryError as e:
                    if e.code != Errc.UNKNOWN_ROOM or str(unknown + k) not in e.message:
                        wrong.append(f"poll({unknown + k}): {e}")
                many = d.poll_many([room, unknown])
                if [x.room for x in many] != [room, unknown]:
                    wrong.append(f"poll_many([{room}, {unknown}]) answered {many}")
            return wrong
        with ThreadPoolExecutor(8) as pool:
            wrong = [w for f in [pool.submit(polls, k) for k in range(8)]
                     for w in f.result(timeout=T)]
        assert not wrong, wrong[:10]
        # a v3 connection to the same daemon polls one room at a time and sees no codes
        with client(dd, "it-decode-v3", version_range=(3, 3)) as d3:
            r3 = d3.poll(rooms[0])
            assert r3.status in live and r3.code is None


def test_event_codes_of_a_cancelled_room(mamba_pair: tuple[Daemon, Daemon]) -> None:
    """A prefill room queued before its prepare, then cancelled: Failed with code 406
    (cancelled) on a v4 connection, and no code on a v3 one; the same for a decode room."""
    pd, dd = mamba_pair
    with client(pd, "it-cancel-v4") as p4, \
            client(pd, "it-cancel-v3", version_range=(3, 3)) as p3, \
            client(dd, "it-cancel-decode") as d:
        got: list = []
        p4.on_event(got.append)
        for c, room in ((p4, 7004), (p3, 7003)):
            c.send(room, [1, 2])
            c.subscribe(room)
            c.cancel(room)
            ev = c.wait_terminal(room, timeout=T)
            assert ev.status == Status.Failed and ev.reason == "cancelled by client", ev
            polled = c.poll(room)
            assert polled.status == Status.Failed
            if c is p4:
                assert ev.code == Errc.CANCELLED and polled.code == Errc.CANCELLED
            else:
                assert ev.code is None and polled.code is None
        assert any(e.room == 7004 and e.code == Errc.CANCELLED for e in got)
        d.prepare(7005, pd.control, [1, 2], state_slot=3, aux_row=3)
        d.subscribe(7005)
        d.cancel(7005)
        ev = d.wait_terminal(7005, timeout=T)
        assert (ev.status, ev.code) == (Status.Failed, Errc.CANCELLED), ev


def test_prefill_poll_of_an_unseen_room(tmpdir_short: str) -> None:
    """v4: Bootstrapping until timeouts.bootstrapping_ms after the first poll, then Failed with
    timed_out; v3: unknown_room, as before."""
    pd = start_daemon(tmpdir_short, "prefill-b", "prefill", KV_ONLY_POOLS,
                      "timeouts: {bootstrapping_ms: 1000}\n")
    try:
        with client(pd, "it-unseen") as p, client(pd, "it-unseen-v3", version_range=(3, 3)) as p3:
            first = p.poll(8001)
            assert (first.status, first.code) == (Status.Bootstrapping, Errc.OK), first
            with pytest.raises(FerryError) as info:
                p3.poll(8002)
            assert info.value.code == Errc.UNKNOWN_ROOM
            deadline = time.monotonic() + 30
            wake = threading.Event()
            while True:  # an engine's poll loop: Bootstrapping, then Failed once 1 s has passed
                r = p.poll(8001)
                if r.status != Status.Bootstrapping or time.monotonic() > deadline:
                    break
                wake.wait(0.05)
            assert (r.status, r.code) == (Status.Failed, Errc.TIMED_OUT), r
            assert r.reason.startswith("timed out in Bootstrapping after "), r.reason
            many = p.poll_many([8001, 8003])
            assert many[0].status == Status.Failed and many[0].code == Errc.TIMED_OUT
            assert many[1].status == Status.Bootstrapping
    finally:
        stop_all([pd])


def test_ferryd_words_decoding_errors_as_the_python_codec(
        kv_pair: tuple[Daemon, Daemon]) -> None:
    """Malformed request bodies sent raw: ferryd's error reply (code 310) is word for word the
    ProtocolError the Python codec raises for the same body."""
    _, dd = kv_pair
    bodies = [
        (MessageType.POLL_MANY, struct.pack("<I", 16385)),
        (MessageType.POLL_MANY, struct.pack("<IQ", 3, 1)),
        (MessageType.POLL_MANY, struct.pack("<IQ", 1, 1) + b"\0"),
        (MessageType.POLL, struct.pack("<I", 7)),
        (MessageType.SEND, struct.pack("<QIBII", 5, 0, 2, 0xFFFFFFFF, 0xFFFFFFFF)),
        (MessageType.PREPARE, struct.pack("<QI", 7, 300)),
        (MessageType.PREPARE, struct.pack("<QII", 7, 0, 3) + b"\0" * 8),
        (MessageType.INFO, b"\x05"),
        (MessageType.SUBSCRIBE, b""),
        (99, b""),
    ]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(IO_TIMEOUT)
        s.connect(dd.sock)
        frames = FrameReader()

        def reply() -> tuple[int, object]:
            while (f := frames.next()) is None:
                chunk = s.recv(1 << 16)
                assert chunk, "ferryd closed the connection"
                frames.feed(chunk)
            return f.seq, decode(f.type, f.seq, f.body, 4)
        s.sendall(encode(Hello(4, "it-raw", True, 3), 1, 4))
        seq, hello = reply()
        assert isinstance(hello, HelloReply) and hello.version == 4, hello
        for i, (mtype, body) in enumerate(bodies, 2):
            with pytest.raises(ProtocolError) as info:
                decode(mtype, i, body, 4)
            s.sendall(struct.pack("<IHHI", 8 + len(body), mtype, 0, i) + body)
            seq, err = reply()
            assert seq == i and isinstance(err, Error), err
            assert (err.code, err.message) == (Errc.MALFORMED_FRAME, info.value.message)


def test_the_legacy_script_passes() -> None:
    """tests/python/test_python_client.py (ctest's python_client_end_to_end) through the
    compatibility module."""
    if not (BIN_DIR / "ferryd").is_file():
        pytest.fail(f"no ferryd at {BIN_DIR}: build it, or set FERRY_BIN_DIR")
    r = subprocess.run([sys.executable, str(REPO / "tests/python/test_python_client.py"),
                        str(BIN_DIR)], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert " 0 failed" in r.stdout


def test_v5_log_levels_and_drain_from_the_python_client(tmpdir_short: str) -> None:
    """v5: set_log_level changes what info("status")["log"] shows and names what it refuses;
    drain answers ok and ferryd exits 0 by itself (tests/e2e/test_logs.cpp drains with a room
    in flight)."""
    pd = start_daemon(tmpdir_short, "prefill-v5", "prefill", KV_ONLY_POOLS)
    try:
        with client(pd, "it-v5") as p, client(pd, "it-v4", version_range=(3, 4)) as p4:
            assert p.info("status")["log"] == {"format": "text", "levels": {
                n: "info" for n in ("ferryd", "scheduler", "room", "peer", "client",
                                    "transport")}}
            p.set_log_level("debug", "peer")
            p.set_log_level("warn")
            levels = p.info("status")["log"]["levels"]
            assert set(levels.values()) == {"warn"}, levels
            with pytest.raises(FerryError) as bad:
                p.set_log_level("loud")
            assert bad.value.code == Errc.INVALID_REQUEST
            assert str(bad.value.message).startswith("unknown log level 'loud'")
            with pytest.raises(FerryError) as old:
                p4.drain()
            assert old.value.code == Errc.UNSUPPORTED_VERSION
            assert "drain needs protocol version 5" in old.value.message
            p.set_log_level("info")
            p.drain()  # no room is active: the drain ends at once
        assert pd.proc.wait(timeout=60) == 0
        assert "a client asked for a drain" in open(pd.log).read()
    finally:
        stop_all([pd])
