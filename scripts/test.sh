#!/usr/bin/env bash
# Install what is missing, then test in two stages, two jobs at a time (the reference machine
# has two cores):
#   the gate, which fails fast: formatting, the Python type check, the Python codec against
#     src/core/wire.yaml, the unit and fabric test binaries (with the core and transport they
#     link) built with warnings as errors, and their tiers (pure code and libfabric on loopback);
#   the rest: end-to-end with sanitized daemons, cluster (network namespaces), Python and
#     install tiers, then a bounded smoke run of each libFuzzer target (scripts/fuzz.sh).
# Each stage prints how long the run has taken so far.
#
# Environment: SANITIZE=0 tests the plain build in build/ instead of AddressSanitizer +
# UndefinedBehaviorSanitizer in build-asan/ (faster to build); GATE_ONLY=1 stops after the gate;
# FUZZ_SECONDS per fuzz target (10; 0 skips fuzzing); CTEST_JOBS (2). Extra arguments go to
# every ctest run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
start=$(date +%s)
elapsed() { echo "test.sh: $1 after $(($(date +%s) - start)) s"; }

"$root/scripts/install-deps.sh"
"$root/scripts/check-format.sh"
"$root/scripts/check-types.sh"
/usr/bin/python3 "$root/scripts/gen_wire.py" --check  # the Python codec is what wire.yaml says
# Warnings are errors here (CAF, libfabric and the other libraries' headers are system headers).
if [ "${SANITIZE:-1}" = 0 ]; then
  export FERRY_BUILD_DIR=${FERRY_BUILD_DIR:-$root/build}
  flags=(-DFERRY_WERROR=ON)
else
  export FERRY_BUILD_DIR=${FERRY_BUILD_DIR:-$root/build-asan}
  flags=(-DFERRY_SANITIZE=ON -DFERRY_WERROR=ON)
  # Any sanitizer report stops the process, so the test that ran it fails.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
fi
jobs=${CTEST_JOBS:-2}
run_ctest() { (cd "$FERRY_BUILD_DIR" && ctest -j"$jobs" --output-on-failure --timeout 300 "$@"); }

# The gate: the unit and fabric test binaries first (their tests need no daemon), then their tiers.
FERRY_BUILD_TARGETS="ferry_core_tests ferry_os_tests ferry_client_tests ferry_tools_tests ferry_transport_tests" "$root/scripts/build.sh" "${flags[@]}"
run_ctest -L '^(unit|fabric)$' "$@"
elapsed "the gate passed (format, types, warnings, unit and fabric tiers)"
[ "${GATE_ONLY:-0}" = 1 ] && exit 0

# The rest: everything built, every other tier.
"$root/scripts/build.sh" "${flags[@]}"
run_ctest -LE '^(unit|fabric)$' "$@"
elapsed "every ctest tier passed"
if [ "${FUZZ_SECONDS:-10}" != 0 ]; then
  FUZZ_SECONDS=${FUZZ_SECONDS:-10} "$root/scripts/fuzz.sh"
fi
elapsed "all passed"
