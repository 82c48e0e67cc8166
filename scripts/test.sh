#!/usr/bin/env bash
# Install what is missing, build, and run every test (unit, fabric, end-to-end) under ctest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
cd "${FERRY_BUILD_DIR:-$root/build}"
ctest --output-on-failure --timeout 300 "$@"
