#!/usr/bin/python3
"""A fake SGLang engine pair that proves Ferry does what it is for.

    /usr/bin/python3 tests/fake_engine/fake_engine.py --bin-dir build/src [--requests 300] [--seed N]
        [--swa-requests 48] [--aux-memory memfd|ordinary] [--provider tcp|shm] [--ci]
        [--json PATH]

Standard library only. Each phase starts its own ferryd daemons from configs/prefill.yaml and
configs/decode.yaml, rewritten into a temporary directory with their own names, sockets and
ports and their pools section replaced by pools the registration describes (``memory: client``
and nothing else), then runs two engine processes that hold their memory the way SGLang does
(fake_engine_memory.py, Qwen3-Next-80B-A3B: one memfd per rank with per-layer KV tensors at
allocator offsets, an EAGLE draft layer after the target's, the Mamba component as ``[layers,
size + 1, ...]`` tensors, MetadataBuffers of ten tensors in ordinary memory or in the memfd,
``--aux-memory``; fake_engine_swa.py, the SWA phase's gpt-oss-shaped model: the full-attention
layers as KV and the sliding-window layers' pool, SGLang's ``SWAKVPool``, as the ``swa`` state
component) and build every adapter class
with SGLang's signatures: the prefill process starts a ``KVBootstrapServer(host=, port=)``,
each rank makes ``KVManager(kv_args, mode, server_args, is_mla_backend)`` with FERRY_SOCKET
naming its ferryd, and the decode finds the prefill ranks through the server's HTTP routes.

- the **decode engine** (fake_engine_decode.py) drives SGLang's decode scheduler: waiting
  queue (``try_ensure_parallel_info``, ``KVReceiver(mgr=, bootstrap_addr=, bootstrap_room=)``,
  ``init(prefill_dp_rank)``), prealloc (pages, the Mamba slot or the SWA window's pages, row,
  ``send_metadata(kv_indices, aux_index, [[slot]] or [window_pages], decode_prefix_len)``),
  transfer queue (MIN-reduced polls, the metadata gate, ``failure_exception`` on Failed,
  ``clear`` on Success), and verifies every destination byte of every successful request:
  every KV buffer's pages (the draft layer's too), every state entry's slot or every SWA
  buffer's window pages, every metadata row;
- the **prefill engine** (fake_engine_prefill.py) drives SGLang's prefill scheduler:
  ``KVSender(mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks, pp_rank)``, MIN-reduced
  polls, ``pop_decode_prefix_len``, ``init``, page-rounded non-last chunks (skipped when
  empty), the last with the metadata rows and ``[[slot]]`` (or ``[window_pages]``), ``clear``
  / ``failure_exception``.

Both derive the requests (rooms, prompt lengths, chunk sizes, prefix hits, aborts at five
points on each side: fake_engine_schedule.py) and the bytes from the shared seed. Phases: the
main one (TP 1 -> TP 1, 300 requests by default), TP 2 -> TP 1 (one engine process drives two
prefill ranks in lockstep), TP 1 -> TP 2 (two decode ranks in lockstep), all Qwen3-Next, and
the SWA phase (``--swa-requests``, 48 by default, TP 1 -> TP 1: SGLang refuses SWA state under
a TP mismatch, and so does ferryd, tested in tests/python/test_sglang_paged_e2e.py): a
gpt-oss-shaped model whose window pages (the pages of the prompt's last 128 tokens, start
floored to a page) come from each side's SWA page allocator, not the KV pages' numbers. After
each phase every room and every allocator is empty and ferryd says so. The report gives every
adapter call's latency by kind (p50, p99, max) over all phases, and the SWA phase's alone; the
run FAILS when the p99 of all calls exceeds 5 ms (``--p99-limit-ms``). ``--ci`` is the short
form CI runs (tests/python/test_fake_engine.py): 40 requests, 8 per TP phase and in the SWA
phase, the latency reported but not checked.

Exit 0 only when every check passed; the last line is the summary (``fake_engine: PASS ...``).

Its parts: fake_engine_daemons.py (configs, ferryd processes), fake_engine_schedule.py (the
shared schedule and byte patterns), fake_engine_allocators.py (pages, slots, rows),
fake_engine_memory.py (a rank's tensors and KVArgs), fake_engine_swa.py (the SWA phase's
memory and its engines' state handling), fake_engine_rank.py (a rank's manager,
the geometry, the call timer, the log; it puts this tree's clients/python on ``sys.path``),
fake_engine_decode.py and fake_engine_prefill.py (the engines), fake_engine_report.py (the
latency report).
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
from typing import Any

from fake_engine_daemons import Daemon, free_port, rewrite_config
from fake_engine_decode import DecodeEngine
from fake_engine_memory import Model, RankMemory
from fake_engine_prefill import PrefillEngine
from fake_engine_rank import REPO, GiB, Rank, ferry_env, log, server_args
from fake_engine_report import P99_LIMIT_S, latency_lines, summarize
from fake_engine_schedule import Pattern, make_schedule
from fake_engine_swa import (SwaDecodeEngine, SwaModel, SwaPrefillEngine, SwaRankMemory,
                             with_short_prompts)
from ferry.sglang import KVBootstrapServer

# --------------------------------------------------------------------------------------------
# The engine processes


def engine_main(side: str, phase: str, tp: int, o: dict, boot_up: Any, result_q: Any) -> None:
    """One engine process: its ranks' memory and managers, built as SGLang builds them, and
    its scheduler."""
    who = f"{phase}/{side}"
    server = None
    ranks: list[Rank] = []
    mems: list[RankMemory] = []
    try:
        ferry_env(o["socket_template"])
        sargs = server_args(o["boot_port"])
        boot = f"127.0.0.1:{o['boot_port']}"
        if side == "prefill":  # SGLang's prefill starts the bootstrap server
            server = KVBootstrapServer(host="127.0.0.1", port=o["boot_port"])
            boot_up.set()
        elif not boot_up.wait(60):
            raise RuntimeError("the prefill's bootstrap server did not start in 60 s")
        swa = o.get("model") == "swa"  # gpt-oss-shaped, an swa component; else Qwen3-Next
        model: Any = SwaModel(page=o["page"]) if swa else Model(page=o["page"])
        memory = SwaRankMemory if swa else RankMemory
        deadline = time.monotonic() + o["deadline_s"]
        for i in range(tp):
            mems.append(memory(model, tp, i, o["aux_memory"], f"{phase}-{side}{i}"))
            ranks.append(Rank(mems[-1], side, sargs))
        reqs = make_schedule(o["seed"], o["n"], o["max_tokens"], model.page, o["abort_rate"],
                             phase)
        if swa:
            reqs = with_short_prompts(reqs, o["seed"], model)
        pat = Pattern(o["seed"])
        if side == "decode":
            eng = SwaDecodeEngine if swa else DecodeEngine
        else:
            eng = SwaPrefillEngine if swa else PrefillEngine
        res = eng(ranks, reqs, pat, who, deadline, boot).run()
        result_q.put((side, res))
    except BaseException as e:
        result_q.put((side, {"errors": [f"{who}: {e!r}\n{traceback.format_exc()}"]}))
    finally:
        for r in ranks:
            r.close()
        for m in mems[len(ranks):]:
            m.close()
        if server is not None:
            server.close()


# --------------------------------------------------------------------------------------------
# Phases


def run_phase(phase: str, bin_dir: Path, work: str, o: dict, prefill_tp: int,
              decode_tp: int) -> tuple[dict, list[str]]:
    """Start the daemons of one phase, run both engines, check and stop the daemons."""
    errors: list[str] = []
    daemons: list[Daemon] = []
    o = dict(o, boot_port=free_port(),
             socket_template=os.path.join(work, phase + "-{mode}-{tp_rank}.sock"))
    results: dict[str, Any] = {}
    t0 = time.monotonic()
    try:
        for side, tp in (("prefill", prefill_tp), ("decode", decode_tp)):
            base = (REPO / "configs" / f"{side}.yaml").read_text()
            ctrl = [f"127.0.0.1:{free_port()}" for _ in range(tp)]
            for i in range(tp):
                name = f"{phase}-{side}-{i}"
                sock = o["socket_template"].format(mode=side, tp_rank=i)
                text = rewrite_config(base, name=name, control=ctrl[i], sock=sock, tp=(tp, i),
                                      instance_ranks=ctrl if tp > 1 and side == "prefill"
                                      else None, provider=o["provider"])
                daemons.append(Daemon(bin_dir, work, name, text, ctrl[i], sock, wait=False))
        for d in daemons:  # they start at once
            d.wait_ready()
        log(phase, f"{len(daemons)} ferryd daemons ready (prefill TP {prefill_tp}, decode TP "
                   f"{decode_tp}, {o.get('model', 'qwen3-next')} model, pools left to the "
                   f"registration); {o['n']} requests")
        ctx = mp.get_context("fork")
        boot_up = ctx.Event()
        q = ctx.Queue()
        procs = [ctx.Process(target=engine_main, name=f"{phase}-{side}",
                             args=(side, phase, tp, o, boot_up, q))
                 for side, tp in (("prefill", prefill_tp), ("decode", decode_tp))]
        for pr in procs:
            pr.start()
        end = time.monotonic() + o["deadline_s"] + 90
        while len(results) < 2 and time.monotonic() < end:
            try:
                side, res = q.get(timeout=1.0)
                results[side] = res
            except Exception:
                if all(not pr.is_alive() for pr in procs) and q.empty():
                    break
        for pr in procs:
            pr.join(timeout=max(1.0, end - time.monotonic()))
            if pr.is_alive():
                pr.kill()
                pr.join(timeout=10)
                errors.append(f"{pr.name} did not finish in time (killed)")
            elif pr.exitcode != 0:
                errors.append(f"{pr.name} exited {pr.exitcode}")
        for side in ("decode", "prefill"):
            if side not in results:
                errors.append(f"{phase}/{side} engine reported nothing")
            errors.extend(results.get(side, {}).get("errors", []))
        # after the engines: ferryd itself reports nothing active and no pool item in use
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
        decode0 = daemons[prefill_tp]
        results["ferryd"] = {"decode": decode0.ferryctl(bin_dir, "status")["decode"]}
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
    results["ok"] = not errors
    return results, errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin-dir", default=str(REPO / "build" / "src"),
                    help="directory holding ferryd and ferryctl (default build/src)")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--page-size", type=int, default=16, help="tokens per KV page")
    ap.add_argument("--abort-rate", type=float, default=0.05,
                    help="fraction of requests aborted on each side, spread over the five "
                         "points (default 0.05; every point at least once)")
    ap.add_argument("--aux-memory", choices=("memfd", "ordinary"), default="ordinary",
                    help="where the MetadataBuffers live: in ordinary memory (anonymous mmaps, "
                         "as SGLang's CPU tensors; the adapter copies their rows through a "
                         "memfd of its own; the default) or in the rank's memfd (lent)")
    ap.add_argument("--tp2-requests", type=int, default=24,
                    help="requests of the TP 2 -> TP 1 phase (0 skips it)")
    ap.add_argument("--tp12-requests", type=int, default=24,
                    help="requests of the TP 1 -> TP 2 phase (0 skips it)")
    ap.add_argument("--swa-requests", type=int, default=48,
                    help="requests of the SWA phase (a gpt-oss-shaped model with an swa state "
                         "component, TP 1 -> TP 1; 0 skips it)")
    ap.add_argument("--tp-max-tokens", type=int, default=1024,
                    help="prompt tokens at most in the TP and SWA phases")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="bound of the main phase's engines, seconds")
    ap.add_argument("--provider", default="tcp",
                    help="the daemons' fabric provider (default tcp, as configs/; shm moves "
                         "the bytes with one copy on one host)")
    ap.add_argument("--p99-limit-ms", type=float, default=P99_LIMIT_S * 1e3,
                    help="fail when the p99 of all adapter calls exceeds this (default 5; 0: "
                         "report only)")
    ap.add_argument("--ci", action="store_true",
                    help="the short form for CI: 40 requests of at most 2048 tokens, 8 in each "
                         "TP phase and in the SWA phase, the latency reported but not checked "
                         "(a shared CI machine and sanitized daemons say nothing about it)")
    ap.add_argument("--json", metavar="PATH",
                    help="also write the verdict, errors and every counter as JSON to PATH")
    a = ap.parse_args()
    if a.ci:
        a.requests, a.max_tokens, a.tp2_requests, a.tp12_requests = 40, 2048, 8, 8
        a.swa_requests = 8
        a.timeout, a.p99_limit_ms = 180.0, 0.0
    bin_dir = Path(a.bin_dir).resolve()
    for b in ("ferryd", "ferryctl"):
        if not (bin_dir / b).is_file():
            print(f"fake_engine: no {b} in {bin_dir} (build first, or pass --bin-dir)",
                  file=sys.stderr)
            return 2
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"fake_engine: seed {seed}, {a.requests} requests (prompts 1..{a.max_tokens} tokens, "
          f"page size {a.page_size}, metadata in {a.aux_memory} memory), TP 2 -> 1 phase "
          f"{a.tp2_requests} requests, TP 1 -> 2 phase {a.tp12_requests}, SWA phase "
          f"{a.swa_requests} (prompts 1..{a.tp_max_tokens} tokens)", flush=True)
    t0 = time.monotonic()
    work = tempfile.mkdtemp(prefix="ferry-fe-")
    errors: list[str] = []
    base = dict(seed=seed, abort_rate=a.abort_rate, aux_memory=a.aux_memory,
                page=a.page_size, provider=a.provider)
    # (phase, requests, prompt tokens at most, prefill TP, decode TP, bound in s, model)
    phases = [("main", a.requests, a.max_tokens, 1, 1, a.timeout, "qwen3-next"),
              ("tp2", a.tp2_requests, a.tp_max_tokens, 2, 1, 120.0, "qwen3-next"),
              ("tp12", a.tp12_requests, a.tp_max_tokens, 1, 2, 120.0, "qwen3-next"),
              ("swa", a.swa_requests, a.tp_max_tokens, 1, 1, 120.0, "swa")]
    res: dict[str, Any] = {}
    try:
        for phase, n, max_tokens, ptp, dtp, bound, model in phases:
            if n <= 0:
                continue
            o = dict(base, n=n, max_tokens=max_tokens, deadline_s=bound, model=model)
            res[phase], errs = run_phase(phase, bin_dir, work, o, ptp, dtp)
            errors += errs
    finally:
        if errors:
            print(f"fake_engine: daemon logs and configs kept in {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    lat = summarize(res)
    swa_lat: dict[str, float] = {}
    if "swa" in res:  # the SWA phase's calls alone, also in its JSON
        swa_lat = res["swa"]["latency"] = summarize({"swa": res["swa"]})["all"]
        print(f"fake_engine: SWA phase adapter calls: n={swa_lat['n']} p50 "
              f"{swa_lat['p50'] * 1e3:.3f} ms, p99 {swa_lat['p99'] * 1e3:.3f} ms, max "
              f"{swa_lat['max'] * 1e3:.3f} ms", flush=True)
    for line in latency_lines(lat, a.p99_limit_ms):
        print(f"fake_engine: {line}", flush=True)
    if a.p99_limit_ms > 0 and lat["all"]["n"] and lat["all"]["p99"] * 1e3 > a.p99_limit_ms:
        errors.append(f"adapter call latency p99 {lat['all']['p99'] * 1e3:.2f} ms exceeds "
                      f"{a.p99_limit_ms:g} ms")
    for ph in res.values():  # the raw durations stay out of the report
        for side in ("decode", "prefill"):
            ph.get(side, {}).pop("calls", None)
    elapsed = time.monotonic() - t0
    for e in errors[:30]:
        print(f"fake_engine: ERROR: {e}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"ok": not errors, "seed": seed, "errors": errors,
                                            "elapsed_s": elapsed, "latency": lat, **res},
                                           indent=1, default=str) + "\n")
    main_res = res.get("main", {})
    d, p = main_res.get("decode", {}), main_res.get("prefill", {})
    tp_text = []
    for phase, label in (("tp2", "TP 2 -> 1"), ("tp12", "TP 1 -> 2")):
        if phase in res:
            td = res[phase].get("decode", {})
            tp_text.append(f"{label} {'ok' if res[phase]['ok'] else 'FAILED'} "
                           f"({td.get('succeeded', 0)} verified, "
                           f"{td.get('verified_bytes', 0) / GiB:.2f} GiB)")
    if "swa" in res:
        sd, sp = res["swa"].get("decode", {}), res["swa"].get("prefill", {})
        tp_text.append(
            f"SWA {'ok' if res['swa']['ok'] else 'FAILED'} ({a.swa_requests} requests, "
            f"{sd.get('succeeded', 0)} verified, {sd.get('verified_bytes', 0) / GiB:.2f} GiB of "
            f"which {sd.get('verified_state_bytes', 0) / (1 << 20):.1f} MiB in "
            f"{sd.get('verified_state_indices', 0)} window pages; windows of a whole prompt "
            f"{sd.get('windows_of_the_whole_prompt', 0)}, of a tail "
            f"{sd.get('windows_of_a_tail', 0)}, reaching into the decode's prefix "
            f"{sd.get('windows_in_prefix', 0)}; "
            f"{sp.get('swa_evicted', 0)} SWA pages evicted by the prefill, aborted "
            f"{sd.get('decode_aborts', 0)} by decode and {sp.get('prefill_aborts', 0)} by "
            f"prefill, adapter p99 "
            f"{swa_lat['p99'] * 1e3:.2f} ms, max {swa_lat['max'] * 1e3:.1f} ms)")
    phases_text = "; ".join(tp_text) or "TP and SWA phases skipped"
    verdict = "PASS" if not errors else f"FAIL ({len(errors)} errors)"
    print(f"fake_engine: {verdict}: {a.requests} requests, {d.get('succeeded', 0)} succeeded "
          f"and verified ({d.get('verified_bytes', 0) / GiB:.2f} GiB byte-exact), aborted by "
          f"decode {d.get('aborts', {})}, by prefill {p.get('aborts', {})} (raced with the "
          f"commit: {p.get('abort_raced', 0)}; missed: {d.get('abort_missed', 0)}; aborted "
          f"memory reused byte-exact by {d.get('reused_after_abort', 0)} later requests), "
          f"{d.get('prefix_hits', 0)} prefix hits, {p.get('chunks_sent', 0)} chunks sent "
          f"({p.get('chunks_skipped', 0)} skipped, {p.get('zero_page_last', 0)} zero-page "
          f"last), 0 rooms active, allocators full; {phases_text}; adapter p99 "
          f"{lat['all']['p99'] * 1e3:.2f} ms; {elapsed:.1f} s", flush=True)
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
