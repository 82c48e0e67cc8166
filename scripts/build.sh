#!/usr/bin/env bash
# Configure and build Ferry into build/ (two jobs: the reference machine has two cores).
# Extra arguments go to the CMake configure step, e.g. -DFERRY_SANITIZE=ON.
# FERRY_BUILD_TARGETS (space-separated) builds only those targets and what they need.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=${FERRY_BUILD_TYPE:-RelWithDebInfo} "$@" >/dev/null
targets=()
for t in ${FERRY_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j2 "${targets[@]}"
