#!/usr/bin/env bash
# Installs what vnet needs on a fresh Debian 12 machine (idempotent), and builds it.
# Run as root: vnet creates TAP devices, network namespaces and raw sockets.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib.sh

if [ "$(id -u)" != 0 ]; then
    echo "setup.sh: run as root (vnet creates TAP devices and network namespaces)" >&2
    exit 1
fi

# iproute2 (ip, bridge), ping, iperf3 for the demo and tests, ethtool for the kernel peers,
# iptables for the underlay-fault tests,
# openssl for the etcd TLS test.
ensure_packages iproute2 iputils-ping iperf3 procps ethtool iptables openssl
# The kernel fast path (crates/vnet-fastpath): clang/llvm compile its BPF programs at build
# time against libbpf-dev's headers; libelf-dev, zlib1g-dev and pkg-config build the vendored
# libbpf of libbpf-rs; bpftool lets the tests see what is attached.
ensure_packages clang llvm libbpf-dev libelf-dev zlib1g-dev pkg-config bpftool
# protoc: etcd-client (vnet-etcd's gRPC client, #19) compiles etcd's protobuf files at build time.
ensure_packages protobuf-compiler
# etcd for distributed control (#5): the system tests start their own etcd (own ports and data
# directory, stopped by PID); the packaged service must not run beside them.
ensure_etcd
# Issue #12: Prometheus for the metrics test (its packaged service must not run: the test
# starts its own in a namespace of its own), headless Chromium for the live-view test, the standard CNI
# plugins (host-local IPAM) and cnitool (a CNI runtime) for the CNI plugin's test.
ensure_packages_no_start prometheus
ensure_packages chromium containernetworking-plugins
ensure_cnitool
# Issue #17: the CNI plugin through podman (tests/system/test_podman.py). Debian's podman 4.3
# (CNI backend) with runc (crun refuses this machine's hybrid cgroups) and a busybox-static tree
# as the containers' root file system (no image registry is needed). podman's units (API
# socket, restart service, auto-update timer) act only on its default storage, empty here, and
# none is started by the install; the test runs podman with its own storage and CNI config
# directory, so podman's default network (the cni-podman0 bridge) is never made.
ensure_packages_no_start podman runc
ensure_packages busybox-static
# Issue #31's wide-area lab (vnetlab/wanlab.py, tests/system/test_wanlab.py, bench/reach.py): its
# NAT routers and firewalls are nftables rulesets in namespaces, conntrack -L/-F reads and clears
# their mappings, ethtool turns offloads off where frames enter vnet-pathem.
ensure_packages nftables conntrack ethtool
ensure_cargo

if ! python3 -c 'import pytest' 2>/dev/null; then
    say "installing pytest"
    python3 -m pip install -q pytest 2>/dev/null || apt-get install -y -qq python3-pytest >/dev/null
fi
if ! python3 -c 'import pyflakes' 2>/dev/null; then
    say "installing pyflakes"
    python3 -m pip install -q pyflakes 2>/dev/null || apt-get install -y -qq python3-pyflakes >/dev/null
fi

# Issue #33: pods through containerd's CRI (tests/system/test_cri.py) and VMs through libvirt
# (tests/system/test_libvirt.py). Debian's containerd 1.6 (its CRI plugin built in) and runc;
# crictl (kubelet's stand-in) from the Go module proxy into target/tools, as cnitool; gcc and
# a static libc build the pods' pause binary (no registry: the images are made by the test).
# libvirt's daemons (libvirtd, virtlogd) and QEMU, whose packaged services are not started:
# the tests start their own containerd and libvirtd by hand and stop them by PID.
ensure_packages_no_start containerd libvirt-daemon-system
ensure_packages libvirt-clients qemu-system-x86 gcc libc6-dev
ensure_crictl

[ -e /dev/net/tun ] || { mkdir -p /dev/net && mknod /dev/net/tun c 10 200; }
modprobe tun 2>/dev/null || true
modprobe vxlan 2>/dev/null || true

say "building vnet (release)"
cargo build --release --workspace --quiet
# fplab, the fast path's stand-alone driver (tests/system/test_fastpath.py, bench/fastpath_variants.py)
cargo build --release -p vnet-fastpath --examples --quiet
# handshake_flood, the forged-handshake sender of tests/system/test_crypto.py
cargo build --release -p vnet-crypto --example handshake_flood --quiet
