#!/usr/bin/env bash
# The cost of Ferry's metrics, counted rather than timed: run one side of a small-room pair under
# valgrind's callgrind (the other side runs natively), with /metrics served and scraped once a
# second, and report the share of that ferryd's instructions spent updating the metrics
# (daemon_metrics' update calls, inclusive) and serving a scrape. Instruction counts do not
# depend on what else the machine is doing; they cover user space only, so the share of the
# whole CPU (kernel copies and syscalls included) is smaller still.
#
#   scripts/metrics-cost.sh            both sides, 512 rooms of 16 tokens each
#   REQUESTS=2048 scripts/metrics-cost.sh
# Assumes a built tree (scripts/build.sh) and valgrind (Debian's valgrind package).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FERRY_BUILD_DIR:-$root/build}
command -v valgrind >/dev/null || { echo "metrics-cost: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
source "$root/scripts/pair-lib.sh"
small=(--set "pools.mamba.layer_ids=[0,1]" --set "pools.mamba.tensors[0].shape=[2048,3]"
       --set "pools.mamba.tensors[0].shard_groups=[512,512,1024]"
       --set "pools.mamba.tensors[1].shape=[4,32,64]" --set pools.mamba.slots=128
       --set pools.aux.rows=128 --set fabric.provider=tcp --set pools.kv.page_tokens=1
       --set pools.kv.pages=4096 --set timeouts.handshake_ms=60000)
native=$build
for side in prefill decode; do
  # A ferryd that runs itself under callgrind, for the side measured.
  wrapped="$ferry_work/wrapped-$side"
  mkdir -p "$wrapped/src"
  out="$ferry_work/callgrind.$side"
  printf '#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file=%s %s/src/ferryd "$@"\n' \
    "$out" "$native" >"$wrapped/src/ferryd"
  chmod +x "$wrapped/src/ferryd"
  for name in prefill decode; do
    port=$([ $name = prefill ] && echo 7711 || echo 7712)
    mport=$([ $name = prefill ] && echo 9574 || echo 9575)
    build=$native
    [ $name = $side ] && build=$wrapped
    ferry_start $name "$root/configs/$name.yaml" "${small[@]}" --set "listen.control=127.0.0.1:$port" \
      --set "listen.client=$ferry_work/$name.sock" --set "listen.metrics=127.0.0.1:$mport" \
      --set "node.name=cost-$name"
  done
  build=$native
  /usr/bin/python3 -c '
import time, urllib.request
for _ in range(3600):
    for port in (9574, 9575):
        try: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()
        except OSError: pass
    time.sleep(1)' &
  scraper=$!
  "$build/src/ferry-bench" --prefill-socket "$ferry_work/prefill.sock" \
    --decode-socket "$ferry_work/decode.sock" --prompt-tokens 16 --requests "${REQUESTS:-512}" \
    --concurrency 16 --no-baseline >/dev/null 2>&1
  kill $scraper 2>/dev/null || true
  wait $scraper 2>/dev/null || true
  ferry_stop_all || true
  /usr/bin/python3 - "$side" "$out" "${REQUESTS:-512}" <<'PY'
import re, subprocess, sys
side, path, rooms = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100",
                       "--tree=caller", path], capture_output=True, text=True).stdout
total = int(re.search(r"^([\d,]+) .*PROGRAM TOTALS", text, re.M).group(1).replace(",", ""))
updates, scrape, scrapes = 0, 0, 0
# In the caller tree, a function's own line is marked '*' (its callers '<'): the update calls'
# inclusive costs, a scrape's handler (serve: snapshot, exposition, reply), and how often
# the exposition was called.
for m in re.finditer(r"^ *([\d,]+) \([ \d.]+%\)  \*  /\S*metrics\.cpp:ferry::daemon_metrics::"
                     r"(room_ended|phase|writes_posted|writes_completed|writes_landed)\(", text, re.M):
    updates += int(m.group(1).replace(",", ""))
m = re.search(r"^ *([\d,]+) \([ \d.]+%\)  \*  /\S*http_server\.cpp:ferry::\(anonymous "
              r"namespace\)::serve\(", text, re.M)
if m: scrape = int(m.group(1).replace(",", ""))
# A function's callers are the '<' lines right above its own: their call counts add up.
lines = text.splitlines()
for i, line in enumerate(lines):
    if re.search(r"\*  /\S*metrics\.cpp:ferry::daemon_metrics::exposition", line):
        j = i - 1
        while j >= 0 and "  < " in lines[j]:
            c = re.search(r"\((\d+)x\)\s*$", lines[j])
            scrapes += int(c.group(1)) if c else 0
            j -= 1
        break
print(f"{side}: {total:,} instructions for {rooms} rooms; metric updates {updates:,} "
      f"({100.0 * updates / total:.2f} %, {updates // rooms} per room); "
      f"{scrapes} scrapes served, {scrape // max(scrapes, 1):,} instructions each")
PY
done
