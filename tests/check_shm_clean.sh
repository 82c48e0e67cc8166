#!/usr/bin/env bash
# Usage: check_shm_clean.sh before|after STATE_FILE
# Run around the tests that start daemons (ctest fixtures): `before` records the objects of dead
# ferryd instances already in /dev/shm; `after` fails if the tests left new ones behind. An
# object belongs to a dead instance when its instance lock is missing or held by nobody
# (flock -n succeeds); live daemons (a demo running beside the tests) are left alone.
set -euo pipefail
mode=$1 state=$2
dead_objects() {
  shopt -s nullglob
  for f in /dev/shm/ferry.*.kv /dev/shm/ferry.*.state /dev/shm/ferry.*.aux /dev/shm/ferry.*.lock; do
    local lock=${f%.*}.lock
    if [ ! -e "$lock" ] || flock -n "$lock" true; then echo "$f"; fi
  done | sort
}
if [ "$mode" = before ]; then
  dead_objects > "$state"
  echo "$(wc -l < "$state") object(s) of dead ferryd instances were in /dev/shm before the tests"
  exit 0
fi
[ -f "$state" ] || : > "$state"
new=$(comm -13 "$state" <(dead_objects))
if [ -n "$new" ]; then
  echo "the tests left shared-memory objects of dead ferryd instances behind:"
  echo "$new" | sed 's/^/  /'
  exit 1
fi
echo "no shared-memory object of a dead ferryd was left in /dev/shm by the tests"
