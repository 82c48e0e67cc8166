#!/usr/bin/env bash
# TP-mismatch benchmark behind docs/performance.md: Qwen3-Next-80B-A3B (configs/) with one ferryd
# per rank, for each "PREFILL_TP:DECODE_TP" geometry. Every geometry moves the same bytes per
# request (each KV head and state channel once), so GB/s compare directly with equal TP.
#
#   scripts/bench-geometry.sh                      geometries 1:1 1:2 2:1 2:2 on tcp
#   GEOMETRIES="1:1 1:4" PROVIDER=shm scripts/bench-geometry.sh --verify
#   GEOMETRIES="pp2:1" scripts/bench-geometry.sh    prefill in 2 PP stages (layers 0-23, 24-47)
#                                                   into one decode holding all 48 layers
#   MODEL_JSON=/path/config.json MODEL_ENGINE=vllm scripts/bench-geometry.sh
#                                                   another model, its pools from the catalogue
# Environment: GEOMETRIES, PROVIDER (tcp), TOKENS (4096), REQUESTS (16), CONCURRENCY (4),
# REPEAT (3), STAGING (fabric.staging_bytes, default from configs/), MODEL_JSON, MODEL_ENGINE,
# PAGES (20480) and SLOTS (8) for a catalogued model. Extra arguments go to
# ferry-bench. Assumes a built tree (scripts/build.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build}
geometries=${GEOMETRIES:-"1:1 1:2 2:1 2:2"}
provider=${PROVIDER:-tcp}
source "$root/scripts/pair-lib.sh"

# start_rank ROLE TP RANK PORT: the configs/ daemon rewritten for one rank of a TP group (Qwen3-Next
# has 2 KV heads, 8192 conv channels and 32 temporal heads; each rank holds its share). With
# MODEL_JSON, its pools come from that config.json through the model catalogue instead
# (MODEL_ENGINE: sglang or vllm) and only their sizes are written.
start_rank() {
  local role=$1 tp=$2 rank=$3 port=$4 heads=$(( $2 <= 2 ? 2 / $2 : 1 ))
  local cfg="$ferry_work/$role-$rank.yaml"
  local shapes=(-e "s/^    kv_heads: 2/    total_heads: 2\n    kv_heads: $heads/"
                -e "s/shape: \[8192, 3\]/shape: [$((8192 / tp)), 3]/"
                -e "s/shape: \[32, 128, 128\]/shape: [$((32 / tp)), 128, 128]/")
  [ -z "${MODEL_JSON:-}" ] || shapes=(-e '/^pools:/,$d')  # the catalogue writes them
  sed -e "s/provider: tcp/provider: $provider/" \
      -e "s/name: $role-0/name: $role-$rank/" \
      -e "s|control: 127.0.0.1:[0-9]*|control: 127.0.0.1:$port|" \
      -e "s|client: /tmp/ferry-$role.sock|client: $ferry_work/$role-$rank.sock|" \
      -e "s/^  size: 1$/  size: $tp/" -e "s/^  rank: 0$/  rank: $rank/" \
      "${shapes[@]}" "$root/configs/$role.yaml" >"$cfg"
  if [ -n "${MODEL_JSON:-}" ]; then
    cat >>"$cfg" <<YAML
model:
  config_json: $MODEL_JSON
  engine: ${MODEL_ENGINE:-sglang}
pools:
  kv: {page_tokens: 1, pages: ${PAGES:-20480}}
  mamba: {slots: ${SLOTS:-8}}
  aux: {rows: 64, row_bytes: 5632}
YAML
    local check
    check=$("$build/src/ferryd" --check-config "$cfg" 2>&1 || true)
    if [[ $check == *"has no recurrent state"* ]]; then
      sed -i '/^  mamba: {slots/d' "$cfg"  # an MLA model: KV only
    fi
  fi
  if [ -n "${STAGING:-}" ]; then
    sed -i "s/^  write_piece_bytes: \(.*\)$/  write_piece_bytes: \1\n  staging_bytes: $STAGING/" "$cfg"
  fi
  ferry_start "$role-$rank" "$cfg"
}

# start_stage RANK PORT: a TP1 prefill holding PP stage RANK of 2 (global layers 0-23 or 24-47).
start_stage() {
  local rank=$1 port=$2 cfg="$ferry_work/prefill-$1.yaml"
  python3 - "$root/configs/prefill.yaml" "$rank" >"$cfg" <<'PY'
import re, sys
text, rank = open(sys.argv[1]).read(), int(sys.argv[2])
lo, hi = 24 * rank, 24 * rank + 24
def keep(m):
    ids = [int(x) for x in re.findall(r"\d+", m.group(2)) if lo <= int(x) < hi]
    return m.group(1) + "[" + ", ".join(map(str, ids)) + "]"
text = re.sub(r"(layer_ids: )\[([^\]]*)\]", keep, text, flags=re.S)
text = text.replace("tp:\n", "pp:\n  size: 2\n  rank: %d\ntp:\n" % rank, 1)
print(text, end="")
PY
  sed -i -e "s/provider: tcp/provider: $provider/" -e "s/name: prefill-0/name: prefill-$rank/" \
      -e "s|control: 127.0.0.1:[0-9]*|control: 127.0.0.1:$port|" \
      -e "s|client: /tmp/ferry-prefill.sock|client: $ferry_work/prefill-$rank.sock|" "$cfg"
  ferry_start "prefill-$rank" "$cfg"
}

for g in $geometries; do
  if [ "$g" = "pp2:1" ]; then
    echo "=== Qwen3-Next prefill PP2 -> decode PP1 over $provider ==="
    start_stage 0 7451
    start_stage 1 7452
    start_rank decode 1 0 7471
    "$build/src/ferry-bench" --prefill-socket "$ferry_work/prefill-0.sock,$ferry_work/prefill-1.sock" \
      --decode-socket "$ferry_work/decode-0.sock" \
      --prompt-tokens "${TOKENS:-4096}" --requests "${REQUESTS:-16}" --concurrency "${CONCURRENCY:-4}" \
      --repeat "${REPEAT:-3}" "$@"
    ferry_stop_all || echo "bench: a daemon did not exit cleanly" >&2
    continue
  fi
  ptp=${g%%:*} dtp=${g##*:}
  echo "=== ${MODEL_JSON:-Qwen3-Next} prefill TP$ptp -> decode TP$dtp over $provider ==="
  psock=() dsock=()
  for ((r = 0; r < ptp; r++)); do start_rank prefill "$ptp" $r $((7451 + r)); psock+=("$ferry_work/prefill-$r.sock"); done
  for ((r = 0; r < dtp; r++)); do start_rank decode "$dtp" $r $((7471 + r)); dsock+=("$ferry_work/decode-$r.sock"); done
  "$build/src/ferry-bench" --prefill-socket "$(IFS=,; echo "${psock[*]}")" \
    --decode-socket "$(IFS=,; echo "${dsock[*]}")" \
    --prompt-tokens "${TOKENS:-4096}" --requests "${REQUESTS:-16}" --concurrency "${CONCURRENCY:-4}" \
    --repeat "${REPEAT:-3}" "$@"
  ferry_stop_all || echo "bench: a daemon did not exit cleanly" >&2
done
