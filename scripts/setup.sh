#!/usr/bin/env bash
# Installs what vnet needs on a fresh Debian 12 machine (idempotent), and builds it.
# Run as root: vnet creates TAP devices, network namespaces and raw sockets.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
    echo "setup.sh: run as root (vnet creates TAP devices and network namespaces)" >&2
    exit 1
fi

# Debian packages: iproute2 (ip, bridge), ping, iperf3 for the demo and tests.
need=()
for pkg in iproute2 iputils-ping iperf3 procps ethtool; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
    [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null || { echo "setup.sh: cargo (Rust) is required" >&2; exit 1; }

if ! python3 -c 'import pytest' 2>/dev/null; then
    say "installing pytest"
    python3 -m pip install -q pytest 2>/dev/null || apt-get install -y -qq python3-pytest >/dev/null
fi

[ -e /dev/net/tun ] || { mkdir -p /dev/net && mknod /dev/net/tun c 10 200; }
modprobe tun 2>/dev/null || true
modprobe vxlan 2>/dev/null || true

say "building vnet (release)"
cargo build --release --workspace --quiet
