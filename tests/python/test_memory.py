"""register_memory from the client's side (docs/protocol.md) against the fake daemon, which
receives the descriptors with recvmsg as ferryd does, and ferry.memory.MemfdPool."""

from __future__ import annotations

import mmap
import os
import stat
import threading
import time

import pytest

from conftest import IO_TIMEOUT, FakeConn, FakeDaemon
from ferry import Client, Errc, FerryError
from ferry.errors import EncodeError
from ferry.memory import (F_SEAL_SHRINK, PAGE, MemfdPool, MemoryRegion, address_of, create_memfd,
                          seals)
from ferry.protocol import (Buffer, BufferKind, Error, HelloReply, MemoryBuffer, MemoryKind, Ok,
                            Poll, Pool, PollReply, RegisterMemory, Status)

T = IO_TIMEOUT

KV = Pool(True, "", 3 * PAGE, (Buffer(0, 1024, 2, 3, 0, BufferKind.K),
                               Buffer(PAGE, 1024, 2, 7, 0, BufferKind.K),
                               Buffer(2 * PAGE, 1024, 2, 3, 0, BufferKind.V)))
STATE = Pool(True, "", 2 * PAGE, (Buffer(0, 96, 4, 0, 0, BufferKind.STATE),
                                  Buffer(PAGE, 2048, 4, 0, 1, BufferKind.STATE)))
AUX = Pool(True, "/ferry.fake.aux", 512, (Buffer(0, 64, 8, 0, 0, BufferKind.AUX),))


def hello(c: FakeConn, pools: tuple[Pool, Pool, Pool] = (KV, STATE, AUX),
          speaks: tuple[int, int] = (3, 4)) -> None:
    seq, msg = c.recv()
    hi = min(msg.version, speaks[1])
    c.version = hi
    c.send(HelloReply(version=hi, node="fake", instance="0", role="decode",
                      control="127.0.0.1:1", page_tokens=1, pools=pools,
                      min_version=speaks[0], max_version=speaks[1]), seq)


def examine(fd: int) -> tuple[int, int]:
    """(size, seals) of a received descriptor, checking it is a regular file (a memfd)."""
    st = os.fstat(fd)
    assert stat.S_ISREG(st.st_mode)
    return st.st_size, seals(fd)


def connect(fake: FakeDaemon) -> Client:
    return Client(fake.path, name="mem-test", timeout=T)


# --- the descriptors arrive with the frame -------------------------------------------------------

def test_register_memory_passes_the_memfds_with_the_frame(fake: FakeDaemon) -> None:
    """ferryd's view: the frame decodes to the table, fd_count descriptors came on its first
    byte, each a memfd sealed against shrinking and as large as its buffers, and what the
    engine writes through its mapping is what ferryd reads through its own."""
    seen: dict = {}

    def serve(c: FakeConn) -> None:
        hello(c)
        seq, msg = c.recv()
        seen["msg"], seen["fds"] = msg, list(c.fds)
        seen["stat"] = [examine(fd) for fd in c.fds]
        # map the received memfd as ferryd would and read what the engine wrote
        m = mmap.mmap(c.fds[0], seen["stat"][0][0])
        seen["bytes"] = bytes(m[PAGE + 1024:PAGE + 1024 + 16])
        m[2 * PAGE:2 * PAGE + 5] = b"ferry"  # a fabric write landing in V of layer 3, page 0
        m.close()
        c.send(Ok(), seq)
        c.wait_closed()
    fake.serve(serve)
    with connect(fake) as client, MemfdPool.for_client(client, "kv") as kv:
        kv.item(1, 1)[:16] = b"K of layer 7, p1"
        kv.register(client)
        assert bytes(kv.item(2, 0)[:5]) == b"ferry"
    fake.join()
    msg = seen["msg"]
    assert isinstance(msg, RegisterMemory)
    assert (msg.pool, msg.memory_kind, msg.fd_count) == (0, MemoryKind.HOST, 1)
    assert msg.buffers == [MemoryBuffer(0, b.offset, b.item_bytes, b.items, b.layer_id, b.tensor,
                                        b.kind) for b in KV.buffers]
    assert len(seen["fds"]) == 1
    size, sealed = seen["stat"][0]
    assert size == 3 * PAGE and sealed & F_SEAL_SHRINK
    assert seen["bytes"] == b"K of layer 7, p1"


def test_one_memfd_per_buffer(fake: FakeDaemon) -> None:
    seen: dict = {}

    def serve(c: FakeConn) -> None:
        hello(c)
        seq, msg = c.recv()
        seen["msg"], seen["stat"] = msg, [examine(fd) for fd in c.fds]
        for i, fd in enumerate(c.fds):  # each memfd holds its buffer at offset 0
            with mmap.mmap(fd, PAGE) as m:
                m[:4] = b"st%02d" % i
        c.send(Ok(), seq)
        c.wait_closed()
    fake.serve(serve)
    with connect(fake) as client, MemfdPool.for_client(client, "mamba", per_buffer=True) as st:
        assert st.kind == "state" and len(st.fds) == 2
        st.register(client)
        assert [bytes(st.view(b)[:4]) for b in range(2)] == [b"st00", b"st01"]
        assert [bytes(st.item(b, 0)[:4]) for b in range(2)] == [b"st00", b"st01"]
    fake.join()
    msg = seen["msg"]
    assert msg.pool == 1 and msg.fd_count == 2
    assert [(b.fd_index, b.fd_offset) for b in msg.buffers] == [(0, 0), (1, 0)]
    assert [(b.item_bytes, b.items, b.tensor, b.kind) for b in msg.buffers] == \
        [(96, 4, 0, BufferKind.STATE), (2048, 4, 1, BufferKind.STATE)]
    assert [s for s, _ in seen["stat"]] == [PAGE, 2 * PAGE]
    assert all(sealed & F_SEAL_SHRINK for _, sealed in seen["stat"])


def test_register_memory_takes_names_dicts_and_tuples(fake: FakeDaemon) -> None:
    seen: list = []

    def serve(c: FakeConn) -> None:
        hello(c)
        for _ in range(2):
            seq, msg = c.recv()
            seen.append((msg, len(c.fds)))
            c.send(Ok(), seq)
        c.wait_closed()
    fake.serve(serve)
    fd = create_memfd("t", PAGE)
    try:
        with connect(fake) as client:
            client.register_memory("aux", [dict(fd_index=0, fd_offset=0, item_bytes=64, items=8,
                                                layer_id=0, tensor=0, kind=4)], [fd])
            client.register_memory(2, [(0, 0, 64, 8, 0, 0, BufferKind.AUX)], [fd],
                                   memory_kind=MemoryKind.HOST)
    finally:
        os.close(fd)
    fake.join()
    assert [(m.pool, m.buffers[0], n) for m, n in seen] == \
        [(2, MemoryBuffer(0, 0, 64, 8, 0, 0, BufferKind.AUX), 1)] * 2


def test_a_refusal_names_the_buffer_and_the_connection_stays(fake: FakeDaemon) -> None:
    why = ("pool kv: buffer 1 is K of layer 7 with 2 items of 1024 bytes, but the table says K "
           "of layer 7 with 2 items of 512 bytes")

    def serve(c: FakeConn) -> None:
        hello(c)
        seq, msg = c.recv()
        assert len(c.fds) == 1
        c.send(Error(Errc.INVALID_REQUEST, why), seq)
        seq, msg = c.recv()
        assert msg == Poll(5)
        c.send(PollReply(5, Status.Failed, Errc.UNKNOWN_ROOM, "room 5 is unknown"), seq)
        c.wait_closed()
    fake.serve(serve)
    with connect(fake) as client, MemfdPool.for_client(client, "kv") as kv:
        table = list(kv.table)
        table[1] = table[1]._replace(item_bytes=512)
        with pytest.raises(FerryError) as info:
            client.register_memory("kv", table, kv.fds)
        assert info.value.code == Errc.INVALID_REQUEST and info.value.message == why
        assert client.poll(5).code == Errc.UNKNOWN_ROOM
    fake.join()


def test_the_descriptors_ride_on_the_frame_even_behind_a_pipelined_request(
        fake: FakeDaemon) -> None:
    """A request from another thread is still unanswered when register_memory is called: the
    client waits for its reply before sending, so ferryd (which credits descriptors to the
    first byte its recvmsg returned) finds them on the register_memory frame, not on the
    poll's."""
    order: list[str] = []

    def serve(c: FakeConn) -> None:
        hello(c)
        time.sleep(0.3)  # the poll waits unread (with whatever follows it)
        seq, msg = c.recv()
        assert msg == Poll(9)
        order.append("poll answered")
        c.send(PollReply(9, Status.Transferring, Errc.OK, ""), seq)
        seq, msg = c.recv()
        order.append(f"register_memory with {len(c.fds)} fd(s), {len(c.stray_fds)} stray")
        c.send(Ok(), seq)
        c.wait_closed()
    fake.serve(serve)
    with connect(fake) as client, MemfdPool.for_client(client, "kv") as kv:
        t = threading.Thread(target=client.poll, args=(9,))
        t.start()
        time.sleep(0.1)  # the poll is on the wire
        kv.register(client)
        t.join(T)
    fake.join()
    assert order == ["poll answered", "register_memory with 1 fd(s), 0 stray"]


def test_many_fds(fake: FakeDaemon) -> None:
    got: list[int] = []

    def serve(c: FakeConn) -> None:
        hello(c)
        seq, msg = c.recv()
        got.extend([msg.fd_count, len(c.fds)])
        c.send(Ok(), seq)
        c.wait_closed()
    fake.serve(serve)
    fds = [create_memfd(f"m{i}", PAGE) for i in range(64)]
    try:
        with connect(fake) as client:
            client.register_memory("kv", [MemoryBuffer(i, 0, 64, 1, 0, 0, 0) for i in range(64)],
                                   fds)
            with pytest.raises(EncodeError) as info:
                client.register_memory("kv", [], fds + [fds[0]])
            assert info.value.message == ("cannot encode register_memory: field 'fd_count' is "
                                          "65, above the limit of 64")
            assert not client.closed  # nothing was sent
    finally:
        for fd in fds:
            os.close(fd)
    fake.join()
    assert got == [64, 64]


def test_register_memory_needs_v4(fake: FakeDaemon) -> None:
    def serve(c: FakeConn) -> None:
        hello(c, speaks=(3, 3))
        c.wait_closed()
    fake.serve(serve)
    with Client(fake.path, timeout=T, version_range=(3, 3)) as client:
        with pytest.raises(FerryError) as info:
            client.register_memory("kv", [], [])
        assert info.value.code == Errc.UNSUPPORTED_VERSION
        assert "register_memory needs protocol version 4" in info.value.message
        with pytest.raises(FerryError):
            client.pool("kv")  # a client pool has no shm object to map
    fake.join()


def test_a_client_pool_cannot_be_mapped_by_name(fake: FakeDaemon) -> None:
    def serve(c: FakeConn) -> None:
        hello(c)
        c.wait_closed()
    fake.serve(serve)
    with connect(fake) as client:
        with pytest.raises(FerryError) as info:
            client.pool("kv")
        assert "pool kv is client memory (memory: client)" in info.value.message
    fake.join()


# --- MemfdPool -----------------------------------------------------------------------------------

def test_memfd_pool_layout_and_access() -> None:
    with MemfdPool("kv", KV) as kv:
        assert len(kv.fds) == 1 and kv.sizes == [3 * PAGE]
        assert [b.fd_offset for b in kv.table] == [0, PAGE, 2 * PAGE]  # ferryd's offsets
        size, sealed = examine(kv.fds[0])
        assert size == 3 * PAGE and sealed & F_SEAL_SHRINK
        kv.item(2, 1)[:] = b"v" * 1024
        whole = kv.view()
        assert bytes(whole[2 * PAGE + 1024:2 * PAGE + 2048]) == b"v" * 1024
        assert kv.address(2) - kv.address(0) == 2 * PAGE
        (region,) = kv.regions()
        assert region == MemoryRegion(kv.fds[0], kv.address(0), 3 * PAGE)
        assert region.contains(kv.address(1), 2048) and region.fd_offset(kv.address(1)) == PAGE
        with pytest.raises(IndexError):
            kv.item(0, 2)
        with pytest.raises(IndexError):
            kv.view(3)
        with pytest.raises(OSError):  # sealed: the memfd cannot shrink under ferryd's mapping
            os.ftruncate(kv.fds[0], PAGE)
        del whole
    assert kv.fds == []
    with pytest.raises(ValueError):
        kv.item(0, 0)


def test_memfd_pool_packs_unaligned_layouts_and_rejects_empty_ones() -> None:
    odd = (Buffer(0, 100, 3, 0, 0, BufferKind.K), Buffer(300, 100, 3, 0, 0, BufferKind.V))
    with MemfdPool("kv", odd) as p:
        assert [b.fd_offset for b in p.table] == [0, PAGE]
    with MemfdPool("kv", odd, per_buffer=True) as p:
        assert [(b.fd_index, b.fd_offset) for b in p.table] == [(0, 0), (1, 0)]
        assert p.sizes == [PAGE, PAGE]
        with pytest.raises(ValueError):
            p.view()  # two memfds: no single view
    with pytest.raises(ValueError):
        MemfdPool("kv", ())
    with pytest.raises(ValueError):
        MemfdPool("weights", odd)


def test_address_of_matches_ctypes_view() -> None:
    import ctypes
    m = mmap.mmap(-1, PAGE)
    try:
        a = address_of(m)
        m[:3] = b"abc"
        assert ctypes.string_at(a, 3) == b"abc"
    finally:
        m.close()
