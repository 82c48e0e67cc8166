"""A room end to end between real ferryd processes (FERRY_BIN_DIR) whose engine ranks are built
only as SGLang builds a backend: ``KVBootstrapServer(host=, port=)`` on 127.0.0.1, then
``KVManager(kv_args, mode, server_args, is_mla_backend)`` per side with nothing but FERRY_*
variables to find the ferryd; the prefill rank registers its ferryd's control address with
the bootstrap server, the decode learns it through GET /route, and the prefill's bytes land in
the decode engine's memfds."""

from __future__ import annotations

import os
import shutil
import tempfile
from types import SimpleNamespace
from typing import Iterator

import pytest

from conftest import IO_TIMEOUT, Daemon, start_pair
from ferry.sglang import FerryHTTPBootstrap, KVBootstrapServer, KVManager

from engine_ranks import CLIENT_POOLS, T, Engine, check_landed, ensured, run_room, stop_all


class SGLangEngine(Engine):
    """engine_ranks.Engine whose manager is constructed as SGLang constructs it."""

    def __init__(self, d: Daemon, mode: str, server_args: SimpleNamespace) -> None:
        self.server_args = server_args
        super().__init__(d, mode, None)  # type: ignore[arg-type]

    def connect(self) -> KVManager:
        return KVManager(self.args, self.mode, self.server_args, False)


@pytest.fixture(scope="module")
def tmp() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="ferry-sg-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def ranks(tmp: str) -> Iterator[tuple[KVBootstrapServer, Engine, Engine]]:
    p, d = start_pair(tmp, "prefill", "decode", CLIENT_POOLS)
    boot = KVBootstrapServer(host="127.0.0.1", port=0)
    mp = pytest.MonkeyPatch()
    for k in [k for k in os.environ if k.startswith("FERRY_") and k != "FERRY_BIN_DIR"]:
        mp.delenv(k)
    mp.setenv("FERRY_SOCKET", os.path.join(tmp, "{mode}.sock"))  # <tmp>/prefill.sock, ...
    mp.setenv("FERRY_TIMEOUT", str(IO_TIMEOUT * 3))
    mp.setenv("FERRY_REGISTER_TIMEOUT", str(T))
    sargs = SimpleNamespace(host="127.0.0.1", port=30000, disaggregation_bootstrap_port=boot.port,
                            dist_init_addr=None, dp_size=1, enable_dp_attention=False,
                            kv_cache_dtype="auto", load_balance_method="follow_bootstrap_room")
    engines: list[Engine] = []
    try:
        engines.append(SGLangEngine(p, "prefill", sargs))
        engines.append(SGLangEngine(d, "decode", sargs))
        yield boot, engines[0], engines[1]
    finally:
        for e in engines:
            e.close()
        mp.undo()
        boot.close()
        stop_all([p, d])


def test_a_room_lands_between_ranks_built_as_sglang_builds_them(
        ranks: tuple[KVBootstrapServer, Engine, Engine]) -> None:
    boot, p, d = ranks
    assert isinstance(d.mgr.bootstrap, FerryHTTPBootstrap)
    assert boot.ranks == {(0, 0, 0, 0): {"rank_ip": "127.0.0.1",
                                         "rank_port": int(p.daemon.control.split(":")[1])}}
    addr = boot.address
    assert ensured(d.mgr, addr)
    info = d.mgr.prefill_info_table[addr]
    assert (info.dp_size, info.follow_bootstrap_room, info.attn_tp_size, info.pp_size) == \
        (1, True, 1, 1)
    expect = run_room(p, d, 900, src=[10, 11, 12], dst=[20, 21, 22], prefix=0, src_slot=1,
                      dst_slot=2, src_row=3, dst_row=4, chunks=[2, 1], boot=addr)
    assert check_landed(d, expect) == []
    expect = run_room(p, d, 901, src=[30, 31, 32, 33], dst=[40, 41], prefix=2, src_slot=0,
                      dst_slot=3, src_row=5, dst_row=6, chunks=[2], boot=addr)
    assert check_landed(d, expect) == []
