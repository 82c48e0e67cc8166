#!/usr/bin/env bash
# The install as an engine sees it (ctest, label install; docs/install.md):
#   run.sh package BUILD_DIR CXX [FLAGS]: `cmake --install` the build into a temporary prefix,
#     check the layout, configure and build tests/install/ with find_package(Ferry) against that
#     prefix alone, check that neither its link line, its binary (ldd) nor the exported targets
#     reach yaml-cpp, spdlog or OpenSSL, and move one room between an installed ferryd pair
#     with it, checking every destination byte; then the installed Python client imports.
#   run.sh unit BUILD_DIR: `systemd-analyze verify` the installed ferryd@.service (exit 77,
#     skipped, where systemd-analyze is missing or cannot verify a unit here at all).
#   run.sh docs BUILD_DIR: install the docs component alone (nothing built needed) and check
#     that every relative link of every installed doc resolves in the installed tree: the
#     Grafana dashboard, the example cluster configs, ... are installed where the docs say.
# FLAGS: compile and link flags the probe needs to link the build's library (the sanitizers).
set -euo pipefail
mode=$1 build=$2
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d /tmp/ferry-install-XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  [ "${FERRY_KEEP_TEST_DIRS:-0}" = 1 ] || rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

prefix=$tmp/prefix

if [ "$mode" = docs ]; then
  cmake --install "$build" --prefix "$prefix" --component docs > "$tmp/install.log" ||
    fail "cmake --install --component docs: $(cat "$tmp/install.log")"
  python3 - "$prefix/share/doc/ferry" <<'PY' || fail "links of the installed docs do not resolve (above)"
import pathlib, re, sys
root = pathlib.Path(sys.argv[1])
link, fence = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)"), re.compile(r"^\s*(```|~~~)")
docs = sorted(root.rglob("*.md"))
assert len(docs) > 10, f"only {len(docs)} docs installed under {root}"
bad, checked = [], 0
for doc in docs:
    fenced = False
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        if fence.match(line):
            fenced = not fenced
            continue
        for target in [] if fenced else link.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL, or an anchor of the same doc
            checked += 1
            if not (doc.parent / target.split("#")[0]).exists():
                bad.append(f"{doc.relative_to(root)}:{n}: {target}")
print("\n".join(bad) or f"ok: {checked} relative links of {len(docs)} installed docs resolve")
sys.exit(1 if bad else 0)
PY
  for f in docs/grafana/ferry.json configs/examples/two-hosts/prefill.yaml; do
    [ -e "$prefix/share/doc/ferry/$f" ] || fail "cmake --install did not install $f"
  done
  exit 0
fi

cmake --install "$build" --prefix "$prefix" > "$tmp/install.log" || fail "cmake --install: $(cat "$tmp/install.log")"
unit=$prefix/lib/systemd/system/ferryd@.service

if [ "$mode" = unit ]; then
  if ! command -v systemd-analyze > /dev/null; then
    echo "SKIPPED: systemd-analyze is not installed"; exit 77
  fi
  # A unit known to be good first: where even it cannot be verified (no systemd in this
  # container, say), verifying ours would prove nothing.
  mkdir -p "$tmp/units"
  printf '[Unit]\nDescription=control\n[Service]\nType=oneshot\nExecStart=/bin/true\n' \
    > "$tmp/units/ferry-control.service"
  if ! out=$(systemd-analyze verify "$tmp/units/ferry-control.service" 2>&1); then
    echo "SKIPPED: systemd-analyze cannot verify units here: $out"; exit 77
  fi
  # An instance of the template, as `systemctl start ferryd@prefill` would load it.
  cp "$unit" "$tmp/units/ferryd@prefill.service"
  out=$(systemd-analyze verify "$tmp/units/ferryd@prefill.service" 2>&1) ||
    fail "systemd-analyze verify ferryd@.service: $out"
  # verify exits 0 on some problems and only prints them.
  [ -z "$out" ] || fail "systemd-analyze verify ferryd@.service printed: $out"
  grep -qx "ExecStart=$prefix/bin/ferryd --config /etc/ferry/%i.yaml" "$unit" ||
    fail "ExecStart does not name the installed ferryd: $(grep ExecStart "$unit")"
  grep -qx 'Type=notify' "$unit" || fail "the unit is not Type=notify"
  echo "ok: systemd-analyze verify passes $unit"
  exit 0
fi

[ "$mode" = package ] || fail "unknown mode '$mode' (package, unit or docs)"
cxx=$3 flags=${4:-}
for f in bin/ferryd bin/ferryctl bin/ferry-bench include/ferry/client.hpp \
         include/ferry/engine_memory.hpp include/ferry/event_queue.hpp include/ferry/core/protocol.hpp \
         lib/python3/dist-packages/ferry/__init__.py lib/python3/dist-packages/ferry_client.py \
         lib/systemd/system/ferryd@.service share/ferry/configs/prefill.yaml \
         share/ferry/configs/decode.yaml share/ferry/configs/examples/two-hosts/decode.yaml \
         share/ferry/configs/sglang-prefill.yaml share/ferry/configs/sglang-decode.yaml \
         share/doc/ferry/docs/operations.md share/doc/ferry/docs/grafana/ferry.json \
         share/doc/ferry/docs/prometheus/ferry-rules.yml; do
  [ -e "$prefix/$f" ] || fail "cmake --install did not install $f"
done
config=$(find "$prefix" -name FerryConfig.cmake)
[ -n "$config" ] || fail "no FerryConfig.cmake under $prefix"
if grep -rnE '#include *[<"](yaml-cpp|spdlog|openssl|fmt)/' "$prefix/include"; then
  fail "an installed header includes yaml-cpp, spdlog, OpenSSL or fmt (above)"
fi

# The engine's build: this build's compiler, the prefix and nothing of the source tree.
cmake -S "$here" -B "$tmp/probe" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
  > "$tmp/probe-configure.log" 2>&1 || fail "configure: $(cat "$tmp/probe-configure.log")"
grep 'INTERFACE_LINK_LIBRARIES' "$tmp/probe-configure.log"
cmake --build "$tmp/probe" --verbose > "$tmp/probe-build.log" 2>&1 ||
  fail "build: $(cat "$tmp/probe-build.log")"
link=$(grep -E -- '-o ferry_install_probe( |$)' "$tmp/probe-build.log") ||
  fail "no link line for ferry_install_probe in: $(cat "$tmp/probe-build.log")"
echo "link line: $link"
if grep -qE 'yaml|spdlog|ssl|crypto' <<< "$link"; then fail "the link line reaches the daemon's libraries"; fi
if grep -qE "$(cd "$here/../.." && pwd)" <<< "$link"; then fail "the link line names the source tree"; fi
probe=$tmp/probe/ferry_install_probe
if ldd "$probe" | grep -E 'yaml|spdlog|ssl|crypto'; then fail "ferry_install_probe loads the above"; fi

# An installed pair on loopback, small pools; ready when each writes its --ready-fd.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
start() {  # name role control_port
  local name=$1 role=$2 ctl=$3
  cat > "$tmp/$name.yaml" <<YAML
node: {name: install-$name-$$}
role: $role
listen: {control: "127.0.0.1:$ctl", client: "$tmp/$name.sock"}
fabric: {provider: tcp, address: 127.0.0.1, staging_bytes: 0}
pools:
  kv: {layer_ids: [3, 7], page_tokens: 2, kv_heads: 2, head_dim: 64, dtype_bytes: 2, pages: 64}
  mamba:
    slots: 4
    layer_ids: [0, 1]
    tensors:
      - {name: conv, shape: [256, 3], dtype_bytes: 2, slice_axis: 0}
  aux: {rows: 8, row_bytes: 256}
YAML
  mkfifo "$tmp/$name.ready"
  "$prefix/bin/ferryd" --config "$tmp/$name.yaml" --ready-fd 3 3> "$tmp/$name.ready" \
    > "$tmp/$name.log" 2>&1 &
  pids+=($!)
  local line=""
  read -r -t 60 line < "$tmp/$name.ready" || true
  [ "$line" = ready ] || fail "installed ferryd $name did not become ready: $(cat "$tmp/$name.log")"
}
pctl=$(port)
start prefill prefill "$pctl"
start decode decode "$(port)"
"$probe" "$tmp/prefill.sock" "$tmp/decode.sock" "127.0.0.1:$pctl" ||
  fail "the probe failed; prefill log: $(cat "$tmp/prefill.log"); decode log: $(cat "$tmp/decode.log")"
for pid in "${pids[@]}"; do kill -TERM "$pid"; done
for pid in "${pids[@]}"; do wait "$pid" || fail "an installed ferryd exited $? at SIGTERM"; done
pids=()

# The installed Python client: what PYTHONPATH=<prefix>/lib/python3/dist-packages gives.
PYTHONPATH=$prefix/lib/python3/dist-packages python3 -c '
import ferry, ferry_client, sys
assert ferry.__file__.startswith(sys.argv[1]), ferry.__file__
assert ferry_client.Client is ferry.Client
print("python: ferry", ferry.__version__, "from", ferry.__file__)' "$prefix" ||
  fail "the installed Python client does not import"
echo "ok: installed, built against find_package(Ferry) and moved a room"
