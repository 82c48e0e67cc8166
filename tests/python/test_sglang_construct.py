"""The SGLang adapter constructed exactly as SGLang constructs a backend (issue 29, item 5):
SGLang's signatures and call forms, the settings a manager derives from server_args, the
KVArgs and FERRY_* variables, a prefill rank registering with the bootstrap server, a decode
filling prefill_info_table from it, a sender's room DP rank, and get_transfer_metric; against
the model daemons of sglang_fakes.py and a real bootstrap server on 127.0.0.1."""

from __future__ import annotations

import enum
import inspect
import os
import time
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from conftest import IO_TIMEOUT
from engine_ranks import ensured
from ferry import Errc, FerryError
from ferry.memory import MemfdPool
from ferry.protocol import Cancel, Prepare, Send
from ferry.sglang import (FerryKVArgs, FerryKVManager, FerryKVReceiver, FerryKVSender,
                          FerrySettings, KVArgs, KVBootstrapServer, KVManager, KVPoll, KVReceiver,
                          KVSender)
from ferry.sglang.http import FerryHTTPBootstrap
from ferry.sglang.settings import DEFAULT_SOCKET, config_section
from sglang_fakes import ModelDaemon, World, failure, layout

Mode = enum.Enum("DisaggregationMode", {"NULL": "null", "PREFILL": "prefill",
                                        "DECODE": "decode"})  # SGLang's enum's values


def server_args(port: int, **kw: Any) -> SimpleNamespace:
    """The ServerArgs fields the adapter reads, with SGLang's defaults."""
    d = dict(host="127.0.0.1", port=30000, disaggregation_bootstrap_port=port,
             dist_init_addr=None, dp_size=1, enable_dp_attention=False, kv_cache_dtype="auto",
             load_balance_method="round_robin")
    d.update(kw)
    return SimpleNamespace(**d)


# --- signatures --------------------------------------------------------------------------------

def params(fn: Any) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def test_the_classes_take_sglangs_parameters_in_sglangs_order() -> None:
    """The parameter lists of SGLang's base classes (base/conn.py), name for name; Ferry's
    keywords come after them, keyword-only."""
    assert (KVManager, KVSender, KVReceiver, KVArgs) == \
        (FerryKVManager, FerryKVSender, FerryKVReceiver, FerryKVArgs)
    sig = inspect.signature(KVManager)
    assert params(KVManager)[:4] == ["args", "disaggregation_mode", "server_args",
                                     "is_mla_backend"]
    assert all(p.kind == p.KEYWORD_ONLY for p in list(sig.parameters.values())[4:])
    assert params(KVSender) == ["mgr", "bootstrap_addr", "bootstrap_room", "dest_tp_ranks",
                                "pp_rank", "req_has_disagg_prefill_dp_rank"]
    assert params(KVReceiver) == ["mgr", "bootstrap_addr", "bootstrap_room"]
    assert inspect.signature(KVReceiver).parameters["bootstrap_room"].default is None
    assert params(KVBootstrapServer)[:2] == ["host", "port"]
    assert params(KVReceiver.init) == ["prefill_dp_rank"]
    assert params(KVReceiver.send_metadata)[:4] == ["kv_indices", "aux_index", "state_indices",
                                                    "decode_prefix_len"]
    assert params(KVSender.init) == ["num_kv_indices", "aux_index"]
    assert params(KVSender.send)[:3] == ["kv_indices", "state_indices", "token_position_offset"]
    assert params(KVSender.should_send_kv_chunk) == ["num_pages", "last_chunk"]
    for cls in (KVSender, KVReceiver):
        for m in ("poll", "failure_exception", "clear", "abort"):
            assert params(getattr(cls, m)) == []
    assert params(KVSender.get_transfer_metric) == []
    assert params(KVSender.pop_decode_prefix_len) == []
    assert params(FerryKVManager.try_ensure_parallel_info)[0] == "bootstrap_addr"
    assert params(FerryKVReceiver.query_prefill_dp_ranks) == ["bootstrap_addr", "bootstrap_rooms"]


# --- settings ----------------------------------------------------------------------------------

def test_settings_derive_from_the_kvargs_server_args_and_environment() -> None:
    args = FerryKVArgs(engine_rank=3, pp_rank=1, system_dp_rank=2, gpu_id=5)
    s = FerrySettings.derive(args, "prefill", server_args(8998), {})
    assert s == FerrySettings(socket_path="/run/ferry/prefill-5/ferryd.sock",
                              bootstrap_addr="127.0.0.1:8998", control_addr=None)
    assert DEFAULT_SOCKET == "/run/ferry/{mode}-{gpu_id}/ferryd.sock"
    env = {"FERRY_SOCKET": "/s/{mode}-tp{tp_rank}-pp{pp_rank}-dp{dp_rank}-e{engine_rank}.sock",
           "FERRY_TIMEOUT": "2.5", "FERRY_REGISTER_TIMEOUT": "7", "FERRY_DRAIN_TIMEOUT": "3",
           "FERRY_RECONNECT": "off", "FERRY_BOOTSTRAP_HTTP_TIMEOUT": "1",
           "FERRY_CONTROL_ADDR": "10.0.0.7:7401", "FERRY_CHECKSUMS": "yes"}
    s = FerrySettings.derive(args, "decode", server_args(8998, host="0.0.0.0"), env)
    assert s == FerrySettings("/s/decode-tp3-pp1-dp2-e3.sock", "127.0.0.1:8998", "10.0.0.7:7401",
                              2.5, 7.0, 3.0, False, 1.0, True)
    # several nodes: the bootstrap server is on dist_init_addr's host, as SGLang registers
    s = FerrySettings.derive(args, "prefill", server_args(8998, dist_init_addr="10.1.2.3:5000"),
                             {})
    assert s.bootstrap_addr == "10.1.2.3:8998"
    s = FerrySettings.derive(args, "prefill", server_args(8998),
                             {"FERRY_BOOTSTRAP_ADDR": "[::1]:9000"})
    assert s.bootstrap_addr == "[::1]:9000"
    assert FerrySettings.derive(args, "prefill", None, {}).bootstrap_addr is None
    for env, msg in (({"FERRY_SOCKET": "/s/{rank}.sock"}, "FERRY_SOCKET='/s/{rank}.sock' names "
                      "{rank}: a socket template may name {mode}, {engine_rank}, {tp_rank}, "
                      "{pp_rank}, {dp_rank}, {gpu_id}"),
                     ({"FERRY_TIMEOUT": "soon"}, "FERRY_TIMEOUT='soon': expected a number of "
                                                 "seconds"),
                     ({"FERRY_DRAIN_TIMEOUT": "0"}, "FERRY_DRAIN_TIMEOUT='0': expected a "
                                                    "positive number of seconds"),
                     ({"FERRY_RECONNECT": "maybe"}, "FERRY_RECONNECT='maybe': expected 1 or 0"),
                     ({"FERRY_CHECKSUMS": "2"}, "FERRY_CHECKSUMS='2': expected 1 or 0"),
                     ({"FERRY_BOOTSTRAP_ADDR": "nohost"}, "FERRY_BOOTSTRAP_ADDR='nohost': "
                                                          "expected host:port")):
        with pytest.raises(ValueError) as info:
            FerrySettings.derive(args, "prefill", None, env)
        assert str(info.value).startswith(msg), str(info.value)


def test_the_rank_position_is_read_from_ferryds_effective_config() -> None:
    text = "tp:\n  size: 2\n  rank: 1\npp:\n  size: 4  # x\n  rank: 3\ndp:\n  size: 1\n  " \
           "rank: 0\npools:\n  kv:\n    pages: 8\n"
    assert config_section(text, "pp") == {"size": 4, "rank": 3}
    assert config_section(text, "dp") == {"size": 1, "rank": 0}
    assert config_section(text, "cp") == {}


# --- constructed as SGLang does, against model daemons ------------------------------------------

class Rank:
    """An engine rank built as SGLang builds it: KVArgs filled field by field, then
    ``KVManager(kv_args, mode, server_args, is_mla_backend)`` positionally."""

    def __init__(self, mode: Any, sargs: Any, **fields: Any) -> None:
        kv, state, aux = layout()  # the model daemons' pools
        self.pools = [MemfdPool("kv", kv), MemfdPool("state", state), MemfdPool("aux", aux)]
        a = FerryKVArgs.from_memfd_pools(kv=self.pools[0], state=self.pools[1],
                                         aux=self.pools[2], page_size=16)
        for k, v in fields.items():
            setattr(a, k, v)
        try:
            self.mgr = KVManager(a, mode, sargs, False)
        except BaseException:
            self.close_pools()
            raise

    def close_pools(self) -> None:
        for p in self.pools:
            p.close()

    def close(self) -> None:
        self.mgr.close()
        self.close_pools()


@pytest.fixture
def boot() -> Iterator[KVBootstrapServer]:
    s = KVBootstrapServer(host="127.0.0.1", port=0)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def daemons(short_tmp: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[World, str]]:
    """A prefill and a decode model daemon at <tmp>/prefill.sock and <tmp>/decode.sock (also in
    ``world.daemons``), and FERRY_SOCKET naming them by the side."""
    world = World()
    pd, dd = ModelDaemon(short_tmp, "prefill", world), ModelDaemon(short_tmp, "decode", world)
    world.daemons = [pd, dd]  # type: ignore[attr-defined]
    for k in [k for k in os.environ if k.startswith("FERRY_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("FERRY_SOCKET", os.path.join(short_tmp, "{mode}.sock"))
    monkeypatch.setenv("FERRY_TIMEOUT", str(IO_TIMEOUT))
    try:
        yield world, short_tmp
    finally:
        for d in world.daemons:  # type: ignore[attr-defined]
            d.close()


def test_a_room_between_ranks_built_only_as_sglang_builds_them(
        daemons: tuple[World, str], boot: KVBootstrapServer) -> None:
    world, _ = daemons
    sa = server_args(boot.port)
    decode = Rank(Mode.DECODE, sa)
    prefill = None
    try:
        addr = boot.address  # the request's bootstrap_host:bootstrap_port
        assert decode.mgr.prefill_info_table == {}
        assert decode.mgr.try_ensure_parallel_info(addr) is False  # nothing registered yet
        prefill = Rank(Mode.PREFILL, sa)
        assert boot.ranks == {(0, 0, 0, 0): {"rank_ip": "127.0.0.1", "rank_port": 7401}}
        assert ensured(decode.mgr, addr)
        info = decode.mgr.prefill_info_table[addr]
        assert (info.dp_size, info.follow_bootstrap_room, info.attn_tp_size, info.page_size) \
            == (1, False, 1, 16)
        # the decode scheduler's calls, in its forms
        r = KVReceiver(mgr=decode.mgr, bootstrap_addr=addr, bootstrap_room=41)
        r.init(0)
        assert r.poll() == KVPoll.WaitingForInput
        s = KVSender(mgr=prefill.mgr, bootstrap_addr=addr, bootstrap_room=41, dest_tp_ranks=[0],
                     pp_rank=0, req_has_disagg_prefill_dp_rank=False)
        assert s.poll() == KVPoll.Bootstrapping
        r.send_metadata([3, 4], 1, [[2]], 0)
        assert world.requests("decode", Prepare) == [Prepare(41, ["127.0.0.1:7401"], [3, 4], 2, 1)]
        assert s.poll() == KVPoll.WaitingForInput and s.pop_decode_prefix_len() == 0
        s.init(2, 0)
        s.send([7, 8], [[1]])
        assert world.requests("prefill", Send) == [Send(41, [7, 8], True, 1, 0)]
        assert s.poll() == KVPoll.Success and r.poll() == KVPoll.Success
        m = s.get_transfer_metric()
        assert m.transfer_total_bytes == 2 * 4 * 256 + 128 + 512
        assert m.alloc_latency_s is not None and m.alloc_latency_s >= 0
        assert m.transfer_latency_s is not None and m.transfer_latency_s >= 0
        fresh = KVSender(prefill.mgr, addr, 42, [0], 0)  # positional, as older schedulers
        assert fresh.get_transfer_metric() == type(m)(None, None, 0)
        decode.mgr.forget_prefill(addr)  # asked again: still registered, so ready again
        assert decode.mgr.prefill_info_table == {}
        assert ensured(decode.mgr, addr) and addr in decode.mgr.prefill_info_table
    finally:
        if prefill is not None:
            prefill.close()
        decode.close()



def test_a_sender_registers_its_rooms_dp_rank_as_sglangs_do(
        daemons: tuple[World, str], boot: KVBootstrapServer) -> None:
    """server_args.dp_size > 1 and a load balancer that does not follow the room: the sender
    registers this rank's DP rank for the room, and the decode's scheduler finds it with
    query_prefill_dp_ranks; following the room, a room of another DP group fails at once with
    SGLang's words (and its cancel is remembered by the prefill ferryd)."""
    world, _ = daemons
    prefill = Rank(Mode.PREFILL, server_args(boot.port, dp_size=2, enable_dp_attention=True))
    try:
        KVSender(prefill.mgr, boot.address, 60, [0], 0)
        KVSender(prefill.mgr, boot.address, 61, [0], 0, req_has_disagg_prefill_dp_rank=True)
        # posted off the scheduler loop, in order: the decode sees it once it is done
        deadline = time.monotonic() + IO_TIMEOUT
        while FerryKVReceiver.query_prefill_dp_ranks(boot.address, [60, 61]) != {"60": 0} and \
                time.monotonic() < deadline:
            time.sleep(0.005)
        assert FerryKVReceiver.query_prefill_dp_ranks(boot.address, [60, 61]) == {"60": 0}
        # A bootstrap server that accepts and never answers, with an hour's HTTP timeout: a
        # sender that waited on it would hang here.
        import socket
        hang = socket.socket()
        hang.bind(("127.0.0.1", 0))
        hang.listen(8)
        prefill.mgr.settings.http_timeout = 3600.0
        try:
            for room in (64, 66):
                KVSender(prefill.mgr, f"127.0.0.1:{hang.getsockname()[1]}", room, [0], 0)
        finally:
            hang.close()
            prefill.mgr.settings.http_timeout = 5.0
        prefill.mgr.server_args.load_balance_method = "follow_bootstrap_room"
        ok = KVSender(prefill.mgr, boot.address, 62, [0], 0)  # 62 % 2 == 0: this rank's group
        assert ok.poll() == KVPoll.Bootstrapping
        bad = KVSender(prefill.mgr, boot.address, 63, [0], 0)
        assert bad.poll() == KVPoll.Failed
        e = failure(bad)
        assert e.code == Errc.INVALID_REQUEST and e.failure_reason.startswith(
            "follow_bootstrap_room conflict: dispatched to dp_rank 0 but bootstrap_room 63 "
            "implies dp_rank 1.")
        assert world.requests("prefill", Cancel) == [Cancel(63)]
        assert FerryKVReceiver.query_prefill_dp_ranks(boot.address, [62, 63]) == {}
    finally:
        prefill.close()


def test_a_derived_socket_must_reach_this_ranks_ferryd(daemons: tuple[World, str],
                                                       boot: KVBootstrapServer) -> None:
    """The socket template points the rank at a ferryd; one configured for another TP rank
    would put this rank's slices where another's belong, so it is refused by name."""
    world, _ = daemons
    with pytest.raises(FerryError) as info:
        Rank(Mode.DECODE, server_args(boot.port), engine_rank=1)
    assert "is tp.rank 0, but this engine rank is tp rank 1 (KVArgs)" in info.value.message
    assert world.registered == []  # nothing was lent


def test_a_prefill_rank_that_cannot_register_fails_its_construction(
        daemons: tuple[World, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """No bootstrap server answering within FERRY_REGISTER_TIMEOUT: the constructor raises,
    naming the URL (SGLang's decode could never find the rank)."""
    monkeypatch.setenv("FERRY_REGISTER_TIMEOUT", "0.2")
    with pytest.raises(ConnectionError) as info:
        Rank(Mode.PREFILL, server_args(1))
    assert str(info.value).startswith("could not register prefill rank with the bootstrap "
                                      "server: PUT http://127.0.0.1:1/route: no answer")


def test_a_wildcard_control_address_is_replaced_by_ferry_control_addr(
        daemons: tuple[World, str], boot: KVBootstrapServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_CONTROL_ADDR", "10.0.0.9:7500")
    prefill = Rank(Mode.PREFILL, server_args(boot.port))
    try:
        assert boot.ranks == {(0, 0, 0, 0): {"rank_ip": "10.0.0.9", "rank_port": 7500}}
        prefill.mgr.settings.control_addr = "0.0.0.0:7401"
        with pytest.raises(ValueError, match="set FERRY_CONTROL_ADDR to this rank's reachable"):
            prefill.mgr.registration()
    finally:
        prefill.close()


def test_the_table_bootstrap_fills_prefill_info_table_too(daemons: tuple[World, str]) -> None:
    """A manager given a FerryBootstrap table: prefill_info_table says what the table's
    dp_size and follow_bootstrap_room say, once the ranks are ready."""
    from ferry.sglang import FerryBootstrap
    ready: dict = {}
    b = FerryBootstrap({"p:1": ["127.0.0.1:7401"]}, ready=ready, dp_size=2,
                       follow_bootstrap_room=False)
    kv, state, aux = layout()
    pools = [MemfdPool("kv", kv), MemfdPool("state", state), MemfdPool("aux", aux)]
    try:
        args = FerryKVArgs.from_memfd_pools(kv=pools[0], state=pools[1], aux=pools[2],
                                            page_size=16)
        mgr = KVManager(args, "decode", None, False, bootstrap=b)
        assert mgr.try_ensure_parallel_info("p:1") is False and mgr.prefill_info_table == {}
        b.mark_ready("127.0.0.1:7401")
        assert mgr.try_ensure_parallel_info("p:1") is True
        assert (mgr.prefill_info_table["p:1"].dp_size,
                mgr.prefill_info_table["p:1"].follow_bootstrap_room) == (2, False)
        mgr.close()
    finally:
        for p in pools:
            p.close()


def test_a_prefill_rank_registers_again_when_its_ferryd_comes_back(
        daemons: tuple[World, str], boot: KVBootstrapServer) -> None:
    """The client reconnects to a restarted ferryd and lends the memory again; the rank then
    registers with the bootstrap server again (here one that lost its table)."""
    world, tmp = daemons
    prefill = Rank(Mode.PREFILL, server_args(boot.port))
    try:
        assert len(boot.ranks) == 1
        world.daemons[0].vanish()  # type: ignore[attr-defined]
        with boot.lock:
            boot.ranks.clear()
            boot.info = None
        world.daemons.append(ModelDaemon(tmp, "prefill", world))  # type: ignore[attr-defined]
        deadline = time.monotonic() + IO_TIMEOUT
        while not boot.ranks and time.monotonic() < deadline:
            time.sleep(0.02)
        assert boot.ranks == {(0, 0, 0, 0): {"rank_ip": "127.0.0.1", "rank_port": 7401}}
    finally:
        prefill.close()


def test_the_bootstrap_servers_ranks_may_seed_discovery(daemons: tuple[World, str],
                                                         boot: KVBootstrapServer) -> None:
    """FerryHTTPBootstrap(discover=True): the registered rank is the seed; the prepare names
    every rank ferryd's discover reports up."""
    from ferry.protocol import DiscoveredRank
    from ferry.sglang import FerryHTTPBootstrap
    world, _ = daemons
    world.instances["127.0.0.1:7401"] = [
        DiscoveredRank("127.0.0.1:7401", True, "p0", 2, 0, 1, 0, 1, 0, ""),
        DiscoveredRank("127.0.0.1:7402", True, "p1", 2, 1, 1, 0, 1, 0, "")]
    prefill = Rank(Mode.PREFILL, server_args(boot.port))
    kv, state, aux = layout()
    pools = [MemfdPool("kv", kv), MemfdPool("state", state), MemfdPool("aux", aux)]
    try:
        args = FerryKVArgs.from_memfd_pools(kv=pools[0], state=pools[1], aux=pools[2],
                                            page_size=16)
        mgr = KVManager(args, Mode.DECODE, server_args(boot.port), False,
                        bootstrap=FerryHTTPBootstrap(discover=True))
        assert ensured(mgr, boot.address)
        r = KVReceiver(mgr=mgr, bootstrap_addr=boot.address, bootstrap_room=70)
        r.init(0)
        r.send_metadata([1], 0, [[0]], 0)
        assert world.requests("decode", Prepare)[-1].prefill_peers == ["127.0.0.1:7401",
                                                                       "127.0.0.1:7402"]
        mgr.close()
    finally:
        prefill.close()
        for p in pools:
            p.close()


def test_sglangs_dynamic_backend_loads_ferry_by_module_and_class_name() -> None:
    """SGLang's DisaggBackendFactory: the extra config names a module and a class; SGLang imports
    it, constructs it with no argument, and asks get_kv_class(KVClassType.X) for each class."""
    import enum
    import importlib
    import json

    class KVClassType(enum.Enum):  # SGLang's enum (utils.py)
        KVARGS = "kvargs"
        MANAGER = "manager"
        SENDER = "sender"
        RECEIVER = "receiver"
        BOOTSTRAP_SERVER = "bootstrap_server"

    extra = json.loads('{"backend_name": "ferry", "module_path": "ferry.sglang", '
                       '"class_name": "FerryBackendProvider"}')
    provider = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])()
    from ferry import sglang
    assert [provider.get_kv_class(t) for t in KVClassType] == \
        [sglang.KVArgs, sglang.KVManager, sglang.KVSender, sglang.KVReceiver,
         sglang.KVBootstrapServer]
    assert provider.get_kv_class("sender") is sglang.KVSender
    assert provider.get_kv_class("CHECKPOINT_LOADER") is None
    args = provider.get_kv_class(KVClassType.KVARGS)()  # SGLang: kv_args_class(), then fields
    args.kv_data_ptrs = [0x1000]
    assert args.kv_data_ptrs == [0x1000] and args.memory_regions == []


def test_try_ensure_parallel_info_never_waits_on_the_bootstrap_server(
        daemons: tuple[World, str]) -> None:
    """A bootstrap address that accepts and never answers, and an HTTP timeout of an hour: a
    call that waited on it would hang this test. Every call answers False at once (the lookup
    runs in a thread of its own), as a scheduler keeps the request waiting."""
    import socket
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    addr = f"127.0.0.1:{srv.getsockname()[1]}"
    kv, state, aux = layout()
    pools = [MemfdPool("kv", kv), MemfdPool("state", state), MemfdPool("aux", aux)]
    try:
        args = FerryKVArgs.from_memfd_pools(kv=pools[0], state=pools[1], aux=pools[2],
                                            page_size=16)
        mgr = KVManager(args, "decode", None, False,
                        bootstrap=FerryHTTPBootstrap(timeout=3600.0))
        assert [mgr.try_ensure_parallel_info(addr) for _ in range(50)] == [False] * 50
        assert mgr.prefill_info_table == {}
        mgr.close()
    finally:
        srv.close()
        for p in pools:
            p.close()
