#!/usr/bin/env bash
# Build the libFuzzer targets with clang (ASan + UBSan) in build-fuzz and run each one for a
# bounded time from seeds made of configs/, keeping the corpus in build-fuzz/corpus/.
#
#   scripts/fuzz.sh                        every target, FUZZ_SECONDS (20) each
#   FUZZ_SECONDS=600 scripts/fuzz.sh fuzz_config
# A crash, leak or sanitizer report fails the script and leaves the input in build-fuzz/crash-*.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_FUZZ_DIR:-$root/build-fuzz}
seconds=${FUZZ_SECONDS:-20}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_protocol fuzz_config fuzz_geometry fuzz_preamble fuzz_registration
  fuzz_peer_wire)

CXX=clang++ cmake -S "$root" -B "$build" -DFERRY_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j2 --target fuzzers

seeds="$build/seeds"
mkdir -p "$seeds/fuzz_protocol" "$seeds/fuzz_config" "$seeds/fuzz_geometry" "$seeds/fuzz_preamble" \
  "$seeds/fuzz_registration" "$seeds/fuzz_peer_wire"
cp "$root"/configs/*.yaml "$seeds/fuzz_config/"
{ cat "$root/configs/prefill.yaml"; printf '\n---8<---\n'; cat "$root/configs/decode.yaml"; } \
  >"$seeds/fuzz_geometry/pair.yaml"
# A hello frame (type 1, seq 1, version 2, name "x"), sliced 7 bytes at a time.
printf '\x06\x09\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x02\x00\x01\x00\x00\x00x' \
  >"$seeds/fuzz_protocol/hello.bin"

# Peer preamble: a HELLO without a secret (node "decode-0") followed by a PROOF, as a peer
# sends them, and a BASP client handshake header claiming a 0xFFFFFFFF payload.
{
  printf 'FERRY-PP\x00\x02H\x00'; head -c 32 /dev/zero; printf 'decode-0'; head -c 124 /dev/zero
  printf 'FERRY-PP\x00\x02P\x00'; head -c 36 /dev/zero
} >"$seeds/fuzz_preamble/hello-proof.bin"
{ printf '\x01\x00\x00\x00\xff\xff\xff\xff'; head -c 24 /dev/zero; } >"$seeds/fuzz_preamble/basp.bin"
# One descriptor of 1 MiB; an aux pool (2) of two buffers at offsets 100 and 4000, 8 rows of 64
# bytes each, room id in buffer 1 (v7 register_memory body).
{
  printf '\x00\x00\x00\x10\x00\x00\x00\x00\x00'
  printf '\x02\x00\x01\x00\x00\x00\x02\x00\x00\x00'
  for b in 'd\x00' '\xa0\x0f'; do
    printf '\x00\x00\x00\x00'"$b"'\x00\x00\x00\x00\x00\x00'
    printf '\x40\x00\x00\x00\x00\x00\x00\x00\x08\x00\x00\x00\x00\x00\x00\x00'
    printf '\x00\x00\x00\x00\x00\x00\x00\x00\x04'
    head -c 16 /dev/zero; printf '\x00\x00'
  done
  printf '\x00\x00\x00\x00\x01\x00\x00\x00'
} >"$seeds/fuzz_registration/aux.bin"

# Peer channel: a peer_prepare header (kind 4) and body (room 7, token 9, pages 1 and 2, slot
# 3, row 4, no staging, no prefix), and a peer_outcome (kind 8) with reason "x".
{
  printf '\x30\x00\x00\x00\x04\x00\x00\x00'; head -c 8 /dev/zero
  printf '\x07\x00\x00\x00\x00\x00\x00\x00\x09\x00\x00\x00\x00\x00\x00\x00'
  printf '\x02\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00\x04\x00\x00\x00'
  printf '\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00'
} >"$seeds/fuzz_peer_wire/prepare.bin"
{
  printf '\x19\x00\x00\x00\x08\x00\x00\x00'; head -c 8 /dev/zero
  printf '\x07\x00\x00\x00\x00\x00\x00\x00\x09\x00\x00\x00\x00\x00\x00\x00\x01\x00'
  printf '\x01\x00\x00\x00x\x05\x00'
} >"$seeds/fuzz_peer_wire/outcome.bin"

status=0
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"
  mkdir -p "$corpus"
  echo "=== $t: ${seconds} s"
  if ! "$build/tests/fuzz/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$build/crash-$t-" "$corpus" "$seeds/$t" 2>"$build/$t.log"; then
    echo "fuzz: $t failed; see $build/$t.log and $build/crash-$t-*" >&2
    tail -30 "$build/$t.log" >&2
    status=1
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|DONE" "$build/$t.log" | tr '\n' ' '
  echo
done
exit $status
