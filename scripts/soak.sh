#!/usr/bin/env bash
# Soak (docs/reliability.md, section 11): a prefill and a decode ferryd, each in its own network
# namespace, joined through a bridge by veth links (198.18.100.0/24, the benchmarking range),
# ferry-soak driving rooms through them for SOAK_SECONDS, and chaos on a schedule:
#   - kill -9 of the prefill, restarted after RESTART_DOWN_SECONDS (every PREFILL_RESTART_SECONDS)
#   - SIGSTOP of a daemon, the prefill and the decode in turn, for STOP_DURATION, longer than the
#     heartbeat bound (every STOP_SECONDS)
#   - a link flap: a host's cable pulled (its bridge port down), alternately for FLAP_SHORT
#     (below the heartbeat bound: the rooms should survive) and FLAP_LONG (beyond it)
#     (every FLAP_SECONDS)
# No chaos in the first and last CHAOS_QUIET_SECONDS. Each daemon's memory (VmRSS, RssAnon) is
# recorded at start, every RSS_SECONDS, around each restart and at the end. Without the right to
# make network namespaces the daemons run on loopback and there are no link flaps (said so).
#
#   scripts/soak.sh                           30 minutes (SOAK_SECONDS=1800)
#   SOAK_SECONDS=60 scripts/soak.sh           a short run
#   SOAK_SECONDS=600 scripts/soak.sh --cancel-percent 20     (extra arguments go to ferry-soak)
#
# Environment (default): SOAK_SECONDS (1800), SOAK_RATE (1000 rooms/s target),
# SOAK_CONCURRENCY (64), SOAK_CANCEL_PERCENT (10), SOAK_MAX_PAGES (8), SOAK_SEED (time-based),
# PREFILL_RESTART_SECONDS (120; 0 = never), RESTART_DOWN_SECONDS (1), STOP_SECONDS (90; 0 = never),
# STOP_DURATION (2), FLAP_SECONDS (60; 0 = never), FLAP_SHORT (0.1), FLAP_LONG (2),
# CHAOS_QUIET_SECONDS (20), RSS_SECONDS (60), SOAK_NETNS (1; 0 = loopback), SOAK_LOG_LEVEL (info),
# SOAK_KEEP (0; 1 = keep the work directory with configs and logs, also kept on failure),
# FERRY_BUILD_DIR (build/; configured Release and built if needed).
#
# Exit status: ferry-soak's (0: nothing lost, corrupted or leaked), or 1 when a daemon died
# without being killed by the schedule or did not stop cleanly at the end.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build}
seconds=${SOAK_SECONDS:-1800}
restart_every=${PREFILL_RESTART_SECONDS:-120}
restart_down=${RESTART_DOWN_SECONDS:-1}
stop_every=${STOP_SECONDS:-90}
stop_for=${STOP_DURATION:-2}
flap_every=${FLAP_SECONDS:-60}
flap_short=${FLAP_SHORT:-0.1}
flap_long=${FLAP_LONG:-2}
quiet=${CHAOS_QUIET_SECONDS:-20}
rss_every=${RSS_SECONDS:-60}
log_level=${SOAK_LOG_LEVEL:-info}

ts() { date +%H:%M:%S; }
say() { echo "[soak $(ts)] $*"; }
chaos() {  # a chaos event: printed, and logged with ms timestamps to chaos.log
  say "$*"
  echo "$(date +%T.%3N) $*" >>"$work/chaos.log"
}

# --- build if needed ---
if [ ! -f "$build/CMakeCache.txt" ]; then
  say "configuring $build (Release)"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
say "building ferryd and ferry-soak in $build"
cmake --build "$build" -j2 --target ferryd ferry-soak | grep -E "error|warning|Linking" || true
[ -x "$build/src/ferryd" ] && [ -x "$build/src/ferry-soak" ] || { say "build failed"; exit 2; }

work=$(mktemp -d /tmp/ferry-soak-XXXXXX)
tag=$$
prefix="ferry-soak-$tag-"   # namespace names; the pid tells a later run whether they are stale
sw="${prefix}sw"
declare -A ns=([prefill]="" [decode]="") addr=([prefill]=127.0.0.1 [decode]=127.0.0.1)
declare -A port=() node=([prefill]="soak-prefill-$tag" [decode]="soak-decode-$tag") pid=()
made_ns=()
soak_pid=""
status=0
keep=${SOAK_KEEP:-0}

cleanup() {
  local rc=$? p name
  trap - EXIT INT TERM
  if [ -n "$soak_pid" ] && kill -0 "$soak_pid" 2>/dev/null; then
    kill -TERM "$soak_pid" 2>/dev/null || true
    wait "$soak_pid" 2>/dev/null || true
  fi
  for name in prefill decode; do
    p=${pid[$name]:-}
    [ -n "$p" ] || continue
    kill -CONT "$p" 2>/dev/null || true  # a stopped daemon must run to handle SIGTERM
    kill -TERM "$p" 2>/dev/null || true
  done
  for name in prefill decode; do
    p=${pid[$name]:-}
    [ -n "$p" ] || continue
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  rm -f /dev/shm/ferry."${node[prefill]}".* /dev/shm/ferry."${node[decode]}".*
  for ((i = ${#made_ns[@]} - 1; i >= 0; i--)); do ip netns del "${made_ns[$i]}" 2>/dev/null || true; done
  if [ "$keep" = 1 ] || [ "$rc" != 0 ]; then
    echo "[soak] configs and logs kept in $work"
  else
    rm -rf "$work"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- namespaces left by soak runs that died ---
for stale in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^ferry-soak-' || true); do
  owner=${stale#ferry-soak-}; owner=${owner%%-*}
  if ! kill -0 "$owner" 2>/dev/null; then
    for p in $(ip netns pids "$stale" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$stale" 2>/dev/null && say "removed stale namespace $stale"
  fi
done

# --- the network: two hosts on a bridge, or loopback ---
netns_ok=0
netns_error=""
make_net() {
  local i name out
  out=$(ip netns add "$sw" 2>&1) || { netns_error="ip netns add $sw: $out"; return 1; }
  made_ns+=("$sw")
  ip -n "$sw" link add br0 type bridge stp_state 0 && ip -n "$sw" link set br0 up || return 1
  i=0
  for name in prefill decode; do
    ns[$name]="${prefix}h$i"
    addr[$name]="198.18.100.$((i + 1))"
    out=$(ip netns add "${ns[$name]}" 2>&1) || { netns_error="ip netns add ${ns[$name]}: $out"; return 1; }
    made_ns+=("${ns[$name]}")
    ip -n "${ns[$name]}" link set lo up &&
      ip -n "$sw" link add "p$i" type veth peer name eth0 netns "${ns[$name]}" &&
      ip -n "$sw" link set "p$i" master br0 && ip -n "$sw" link set "p$i" up &&
      ip -n "${ns[$name]}" addr add "${addr[$name]}/24" dev eth0 &&
      ip -n "${ns[$name]}" link set eth0 up || { netns_error="veth setup of $name failed"; return 1; }
    i=$((i + 1))
  done
  for i in 0 1; do wait_forwarding "$i" || { netns_error="bridge port p$i does not forward"; return 1; }; done
}
# wait_forwarding I: bounded wait until bridge port pI forwards (STP is off: at once, normally)
wait_forwarding() {
  for _ in $(seq 200); do
    ip -n "$sw" -d link show "p$1" | grep -q "state forwarding" && return 0
    sleep 0.05
  done
  return 1
}
free_port() {  # a TCP port on 127.0.0.1 nothing listens on
  local p
  while :; do
    p=$((20000 + RANDOM % 30000))
    ss -Hltn "sport = :$p" | grep -q . || { echo "$p"; return; }
  done
}
if [ "${SOAK_NETNS:-1}" = 1 ] && make_net; then
  netns_ok=1
  port[prefill]=7400; port[decode]=7400
  say "network: prefill in ${ns[prefill]} (${addr[prefill]}), decode in ${ns[decode]} (${addr[decode]}), bridge in $sw; link flaps on"
else
  [ "${SOAK_NETNS:-1}" = 1 ] || netns_error="SOAK_NETNS=0"
  for ((i = ${#made_ns[@]} - 1; i >= 0; i--)); do ip netns del "${made_ns[$i]}" 2>/dev/null || true; done
  made_ns=()
  ns[prefill]=""; ns[decode]=""; addr[prefill]=127.0.0.1; addr[decode]=127.0.0.1
  port[prefill]=$(free_port); port[decode]=$(free_port)
  say "network: LOOPBACK, no link flaps (no network namespaces: ${netns_error:-unknown error})"
fi

# --- daemon configs: small pools and states (rate over realism), short timeouts ---
make_config() {  # NAME ROLE
  local name=$1 role=$2
  cat >"$work/$name.yaml" <<EOF
node:
  name: ${node[$name]}
role: $role
listen:
  control: ${addr[$name]}:${port[$name]}
  client: $work/$name.sock
fabric:
  provider: tcp
  address: ${addr[$name]}
  max_inflight_writes: 64
  write_piece_bytes: 262144
  staging_bytes: 4194304
timeouts:
  handshake_ms: 3000
  bootstrapping_ms: 5000
  waiting_for_input_ms: 5000
  transferring_ms: 5000
  transfer_ms: 10000
  drain_ms: 1000
  heartbeat_ms: 200
  heartbeat_misses: 3
limits:
  max_active_rooms: 4096
log:
  level: $log_level
pools:
  kv:
    layer_ids: [3, 7]
    page_tokens: 1
    kv_heads: 2
    head_dim: 64
    dtype_bytes: 2
    pages: 8192
  mamba:
    slots: 256
    layer_ids: [0, 1, 2]
    tensors:
      - name: conv
        shape: [256, 3]
        dtype_bytes: 2
        slice_axis: 0
      - name: temporal
        shape: [4, 32, 32]
        dtype_bytes: 4
        slice_axis: 0
  aux:
    rows: 256
    row_bytes: 256
EOF
}
make_config prefill prefill
make_config decode decode

# start_daemon NAME: run ferryd (in its namespace), wait (bounded) for its ready line
start_daemon() {
  local name=$1 line="" fifo="$work/$1.ready"
  rm -f "$fifo"; mkfifo "$fifo"
  echo "=== start $(date +%T.%N) ===" >>"$work/$name.log"
  if [ -n "${ns[$name]}" ]; then
    ip netns exec "${ns[$name]}" "$build/src/ferryd" --config "$work/$name.yaml" --ready-fd 3 \
      3>"$fifo" >>"$work/$name.log" 2>&1 &
  else
    "$build/src/ferryd" --config "$work/$name.yaml" --ready-fd 3 3>"$fifo" >>"$work/$name.log" 2>&1 &
  fi
  pid[$name]=$!
  read -r -t 30 line <"$fifo" || true
  rm -f "$fifo"
  if [ "$line" != ready ]; then
    say "$name did not start; the end of its log:"
    tail -20 "$work/$name.log" >&2
    return 1
  fi
}

# rss NAME: "VmRSS/RssAnon kB" of the daemon, from /proc
rss() {
  local p=${pid[$1]:-}
  awk '/^VmRSS:/ {r=$2} /^RssAnon:/ {a=$2} END {if (r) printf "%s/%s", r, a; else printf "-"}' \
    "/proc/$p/status" 2>/dev/null || echo -
}
rss_log() {  # WHEN
  echo "$(ts) $1 prefill=$(rss prefill) decode=$(rss decode)" >>"$work/rss.log"
}

start_daemon prefill
start_daemon decode
rss_log start
rss_start_prefill=$(rss prefill)
rss_start_decode=$(rss decode)
say "prefill pid ${pid[prefill]} rss(VmRSS/RssAnon kB) $rss_start_prefill; decode pid ${pid[decode]} rss $rss_start_decode"

# --- the soak ---
soak_args=(--prefill-socket "$work/prefill.sock" --decode-socket "$work/decode.sock"
  --prefill-control "${addr[prefill]}:${port[prefill]}" --seconds "$seconds"
  --rate "${SOAK_RATE:-1000}" --concurrency "${SOAK_CONCURRENCY:-64}"
  --cancel-percent "${SOAK_CANCEL_PERCENT:-10}" --max-pages "${SOAK_MAX_PAGES:-8}"
  --progress-seconds "${SOAK_PROGRESS_SECONDS:-10}")
[ -z "${SOAK_SEED:-}" ] || soak_args+=(--seed "$SOAK_SEED")
every() { [ "$1" -gt 0 ] && echo "every ${1}s" || echo "never"; }
say "chaos: prefill kill -9 $(every "$restart_every") (down ${restart_down}s); SIGSTOP $(every "$stop_every") for ${stop_for}s; $([ $netns_ok = 1 ] && echo "link flap $(every "$flap_every") (${flap_short}s / ${flap_long}s)" || echo "no link flaps"); quiet ${quiet}s at both ends"
"$build/src/ferry-soak" "${soak_args[@]}" "$@" > >(tee "$work/soak.log") 2>&1 &
soak_pid=$!

restarts=0 stops_p=0 stops_d=0 flaps_short=0 flaps_long=0 crashes=0 next_stop_target=prefill flap_turn=0
restart_rss=()
t0=$(date +%s)
# first occurrences staggered so two kinds of chaos rarely meet
next_restart=$((restart_every > 0 ? quiet + restart_every / 2 : 1 << 30))
next_stop=$((stop_every > 0 ? quiet + stop_every / 3 : 1 << 30))
next_flap=$((flap_every > 0 && netns_ok == 1 ? quiet + flap_every / 4 : 1 << 30))
next_rss=$rss_every
chaos_end=$((seconds - quiet))

check_alive() {  # a daemon that died without being killed by the schedule is a bug: say so, restart it
  local name
  for name in prefill decode; do
    if ! kill -0 "${pid[$name]}" 2>/dev/null; then
      local st=0
      wait "${pid[$name]}" || st=$?
      crashes=$((crashes + 1))
      say "DAEMON DIED: $name (pid ${pid[$name]}, status $st) was not killed by the schedule; the end of its log:"
      tail -30 "$work/$name.log"
      rm -f /dev/shm/ferry."${node[$name]}".*
      start_daemon "$name"
    fi
  done
}

while kill -0 "$soak_pid" 2>/dev/null; do
  t=$(($(date +%s) - t0))
  if ((t >= next_rss)); then rss_log "t=${t}s"; next_rss=$((next_rss + rss_every)); fi
  if ((t < chaos_end)); then
    if ((t >= next_restart)); then
      before=$(rss prefill)
      chaos "chaos t=${t}s: kill -9 prefill (pid ${pid[prefill]}, rss $before), down ${restart_down}s"
      kill -KILL "${pid[prefill]}"
      wait "${pid[prefill]}" 2>/dev/null || true
      rm -f /dev/shm/ferry."${node[prefill]}".*   # a killed daemon cannot unlink its pools
      sleep "$restart_down"
      start_daemon prefill
      restarts=$((restarts + 1))
      restart_rss+=("$before->$(rss prefill)")
      rss_log "restart $restarts (prefill before kill $before)"
      chaos "chaos: prefill restarted (pid ${pid[prefill]}, rss $(rss prefill))"
      next_restart=$((next_restart + restart_every))
    elif ((t >= next_stop)); then
      target=$next_stop_target
      chaos "chaos t=${t}s: SIGSTOP $target for ${stop_for}s"
      kill -STOP "${pid[$target]}"
      sleep "$stop_for"
      kill -CONT "${pid[$target]}"
      chaos "SIGCONT $target"
      if [ "$target" = prefill ]; then stops_p=$((stops_p + 1)); next_stop_target=decode
      else stops_d=$((stops_d + 1)); next_stop_target=prefill; fi
      next_stop=$((next_stop + stop_every))
    elif ((t >= next_flap)); then
      if ((flap_turn % 2 == 0)); then d=$flap_short; flaps_short=$((flaps_short + 1))
      else d=$flap_long; flaps_long=$((flaps_long + 1)); fi
      p=$((flap_turn / 2 % 2))   # alternate hosts: p0 prefill, p1 decode, per pair of flaps
      chaos "chaos t=${t}s: link flap, port p$p down for ${d}s"
      ip -n "$sw" link set "p$p" down
      sleep "$d"
      ip -n "$sw" link set "p$p" up
      wait_forwarding "$p" || say "bridge port p$p does not forward again!"
      chaos "port p$p up and forwarding"
      flap_turn=$((flap_turn + 1))
      next_flap=$((next_flap + flap_every))
    fi
  fi
  check_alive
  sleep 0.5
done
soak_status=0
wait "$soak_pid" || soak_status=$?
soak_pid=""
check_alive
rss_log end
rss_end_prefill=$(rss prefill)
rss_end_decode=$(rss decode)
cpu() { ps -o time= -p "${pid[$1]}" 2>/dev/null | tr -d ' '; }
cpu_end="prefill $(cpu prefill) (its last instance), decode $(cpu decode)"

# --- stop the daemons: they must exit cleanly ---
for name in prefill decode; do kill -TERM "${pid[$name]}"; done
for name in prefill decode; do
  st=0
  wait "${pid[$name]}" || st=$?
  if [ "$st" != 0 ]; then say "$name exited with status $st on SIGTERM"; status=1; fi
  pid[$name]=""
done
((crashes == 0)) || status=1

echo
say "memory (VmRSS/RssAnon kB) over time:"
sed 's/^/    /' "$work/rss.log"
say "prefill restarts (rss before kill -> new instance): ${restart_rss[*]:-none}"
echo "SOAK_CHAOS netns=$netns_ok prefill_restarts=$restarts stops_prefill=$stops_p stops_decode=$stops_d flaps_short=$flaps_short flaps_long=$flaps_long unexpected_daemon_deaths=$crashes"
echo "SOAK_RSS decode_start=$rss_start_decode decode_end=$rss_end_decode prefill_start=$rss_start_prefill prefill_end=$rss_end_prefill (VmRSS/RssAnon kB)"
echo "SOAK_CPU $cpu_end (cumulative cpu time, [dd-]hh:mm:ss)"
echo "SOAK_LOGS $(du -sh "$work" | cut -f1) in $work (daemon logs: $(wc -l <"$work/prefill.log") + $(wc -l <"$work/decode.log") lines)"
if [ "$soak_status" != 0 ]; then status=$soak_status; fi
exit "$status"
