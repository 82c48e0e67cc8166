#!/usr/bin/env bash
# Start one of the example clusters of configs/examples/ in network namespaces, one namespace
# per host on one bridge (10.77.0.0/24, the addresses the configs name), each ferryd from its
# config file as is; move verified rooms through it with ferryctl (fill, prepare, send, wait,
# verify every destination byte); stop every daemon with SIGTERM and check each exits 0.
#
#   scripts/example-cluster.sh two-hosts      1 prefill -> 1 decode, a host each
#   scripts/example-cluster.sh tp-mismatch    a TP-2 prefill (2 hosts) -> a TP-1 decode
#   ROOMS=8 scripts/example-cluster.sh two-hosts
#
# Root only (ip netns). Exit 0: every room verified; 1: a step failed (it says which);
# 77: this machine cannot make network namespaces. FERRY_BUILD_DIR: the build (build/).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build}
name=${1:-}
rooms=${ROOMS:-4}
case "$name" in
  two-hosts) prefills=(prefill) decode=decode ;;
  tp-mismatch) prefills=(prefill-rank0 prefill-rank1) decode=decode ;;
  *) echo "usage: $0 two-hosts|tp-mismatch (see configs/examples/)" >&2; exit 2 ;;
esac
dir=$root/configs/examples/$name
hosts=("${prefills[@]}" "$decode")
say() { echo "example-cluster: $*"; }

if [ "$(id -u)" -ne 0 ]; then say "skipped: needs root for ip netns"; exit 77; fi
tag=fx$$                       # namespaces of this run: fx<pid>-sw, fx<pid>-h0, ...
work=$(mktemp -d /tmp/ferry-example-XXXXXX)
# The configs take their client sockets' directory from FERRY_RUN_DIR (listen.client:
# ${FERRY_RUN_DIR}/...): this run's own, so runs side by side never share a socket.
export FERRY_RUN_DIR=$work
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; kill -INT "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$tag-" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

if ! ip netns add "$tag-sw" 2>"$work/netns.err"; then
  say "skipped: cannot make a network namespace: $(cat "$work/netns.err")"
  exit 77
fi
ip -n "$tag-sw" link add br0 type bridge stp_state 0
ip -n "$tag-sw" link set br0 up
for i in "${!hosts[@]}"; do
  ns=$tag-h$i
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$tag-sw" link add "p$i" type veth peer name eth0 netns "$ns"
  ip -n "$tag-sw" link set "p$i" master br0
  ip -n "$tag-sw" link set "p$i" up
  ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev eth0
  ip -n "$ns" link set eth0 up
done

config_value() {  # config_value FILE KEY: the first "  KEY: value" of a config, comment cut,
  local v        # ${FERRY_RUN_DIR} expanded as ferryd expands it
  v=$(sed -n "s/^  $2: *\([^ #]*\).*/\1/p" "$1" | head -1)
  echo "${v//'${FERRY_RUN_DIR}'/$FERRY_RUN_DIR}"
}
start() {  # start I HOST: ferryd of configs/examples/NAME/HOST.yaml in namespace I
  local i=$1 host=$2 line=""
  mkfifo "$work/$host.ready"
  ip netns exec "$tag-h$i" "$build/src/ferryd" --config "$dir/$host.yaml" --ready-fd 3 \
    3>"$work/$host.ready" >"$work/$host.log" 2>&1 &
  pids+=($!)
  read -r -t 60 line <"$work/$host.ready" || true
  if [ "$line" != ready ]; then say "FAIL: $host did not start; its log:"; cat "$work/$host.log"; exit 1; fi
  say "$host ready on $(config_value "$dir/$host.yaml" control) (namespace $tag-h$i)"
}
for i in "${!hosts[@]}"; do start "$i" "${hosts[$i]}"; done

ctl() { "$build/src/ferryctl" "$@"; }
dsock=$(config_value "$dir/$decode.yaml" client)
peers=()
for p in "${prefills[@]}"; do peers+=(--peer "$(config_value "$dir/$p.yaml" control)"); done
for r in $(seq 1 "$rooms"); do
  room=$((7000 + r))
  src="$(( (r - 1) * 64 ))-$(( r * 64 - 1 ))" dst="$(( 1000 + (r - 1) * 64 ))-$(( 1000 + r * 64 - 1 ))"
  slot=$(( (r - 1) % 4 )) row=$(( (r - 1) % 16 ))
  for p in "${prefills[@]}"; do
    ctl -s "$(config_value "$dir/$p.yaml" client)" fill -r "$room" -p "$src" --state-slot "$slot" \
      --aux-row "$row" >/dev/null
  done
  ctl -s "$dsock" prepare -r "$room" "${peers[@]}" -p "$dst" --state-slot "$slot" --aux-row "$row" >/dev/null
  for p in "${prefills[@]}"; do
    ctl -s "$(config_value "$dir/$p.yaml" client)" send -r "$room" -p "$src" --last \
      --state-slot "$slot" --aux-row "$row" >/dev/null
  done
  if ! ctl -s "$dsock" wait -r "$room" --timeout-ms 30000 >"$work/wait.out"; then
    say "FAIL: room $room did not succeed: $(tail -1 "$work/wait.out")"; exit 1
  fi
  if ! ctl -s "$dsock" verify -r "$room" -p "$dst" --state-slot "$slot" --aux-row "$row" >"$work/verify.out" 2>&1; then
    say "FAIL: room $room: $(cat "$work/verify.out")"; exit 1
  fi
  say "room $room: Success, every destination byte verified ($(tail -1 "$work/verify.out"))"
done

status=0
for i in "${!pids[@]}"; do
  kill -TERM "${pids[$i]}"
  if wait "${pids[$i]}"; then :; else st=$?; say "FAIL: ${hosts[$i]} exited $st on SIGTERM"; status=1; fi
done
pids=()
[ "$status" = 0 ] && say "PASS: $name, $rooms rooms through ${#prefills[@]} prefill rank(s), verified byte for byte; every daemon exited 0"
exit "$status"
