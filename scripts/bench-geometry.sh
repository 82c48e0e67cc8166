#!/usr/bin/env bash
# TP-mismatch benchmark behind docs/performance.md: Qwen3-Next-80B-A3B (configs/) with one ferryd
# per rank, for each "PREFILL_TP:DECODE_TP" geometry. Every geometry moves the same bytes per
# request (each KV head and state channel once), so GB/s compare directly with equal TP.
#
#   scripts/bench-geometry.sh                      geometries 1:1 1:2 2:1 2:2 on tcp
#   GEOMETRIES="1:1 1:4" PROVIDER=shm scripts/bench-geometry.sh --verify
# Environment: GEOMETRIES, PROVIDER (tcp), TOKENS (4096), REQUESTS (16), CONCURRENCY (4),
# REPEAT (3), STAGING (fabric.staging_bytes, default from configs/). Extra arguments go to
# ferry-bench. Assumes a built tree (scripts/build.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build}
geometries=${GEOMETRIES:-"1:1 1:2 2:1 2:2"}
provider=${PROVIDER:-tcp}
source "$root/scripts/pair-lib.sh"

# start_rank ROLE TP RANK PORT: the configs/ daemon rewritten for one rank of a TP group (Qwen3-Next
# has 2 KV heads, 8192 conv channels and 32 temporal heads; each rank holds its share).
start_rank() {
  local role=$1 tp=$2 rank=$3 port=$4 heads=$(( $2 <= 2 ? 2 / $2 : 1 ))
  local cfg="$ferry_work/$role-$rank.yaml"
  sed -e "s/provider: tcp/provider: $provider/" \
      -e "s/name: $role-0/name: $role-$rank/" \
      -e "s|control: 127.0.0.1:[0-9]*|control: 127.0.0.1:$port|" \
      -e "s|client: /tmp/ferry-$role.sock|client: $ferry_work/$role-$rank.sock|" \
      -e "s/^  size: 1$/  size: $tp/" -e "s/^  rank: 0$/  rank: $rank/" \
      -e "s/^    kv_heads: 2/    total_heads: 2\n    kv_heads: $heads/" \
      -e "s/shape: \[8192, 3\]/shape: [$((8192 / tp)), 3]/" \
      -e "s/shape: \[32, 128, 128\]/shape: [$((32 / tp)), 128, 128]/" \
      "$root/configs/$role.yaml" >"$cfg"
  if [ -n "${STAGING:-}" ]; then
    sed -i "s/^  write_piece_bytes: \(.*\)$/  write_piece_bytes: \1\n  staging_bytes: $STAGING/" "$cfg"
  fi
  ferry_start "$role-$rank" "$cfg"
}

for g in $geometries; do
  ptp=${g%%:*} dtp=${g##*:}
  echo "=== Qwen3-Next prefill TP$ptp -> decode TP$dtp over $provider ==="
  psock=() dsock=()
  for ((r = 0; r < ptp; r++)); do start_rank prefill "$ptp" $r $((7451 + r)); psock+=("$ferry_work/prefill-$r.sock"); done
  for ((r = 0; r < dtp; r++)); do start_rank decode "$dtp" $r $((7471 + r)); dsock+=("$ferry_work/decode-$r.sock"); done
  "$build/src/ferry-bench" --prefill-socket "$(IFS=,; echo "${psock[*]}")" \
    --decode-socket "$(IFS=,; echo "${dsock[*]}")" \
    --prompt-tokens "${TOKENS:-4096}" --requests "${REQUESTS:-16}" --concurrency "${CONCURRENCY:-4}" \
    --repeat "${REPEAT:-3}" "$@"
  ferry_stop_all || echo "bench: a daemon did not exit cleanly" >&2
done
