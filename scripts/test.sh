#!/usr/bin/env bash
# The whole test suite: unit and property tests of every crate, lints, and the system tests
# that build real hosts and guests from network namespaces. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The system suite also runs the benchmark suite in quick mode and boots real QEMU guests;
# both install what they need (idempotent).
bash scripts/bench.sh --install-only

. scripts/lib.sh

say "format and lint"
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets --quiet -- -D warnings
# Python: a name used but never defined or imported fails here, not halfway through the suite.
if python3 -m pyflakes vnetlab bench tests scripts | grep -E "undefined name|undefined local"; then
    echo "python: undefined names (above)" >&2
    exit 1
fi
# The docs: every path and name they cite exists; docs/architecture.md stays a map (300 lines).
python3 scripts/check_docs.py --self-test
python3 scripts/check_docs.py

say "the crates that need no BPF build without clang"
# The kernel fast path is a cargo feature (vnet-fastpath's `kernel`, vnetd's `kernel-fastpath`);
# without it nothing needs clang or libbpf. Checked with clang and llvm hidden from PATH.
noclang=$(mktemp -d)
trap 'rm -rf "$noclang"' EXIT
for f in /usr/bin/* /bin/*; do
    case "$(basename "$f")" in clang*|llvm*|ld.lld*) continue ;; esac
    [ -e "$noclang/$(basename "$f")" ] || ln -s "$f" "$noclang/$(basename "$f")"
done
PATH="$noclang:$HOME/.cargo/bin" CLANG=/nonexistent \
    cargo build --release --quiet -p vnet-dataplane -p vnet-vhost -p vnetd --no-default-features
# The binaries the system tests run are the ones with every default feature again.
cargo build --release --workspace --quiet

say "unit and property tests"
# VNET_REQUIRE_BPF=1: the kernel fast path's BPF programs must load (the kernel's verifier
# checks them) and run in its tests; without it they would skip where BPF is unavailable.
# Every test binary runs (--no-fail-fast); all of cargo's output goes to target/cargo-test.log,
# and the log here shows per crate the tests passed, failed and ignored, then the first failures
# in full. pipefail (above) keeps cargo's exit status.
VNET_REQUIRE_BPF=1 cargo test --release --workspace --no-fail-fast 2>&1 |
    python3 scripts/cargo_test_summary.py --log target/cargo-test.log

say "system tests (real namespaces, TAP devices, kernel VXLAN)"
python3 -m pytest -q -p no:cacheprovider tests/system "$@"
