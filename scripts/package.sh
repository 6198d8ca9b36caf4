#!/usr/bin/env bash
# Builds vnet's Debian package: target/debian/vnet_<version>-1_<arch>.deb with vnetd, vnetctl,
# the CNI plugin (/usr/lib/cni/vnet-cni), their man pages, a default configuration in
# /etc/vnet/ and /etc/default/vnetd, and the systemd unit vnetd.service (installed, not
# enabled). Installs what it needs first (cargo-deb, help2man), idempotently.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib.sh

ensure_cargo
ensure_packages help2man binutils
if ! cargo deb --version >/dev/null 2>&1; then
    say "installing cargo-deb (crates.io)"
    cargo install cargo-deb --locked --quiet
fi

say "building vnet (release)"
# The whole workspace, as scripts/setup.sh builds it (a subset would unify features
# differently and relink the binaries the tests use).
cargo build --release --workspace --quiet

say "man pages"
mkdir -p target/package/man
help2man --no-info --section 8 --name "the vnet overlay daemon" \
    --version-string "$(target/release/vnetd --version)" target/release/vnetd |
    gzip -9n >target/package/man/vnetd.8.gz
help2man --no-info --section 1 --name "control a vnet daemon or overlay" \
    --version-string "$(target/release/vnetctl --version)" target/release/vnetctl |
    gzip -9n >target/package/man/vnetctl.1.gz
gzip -9n <packaging/vnet-cni.8 >target/package/man/vnet-cni.8.gz

say "the package"
deb=$(cargo deb -p vnetd --no-build --strip --quiet 2>/dev/null | tail -n 1)
[ -f "$deb" ] || deb=$(ls -t target/debian/vnet_*.deb | head -n 1)
echo "$deb"
