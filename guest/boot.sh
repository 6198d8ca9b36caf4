#!/usr/bin/env bash
# Boot vnet's test guest with QEMU (TCG, or KVM where a probe shows it works).
#
#   guest/boot.sh [--tap IFNAME [--netns NS] | --vhost-user SOCKET [--server]] [--ip A/N]
#                 [--mtu N] [--mac MAC] [--queues N] [--cmd 'shell'] [--then poweroff|wait]
#                 [--console stdio|file --log FILE] [--dry-run] [--probe]
#
# Builds the image first when target/guest has none. The serial console is on stdio by
# default (Ctrl-A X quits QEMU). All options: guest/boot.sh --help; see guest/README.md.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec python3 "$HERE/qemu.py" "$@"
