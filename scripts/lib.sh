# Shared by the scripts: sourced, not run.

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# ensure_packages PKG...: installs the Debian packages that are missing (idempotent).
ensure_packages() {
    local need=() pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
    done
    if [ ${#need[@]} -gt 0 ]; then
        say "installing ${need[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    fi
}

# ensure_cargo: cargo on PATH, or a clear error.
ensure_cargo() {
    if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    command -v cargo >/dev/null || { echo "cargo (Rust) is required" >&2; exit 1; }
}
