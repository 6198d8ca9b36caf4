#!/usr/bin/env bash
# The scale of vnet's etcd control plane (issue #13): installs what it needs (Debian 12,
# idempotent), builds the harness (release), then runs bench.scale with the arguments given
# here. Run as root (for the file-descriptor limit); nothing is sent off loopback.
#
#   bash scripts/scale.sh                       # N = 10, 100, 300, 1000 hosts x 8 guests
#   bash scripts/scale.sh --quick               # N = 10, 50 (a minute or two; CI runs this)
#   bash scripts/scale.sh --hosts 100,200 --vnis 10 --baseline results/scale-X/scale.json
#   bash scripts/scale.sh --daemons 200         # 200 real vnetd --etcd daemons in namespaces
#   bash scripts/scale.sh --hosts 100,300 --proxies 0,4   # straight to etcd, then through 4 gRPC proxies
#   bash scripts/scale.sh --hosts 1000 --cold-start       # every agent at once: time to converge, leases lost
#   bash scripts/scale.sh --hosts 300,1000 --daemons 200   # both, into one results directory
#   bash scripts/scale.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib.sh

ensure_packages python3-matplotlib procps iproute2
ensure_etcd
ensure_cargo
say "building the scale harness and the daemons (release)"
cargo build --release --quiet -p vnet-scale -p vnetd -p vnetctl

exec python3 -m bench.scale "$@"
