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

# ensure_etcd: Debian's etcd-server (/usr/bin/etcd) and etcd-client (etcdctl), installed without
# starting the packaged service, which is stopped and disabled if it runs anyway (idempotent).
ensure_etcd() {
    local need=0 pkg
    for pkg in etcd-server etcd-client; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need=1
    done
    if [ "$need" = 1 ]; then
        local own_policy=0
        if [ ! -e /usr/sbin/policy-rc.d ]; then
            # Refuse service starts during this install only (invoke-rc.d's documented hook).
            printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
            chmod 755 /usr/sbin/policy-rc.d
            own_policy=1
        fi
        ensure_packages etcd-server etcd-client
        [ "$own_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
    fi
    if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
        systemctl disable --now etcd >/dev/null 2>&1 || true
    fi
    if [ -x /etc/init.d/etcd ] && /etc/init.d/etcd status >/dev/null 2>&1; then
        /etc/init.d/etcd stop >/dev/null 2>&1 || true
    fi
}

# ensure_cargo: cargo on PATH, or a clear error.
ensure_cargo() {
    if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    command -v cargo >/dev/null || { echo "cargo (Rust) is required" >&2; exit 1; }
}
