#!/usr/bin/python3
"""What the SGLang-shaped adapter and the Python client cost per request, against ferry-bench
(C++ client) moving the same rooms through the same daemons in the same run.

    /usr/bin/python3 tests/fake_engine/adapter_bench.py --bin-dir build/src [--tokens 64,4096] [--json F]

It starts one prefill and one decode ferryd from configs/prefill.yaml and configs/decode.yaml
(Qwen3-Next-80B-A3B shapes, ``memory: client`` on every pool, tcp unless ``--provider``) and,
for each prompt length, alternates ``--repeat`` times:

- **adapter**: one Python process holds a prefill and a decode FerryKVManager, each lending
  its own memfd memory, and moves ``--requests`` rooms in waves of ``--concurrency``, as
  ferry-bench does: per wave every room's FerryKVReceiver.init + send_metadata (the prepare),
  then per room FerryKVSender.init + one send of all its pages with the state slot and aux row,
  then poll_all of every sender and receiver (one poll_many per daemon per step) until every
  room is terminal, a step every ``--step-ms`` (default 1 ms: an engine polls once per
  scheduler step, and a loop that polls without pause takes a core from the daemons on this
  two-core machine; 0 measures that too). With ``--wait events`` the decode engine instead
  subscribes each room and sleeps until ferryd pushes its terminal event (the Python client's
  dispatcher), then polls once: the same wake-up as ferry-bench's, so the difference is what
  the adapter and the Python client cost, not the poll cadence. A room's time runs from its send to the first poll_all that
  sees Success on the decode; a wave's from its first send to its last Success.
- **ferry-bench** with the same prompt length, requests, concurrency and contiguous page
  lists (it lends its own memory too), without its raw baseline; its commit latency runs from
  a room's first send to its Success event on the decode.

Both report the per-room time (p50, p99) and rooms per second of transfer time; the ratio of
the medians over the repeats is the adapter's cost. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_engine_daemons import Daemon, free_port  # noqa: E402
from fake_engine_rank import IO_TIMEOUT, REPO  # noqa: E402
from ferry import Client  # noqa: E402
from ferry.memory import MemfdPool  # noqa: E402
from ferry.sglang import (FerryBootstrap, FerryKVArgs, FerryKVManager,  # noqa: E402
                          FerryKVReceiver, FerryKVSender, KVPoll, poll_all)

BOOT = "fake-prefill:8998"

TERMINAL = (KVPoll.Success, KVPoll.Failed)


def bench_config(text: str, *, name: str, control: str, sock: str,
                 pages: Optional[int] = None, slots: Optional[int] = None) -> str:
    """configs/*.yaml with this run's name and addresses, ``memory: client`` on every pool
    (the pools keep the config's layout, which the bench lends memfds for: MemfdPool), and the
    given numbers of KV pages and state slots."""
    out = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("name:") and line.startswith("  name:"):
            line = f"  name: {name}"
        elif s.startswith("control:"):
            line = f"  control: {control}"
        elif s.startswith("client:"):
            line = f"  client: {sock}"
        elif s.startswith("pages:") and pages is not None:
            line = f"    pages: {pages}"
        elif s.startswith("slots:") and slots is not None:
            line = f"    slots: {slots}"
        out.append(line)
        if line in ("  kv:", "  mamba:", "  aux:"):
            out.append("    memory: client")
    return "\n".join(out) + "\n"


class Rank:
    """One engine rank's memory (MemfdPools as its ferryd lays them out) and manager."""

    def __init__(self, sock: str, mode: str, bootstrap: FerryBootstrap, tag: str) -> None:
        with Client(sock, name=f"{tag}-layout", timeout=IO_TIMEOUT) as c:
            pools = dict(c.pools)
        self.kv = MemfdPool("kv", pools["kv"], name=f"{tag}-kv")
        self.state = MemfdPool("state", pools["state"], name=f"{tag}-state")
        self.aux = MemfdPool("aux", pools["aux"], name=f"{tag}-aux")
        args = FerryKVArgs.from_memfd_pools(kv=self.kv, state=self.state, aux=self.aux)
        self.mgr = FerryKVManager(args, mode, socket_path=sock, bootstrap=bootstrap,
                                  name=tag, timeout=IO_TIMEOUT, drain_timeout=10.0)
        assert self.mgr.registered == ["kv", "state", "aux"], self.mgr.registered
        self.page_tokens = self.mgr.page_size

    def active_rooms(self, side: str) -> int:
        return int(self.mgr.client.info("status")[side]["active"])

    def close(self) -> None:
        self.mgr.close()
        for p in (self.kv, self.state, self.aux):
            p.close()


def pct(v: list[float], p: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(p * (len(s) - 1) + 0.5))] if s else 0.0


def fill_sources(pre: Rank, pages: int, region: int, concurrency: int) -> None:
    """Write the source pages, slots and rows before the timed window, as a prefill's forward
    pass has (and as ferry-bench fills its own): a fresh memfd page is otherwise allocated
    while ferryd reads it."""
    for b, buf in enumerate(pre.kv.buffers):
        n = min(region * concurrency, buf.items) * buf.item_bytes
        pre.kv.view(b)[:n] = bytes([0x5A]) * n
    for b in range(len(pre.state.buffers)):
        for c in range(concurrency):
            it = pre.state.item(b, c)
            it[:] = bytes([0xA5]) * len(it)


def adapter_run(pre_sock: str, dec_sock: str, pre_ctrl: str, tokens: int, requests: int,
                concurrency: int, room_base: int, step_s: float, events: bool
                ) -> dict[str, Any]:
    boot = FerryBootstrap({BOOT: [pre_ctrl]})
    dec = Rank(dec_sock, "decode", boot, "bench-decode")
    pre = Rank(pre_sock, "prefill", boot, "bench-prefill")
    try:
        pages = -(-tokens // pre.page_tokens)
        region = pages + 1
        fill_sources(pre, pages, region, concurrency)
        lat_ms: list[float] = []
        transfer_s = 0.0
        failed: list[str] = []
        room = room_base
        for w in range(-(-requests // concurrency)):
            n = min(concurrency, requests - w * concurrency)
            rooms = list(range(room, room + n))
            room += n
            rcv, snd = [], []
            for c, r in enumerate(rooms):
                pre.aux.item(0, c)[:8] = r.to_bytes(8, "little")  # ferryd checks the room id
                rv = FerryKVReceiver(dec.mgr, BOOT, r)
                rv.init(0)
                dst = list(range((concurrency - 1 - c) * region,
                                 (concurrency - 1 - c) * region + pages))
                rv.send_metadata(dst, aux_index=c, state_indices=[[c]])
                if events:
                    dec.mgr.client.subscribe(r)
                rcv.append(rv)
                snd.append(FerryKVSender(pre.mgr, BOOT, r))
            started = [0.0] * n
            finished = [0.0] * n
            t0 = time.perf_counter()
            for c, s in enumerate(snd):
                started[c] = time.perf_counter()
                s.init(pages, c)
                s.send(list(range(c * region, c * region + pages)), [[c]])
            left = set(range(n))
            bound = time.monotonic() + 120
            while left and time.monotonic() < bound:
                if events:
                    for c in sorted(left):  # ferryd pushed it: the engine wakes, then polls
                        if not finished[c]:
                            dec.mgr.client.wait_terminal(rooms[c], timeout=120)
                            finished[c] = time.perf_counter()
                elif step_s:
                    time.sleep(step_s)
                st = poll_all(rcv + snd)
                now = time.perf_counter()
                for c in list(left):
                    if st[c] in TERMINAL and st[n + c] in TERMINAL:
                        finished[c] = now if not finished[c] else finished[c]
                        left.discard(c)
                    elif st[c] == KVPoll.Success and not finished[c]:
                        finished[c] = now
            if left:
                raise RuntimeError(f"rooms {[rooms[c] for c in left]} did not end in 120 s")
            transfer_s += max(finished) - t0
            for c in range(n):
                if rcv[c].poll() == KVPoll.Success and snd[c].poll() == KVPoll.Success:
                    lat_ms.append((finished[c] - started[c]) * 1e3)
                else:
                    failed.append(f"room {rooms[c]}: {rcv[c].failure or snd[c].failure}")
        ok = requests - len(failed)
        return {"committed": ok, "failed": failed, "transfer_s": transfer_s,
                "rooms_per_s": ok / transfer_s if transfer_s else 0.0,
                "p50_ms": pct(lat_ms, 0.5), "p99_ms": pct(lat_ms, 0.99)}
    finally:
        pre.close()
        dec.close()


def aborts_run(pre_sock: str, dec_sock: str, pre_ctrl: str, n: int, room_base: int
               ) -> dict[str, Any]:
    """What SGLang's abort orders cost the engine's scheduler loop, ``n`` rooms each, against
    one ``poll`` round trip to ferryd in the same run (the floor of any adapter call):

    - early: the prefill aborts before the decode's prepare arrived; SGLang's abort(), the next
      step's poll() (Failed) and failure_exception(); then the decode prepares it: from
      send_metadata to the decode's poll() saying Failed (ferryd refuses it at once);
    - live, per side: a room prepared and fed one chunk; abort() alone, then from abort() to
      the first poll() saying Failed (ferryd's drain, polled back to back);
    - other rank: failure_exception() of a live room no poll said Failed for (SGLang, when
      another rank failed): it cancels and waits for the drain."""
    boot = FerryBootstrap({BOOT: [pre_ctrl]})
    dec = Rank(dec_sock, "decode", boot, "bench-decode")
    pre = Rank(pre_sock, "prefill", boot, "bench-prefill")
    t: dict[str, list[float]] = {k: [] for k in (
        "poll_rtt", "early_abort_poll_failure_exception", "early_decode_learns",
        "live_prefill_abort", "live_prefill_abort_to_failed", "live_decode_abort",
        "live_decode_abort_to_failed", "other_rank_failure_exception")}

    def ms(f: Any) -> float:
        t0 = time.perf_counter()
        f()
        return (time.perf_counter() - t0) * 1e3

    def until_failed(obj: Any) -> None:
        bound = time.monotonic() + 30
        while obj.poll() != KVPoll.Failed:
            if time.monotonic() > bound:
                raise RuntimeError(f"room {obj.bootstrap_room} not Failed in 30 s")

    def fe(obj: Any) -> None:
        try:
            obj.failure_exception()
        except Exception:
            pass

    def live(room: int) -> tuple[FerryKVSender, FerryKVReceiver]:
        pre.aux.item(0, 0)[:8] = room.to_bytes(8, "little")
        r = FerryKVReceiver(dec.mgr, BOOT, room)
        r.init(0)
        r.send_metadata(list(range(64, 80)), aux_index=0, state_indices=[[0]])
        s = FerryKVSender(pre.mgr, BOOT, room)
        bound = time.monotonic() + 30
        while s.poll() != KVPoll.WaitingForInput:
            if time.monotonic() > bound:
                raise RuntimeError(f"room {room}: no prepare in 30 s")
        s.init(16, 0)
        s.send(list(range(16, 24)), None)
        r.poll()
        return s, r

    try:
        room = room_base
        for _ in range(n):
            t["poll_rtt"].append(ms(lambda: pre.mgr.client.poll(room_base)))
            room += 1
            s = FerryKVSender(pre.mgr, BOOT, room)
            s.poll()
            t["early_abort_poll_failure_exception"].append(
                ms(lambda: (s.abort(), s.poll(), fe(s))))
            r = FerryKVReceiver(dec.mgr, BOOT, room)
            r.init(0)
            t["early_decode_learns"].append(ms(lambda: (
                r.send_metadata([1, 2], aux_index=1, state_indices=[[1]]), until_failed(r))))
            for side in ("prefill", "decode"):
                room += 1
                s, r = live(room)
                obj, peer = (s, r) if side == "prefill" else (r, s)
                t0 = time.perf_counter()
                t[f"live_{side}_abort"].append(ms(obj.abort))
                until_failed(obj)
                t[f"live_{side}_abort_to_failed"].append((time.perf_counter() - t0) * 1e3)
                until_failed(peer)
                fe(s), fe(r)
            room += 1
            s, r = live(room)
            t["other_rank_failure_exception"].append(ms(lambda: fe(s)))
            until_failed(r)
        rtt = statistics.median(t["poll_rtt"])
        return {k: {"p50_ms": pct(v, 0.5), "p99_ms": pct(v, 0.99),
                    "p50_over_poll": pct(v, 0.5) / rtt if rtt else 0.0} for k, v in t.items()}
    finally:
        pre.close()
        dec.close()


def bench_run(bin_dir: Path, pre_sock: str, dec_sock: str, tokens: int, requests: int,
              concurrency: int, room_base: int, work: str) -> dict[str, Any]:
    out = os.path.join(work, "bench.json")
    cmd = [str(bin_dir / "ferry-bench"), "--prefill-socket", pre_sock, "--decode-socket",
           dec_sock, "--prompt-tokens", str(tokens), "--requests", str(requests),
           "--concurrency", str(concurrency), "--no-baseline", "--room-base", str(room_base),
           "--json", out]
    # ferryd releases a closed connection's memory asynchronously: ferry-bench's lend may
    # meet the adapter's registration still being released, and is asked again (bounded)
    for _ in range(50):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if p.returncode == 0:
            break
        if "still being released" not in p.stderr:
            raise RuntimeError(f"ferry-bench failed ({p.returncode}): {p.stderr[-2000:]}")
        time.sleep(0.1)
    else:
        raise RuntimeError("ferry-bench could not lend its memory within 5 s")
    r = json.loads(Path(out).read_text())
    return {"committed": r["ferry"]["committed"], "failed": r["ferry"]["failed"],
            "transfer_s": r["runs"][0]["transfer_s"],
            "rooms_per_s": r["ferry"]["rooms_per_s_median"],
            "p50_ms": r["commit_latency_ms"]["p50"], "p99_ms": r["commit_latency_ms"]["p99"],
            "bytes_per_room": r["per_request"]["bytes"], "writes_per_room":
                r["per_request"]["writes"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin-dir", default=str(REPO / "build" / "src"),
                    help="directory holding ferryd and ferry-bench (default build/src)")
    ap.add_argument("--tokens", default="64,4096", help="prompt lengths (default 64,4096)")
    ap.add_argument("--requests", default="400,32",
                    help="requests per run, one per prompt length (default 400,32)")
    ap.add_argument("--concurrency", type=int, default=4, help="rooms per wave (default 4)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each (default 3)")
    ap.add_argument("--provider", default="tcp", choices=["tcp", "shm"])
    ap.add_argument("--wait", choices=["poll", "events"], default="poll",
                    help="how the adapter's engine learns of Success (default poll)")
    ap.add_argument("--step-ms", type=float, default=1.0,
                    help="pause between two poll_all steps of the adapter (default 1)")
    ap.add_argument("--pages", type=int,
                    help="KV pages of each daemon's pool (default: the configs', 20480)")
    ap.add_argument("--slots", type=int,
                    help="Mamba state slots of each daemon's pool, at least --concurrency "
                         "(default: the configs', 8)")
    ap.add_argument("--aborts", type=int, metavar="N",
                    help="instead: time SGLang's abort orders through the adapter, N rooms "
                         "of each, against one poll round trip")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    a = ap.parse_args()
    bin_dir = Path(a.bin_dir).resolve()
    for b in ("ferryd", "ferry-bench"):
        if not (bin_dir / b).is_file():
            print(f"adapter_bench: no {b} in {bin_dir} (build first, or pass --bin-dir)",
                  file=sys.stderr)
            return 2
    sizes = [int(t) for t in a.tokens.split(",")]
    counts = [int(n) for n in a.requests.split(",")]
    if len(counts) != len(sizes):
        print("adapter_bench: --requests needs one count per --tokens entry", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="ferry-ab-")
    daemons: list[Daemon] = []
    results: list[dict[str, Any]] = []
    try:
        pre_ctrl, dec_ctrl = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        pre_sock, dec_sock = os.path.join(work, "p.sock"), os.path.join(work, "d.sock")
        for name, base, ctrl, sock in (("bench-prefill", "prefill.yaml", pre_ctrl, pre_sock),
                                       ("bench-decode", "decode.yaml", dec_ctrl, dec_sock)):
            text = bench_config((REPO / "configs" / base).read_text(), name=name,
                                  control=ctrl, sock=sock, pages=a.pages, slots=a.slots)
            text = text.replace("  provider: tcp", f"  provider: {a.provider}")
            daemons.append(Daemon(bin_dir, work, name, text, ctrl, sock, wait=False))
        for d in daemons:  # they start at once
            d.wait_ready()
        room = int(time.time() * 1000) << 16
        if a.aborts:
            res = aborts_run(pre_sock, dec_sock, pre_ctrl, a.aborts, room)
            print(f"adapter_bench --aborts {a.aborts} ({a.provider}): p50 / p99 ms, and the p50 "
                  f"over one poll round trip")
            for k, v in res.items():
                print(f"  {k:38s} {v['p50_ms']:8.3f} {v['p99_ms']:8.3f} "
                      f"{v['p50_over_poll']:7.1f}x", flush=True)
            results.append({"aborts": a.aborts, "times": res})
            counts = []
        for tokens, n in zip(sizes, counts):
            runs: dict[str, list[dict[str, Any]]] = {"adapter": [], "ferry-bench": []}
            for rep in range(a.repeat):
                ad = adapter_run(pre_sock, dec_sock, pre_ctrl, tokens, n, a.concurrency, room,
                                 a.step_ms / 1e3, a.wait == "events")
                room += n
                fb = bench_run(bin_dir, pre_sock, dec_sock, tokens, n, a.concurrency, room, work)
                room += n
                for name, r in (("adapter", ad), ("ferry-bench", fb)):
                    if r["failed"]:
                        raise RuntimeError(f"{name} at {tokens} tokens: {r['failed']}")
                    runs[name].append(r)
                print(f"  {tokens} tokens, run {rep + 1}/{a.repeat}: adapter p50 "
                      f"{ad['p50_ms']:.2f} ms {ad['rooms_per_s']:.0f} rooms/s; ferry-bench p50 "
                      f"{fb['p50_ms']:.2f} ms {fb['rooms_per_s']:.0f} rooms/s",
                      file=sys.stderr, flush=True)
            med = {k: {m: statistics.median(r[m] for r in v)
                       for m in ("p50_ms", "p99_ms", "rooms_per_s")}
                   for k, v in runs.items()}
            row = {"tokens": tokens, "requests": n, "concurrency": a.concurrency,
                   "bytes_per_room": runs["ferry-bench"][0]["bytes_per_room"],
                   "writes_per_room": runs["ferry-bench"][0]["writes_per_room"],
                   "adapter": med["adapter"], "ferry_bench": med["ferry-bench"],
                   "p50_ratio": med["adapter"]["p50_ms"] / med["ferry-bench"]["p50_ms"],
                   "rate_ratio": med["adapter"]["rooms_per_s"] /
                                 med["ferry-bench"]["rooms_per_s"],
                   "runs": runs}
            results.append(row)
            how = "events" if a.wait == "events" else f"poll every {a.step_ms:g} ms"
            print(f"adapter_bench: {tokens} tokens ({row['bytes_per_room'] / 2**20:.2f} MiB in "
                  f"{row['writes_per_room']} writes per room), {n} requests x {a.repeat}, "
                  f"concurrency {a.concurrency}, {a.provider}, {how}: per-room p50 adapter "
                  f"{med['adapter']['p50_ms']:.2f} ms vs ferry-bench "
                  f"{med['ferry-bench']['p50_ms']:.2f} ms ({row['p50_ratio']:.3f}x); rooms/s "
                  f"{med['adapter']['rooms_per_s']:.0f} vs {med['ferry-bench']['rooms_per_s']:.0f}"
                  f" ({row['rate_ratio']:.3f}x)", flush=True)
    finally:
        for d in daemons:
            why = d.stop()
            if why:
                print(f"adapter_bench: {why}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"provider": a.provider, "wait": a.wait,
                                            "step_ms": a.step_ms,
                                            "sizes": results},
                                           indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
