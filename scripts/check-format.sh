#!/usr/bin/env bash
# Fail when a C++ source differs from what clang-format makes of it with the committed
# .clang-format (Debian 12's clang-format 14). `scripts/check-format.sh --fix` rewrites them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if ! command -v clang-format >/dev/null; then
  echo "check-format: clang-format is missing (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cpp' '*.hpp')
else
  mapfile -t files < <(find actors clients src tests transport -name '*.cpp' -o -name '*.hpp')
fi
if [ "${1:-}" = --fix ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
# ctest splits a discovered test's name at ';' into two tests that match nothing.
if grep -nE 'TEST_CASE\("[^"]*;' tests -r --include='*.cpp'; then
  echo "check-format: a Catch2 test name above holds ';', which ctest splits (use 'and' or ',')" >&2
  exit 1
fi
report=$(mktemp)
trap 'rm -f "$report"' EXIT
if ! clang-format --dry-run -Werror "${files[@]}" 2>"$report"; then
  grep -E '^[^ ].*(warning|error):' "$report" | cut -d: -f1 | sort | uniq -c >&2
  echo "check-format: the files above are not formatted (scripts/check-format.sh --fix)" >&2
  exit 1
fi
echo "check-format: ${#files[@]} files formatted"
