# Sourced by demo.sh and bench.sh: start ferryd daemons and wait (bounded) for their ready line,
# stop them on exit. Needs $build (the build directory).
ferry_work=$(mktemp -d /tmp/ferry-run-XXXXXX)
ferry_pids=()

ferry_cleanup() {
  for pid in "${ferry_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${ferry_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$ferry_work"
}
trap ferry_cleanup EXIT

# ferry_start NAME CONFIG [FERRYD_ARGS...]: run ferryd with CONFIG (and e.g. --set key=value
# overrides); fail with its log if it is not ready in FERRY_READY_S seconds (30; pools of
# gigabytes take a while to reserve on a loaded machine).
ferry_start() {
  local name=$1 config=$2 line=""
  shift 2
  rm -f "$ferry_work/$name.ready"
  mkfifo "$ferry_work/$name.ready"
  "$build/src/ferryd" --config "$config" "$@" --ready-fd 3 3>"$ferry_work/$name.ready" \
    >"$ferry_work/$name.log" 2>&1 &
  ferry_pids+=($!)
  read -r -t "${FERRY_READY_S:-30}" line <"$ferry_work/$name.ready" || true
  if [ "$line" != "ready" ]; then
    echo "$name did not start; its log:" >&2
    cat "$ferry_work/$name.log" >&2
    exit 1
  fi
}

# ferry_stop_all: SIGTERM every daemon and wait; returns non-zero if one did not exit cleanly.
ferry_stop_all() {
  local status=0 pid
  for pid in "${ferry_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${ferry_pids[@]}"; do wait "$pid" || status=$?; done
  ferry_pids=()
  return $status
}
