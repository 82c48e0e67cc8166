#!/usr/bin/env bash
# Install what is missing, check the formatting, build with AddressSanitizer + UndefinedBehaviorSanitizer, and run
# every test (unit, fabric, end-to-end with sanitized daemons, Python) under ctest; then a
# bounded smoke run of each libFuzzer target (scripts/fuzz.sh).
#
# Environment: SANITIZE=0 tests the plain build in build/ instead (faster to build);
# FUZZ_SECONDS per fuzz target (15; 0 skips fuzzing). Extra arguments go to ctest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/check-format.sh"
# Warnings are errors here (CAF, libfabric and the other libraries' headers are system headers).
if [ "${SANITIZE:-1}" = 0 ]; then
  export FERRY_BUILD_DIR=${FERRY_BUILD_DIR:-$root/build}
  "$root/scripts/build.sh" -DFERRY_WERROR=ON
else
  export FERRY_BUILD_DIR=${FERRY_BUILD_DIR:-$root/build-asan}
  "$root/scripts/build.sh" -DFERRY_SANITIZE=ON -DFERRY_WERROR=ON
  # Any sanitizer report stops the process, so the test that ran it fails.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
fi
(cd "$FERRY_BUILD_DIR" && ctest --output-on-failure --timeout 300 "$@")
if [ "${FUZZ_SECONDS:-15}" != 0 ]; then
  FUZZ_SECONDS=${FUZZ_SECONDS:-15} "$root/scripts/fuzz.sh"
fi
