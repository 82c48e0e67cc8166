#!/usr/bin/env bash
# Install what is missing, build, and run every test (unit, fabric, end-to-end, Python) under
# ctest, then a bounded smoke run of each libFuzzer target (scripts/fuzz.sh, FUZZ_SECONDS each;
# FUZZ_SECONDS=0 skips it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
(cd "${FERRY_BUILD_DIR:-$root/build}" && ctest --output-on-failure --timeout 300 "$@")
if [ "${FUZZ_SECONDS:-15}" != 0 ]; then
  FUZZ_SECONDS=${FUZZ_SECONDS:-15} "$root/scripts/fuzz.sh"
fi
