#!/usr/bin/python3
"""A fake disaggregated engine pair that proves Ferry does what it is for.

    /usr/bin/python3 scripts/fake_engine.py --bin-dir build/src [--requests 200] [--seed N]

Standard library only. It starts its own ferryd daemons from configs/prefill.yaml and
configs/decode.yaml (Qwen3-Next-80B-A3B shapes), rewritten into a temporary directory with
``memory: client`` on every pool and its own sockets and ports, then runs two engine processes
through the SGLang-shaped adapter (``ferry.sglang``):

- a **decode engine**: waiting queue -> bootstrap queue (FerryKVReceiver, init, allocate pages /
  state slot / aux row, send_metadata with decode_prefix_len) -> transfer queue, with one
  poll_all (poll_many) of every room in flight per step; it verifies every destination byte of
  every successful request in its own memfd memory;
- a **prefill engine**: bootstrap queue (FerryKVSender, poll until WaitingForInput,
  pop_decode_prefix_len, init(num_pages, aux_index)) -> chunked prefill (one send per chunk,
  the last with the state slot and the aux row) -> transfer queue polled every step.

Both derive the requests (room ids, prompt lengths, chunk sizes, prefix hits, aborts on each
side) from the shared seed; decode_prefix_len reaches the prefill with the room (the decode's
prepare carries it, the prefill's poll answers it), and the prefill ranks' readiness through
FerryBootstrap over a multiprocessing.Manager dict. Each engine owns its memory (MemfdPool lent with register_memory)
and its own allocators, and frees a request's pages, slot and row on Success or Failed. The
bytes are a deterministic per-(room, pool, buffer, page) pattern; the aux row starts with the
room id. A second, smaller phase runs a TP 2 prefill instance (two prefill ferryds, ranks 0 and
1, discovery.instance_ranks listing both, one engine process driving both ranks in lockstep
with SGLang's MIN reduction of poll) into a TP 1 decode, which gathers head-sliced KV and
sliced state.

Exit 0 only when every check passed; the last line is the summary (``fake_engine: PASS ...``).

This script runs the phases and holds the command line; its parts sit next to it:
fake_engine_daemons.py (the configs and the ferryd processes), fake_engine_schedule.py (the
shared schedule and byte patterns), fake_engine_allocators.py (pages, slots, rows),
fake_engine_rank.py (a rank's memory and manager, the geometry, the log; it puts this tree's
clients/python on ``sys.path``), fake_engine_decode.py and fake_engine_prefill.py (the engines).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Optional

from fake_engine_daemons import Daemon, free_port, rewrite_config
from fake_engine_decode import DecodeEngine
from fake_engine_prefill import PrefillEngine
from fake_engine_rank import BOOT, REPO, GiB, Rank, log
from fake_engine_schedule import Pattern, make_schedule
from ferry.sglang import FerryBootstrap

# --------------------------------------------------------------------------------------------
# The engine processes


def engine_main(side: str, phase: str, socks: list[str], seed: int, n: int, max_tokens: int,
                abort_rate: float, deadline_s: float, ready_store: Any, peers: list[str],
                result_q: Any) -> None:
    who = f"{phase}/{side}"
    try:
        bootstrap = FerryBootstrap({BOOT: peers}, ready=ready_store)
        ranks = [Rank(s, side, bootstrap, f"{phase}-{side}{i}") for i, s in enumerate(socks)]
        try:
            page_tokens = ranks[0].page_tokens
            reqs = make_schedule(seed, n, max_tokens, page_tokens, abort_rate, phase)
            pat = Pattern(seed)
            deadline = time.monotonic() + deadline_s
            if side == "decode":
                res = DecodeEngine(ranks[0], reqs, pat, who, deadline).run()
            else:
                res = PrefillEngine(ranks, reqs, pat, who, deadline).run()
        finally:
            for r in ranks:
                r.close()
        result_q.put((side, res))
    except BaseException as e:
        result_q.put((side, {"errors": [f"{who}: {e!r}\n{traceback.format_exc()}"]}))


# --------------------------------------------------------------------------------------------
# Phases


def run_phase(phase: str, bin_dir: Path, work: str, seed: int, n: int, max_tokens: int,
              abort_rate: float, prefill_tp: int, deadline_s: float) -> tuple[dict, list[str]]:
    """Start the daemons of one phase, run both engines, check and stop the daemons."""
    errors: list[str] = []
    base_p = (REPO / "configs" / "prefill.yaml").read_text()
    base_d = (REPO / "configs" / "decode.yaml").read_text()
    daemons: list[Daemon] = []
    pre_ctrl = [f"127.0.0.1:{free_port()}" for _ in range(prefill_tp)]
    dec_ctrl = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    try:
        pre_socks = []
        for i in range(prefill_tp):
            name = f"{phase}-prefill-{i}"
            sock = os.path.join(work, f"{phase}-p{i}.sock")
            text = rewrite_config(base_p, name=name, control=pre_ctrl[i], sock=sock,
                                  tp=(prefill_tp, i),
                                  instance_ranks=pre_ctrl if prefill_tp > 1 else None)
            daemons.append(Daemon(bin_dir, work, name, text, pre_ctrl[i], sock, wait=False))
            pre_socks.append(sock)
        dsock = os.path.join(work, f"{phase}-d.sock")
        text = rewrite_config(base_d, name=f"{phase}-decode-0", control=dec_ctrl, sock=dsock)
        daemons.append(Daemon(bin_dir, work, f"{phase}-decode-0", text, dec_ctrl, dsock,
                              wait=False))
        for d in daemons:  # they start at once
            d.wait_ready()
        log(phase, f"{len(daemons)} ferryd daemons ready (prefill TP {prefill_tp}, decode TP 1, "
                   f"memory: client on kv, mamba and aux); {n} requests")
        ctx = mp.get_context("fork")
        with ctx.Manager() as manager:
            ready = manager.dict()  # prefill ranks whose memory is lent (register_to_bootstrap)
            q = ctx.Queue()
            procs = [
                ctx.Process(target=engine_main, name=f"{phase}-decode",
                            args=("decode", phase, [dsock], seed, n, max_tokens, abort_rate,
                                  deadline_s, ready, pre_ctrl, q)),
                ctx.Process(target=engine_main, name=f"{phase}-prefill",
                            args=("prefill", phase, pre_socks, seed, n, max_tokens,
                                  abort_rate, deadline_s, ready, pre_ctrl, q)),
            ]
            for p in procs:
                p.start()
            results: dict[str, dict] = {}
            end = time.monotonic() + deadline_s + 60
            while len(results) < 2 and time.monotonic() < end:
                try:
                    side, res = q.get(timeout=1.0)
                    results[side] = res
                except Exception:
                    if all(not p.is_alive() for p in procs) and q.empty():
                        break
            for p in procs:
                p.join(timeout=max(1.0, end - time.monotonic()))
                if p.is_alive():
                    p.kill()
                    p.join(timeout=10)
                    errors.append(f"{p.name} did not finish in time (killed)")
                elif p.exitcode != 0:
                    errors.append(f"{p.name} exited {p.exitcode}")
        for side in ("decode", "prefill"):
            if side not in results:
                errors.append(f"{phase}/{side} engine reported nothing")
            errors.extend(results.get(side, {}).get("errors", []))
        # after the engines: ferryd itself reports nothing active
        # and holds none of the pools' items for a room
        for d in daemons:
            st = d.ferryctl(bin_dir, "status")
            for side in ("prefill", "decode"):
                if st[side]["active"] != 0:
                    errors.append(f"{d.name}: ferryctl status says {st[side]['active']} "
                                  f"{side} rooms are active")
            for kind, pool in d.ferryctl(bin_dir, "pools").items():
                if pool["in_use"] != 0:
                    errors.append(f"{d.name}: ferryctl pools says {pool['in_use']} items of "
                                  f"pool {kind} are in use")
        results["ferryd"] = {"decode": daemons[-1].ferryctl(bin_dir, "status")["decode"]}
        ok = results.get("decode", {}).get("succeeded")
        if ok is not None and results["ferryd"]["decode"]["succeeded"] < ok:
            errors.append(f"{phase}: ferryd counted {results['ferryd']['decode']['succeeded']}"
                          f" successes, the decode engine verified {ok}")
    finally:
        stop_errors = [why for why in (d.stop() for d in daemons) if why]
        errors += stop_errors
        if daemons and not stop_errors:
            log(phase, f"all {len(daemons)} daemons stopped cleanly (exit 0, log ends "
                       f"'stopped')")
    results["elapsed"] = time.monotonic() - t0
    return results, errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin-dir", default=str(REPO / "build" / "src"),
                    help="directory holding ferryd and ferryctl (default build/src)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--abort-rate", type=float, default=0.04,
                    help="fraction of requests aborted on each side (default 0.04)")
    ap.add_argument("--tp2-requests", type=int, default=16,
                    help="requests of the TP2-prefill -> TP1-decode phase (0 skips it)")
    ap.add_argument("--tp2-max-tokens", type=int, default=1024)
    ap.add_argument("--timeout", type=float, default=240.0,
                    help="bound of the main phase's engines, seconds")
    ap.add_argument("--json", metavar="PATH",
                    help="also write the verdict, errors and every counter as JSON to PATH")
    a = ap.parse_args()
    bin_dir = Path(a.bin_dir).resolve()
    for b in ("ferryd", "ferryctl"):
        if not (bin_dir / b).is_file():
            print(f"fake_engine: no {b} in {bin_dir} (build first, or pass --bin-dir)",
                  file=sys.stderr)
            return 2
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"fake_engine: seed {seed}, {a.requests} requests (prompts 1..{a.max_tokens} tokens), "
          f"TP2 phase {a.tp2_requests} requests", flush=True)
    t0 = time.monotonic()
    work = tempfile.mkdtemp(prefix="ferry-fe-")
    errors: list[str] = []
    tp2: Optional[dict] = None
    try:
        main_res, errs = run_phase("main", bin_dir, work, seed, a.requests, a.max_tokens,
                                   a.abort_rate, 1, a.timeout)
        errors += errs
        if a.tp2_requests > 0:
            tp2, errs2 = run_phase("tp2", bin_dir, work, seed, a.tp2_requests, a.tp2_max_tokens,
                                   a.abort_rate, 2, 120.0)
            errors += errs2
            tp2["ok"] = not errs2
    finally:
        if errors:
            print(f"fake_engine: daemon logs and configs kept in {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    d, p = main_res.get("decode", {}), main_res.get("prefill", {})
    elapsed = time.monotonic() - t0
    for e in errors[:30]:
        print(f"fake_engine: ERROR: {e}", flush=True)
    if tp2 is None:
        tp2_text = "TP2 phase skipped"
    else:
        td = tp2.get("decode", {})
        tp2_text = (f"TP2 phase {'ok' if tp2['ok'] else 'FAILED'} "
                    f"({td.get('succeeded', 0)}/{a.tp2_requests} verified, "
                    f"{td.get('verified_bytes', 0) / GiB:.2f} GiB gathered from 2 prefill ranks)")
    if a.json:
        Path(a.json).write_text(json.dumps({"ok": not errors, "seed": seed, "errors": errors,
                                            "elapsed_s": elapsed, "main": main_res,
                                            "tp2": tp2}, indent=1, default=str) + "\n")
    verdict = "PASS" if not errors else f"FAIL ({len(errors)} errors)"
    print(f"fake_engine: {verdict}: {a.requests} requests, {d.get('succeeded', 0)} succeeded "
          f"and verified ({d.get('verified_bytes', 0) / GiB:.2f} GiB byte-exact), aborted: "
          f"{d.get('decode_aborts', 0)} by decode ({d.get('decode_aborts_transferring', 0)} "
          f"while Transferring; {p.get('decode_abort_raced', 0)} "
          f"lost the race with the commit), "
          f"{p.get('prefill_aborts', 0)} by prefill "
          f"(their memory reused byte-exact by {d.get('reused_after_abort', 0)} later requests, "
          f"the rest untouched since), "
          f"{d.get('prefix_hits', 0)} prefix hits ({p.get('zero_page_chunks', 0)} zero-page "
          f"chunks, {p.get('zero_page_last', 0)} of them last), {p.get('chunks_sent', 0)} chunks, 0 rooms active, allocators full; "
          f"{tp2_text}; {elapsed:.1f} s", flush=True)
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
