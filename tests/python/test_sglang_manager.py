"""The SGLang adapter's managers and bootstrap (clients/python/ferry/sglang/manager.py,
kvargs.py and bootstrap.py) against the model daemons of sglang_fakes.py: each
manager lends its memory before any request, a decode waits for every prefill rank to be ready,
a KVArgs that does not fit is refused naming the pool, and a receiver finds the prefill ranks
through a table, a callable or ferryd's discover."""

from __future__ import annotations

from typing import Iterator

import pytest

from conftest import IO_TIMEOUT
from ferry import Errc, FerryError
from ferry.memory import MemfdPool
from ferry.protocol import Discover, DiscoveredRank, Prepare
from ferry.sglang import FerryBootstrap, FerryKVArgs, FerryKVManager, FerryKVReceiver, KVPoll
from ferry.sglang.kvargs import NOT_MOVED
from sglang_fakes import BOOT, PREFILL_RANKS, Engine, ModelDaemon, Setup, World, failure


@pytest.fixture
def env(short_tmp: str) -> Iterator[Setup]:
    s = Setup(short_tmp)
    try:
        yield s
    finally:
        s.close()


# --- registration ------------------------------------------------------------------------------

def test_each_manager_registers_every_client_pool_first(env: Setup) -> None:
    w = env.world
    assert sorted((r, pool, n_fds, n_bufs) for r, pool, n_fds, n_bufs, _ in w.registered) == [
        ("decode", 0, 4, 4), ("decode", 1, 2, 2), ("decode", 2, 1, 1),  # one memfd per buffer
        ("prefill", 0, 1, 4), ("prefill", 1, 1, 2), ("prefill", 2, 1, 1)]
    prefill_kv = next(t for r, p, _, _, t in w.registered if r == "prefill" and p == 0)
    assert prefill_kv == [(0, 0), (0, 4096), (0, 8192), (0, 12288)]
    for role in ("prefill", "decode"):
        assert [type(m).__name__ for m in w.requests(role)] == \
            ["Hello", "RegisterMemory", "RegisterMemory", "RegisterMemory"]
    assert env.decode.mgr.registered == ["kv", "state", "aux"]


def test_a_decode_waits_until_every_prefill_rank_lent_its_memory(short_tmp: str) -> None:
    """SGLang's register_to_bootstrap: a prefill manager says so once its memory is registered,
    and a decode's try_ensure_parallel_info is False until every named rank did."""
    world, ready = World(), {}
    boot = FerryBootstrap({BOOT: PREFILL_RANKS}, ready=ready)
    pd, dd = ModelDaemon(short_tmp, "prefill", world), ModelDaemon(short_tmp, "decode", world)
    decode = prefill = None
    try:
        decode = Engine(dd, "decode", boot)
        assert not decode.mgr.try_ensure_parallel_info(BOOT)
        prefill = Engine(pd, "prefill", boot)  # registers, then marks 127.0.0.1:7401 ready
        assert ready == {"127.0.0.1:7401": True}
        assert not decode.mgr.try_ensure_parallel_info(BOOT)  # the second rank is not there
        boot.mark_ready("127.0.0.1:7402")
        assert decode.mgr.try_ensure_parallel_info(BOOT)
        with pytest.raises(LookupError, match="no prefill ranks are known for bootstrap_addr x:1"):
            decode.mgr.try_ensure_parallel_info("x:1")
        # without a ready store readiness is not tracked
        assert FerryBootstrap({BOOT: PREFILL_RANKS}).unready(PREFILL_RANKS) == []
    finally:
        for e in (prefill, decode):
            if e is not None:
                e.close()
        pd.close()
        dd.close()


def test_daemon_memory_pools_are_not_registered(short_tmp: str) -> None:
    world = World()
    d = ModelDaemon(short_tmp, "decode", world, client_memory=False)
    try:
        mgr = FerryKVManager(FerryKVArgs(state_types=["mamba"]), "decode", socket_path=d.path,
                             bootstrap=FerryBootstrap({}), timeout=IO_TIMEOUT)
        assert mgr.registered == [] and world.registered == []
        mgr.close()
    finally:
        d.close()


def test_a_kvargs_table_that_does_not_fit_is_refused_naming_the_pool(short_tmp: str) -> None:
    world = World()
    d = ModelDaemon(short_tmp, "decode", world)
    kv, state, aux = d.pools
    pools = [MemfdPool("kv", kv), MemfdPool("state", state), MemfdPool("aux", aux)]
    try:
        good = FerryKVArgs.from_memfd_pools(kv=pools[0], state=pools[1], aux=pools[2])
        short = FerryKVArgs.from_memfd_pools(kv=pools[0], state=pools[1], aux=pools[2])
        short.kv_data_ptrs = short.kv_data_ptrs[:3]
        with pytest.raises(FerryError) as info:
            FerryKVManager(short, "decode", socket_path=d.path, timeout=IO_TIMEOUT)
        assert info.value.message.startswith("pool kv: the KVArgs list 3 buffers (kv_data_ptrs), "
                                             "ferryd's pool has 4")
        stray = FerryKVArgs.from_memfd_pools(kv=pools[0], state=pools[1], aux=pools[2])
        stray.memory_regions = [r for r in stray.memory_regions if r.fd != pools[1].fds[0]]
        with pytest.raises(FerryError) as info:
            FerryKVManager(stray, "decode", socket_path=d.path, timeout=IO_TIMEOUT)
        assert "pool state: buffer 0 (address 0x" in info.value.message
        assert "lies in no memory region of the KVArgs" in info.value.message
        small = FerryKVArgs.from_memfd_pools(kv=pools[0], state=pools[1], aux=pools[2])
        small.state_data_lens = [[128 * 4, 512 * 3]]
        with pytest.raises(FerryError) as info:
            FerryKVManager(small, "decode", socket_path=d.path, timeout=IO_TIMEOUT)
        assert info.value.message == ("pool state: buffer 1 holds 1536 bytes (state_data_lens[1]), "
                                      "fewer than ferryd's pool needs there: 4 items of 512 bytes")
        with pytest.raises(FerryError) as info:
            FerryKVManager(good, "prefill", socket_path=d.path, timeout=IO_TIMEOUT)
        assert info.value.code == Errc.WRONG_ROLE
        no_state = FerryKVArgs.from_memfd_pools(kv=pools[0], aux=pools[2])
        with pytest.raises(FerryError) as info:
            FerryKVManager(no_state, "decode", socket_path=d.path, timeout=IO_TIMEOUT)
        assert "state_types name no state component" in info.value.message
        assert world.registered == []  # nothing was lent by a refused manager
    finally:
        for p in pools:
            p.close()
        d.close()


@pytest.mark.parametrize("kind", ["swa_ring", "c128_state"])
def test_a_row_indexed_state_type_is_refused_at_construction_by_name(
        short_tmp: str, kind: str) -> None:
    d = ModelDaemon(short_tmp, "decode", World())
    try:
        with pytest.raises(FerryError) as info:
            FerryKVManager(FerryKVArgs(state_types=[kind]), "decode", socket_path=d.path)
        assert info.value.code == Errc.INVALID_REQUEST
        assert info.value.message == (f"state_types ['{kind}']: Ferry cannot move {kind} yet "
                                      f"({NOT_MOVED[kind]}); Ferry moves one mamba, swa, dsa or "
                                      f"minimax_index_k component (docs/integration.md)")
        assert "row-indexed" in NOT_MOVED[kind]
        with pytest.raises(FerryError) as info:
            FerryKVManager(FerryKVArgs(state_types=["mamba", "lora"]), "decode",
                           socket_path=d.path)
        assert info.value.message.startswith("state_types ['mamba', 'lora']: unknown state type "
                                             "'lora' (SGLang's are mamba, swa, dsa,")
        assert d.world.log == []  # refused before it said a word to ferryd
    finally:
        d.close()


# --- finding the prefill ranks ------------------------------------------------------------------

def test_an_unknown_bootstrap_address_fails_at_init(env: Setup) -> None:
    r = FerryKVReceiver(env.decode.mgr, "10.9.9.9:8998", 80)
    r.init(0)
    assert r.poll() == KVPoll.Failed
    e = failure(r)
    assert e.code == Errc.PEER_UNREACHABLE
    assert e.failure_reason.startswith("Could not fetch bootstrap info for bootstrap_addr "
                                       "10.9.9.9:8998")
    r.send_metadata([1], aux_index=0, state_indices=[[0]])  # a failed request sends nothing
    assert not env.world.requests("decode", Prepare)


def test_bootstrap_may_be_a_callable() -> None:
    seen: list = []

    def ranks(addr: str, dp: int) -> list[str]:
        seen.append((addr, dp))
        return [f"127.0.0.1:{7400 + dp}"]
    b = FerryBootstrap(ranks)
    assert b.prefill_peers("x:1", 3) == ["127.0.0.1:7403"] and seen == [("x:1", 3)]
    with pytest.raises(LookupError):
        FerryBootstrap({}).prefill_peers("x:1")


def test_bootstrap_by_discovery(env: Setup) -> None:
    """With discover=True the bootstrap address maps to seeds; the decode's ferryd discovers the
    instance's ranks and the prepare names those that are up; answers are cached."""
    w = env.world
    w.instances["127.0.0.1:7401"] = [
        DiscoveredRank("127.0.0.1:7401", True, "prefill-0", 2, 0, 1, 0, 1, 0, ""),
        DiscoveredRank("127.0.0.1:7402", True, "prefill-1", 2, 1, 1, 0, 1, 0, ""),
        DiscoveredRank("127.0.0.1:7403", False, reason="cannot connect to 127.0.0.1:7403: "
                                                       "Connection refused")]
    env.decode.mgr.bootstrap = FerryBootstrap({BOOT: ["bad", "127.0.0.1:7401"]}, discover=True)
    for room in (100, 101):
        r = env.receiver(room)
        assert r.poll() == KVPoll.WaitingForInput
        r.send_metadata([room], aux_index=room - 100, state_indices=[[0]])
    assert [p.prefill_peers for p in w.requests("decode", Prepare)] == \
        [["127.0.0.1:7401", "127.0.0.1:7402"]] * 2
    assert w.requests("decode", Discover) == [Discover("bad"), Discover("127.0.0.1:7401")]
    w.instances["127.0.0.1:7401"] = [DiscoveredRank("127.0.0.1:7401", False, reason="refused")]
    env.decode.mgr.bootstrap.forget_ranks(BOOT)
    r = env.receiver(102)
    assert r.poll() == KVPoll.Failed
    e = failure(r)
    assert e.code == Errc.PEER_UNREACHABLE and "no prefill rank of bootstrap_addr" in \
        e.failure_reason and "127.0.0.1:7401: refused" in e.failure_reason


def test_bootstrap_by_discovery_picks_the_dp_group(env: Setup) -> None:
    """With attention DP, init(prefill_dp_rank) names the ranks of that group only; a group no
    rank is up in fails the request alone, naming the groups that are up."""
    w = env.world
    w.instances["127.0.0.1:7401"] = [
        DiscoveredRank("127.0.0.1:7401", True, "prefill-dp0", 1, 0, 1, 0, 2, 0, ""),
        DiscoveredRank("127.0.0.1:7402", True, "prefill-dp1", 1, 0, 1, 0, 2, 1, "")]
    env.decode.mgr.bootstrap = FerryBootstrap({BOOT: ["127.0.0.1:7401"]}, discover=True)
    for dp, room in ((1, 120), (0, 121)):
        r = FerryKVReceiver(env.decode.mgr, BOOT, room)
        r.init(dp)
        r.send_metadata([room], aux_index=room - 120, state_indices=[[0]])
    assert [p.prefill_peers for p in w.requests("decode", Prepare)] == \
        [["127.0.0.1:7402"], ["127.0.0.1:7401"]]
    r = FerryKVReceiver(env.decode.mgr, BOOT, 122)
    r.init(2)
    assert r.poll() == KVPoll.Failed
    e = failure(r)
    assert "no rank up in DP group 2 (up: DP 0 of 2, 1 of 2)" in e.failure_reason
