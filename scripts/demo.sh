#!/usr/bin/env bash
# Installs what is needed, builds vnet, and runs the demo: three hosts with two guests each on
# this machine, ping and iperf3 across the overlay against the bare underlay, then tears it down.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec python3 scripts/demo.py "$@"
