#!/usr/bin/env bash
# vnet's benchmark suite: installs what it needs (Debian 12, idempotent), builds vnet (release),
# then runs the suite (python3 -m bench.run) with the arguments given here. Run as root.
#
#   bash scripts/bench.sh                  # full run (< 10 min), results/bench-<UTC time>/
#   bash scripts/bench.sh --quick          # CI smoke run (~1 min)
#   bash scripts/bench.sh --install-only   # only the packages (for CI set-up)
#   bash scripts/bench.sh --vhost-only [--quick]   # only the vhost-user data path (bench.vhost)
#   bash scripts/bench.sh --hpc [--quick]  # only the MPI jobs over 4 guests (bench.hpc; its options)
#   bash scripts/bench.sh --help           # every option of bench.run
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib.sh

if [ "$(id -u)" != 0 ]; then
    echo "bench.sh: run as root (the suite creates network namespaces, TAP devices, qdiscs)" >&2
    exit 1
fi

install_only=0
vhost_only=0
hpc_only=0
if [ "${1:-}" = "--install-only" ]; then
    install_only=1
    shift
elif [ "${1:-}" = "--vhost-only" ]; then
    vhost_only=1
    shift
elif [ "${1:-}" = "--hpc" ]; then
    hpc_only=1
    shift
fi

# iperf3 (TCP/UDP), sockperf (latency), Open MPI + NetPIPE + hpcc (application level; Debian's
# hpcc is built against Open MPI), matplotlib (plots), ethtool/procps/iproute2 (the testbed).
pkgs=(iproute2 iputils-ping iperf3 sockperf openmpi-bin hpcc netpipe-openmpi python3-matplotlib ethtool procps)
ensure_packages "${pkgs[@]}"

[ -e /dev/net/tun ] || { mkdir -p /dev/net && mknod /dev/net/tun c 10 200; }
modprobe tun 2>/dev/null || true
modprobe vxlan 2>/dev/null || true
modprobe sch_tbf 2>/dev/null || true

[ "$install_only" = 1 ] && exit 0

ensure_cargo
say "building vnet (release)"
cargo build --release --quiet

# The benchmarks are modules of the package bench/, run from the repository root (this script's
# working directory). Debian's matplotlib belongs to /usr/bin/python3; each benchmark re-executes
# itself there when the python3 on PATH (pyenv, venv) lacks it.
if [ "$vhost_only" = 1 ]; then
    say "running the vhost-user data-path benchmark"
    exec python3 -m bench.vhost "$@"
fi
if [ "$hpc_only" = 1 ]; then
    say "running the MPI jobs over many guests (HPCC, NetPIPE)"
    exec python3 -m bench.hpc "$@"
fi
say "running the benchmark suite"
python3 -m bench.run "$@"
# The vhost-user data path (issue #4), next to the other results when --out was given.
out=""
prev=""
for a in "$@"; do
    [ "$prev" = "--out" ] && out="$a"
    prev="$a"
done
quick=""
for a in "$@"; do [ "$a" = "--quick" ] && quick="--quick"; done
say "running the vhost-user data-path benchmark"
if [ -n "$out" ]; then
    python3 -m bench.vhost $quick --out "$out"
else
    python3 -m bench.vhost $quick
fi
# MPI jobs over 4 guests (issue #13): HPCC and NetPIPE, beside the others with --out.
say "running the MPI jobs over many guests (HPCC, NetPIPE)"
if [ -n "$out" ]; then
    python3 -m bench.hpc $quick --out "$out"
else
    python3 -m bench.hpc $quick
fi
