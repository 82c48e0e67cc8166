#!/usr/bin/env bash
# ThreadSanitizer run: build everything with -DFERRY_TSAN=ON in build-tsan/, check with a canary
# that TSan sees races between CAF actors, run the fabric tests (each case in its own process)
# and end-to-end tests against TSan-built ferryd daemons, count and classify the reports, and
# exit non-zero on any report (the canary's aside), failed test or failed canary.
# Not part of scripts/test.sh or CI: it takes a quarter of an hour on the reference machine,
# plus about 15 minutes once to build the instrumented CAF.
#
# CAF: Debian's libcaf is not built with TSan, and TSan cannot see the happens-before edges of
# CAF's lock-free mailboxes inside it, so on Debian's libcaf every message and every actor that
# changes workers is reported (docs/reliability.md, "Sanitizers"). So by default (TSAN_CAF=source)
# this script builds CAF 0.17.6 from Debian's source package with -fsanitize=thread, once, into
# build-tsan/caf/ (same version and build config as libcaf-dev, so the same headers), and runs
# the daemons on it through LD_LIBRARY_PATH. TSAN_CAF=system runs on Debian's libcaf with
# tests/tsan-system-caf.supp instead, which hides every race an actor takes part in (read its
# header): a weaker check that needs no CAF build.
#
# Environment:
#   TSAN_CAF            source (default) or system
#   E2E_FILTERS         Catch2 test specs for ferry_e2e_tests, separated by '|'
#                       (default: one transfer, 64 concurrent rooms, every [failure] case);
#                       "[e2e]" runs the whole end-to-end suite (about 2.5 minutes more)
#   TSAN_CLUSTER=1      also run the network-namespace cluster tests (root only)
#   TSAN_FABRIC_EXCLUDE fabric test names (extended regex) not run; see tests/tsan.supp
#   TSAN_LOGS           where the reports go (default build-tsan/tsan-logs; emptied first)
#   SKIP_BUILD=1        reuse build-tsan as it is
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build-tsan}
logs=${TSAN_LOGS:-$build/tsan-logs}
mode=${TSAN_CAF:-source}
e2e_filters=${E2E_FILTERS:-'one request moves KV pages*|64 concurrent rooms*|[failure]'}
fabric_exclude=${TSAN_FABRIC_EXCLUDE:-'^fabric fence a writer stopped mid-write resumes after its region was deregistered \(tcp\)$'}
caf_version=0.17.6
caf_dir=$build/caf

case "$mode" in
  source) supp_files=("$root/tests/tsan.supp") ;;
  system) supp_files=("$root/tests/tsan.supp" "$root/tests/tsan-system-caf.supp") ;;
  *) echo "tsan.sh: TSAN_CAF must be 'source' or 'system', got '$mode'" >&2; exit 2 ;;
esac

phase_start=$SECONDS
phase() {
  echo "tsan.sh: $1 ($((SECONDS - phase_start)) s since start)"
}

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  "$root/scripts/install-deps.sh"
  phase "building $build with -DFERRY_TSAN=ON"
  FERRY_BUILD_DIR=$build "$root/scripts/build.sh" -DFERRY_TSAN=ON
fi

# CAF 0.17.6 built with -fsanitize=thread, from Debian's source package (apt-get source with a
# private source list: nothing on the machine's apt configuration changes).
build_instrumented_caf() {
  local work=$caf_dir/work apt=$caf_dir/apt
  rm -rf "$work" "$apt"
  mkdir -p "$work" "$apt/lists/partial" "$apt/cache/archives/partial" "$caf_dir/lib"
  local uri suite
  uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  suite=$(awk '/^Suites:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${uri:-http://deb.debian.org/debian} ${suite:-bookworm} main" \
    >"$apt/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
              -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache")
  apt-get "${opts[@]}" update -q >"$apt/update.log" 2>&1 || { cat "$apt/update.log"; return 1; }
  # Only the upstream tarball is needed (the Debian patches only fix the build with gcc 12);
  # apt-get fails if some other file of the source package is missing, so check the tarball.
  (cd "$work" && apt-get "${opts[@]}" source --download-only actor-framework >"$apt/source.log" 2>&1) || true
  local tarball=$work/actor-framework_${caf_version}.orig.tar.gz
  [ -f "$tarball" ] || { cat "$apt/source.log"; echo "tsan.sh: no CAF $caf_version source" >&2; return 1; }
  tar -xzf "$tarball" -C "$work"
  local src=$work/actor-framework-$caf_version
  # gcc 12: receive_buffer.hpp uses std::numeric_limits without <limits> (Debian adds it too).
  grep -q '#include <limits>' "$src/libcaf_io/caf/io/network/receive_buffer.hpp" ||
    sed -i 's|#include <cstddef>|#include <cstddef>\n#include <limits>|' \
      "$src/libcaf_io/caf/io/network/receive_buffer.hpp"
  cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -g -fno-omit-frame-pointer" \
    -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread -DCAF_NO_OPENSSL=yes -DCAF_NO_PYTHON=yes \
    -DCAF_NO_TOOLS=yes -DCAF_NO_UNIT_TESTS=yes -DCAF_NO_EXAMPLES=yes -DCAF_NO_OPENCL=yes \
    -DCAF_NO_COMPILER_CHECK=yes >"$caf_dir/configure.log" 2>&1 || { cat "$caf_dir/configure.log"; return 1; }
  # Ferry compiles against /usr/include/caf: the library must have the same build config.
  local ours=$work/build/libcaf_core/caf/detail/build_config.hpp
  if ! diff <(grep '^#' "$ours") <(grep '^#' /usr/include/caf/detail/build_config.hpp) >/dev/null; then
    echo "tsan.sh: CAF build config differs from libcaf-dev's:" >&2
    diff "$ours" /usr/include/caf/detail/build_config.hpp >&2 || true
    return 1
  fi
  cmake --build "$work/build" -j2 --target libcaf_core_shared libcaf_io_shared >"$caf_dir/build.log" 2>&1 ||
    { tail -40 "$caf_dir/build.log"; return 1; }
  cp -P "$work/build/lib/"libcaf_core.so* "$work/build/lib/"libcaf_io.so* "$caf_dir/lib/"
  rm -rf "$work/build" "$apt"  # keep the source (for the stacks' file names), drop the objects
}

if [ "$mode" = source ]; then
  if [ ! -f "$caf_dir/lib/libcaf_core.so.$caf_version" ] || [ ! -f "$caf_dir/lib/libcaf_io.so.$caf_version" ]; then
    phase "building CAF $caf_version with ThreadSanitizer into $caf_dir (once)"
    build_instrumented_caf
  fi
  export LD_LIBRARY_PATH=$caf_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  grep -q "$caf_dir/lib/libcaf_core" <(ldd "$build/src/ferryd") ||
    { echo "tsan.sh: ferryd does not load $caf_dir/lib/libcaf_core" >&2; exit 2; }
fi

rm -rf "$logs"
mkdir -p "$logs/canary" "$logs/fabric" "$logs/e2e" "$logs/cluster"
# One suppressions file for TSan: concatenate the ones this mode uses.
cat "${supp_files[@]}" >"$logs/suppressions.txt"
# halt_on_error=0 and exitcode=0: reports never change a test's outcome; they are counted from
# the log files (one per process: log_path.PID). history_size=4 keeps more of the "previous
# access" stacks restorable; print_suppressions=1 records what the suppressions hid.
tsan_options() {
  echo "halt_on_error=0 exitcode=0 second_deadlock_stack=1 history_size=4 print_suppressions=1 suppressions=$logs/suppressions.txt log_path=$1"
}

count_reports() {  # directory -> number of reports in it
  cat "$1"/r.* 2>/dev/null | grep -c '^WARNING: ThreadSanitizer' || true
}

# run_under_tsan DIR LIMIT BINARY [ARGS...]: run one test binary under TSan with its reports and
# output in DIR; sets rc (the binary's exit code) and t0 (start, in SECONDS).
run_under_tsan() {
  local dir=$1 limit=$2
  shift 2
  mkdir -p "$dir"
  t0=$SECONDS
  set +e
  TSAN_OPTIONS=$(tsan_options "$dir/r") timeout "$limit" "$@" >"$dir/out" 2>&1
  rc=$?
  set -e
}

failed_tests=0
canary_failed=0
canary_state=ok

# Canary (tests/tsan/caf_canary.cpp): with this libcaf and these suppressions, does TSan report a
# real race between two actors (it must), and nothing for one actor's own state (it should)?
phase "canary"
canary=$build/tests/ferry_tsan_canary
for m in own shared; do
  mkdir -p "$logs/canary/$m"
  TSAN_OPTIONS=$(tsan_options "$logs/canary/$m/r") timeout 600 "$canary" "$m" 2000 >"$logs/canary/$m/out" 2>&1
done
own_reports=$(count_reports "$logs/canary/own")
shared_reports=$(count_reports "$logs/canary/shared")
shared_race=$(cat "$logs/canary/shared"/r.* 2>/dev/null | grep -c "Location is global '.*unlocked_counter'" || true)
echo "  one actor, own state: $own_reports reports (expected 0);" \
  "two actors, one unlocked global: $shared_reports reports, $shared_race of them that race (expected 1 and 1)"
if [ "$mode" = source ]; then
  if [ "$own_reports" -ne 0 ] || [ "$shared_race" -lt 1 ] || [ "$shared_reports" -ne "$shared_race" ]; then
    echo "tsan.sh: canary failed: TSan does not see CAF's happens-before edges, or misses actor races" >&2
    canary_failed=1
    canary_state=FAILED
  fi
elif [ "$shared_race" -lt 1 ]; then
  echo "  (TSAN_CAF=system: races between actors are not reported; see tests/tsan-system-caf.supp)"
  canary_state="blind to races between actors"
fi

# Fabric tests: every case in its own process (as ctest runs them), so forks and exits are as
# in the normal suite and each report names its case.
phase "fabric tests"
fabric_bin=$build/tests/ferry_transport_tests
i=0
while IFS= read -r name; do
  [ -n "$name" ] || continue
  if [[ "$name" =~ $fabric_exclude ]]; then
    echo "  skipped (TSAN_FABRIC_EXCLUDE): $name"
    continue
  fi
  i=$((i + 1))
  run_under_tsan "$logs/fabric/$i" 600 "$fabric_bin" "${name//,/\\,}"
  echo "$name" >"$logs/fabric/$i/name"
  n=$(count_reports "$logs/fabric/$i")
  status=ok
  if [ $rc -ne 0 ] && [ $rc -ne 4 ]; then status="FAILED rc=$rc"; failed_tests=$((failed_tests + 1)); fi
  [ $rc -eq 4 ] && status=skipped
  if [ "$n" -gt 0 ] || [ "$status" != ok ]; then
    printf '  %-8s reports=%-4s %3d s  %s\n' "$status" "$n" $((SECONDS - t0)) "$name"
  fi
done < <("$fabric_bin" --list-test-names-only)
echo "  $i fabric cases run"

phase "end-to-end tests (TSAN_CAF=$mode)"
IFS='|' read -r -a filters <<<"$e2e_filters"
j=0
for filter in "${filters[@]}"; do
  j=$((j + 1))
  run_under_tsan "$logs/e2e/$j" 1800 "$build/tests/ferry_e2e_tests" "$filter"
  echo "$filter" >"$logs/e2e/$j/name"
  [ $rc -eq 0 ] || failed_tests=$((failed_tests + 1))
  printf '  %-8s reports=%-4s %3d s  %s  (%s)\n' "$([ $rc -eq 0 ] && echo ok || echo "FAILED")" \
    "$(count_reports "$logs/e2e/$j")" $((SECONDS - t0)) "$filter" \
    "$(grep -E '^(All tests passed|test cases:)' "$logs/e2e/$j/out" | tail -1)"
done

if [ "${TSAN_CLUSTER:-0}" = 1 ]; then
  phase "cluster tests"
  run_under_tsan "$logs/cluster" 1800 "$build/tests/ferry_cluster_tests"
  [ $rc -eq 0 ] || [ $rc -eq 4 ] || failed_tests=$((failed_tests + 1))
  printf '  rc=%d reports=%s %d s  (%s)\n' $rc "$(count_reports "$logs/cluster")" $((SECONDS - t0)) \
    "$(grep -E '^(All tests passed|test cases:)' "$logs/cluster/out" | tail -1)"
fi

phase "summary"
total=0
for area in fabric e2e cluster; do
  mapfile -t files < <(find "$logs/$area" -name 'r.*' -type f)
  if [ ${#files[@]} -eq 0 ]; then
    echo " $area: no reports, nothing suppressed"
    continue
  fi
  echo " $area:"
  python3 "$root/scripts/tsan_reports.py" "${files[@]}"
  n=$(cat "${files[@]}" | grep -c '^WARNING: ThreadSanitizer' || true)
  total=$((total + n))
done
echo "tsan.sh: $total ThreadSanitizer reports, $failed_tests failed test runs," \
  "canary: $canary_state (TSAN_CAF=$mode; logs in $logs)"
if [ "$total" -gt 0 ]; then
  echo "tsan.sh: details: python3 scripts/tsan_reports.py -v \$(find $logs -name 'r.*')"
fi
[ "$total" -eq 0 ] && [ "$failed_tests" -eq 0 ] && [ "$canary_failed" -eq 0 ]
