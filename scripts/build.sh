#!/usr/bin/env bash
# Configure and build Ferry into build/ (two jobs: the reference machine has two cores).
# Extra arguments go to the CMake configure step, e.g. -DFERRY_SANITIZE=ON.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=${FERRY_BUILD_TYPE:-RelWithDebInfo} "$@" >/dev/null
cmake --build "$build" -j2
