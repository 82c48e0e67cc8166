#!/usr/bin/env bash
# Install the Debian 12 packages Ferry needs, skipping those already present. `prometheus` is
# there for its promtool, which the tests use to load docs/prometheus/ferry-rules.yml; on a host
# with systemd the package also starts a Prometheus on :9090 (`systemctl disable --now
# prometheus` if it is not wanted).
set -euo pipefail
packages=(build-essential cmake pkg-config libcaf-dev libfabric-dev libfabric-bin libspdlog-dev
          libyaml-cpp-dev catch2 libcli11-dev libssl-dev iproute2 python3 clang libclang-rt-14-dev
          python3-pytest python3-venv python3-pip python3-setuptools nlohmann-json3-dev
          prometheus-cpp-dev libcivetweb-dev clang-format libfmt-dev libsystemd-dev libxxhash-dev
          python3-mypy python3-yaml prometheus)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -q
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}"
