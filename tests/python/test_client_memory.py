"""Engine-owned memory (``memory: client`` pools, register_memory) with real ferryd processes
(FERRY_BIN_DIR, default build/src), driven through the SGLang-shaped adapter: a prefill and a
decode engine each lend memfds to their ferryd, a room runs end to end, and the decode engine's
memfds hold the prefill's bytes; a closed registration can be made again; a table ferryd
refuses is named."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Iterator

import pytest

from conftest import IO_TIMEOUT, Daemon, start_daemon, start_pair
from ferry import Client, Errc, FerryError
from ferry.memory import MemfdPool, create_memfd
from ferry.protocol import PROTOCOL_VERSION, MemoryBuffer
from ferry.sglang import (FerryBootstrap, FerryKVArgs, FerryKVManager, FerryKVReceiver,
                          KVPoll)

from engine_ranks import BOOT, CLIENT_POOLS, T, Engine, check_landed, run_room, stop_all


@pytest.fixture(scope="module")
def tmpdir_short() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="ferry-cm-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def pair(tmpdir_short: str) -> Iterator[tuple[Daemon, Daemon]]:
    p, d = start_pair(tmpdir_short, "prefill-cm", "decode-cm", CLIENT_POOLS)
    yield p, d
    stop_all([p, d])


@pytest.fixture(scope="module")
def engines(pair: tuple[Daemon, Daemon]) -> Iterator[tuple[Engine, Engine]]:
    pd, dd = pair
    boot = FerryBootstrap({BOOT: [pd.control]})
    p = Engine(pd, "prefill", boot)
    try:
        d = Engine(dd, "decode", boot, per_buffer_kv=True)
    except BaseException:
        p.close()
        raise
    yield p, d
    d.close()
    p.close()


KV_CLIENT_POOL = """pools:
  kv: {layer_ids: [0], page_tokens: 1, kv_heads: 1, head_dim: 64, dtype_bytes: 2, pages: 64, memory: client}
"""


def test_the_hello_reply_shows_client_pools(pair: tuple[Daemon, Daemon]) -> None:
    with Client(pair[1].sock, name="cm-hello", timeout=IO_TIMEOUT) as c:
        assert c.version == PROTOCOL_VERSION
        for kind in ("kv", "state", "aux"):
            assert c.pools[kind].present and c.pools[kind].shm_name == "", c.pools[kind]
        with pytest.raises(FerryError):
            c.pool("kv")


def test_a_room_lands_in_the_decode_engines_memfds(engines: tuple[Engine, Engine]) -> None:
    p, d = engines
    assert p.mgr.registered == d.mgr.registered == ["kv", "state", "aux"]
    for e in (p, d):  # the daemon's pools document says whose memory it is, and that it is lent
        pools = e.mgr.client.info("pools")
        assert sorted(pools) == ["aux", "kv", "state"], pools
        for kind in ("kv", "state", "aux"):
            got = pools[kind]
            assert (got["memory"], got["registered"], got["state"], got["shm_name"]) == \
                ("client", True, "registered", ""), (kind, got)
    expect = run_room(p, d, room=5001, src=[10, 11, 12, 13, 14, 15], dst=[100, 101, 102, 103,
                                                                          104, 105],
                      prefix=0, src_slot=1, dst_slot=2, src_row=3, dst_row=4, chunks=[2, 3, 1])
    assert not check_landed(d, expect)


def test_the_decodes_prefix_is_not_sent(engines: tuple[Engine, Engine]) -> None:
    """decode_prefix_len = 2 pages (page_tokens 1): the decode names the 3 pages after them, the
    prefill learns the prefix through FerryBootstrap and sends from its third page; the pages
    the decode already holds are not written."""
    p, d = engines
    held = [d.kv.item(b, 140)[:].tobytes() for b in range(len(d.kv.buffers))]
    expect = run_room(p, d, room=5002, src=[20, 21, 22, 23, 24], dst=[150, 151, 152],
                      prefix=2, src_slot=0, dst_slot=0, src_row=0, dst_row=1, chunks=[1, 2])
    assert not check_landed(d, expect)
    assert [d.kv.item(b, 140)[:].tobytes() for b in range(len(d.kv.buffers))] == held


def test_a_full_prefix_hit_sends_state_and_aux_only(engines: tuple[Engine, Engine]) -> None:
    p, d = engines
    expect = run_room(p, d, room=5003, src=[30, 31], dst=[], prefix=2, src_slot=3, dst_slot=1,
                      src_row=5, dst_row=6, chunks=[0])
    assert {k[0] for k in expect} == {"state", "aux"}
    assert not check_landed(d, expect)


def test_state_indices_fail_one_request_alone(engines: tuple[Engine, Engine]) -> None:
    p, d = engines
    bad = FerryKVReceiver(d.mgr, BOOT, 5004)
    bad.init(0)
    bad.send_metadata([160], aux_index=2, state_indices=[[1, 2]])
    assert bad.poll() == KVPoll.Failed
    with pytest.raises(FerryError) as info:
        bad.failure_exception()
    assert info.value.message == ("PD state transfer failed: mamba requires single state "
                                  "index, got src=1, dst=2")
    expect = run_room(p, d, room=5005, src=[40], dst=[170], prefix=0, src_slot=2, dst_slot=3,
                      src_row=7, dst_row=7, chunks=[1])
    assert not check_landed(d, expect)


def test_prefill_ranks_by_discovery(engines: tuple[Engine, Engine],
                                   pair: tuple[Daemon, Daemon]) -> None:
    """The decode's ferryd discovers the prefill instance from one seed address (a prefill
    whose config lists no discovery.instance_ranks is answered alone) and the room runs."""
    p, d = engines
    table = d.mgr.bootstrap
    d.mgr.bootstrap = FerryBootstrap({BOOT: [pair[0].control]}, discover=True)
    p.mgr.bootstrap = d.mgr.bootstrap
    try:
        expect = run_room(p, d, room=5007, src=[60, 61], dst=[190, 191], prefix=0, src_slot=0,
                          dst_slot=1, src_row=2, dst_row=3, chunks=[2])
        assert not check_landed(d, expect)
        assert d.mgr.bootstrap.prefill_peers(BOOT, 0, d.mgr.client) == [pair[0].control]
    finally:
        d.mgr.bootstrap = p.mgr.bootstrap = table


def test_close_the_registering_client_and_register_again(engines: tuple[Engine, Engine]) -> None:
    """Closing the decode engine's manager ends its registration (ferryd cancels, fences and
    unmaps); a new manager over the same memory registers again and rooms run."""
    p, d = engines
    d.mgr.close()
    d.mgr = d.connect()  # retried while ferryd says the pool is still being released
    assert d.mgr.registered == ["kv", "state", "aux"]
    expect = run_room(p, d, room=5006, src=[50, 51, 52], dst=[180, 181, 182], prefix=0,
                      src_slot=1, dst_slot=0, src_row=1, dst_row=0, chunks=[3])
    assert not check_landed(d, expect)


@pytest.fixture(scope="module")
def lone(tmpdir_short: str) -> Iterator[Daemon]:
    """A decode ferryd with one client-memory kv pool that nothing registers."""
    d = start_daemon(tmpdir_short, "decode-lone", "decode", KV_CLIENT_POOL)
    yield d
    stop_all([d])


def test_info_pools_of_a_client_pool_nothing_registered(lone: Daemon) -> None:
    with Client(lone.sock, name="cm-pools", timeout=IO_TIMEOUT) as c:
        pools = c.info("pools")
        assert list(pools) == ["kv"], pools  # the pools of its config, and only those
        kv = pools["kv"]
        assert (kv["memory"], kv["registered"], kv["state"], kv["shm_name"]) == \
            ("client", False, "unregistered", ""), kv
        hello = c.pools["kv"]
        assert kv["items"] == 64 and kv["item_bytes"] == sum(b.item_bytes for b in hello.buffers)
        assert (kv["in_use"], kv["free"], kv["bytes"]) == (0, 64, hello.total_bytes), kv


def test_a_refused_table_names_the_buffer(lone: Daemon) -> None:
    with Client(lone.sock, name="cm-refused", timeout=IO_TIMEOUT) as c:
        with pytest.raises(FerryError) as info:
            c.prepare(1, ["127.0.0.1:9"], [1])
        # docs/protocol.md words it without the room; this ferryd prefixes "room 1: "
        assert info.value.message.endswith("pool kv is client memory and no client has "
                                           "registered it"), info.value.message
        with MemfdPool.for_client(c, "kv") as kv:
            table = [b._replace(item_bytes=b.item_bytes // 2) if i == 1 else b
                     for i, b in enumerate(kv.table)]
            with pytest.raises(FerryError) as info:
                c.register_memory("kv", table, kv.fds)
            assert info.value.code == Errc.INVALID_REQUEST
            assert info.value.message.startswith("pool kv: buffer 1 is V of layer 0 with 64 "
                                                 "items of 128 bytes, but the table says V of "
                                                 "layer 0 with 64 items of 64 bytes"), \
                info.value.message
        unsealed = os.memfd_create("unsealed", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(unsealed, 4 * 4096)
            table = [MemoryBuffer(0, 0, 128, 64, 0, 0, 0), MemoryBuffer(0, 8192, 128, 64, 0, 0, 1)]
            with pytest.raises(FerryError) as info:
                c.register_memory("kv", table, [unsealed])
            assert info.value.message.startswith("pool kv: fd 0 is not sealed against shrinking "
                                                 "(F_SEAL_SHRINK)"), info.value.message
        finally:
            os.close(unsealed)
        small = create_memfd("small", 4096)
        try:
            with pytest.raises(FerryError) as info:
                c.register_memory("kv", table, [small])
            assert info.value.message.startswith("pool kv: buffer 0 (K of layer 0 with 64 items "
                                                 "of 128 bytes) needs 8192 bytes at fd 0 offset "
                                                 "0, but the fd has 4096"), info.value.message
        finally:
            os.close(small)
        # the connection and the pool are usable: a correct table registers
        with MemfdPool.for_client(c, "kv") as kv:
            kv.register(c)


def test_a_manager_with_a_wrong_item_size_is_refused_naming_the_buffer(lone: Daemon) -> None:
    with Client(lone.sock, name="cm-layout", timeout=IO_TIMEOUT) as c:
        layout = c.pools["kv"]
    with MemfdPool("kv", layout) as kv:
        args = FerryKVArgs.from_memfd_pools(kv=kv)
        args.kv_item_lens = [256, 256]
        deadline = time.monotonic() + T
        while True:  # the previous test's registration may still be being released
            with pytest.raises(FerryError) as info:
                FerryKVManager(args, "decode", socket_path=lone.sock, timeout=IO_TIMEOUT)
            if "still being released" not in info.value.message or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert info.value.message.startswith("pool kv: buffer 0 is K of layer 0 with 64 items of "
                                             "128 bytes, but the table says K of layer 0 with "
                                             "64 items of 256 bytes"), info.value.message
