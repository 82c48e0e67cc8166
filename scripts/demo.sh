#!/usr/bin/env bash
# The main job: install what is missing, build, start a prefill and a decode ferryd on loopback
# from configs/, move a Qwen3-Next-80B-A3B-shaped workload (4096-token prompts: 96 MiB of KV and
# one 74 MiB Mamba state slot per request, plus the aux row) through the client protocol, check
# every destination byte, print a summary, and stop both daemons.
#
#   scripts/demo.sh [ferry-bench options]     e.g. scripts/demo.sh --requests 64 --concurrency 8
#   FERRY_PROVIDER=shm scripts/demo.sh        use the shm provider instead of tcp
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build}
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"

work=$(mktemp -d /tmp/ferry-demo-XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

provider=${FERRY_PROVIDER:-tcp}
start() {  # start NAME CONFIG: run ferryd and wait (bounded) for its ready line
  local name=$1 config=$2
  sed "s/provider: tcp/provider: $provider/" "$config" >"$work/$name.yaml"
  mkfifo "$work/$name.ready"
  "$build/src/ferryd" --config "$work/$name.yaml" --ready-fd 3 3>"$work/$name.ready" >"$work/$name.log" 2>&1 &
  pids+=($!)
  local line=""
  read -r -t 30 line <"$work/$name.ready" || true
  if [ "$line" != "ready" ]; then
    echo "demo: $name did not start; its log:" >&2
    cat "$work/$name.log" >&2
    exit 1
  fi
  echo "demo: $name ready (log: $work/$name.log)"
}
start prefill "$root/configs/prefill.yaml"
start decode "$root/configs/decode.yaml"

"$build/src/ferry-bench" --prefill-socket /tmp/ferry-prefill.sock --decode-socket /tmp/ferry-decode.sock \
  --prompt-tokens 4096 --requests 32 --concurrency 4 --verify "$@"

for pid in "${pids[@]}"; do kill -TERM "$pid"; done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
pids=()
[ $status -eq 0 ] && echo "demo: both daemons stopped cleanly" || { echo "demo: a daemon exited with $status" >&2; exit 1; }
