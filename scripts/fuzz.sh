#!/usr/bin/env bash
# Runs each cargo-fuzz target for SECONDS (default 60). Needs the nightly toolchain; installs
# cargo-fuzz if missing. Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-60}
shift || true
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
rustup toolchain list | grep -q nightly || rustup toolchain install nightly --profile minimal
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(wire_datagram wire_views stream_decoder control_script offload vhost_msg crypto_message cluster_events)
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    [ -d "corpus_seed/$t" ] && cp -n corpus_seed/"$t"/* "corpus/$t/" 2>/dev/null || true
    echo "==> fuzzing $t for ${secs}s"
    cargo +nightly fuzz run "$t" "corpus/$t" -- -max_total_time="$secs" -max_len=70000
done
