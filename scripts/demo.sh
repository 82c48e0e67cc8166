#!/usr/bin/env bash
# The main job: install what is missing, build, run the fake SGLang engine pair
# (tests/fake_engine/fake_engine.py: a prefill and a decode engine process holding memory as SGLang does,
# built with SGLang's signatures, 300 requests and two TP-mismatch phases, verified), then
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

# First the fake engine pair: two engine processes driving the SGLang adapter as SGLang's
# schedulers do against their own prefill and decode ferryds, whose pools the engines' tensors
# describe (300 requests with prefix hits, page-rounded chunks, aborts at five points on each
# side, every destination byte checked, then TP 2 -> 1 and TP 1 -> 2 phases; it fails when the
# p99 of the adapter's calls exceeds 5 ms).
/usr/bin/python3 "$root/tests/fake_engine/fake_engine.py" --bin-dir "$build/src" --requests "${FERRY_FAKE_REQUESTS:-300}"

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
