"""Engine ranks for the adapter's tests against real ferryd processes (test_client_memory.py,
test_sglang_abort.py): pools lent by the engine (``memory: client``), a rank's memfds, KVArgs
and manager, one room driven in SGLang's order, and checks of what landed."""

from __future__ import annotations

import os
import time

import pytest

from conftest import IO_TIMEOUT, MAMBA_POOLS, Daemon
from ferry import Client
from ferry.memory import MemfdPool
from ferry.sglang import (FerryBootstrap, FerryKVArgs, FerryKVManager, FerryKVReceiver,
                          FerryKVSender, KVPoll, poll_all)

T = 60.0  # a room's whole transfer on a loaded 2-core machine
BOOT = "prefill-instance:8998"


def client_memory(pools: str) -> str:
    """``pools`` with ``memory: client`` on every pool."""
    out = []
    for line in pools.splitlines():
        if line.startswith("  kv:") or line.startswith("  aux:"):
            line = line.rstrip()[:-1] + ", memory: client}"
        out.append(line)
        if line.startswith("  mamba:"):
            out.append("    memory: client")
    return "\n".join(out) + "\n"


CLIENT_POOLS = client_memory(MAMBA_POOLS)
def stop_all(daemons: list[Daemon]) -> None:
    codes = [(d.log, d.stop()) for d in daemons]
    bad = [f"{log}: exit {rc}\n{open(log).read()[-3000:]}" for log, rc in codes if rc != 0]
    assert not bad, "ferryd did not exit cleanly:\n" + "\n".join(bad)


class Engine:
    """An engine rank: memfd pools laid out as its ferryd says, KVArgs over them, a manager
    (which registers them)."""

    def __init__(self, d: Daemon, mode: str, bootstrap: FerryBootstrap,
                 per_buffer_kv: bool = False) -> None:
        with Client(d.sock, name="layout", timeout=IO_TIMEOUT) as c:
            pools = dict(c.pools)
        self.kv = MemfdPool("kv", pools["kv"], per_buffer=per_buffer_kv, name=f"{mode}-kv")
        self.state = MemfdPool("state", pools["state"], name=f"{mode}-state")
        self.aux = MemfdPool("aux", pools["aux"], name=f"{mode}-aux")
        self.args = FerryKVArgs.from_memfd_pools(kv=self.kv, state=self.state, aux=self.aux)
        self.mode, self.daemon, self.bootstrap = mode, d, bootstrap
        self.mgr = self.connect()

    def connect(self) -> FerryKVManager:
        return FerryKVManager(self.args, self.mode, socket_path=self.daemon.sock,
                              bootstrap=self.bootstrap, timeout=IO_TIMEOUT * 3,
                              register_timeout=T)

    def close(self) -> None:
        self.mgr.close()
        for p in (self.kv, self.state, self.aux):
            p.close()


def ensured(mgr: FerryKVManager, addr: str, timeout: float = T) -> bool:
    """``try_ensure_parallel_info`` until True (bounded): it answers False while a lookup that
    needs the network runs in its own thread, as a scheduler keeps the request waiting."""
    deadline = time.monotonic() + timeout
    while not mgr.try_ensure_parallel_info(addr):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def wait_all(objs: list, want: int = KVPoll.Success, timeout: float = T) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        got = poll_all(objs)
        if all(g in (want, KVPoll.Failed) for g in got) or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def run_room(p: Engine, d: Engine, room: int, src: list[int], dst: list[int], prefix: int,
             src_slot: int, dst_slot: int, src_row: int, dst_row: int,
             chunks: list[int], boot: str = BOOT) -> dict[tuple, bytes]:
    """One room through the adapter in SGLang's order (receiver and sender built with SGLang's
    keywords, for the bootstrap address ``boot``); the bytes the decode must receive, by
    (pool, buffer, destination index)."""
    expect: dict[tuple, bytes] = {}
    sent = src[prefix:]  # the prefill sends the pages after the decode's prefix only
    for b in range(len(p.kv.buffers)):
        for pos, page in enumerate(sent):
            data = os.urandom(p.kv.buffers[b].item_bytes)
            p.kv.item(b, page)[:] = data
            expect[("kv", b, dst[pos])] = data
    for b in range(len(p.state.buffers)):
        data = os.urandom(p.state.buffers[b].item_bytes)
        p.state.item(b, src_slot)[:] = data
        expect[("state", b, dst_slot)] = data
    row = room.to_bytes(8, "little") + os.urandom(p.aux.buffers[0].item_bytes - 8)
    p.aux.item(0, src_row)[:] = row
    expect[("aux", 0, dst_row)] = row

    r = FerryKVReceiver(mgr=d.mgr, bootstrap_addr=boot, bootstrap_room=room)
    s = FerryKVSender(mgr=p.mgr, bootstrap_addr=boot, bootstrap_room=room, dest_tp_ranks=[0],
                      pp_rank=0)
    assert r.poll() == KVPoll.Bootstrapping and s.poll() == KVPoll.Bootstrapping
    r.init(0)
    r.send_metadata(dst, aux_index=dst_row, state_indices=[[dst_slot]], decode_prefix_len=prefix)
    assert r.poll() != KVPoll.Failed, r.failure_exception()
    deadline = time.monotonic() + T
    while s.poll() == KVPoll.Bootstrapping and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.poll() == KVPoll.WaitingForInput, s.failure_exception()
    start = s.pop_decode_prefix_len()
    assert start == prefix
    s.init(len(src) - start, src_row)
    at = start
    for i, n in enumerate(chunks):
        last = i == len(chunks) - 1
        s.send(src[at:at + n], [[src_slot]] if last else None)
        at += n
    assert at == len(src)
    got = wait_all([r, s])
    if got != [KVPoll.Success, KVPoll.Success]:
        for x in (r, s):
            if x.poll() == KVPoll.Failed:
                x.failure_exception()
        pytest.fail(f"room {room}: {got}")
    return expect


def check_landed(d: Engine, expect: dict[tuple, bytes]) -> list[str]:
    pools = {"kv": d.kv, "state": d.state, "aux": d.aux}
    return [f"{pool} buffer {b} index {i}" for (pool, b, i), data in expect.items()
            if bytes(pools[pool].item(b, i)) != data]
