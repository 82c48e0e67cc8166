#!/usr/bin/env bash
# Benchmark matrix behind docs/performance.md: for each provider and KV page size, start a
# prefill/decode ferryd pair from configs/ (page size rewritten, same KV bytes), run ferry-bench
# with its raw-fabric baseline in the same run, and stop the pair.
#
#   scripts/bench.sh                          full matrix (tcp, shm) x (page 1, 16, 64)
#   PROVIDERS=shm PAGES=1 CONCURRENCY=2 scripts/bench.sh --fragmentation 0.5
#   MEMORY=client scripts/bench.sh            every pool engine-owned (ferry-bench lends memfds)
#   METRICS=1 scripts/bench.sh                both daemons serve listen.metrics (127.0.0.1:9464
#                                             and :9465), each scraped once a second meanwhile
# Environment: PROVIDERS, PAGES, TOKENS (4096), REQUESTS (16), CONCURRENCY (4), REPEAT (5),
# MEMORY (daemon), METRICS (0).
# Extra arguments go to ferry-bench. Assumes a built tree (scripts/build.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build}
providers=${PROVIDERS:-"tcp shm"}
pages=${PAGES:-"1 16 64"}
source "$root/scripts/pair-lib.sh"

start() {  # start NAME PROVIDER PAGE_TOKENS: the configs/ daemon with another provider and page size
  local name=$1 provider=$2 page=$3
  local memory=()
  if [ "${MEMORY:-daemon}" = client ]; then  # each pool section gets `memory: client`
    memory=(-e "s/^\(    pages: .*\)$/\1\n    memory: client/"
            -e "s/^\(    slots: .*\)$/\1\n    memory: client/"
            -e "s/^\(    row_bytes: .*\)$/\1\n    memory: client/")
  fi
  local metrics=()
  if [ "${METRICS:-0}" = 1 ]; then
    local port=9464
    [ "$name" = decode ] && port=9465
    metrics=(-e "s|^\(  client: .*\)$|\1\n  metrics: 127.0.0.1:$port|")
  fi
  sed -e "s/provider: tcp/provider: $provider/" -e "s/page_tokens: 1 /page_tokens: $page /" \
      -e "s/pages: 20480/pages: $((20480 / page))/" "${memory[@]}" "${metrics[@]}" \
      "$root/configs/$name.yaml" >"$ferry_work/$name.yaml"
  ferry_start "$name" "$ferry_work/$name.yaml"
}

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
    "$build/src/ferry-bench" --prefill-socket /tmp/ferry-prefill.sock --decode-socket /tmp/ferry-decode.sock \
      --prompt-tokens "${TOKENS:-4096}" --requests "${REQUESTS:-16}" --concurrency "${CONCURRENCY:-4}" \
      --repeat "${REPEAT:-5}" "$@"
    if [ -n "$scraper" ]; then kill "$scraper" 2>/dev/null || true; wait "$scraper" 2>/dev/null || true; fi
    ferry_stop_all || echo "bench: a daemon did not exit cleanly" >&2
  done
done
