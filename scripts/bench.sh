#!/usr/bin/env bash
# Benchmark matrix behind docs/performance.md: for each provider and KV page size, start a
# prefill/decode ferryd pair from configs/ (provider and page size overridden with ferryd --set,
# same KV bytes), run ferry-bench with its raw-fabric baseline in the same run, and stop the pair.
# Each run's text report is printed as it goes; its JSON results (ferry-bench --json FILE) make
# the summary table at the end.
#
#   scripts/bench.sh                          full matrix (tcp, shm) x (page 1, 16, 64)
#   PROVIDERS=shm PAGES=1 CONCURRENCY=2 scripts/bench.sh --fragmentation 0.5
#   MEMORY=client scripts/bench.sh            every pool engine-owned (ferry-bench lends memfds)
#   METRICS=1 scripts/bench.sh                both daemons serve listen.metrics (127.0.0.1:9464
#                                             and :9465), each scraped once a second meanwhile
#   BENCH_JSON=results.json scripts/bench.sh  also keep every run's JSON document, in one list
#   CTXSW=1 scripts/bench.sh --latency        also print each daemon's context switches (all its
#                                             threads, voluntary + involuntary) during each run
#   MODEL=small TOKENS=16 CONCURRENCY=64 REQUESTS=4096 PAGES=1 scripts/bench.sh
#                                             small rooms: the same 12 attention layers, 2 state
#                                             layers of 44 KiB (conv [2048,3] bf16, temporal
#                                             [4,32,64] fp32), 128 state slots and aux rows
#   MODEL=small-state KV_TOKENS=8192 TOKENS=16 CONCURRENCY=64 REQUESTS=4096 PAGES=1 scripts/bench.sh
#                                             small state writes: conv [256,3] bf16 (shard groups
#                                             64, 64, 128), temporal [32,16,16] fp32: a 16-token
#                                             room is 24 KV writes, 4 small state writes, the aux row
#   MODEL=kv TOKENS=64 scripts/bench.sh       the same KV pool alone (no state, no aux): every
#                                             write is one layer buffer's run, TOKENS KiB
#   MODEL=small KV_TOKENS=98304 PAGES=1 scripts/bench.sh --open-loop 200
#                                             kv pools of 98304 tokens (2.25 GiB per daemon with
#                                             Qwen3-Next's 24 KiB per token): room for 32k rooms
#   BENCH_RUNS=runs.txt scripts/bench.sh      one ferry-bench run per line of runs.txt (its whole
#                                             workload: TOKENS, REQUESTS, CONCURRENCY and REPEAT
#                                             are not passed) against each pair; so does
#                                             --open-loop (bounded by its --duration-s)
#   PAGES=1 REQUESTS=20 scripts/bench.sh --layer-wise 2 --no-baseline
#                                             layer-wise streaming: a layer every 2 ms, last
#                                             send -> Success against a whole send
# Environment: PROVIDERS, PAGES, TOKENS (4096), REQUESTS (16), CONCURRENCY (4), REPEAT (5),
# MEMORY (daemon), METRICS (0), MODEL (qwen3-next, small, small-state or kv), KV_TOKENS (20480: the kv pool
# in tokens, whatever the page size), SETS (more ferryd --set overrides for both daemons,
# space-separated: SETS="runtime.workers=1 log.level=warn"), BENCH_RUNS, BENCH_JSON.
# Extra arguments go to ferry-bench (every run). Assumes a built tree (scripts/build.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build}
providers=${PROVIDERS:-"tcp shm"}
pages=${PAGES:-"1 16 64"}
source "$root/scripts/pair-lib.sh"

start() {  # start NAME PROVIDER PAGE_TOKENS: the configs/ daemon with another provider and page size
  local name=$1 provider=$2 page=$3
  local kv_tokens=${KV_TOKENS:-20480}
  local sets=(--set "fabric.provider=$provider" --set "pools.kv.page_tokens=$page"
              --set "pools.kv.pages=$((kv_tokens / page))")
  local config="$root/configs/$name.yaml"
  if [ "${MODEL:-qwen3-next}" = kv ]; then  # the kv pool alone: the config without its
    config="$ferry_work/$name-kv.yaml"       # pools.mamba and pools.aux sections
    awk '/^  (mamba|aux):/ {skip = 1; next} /^  [a-z_]+:/ || /^[^ #]/ {skip = 0} !skip' \
      "$root/configs/$name.yaml" >"$config"
  fi
  if [ "${MEMORY:-daemon}" = client ]; then  # every pool engine-owned
    sets+=(--set pools.kv.memory=client)
    [ "${MODEL:-qwen3-next}" = kv ] || sets+=(--set pools.mamba.memory=client --set pools.aux.memory=client)
  fi
  local extra
  for extra in ${SETS:-}; do sets+=(--set "$extra"); done
  if [ "${MODEL:-qwen3-next}" = small ]; then
    sets+=(--set "pools.mamba.layer_ids=[0,1]" --set "pools.mamba.tensors[0].shape=[2048,3]"
           --set "pools.mamba.tensors[0].shard_groups=[512,512,1024]"
           --set "pools.mamba.tensors[1].shape=[4,32,64]" --set pools.mamba.slots=128
           --set pools.aux.rows=128)
  elif [ "${MODEL:-qwen3-next}" = small-state ]; then
    sets+=(--set "pools.mamba.layer_ids=[0,1]" --set "pools.mamba.tensors[0].shape=[256,3]"
           --set "pools.mamba.tensors[0].shard_groups=[64,64,128]"
           --set "pools.mamba.tensors[1].shape=[32,16,16]" --set pools.mamba.slots=128
           --set pools.aux.rows=128)
  fi
  if [ "${METRICS:-0}" = 1 ]; then
    local port=9464
    [ "$name" = decode ] && port=9465
    sets+=(--set "listen.metrics=127.0.0.1:$port")
  fi
  ferry_start "$name" "$config" "${sets[@]}"
}

# ctxsw PID: the context switches of every thread of PID so far (voluntary + involuntary).
ctxsw() {
  cat /proc/"$1"/task/*/status 2>/dev/null |
    awk '/^(voluntary|nonvoluntary)_ctxt_switches/ {n += $2} END {print n + 0}'
}

results=()
bench_status=0
for provider in $providers; do
  for page in $pages; do
    echo "=== provider $provider, page_tokens $page ==="
    start prefill "$provider" "$page"
    start decode "$provider" "$page"
    scraper=
    if [ "${METRICS:-0}" = 1 ]; then  # a scrape of each daemon every second until stopped
      python3 -c '
import time, urllib.request
for _ in range(3600):
    for port in (9464, 9465):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    time.sleep(1)' &
      scraper=$!
    fi
    # The workload options from the environment; not with BENCH_RUNS (each line has its own) nor
    # for --open-loop (its arrivals are bounded by --duration-s, --requests would bound them too).
    common=(--prompt-tokens "${TOKENS:-4096}" --requests "${REQUESTS:-16}"
            --concurrency "${CONCURRENCY:-4}" --repeat "${REPEAT:-5}")
    if [ -n "${BENCH_RUNS:-}" ] || [[ " $* " == *" --open-loop "* ]]; then common=(); fi
    runs=("")  # one run with the extra arguments, or one per line of BENCH_RUNS
    if [ -n "${BENCH_RUNS:-}" ]; then mapfile -t runs < <(grep -v '^[[:space:]]*\(#\|$\)' "$BENCH_RUNS"); fi
    for i in "${!runs[@]}"; do
      out="$ferry_work/bench-$provider-$page-$i.json"
      read -r -a run_args <<<"${runs[$i]}"
      status=0
      [ "${CTXSW:-0}" = 1 ] && before=("$(ctxsw "${ferry_pids[0]}")" "$(ctxsw "${ferry_pids[1]}")")
      "$build/src/ferry-bench" --prefill-socket /tmp/ferry-prefill.sock --decode-socket /tmp/ferry-decode.sock \
        "${common[@]}" --json "$out" "$@" "${run_args[@]}" || status=$?
      if [ "${CTXSW:-0}" = 1 ]; then
        echo "context switches during the run: prefill $(($(ctxsw "${ferry_pids[0]}") - before[0])), decode $(($(ctxsw "${ferry_pids[1]}") - before[1]))"
      fi
      if [ ! -s "$out" ]; then
        echo "bench: ferry-bench ${runs[$i]} wrote no results (exit $status)" >&2
        exit 1
      fi
      [ "$status" = 0 ] || bench_status=$status  # its results are kept, the exit code says so
      results+=("$provider" "$page" "$out" "${runs[$i]}")
    done
    if [ -n "$scraper" ]; then kill "$scraper" 2>/dev/null || true; wait "$scraper" 2>/dev/null || true; fi
    ferry_stop_all || echo "bench: a daemon did not exit cleanly" >&2
  done
done

# The summary, from the JSON documents (docs/cli.md lists their fields).
python3 - "${BENCH_JSON:-}" "${results[@]}" <<'PY'
import json, sys
keep, args = sys.argv[1], sys.argv[2:]
docs = []
print(f"{'provider':<9}{'page':>5}{'ferry GB/s':>12}{'raw GB/s':>10}{'ratio':>7}"
      f"{'p50 ms':>9}{'p99 ms':>9}{'committed':>11}{'failed':>8}")
for i in range(0, len(args), 4):
    provider, page, path, run_args = args[i:i + 4]
    d = json.load(open(path))
    d["bench"] = {"provider": provider, "page_tokens": int(page), "args": run_args.split()}
    docs.append(d)
    if "latency" in d:  # --latency: one line per gap
        for g in d["latency"]["gaps"]:
            raw = g["raw_ms"]["p50"] if g["raw_ms"] else None
            ratio = "-" if g["ratio_p50"] is None else f"{g['ratio_p50']:.2f}"
            print(f"{provider:<9}{page:>5}  latency, gap {g['gap_ms']:g} ms: ferry p50 "
                  f"{g['ferry_ms']['p50']:.3f} ms, raw p50 "
                  f"{'-' if raw is None else format(raw, '.3f')} ms, ratio {ratio}")
        continue
    if "open_loop" in d:  # --open-loop: one line per class
        ol = d["open_loop"]
        print(f"{provider:<9}{page:>5}  open loop {ol['rate']:g}/s: achieved "
              f"{ol['achieved_rooms_per_s']:.1f} rooms/s, {ol['gbps']:.2f} GB/s, refused "
              f"{ol['refused']['no_pages'] + ol['refused']['no_slot']}, sustained {ol['sustained']}")
        for c in ol["classes"]:
            lat = c["latency_ms"]
            p50 = "-" if lat["p50"] is None else f"{lat['p50']:.2f}"
            p99 = "-" if lat["p99"] is None else f"{lat['p99']:.2f}"
            print(f"{'':<14}  {c['tokens']:>6} tokens: {c['committed']} committed, p50 {p50} ms, "
                  f"p99 {p99} ms")
        continue
    if "fairness" in d:  # --background-rooms: its own figures, already printed by the run
        f = d["fairness"]
        print(f"{provider:<9}{page:>5}  fairness: idle p50 {f['idle_ms']['p50']:.2f} ms, "
              f"loaded p50 {f['loaded_ms']['p50']:.2f} ms, ratio {f['ratio_p50']:.2f}")
        continue
    if "layer_wise" in d:  # --layer-wise: its own figures, already printed by the run
        w = d["layer_wise"]
        print(f"{provider:<9}{page:>5}  layer-wise every {w['t_ms']} ms: last send -> Success "
              f"p50 {w['last_send_to_success_ms']['p50']:.2f} ms, whole "
              f"{w['whole_send_to_success_ms']['p50']:.2f} ms, ratio {w['ratio_p50']:.3f}")
        continue
    raw = d["raw"]["gbps_median"] if d["raw"] else None
    fmt = lambda v, f: "-" if v is None else format(v, f)
    print(f"{provider:<9}{page:>5}{d['ferry']['gbps_median']:>12.2f}{fmt(raw, '.2f'):>10}"
          f"{fmt(d['ratio'], '.2f'):>7}{d['commit_latency_ms']['p50']:>9.2f}"
          f"{d['commit_latency_ms']['p99']:>9.2f}{d['ferry']['committed']:>11}"
          f"{d['ferry']['failed']:>8}")
if keep:
    with open(keep, "w") as f:
        json.dump(docs, f, indent=1)
    print(f"bench: every run's JSON in {keep}")
PY
exit "$bench_status"
