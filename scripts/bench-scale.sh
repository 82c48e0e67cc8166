#!/usr/bin/env bash
# Scale benchmarks behind docs/performance.md (issue 13, item 7), on the small model of
# bench.sh's MODEL=small (12 attention layers, 2 state layers of 44 KiB):
#
#  1. hold: a prefill/decode pair whose pools hold ROOMS rooms at once (ROOMS state slots and aux
#     rows on both sides, ROOMS room-sized KV regions on the decode, limits.max_active_rooms
#     2 x ROOMS: a prefill room ends once its outcome arrives, after the decode's, so while ROOMS
#     are in flight on the decode the prefill may briefly hold more), then `ferry-bench --hold ROOMS`: each daemon's memory before and with every room
#     open, the rate of the held rooms against waves of 100, and SUSTAIN seconds with ROOMS in
#     flight (memory sampled every 5 s).
#  2. fan-in: FANIN independent prefill daemons (each its own node name, control port and client
#     socket) and one decode; `ferry-bench --fan-in-socket ...`: the rate of all of them feeding
#     the decode against the first alone, CONCURRENCY rooms in flight, REQUESTS per measurement.
#
#   scripts/bench-scale.sh                          both, tcp, 10000 rooms of 16 tokens
#   PROVIDERS="tcp shm" ROOMS=2000 SUSTAIN=0 scripts/bench-scale.sh hold
#   FANIN=4 REQUESTS=4096 scripts/bench-scale.sh fan-in
# Environment: PROVIDERS (tcp), ROOMS (10000), TOKENS (16), SUSTAIN (60), REPEAT (3), FANIN (4),
# CONCURRENCY (64), REQUESTS (4096), PORT_BASE (7450: the daemons' control ports are PORT_BASE
# and up, apart from bench.sh's), SETS (more ferryd --set overrides for every daemon),
# BENCH_JSON (a directory: keep each run's JSON there). Arguments: `hold`, `fan-in` (default
# both); after `--`, more ferry-bench options. The sockets are in a temporary directory, so this
# runs beside bench.sh. Assumes a built tree (scripts/build.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build}
providers=${PROVIDERS:-tcp}
rooms=${ROOMS:-10000}
tokens=${TOKENS:-16}
port_base=${PORT_BASE:-7450}
modes=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do modes+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
[ ${#modes[@]} -eq 0 ] && modes=(hold fan-in)
export FERRY_READY_S=${FERRY_READY_S:-120}
source "$root/scripts/pair-lib.sh"

# start NAME ROLE CONFIG PORT PROVIDER [--set ...]: a daemon of the small model on its own
# control port and socket.
start() {
  local name=$1 config=$2 port=$3 provider=$4
  shift 4
  local sets=(--set "node.name=$name" --set "listen.control=127.0.0.1:$port"
              --set "listen.client=$ferry_work/$name.sock" --set "fabric.provider=$provider"
              --set "pools.mamba.layer_ids=[0,1]" --set "pools.mamba.tensors[0].shape=[2048,3]"
              --set "pools.mamba.tensors[0].shard_groups=[512,512,1024]"
              --set "pools.mamba.tensors[1].shape=[4,32,64]" --set log.level=warn "$@")
  local extra
  for extra in ${SETS:-}; do sets+=(--set "$extra"); done
  ferry_start "$name" "$root/configs/$config.yaml" "${sets[@]}"
}

json_arg() {  # json_arg NAME: --json FILE when BENCH_JSON names a directory
  if [ -n "${BENCH_JSON:-}" ]; then mkdir -p "$BENCH_JSON"; echo "--json $BENCH_JSON/$1.json"; fi
}

for provider in $providers; do
  for mode in "${modes[@]}"; do
    case $mode in
      hold)
        echo "=== hold: $rooms rooms of $tokens tokens, provider $provider ==="
        # Every room needs its own KV region, slot and row on the decode; the prefill's rooms
        # read shared KV regions but each its own aux row (it carries the room id).
        pages=$(( rooms * tokens + 1024 ))
        pool_sets=(--set "pools.mamba.slots=$rooms" --set "pools.aux.rows=$rooms"
                   --set "limits.max_active_rooms=$((2 * rooms))")
        start scale-prefill prefill "$port_base" "$provider" "${pool_sets[@]}" \
          --set pools.kv.pages=20480
        start scale-decode decode "$((port_base + 1))" "$provider" "${pool_sets[@]}" \
          --set "pools.kv.pages=$pages"
        # shellcheck disable=SC2046
        "$build/src/ferry-bench" --prefill-socket "$ferry_work/scale-prefill.sock" \
          --decode-socket "$ferry_work/scale-decode.sock" --prompt-tokens "$tokens" \
          --hold "$rooms" --sustain-s "${SUSTAIN:-60}" --repeat "${REPEAT:-3}" \
          $(json_arg "hold-$provider") "$@"
        ferry_stop_all || echo "bench-scale: a daemon did not exit cleanly" >&2
        ;;
      fan-in)
        n=${FANIN:-4}
        echo "=== fan-in: $n prefills -> 1 decode, provider $provider ==="
        sockets=
        conc=${CONCURRENCY:-64}
        pool_sets=(--set "pools.mamba.slots=$((2 * conc))" --set "pools.aux.rows=$((2 * conc))"
                   --set "pools.kv.pages=$(( (2 * conc * tokens + 1023) / 1024 * 1024 ))")
        for i in $(seq 0 $((n - 1))); do
          start "scale-prefill-$i" prefill "$((port_base + 10 + i))" "$provider" "${pool_sets[@]}"
          sockets+="${sockets:+,}$ferry_work/scale-prefill-$i.sock"
        done
        start scale-decode decode "$((port_base + 1))" "$provider" "${pool_sets[@]}"
        # shellcheck disable=SC2046
        "$build/src/ferry-bench" --fan-in-socket "$sockets" \
          --decode-socket "$ferry_work/scale-decode.sock" --prompt-tokens "$tokens" \
          --concurrency "$conc" --requests "${REQUESTS:-4096}" \
          --repeat "${REPEAT:-3}" $(json_arg "fan-in-$provider") "$@"
        ferry_stop_all || echo "bench-scale: a daemon did not exit cleanly" >&2
        ;;
      *)
        echo "bench-scale: unknown mode '$mode' (hold or fan-in)" >&2
        exit 2
        ;;
    esac
  done
done
