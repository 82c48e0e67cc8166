#!/usr/bin/env bash
# The main job: install what is missing, build, run the fake engine pair (scripts/fake_engine.py:
# a prefill and a decode engine process through the SGLang adapter, 200 verified requests), then
# start a prefill and a decode ferryd on loopback from configs/ and move a Qwen3-Next-80B-A3B-shaped workload (4096-token prompts: 96 MiB of KV and
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

# First the fake engine pair: two engine processes driving the SGLang-shaped adapter against
# their own prefill and decode ferryds (200 requests with prefix hits, chunked prefill, aborts on
# both sides, every destination byte checked, then a TP2-prefill -> TP1-decode phase).
/usr/bin/python3 "$root/scripts/fake_engine.py" --bin-dir "$build/src" --requests "${FERRY_FAKE_REQUESTS:-200}"

source "$root/scripts/pair-lib.sh"
provider=${FERRY_PROVIDER:-tcp}
for name in prefill decode; do
  sed "s/provider: tcp/provider: $provider/" "$root/configs/$name.yaml" >"$ferry_work/$name.yaml"
  ferry_start "$name" "$ferry_work/$name.yaml"
  echo "demo: $name ready"
done

"$build/src/ferry-bench" --prefill-socket /tmp/ferry-prefill.sock --decode-socket /tmp/ferry-decode.sock \
  --prompt-tokens 4096 --requests 32 --concurrency 4 --verify "$@"

if ferry_stop_all; then
  echo "demo: both daemons stopped cleanly"
else
  echo "demo: a daemon did not exit cleanly" >&2
  exit 1
fi
