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

# ensure_packages_no_start PKG...: installs Debian packages that ship a service (prometheus)
# without letting their maintainer scripts start it: the tests start their own instance on
# their own port, stopped by PID (idempotent).
ensure_packages_no_start() {
    local need=0 pkg own_policy=0
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need=1
    done
    [ "$need" = 1 ] || return 0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        # Refuse service starts during this install only (invoke-rc.d's documented hook).
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        own_policy=1
    fi
    ensure_packages "$@"
    [ "$own_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
    for pkg in "$@"; do
        if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
            systemctl disable --now "$pkg" >/dev/null 2>&1 || true
        fi
    done
    return 0
}

# CNITOOL_VERSION: the CNI runtime the CNI plugin's system test drives (built from the Go
# module proxy). v1.3 speaks CNI spec 1.1 (STATUS, GC).
CNITOOL_VERSION=v1.3.0
CNITOOL="target/tools/cnitool"

# ensure_cnitool: builds cnitool into target/tools/ with the machine's Go (or Debian's
# golang-go when there is none), once per version (idempotent).
ensure_cnitool() {
    local stamp="target/tools/.cnitool-$CNITOOL_VERSION"
    [ -x "$CNITOOL" ] && [ -e "$stamp" ] && return 0
    if ! command -v go >/dev/null; then
        if [ -x /usr/local/go/bin/go ]; then
            export PATH="/usr/local/go/bin:$PATH"
        else
            ensure_packages golang-go
        fi
    fi
    # cnitool v1.3 needs Go 1.21 or later (Debian 12's golang-go is 1.19).
    local gov
    gov=$(go env GOVERSION | sed 's/^go//')
    if [ "$(printf '%s\n1.21\n' "$gov" | sort -V | head -n 1)" != 1.21 ]; then
        echo "cnitool $CNITOOL_VERSION needs Go 1.21 or later; this machine has $gov" >&2
        exit 1
    fi
    say "building cnitool $CNITOOL_VERSION (Go module proxy)"
    mkdir -p target/tools
    GOBIN="$PWD/target/tools" \
        go install "github.com/containernetworking/cni/cnitool@$CNITOOL_VERSION"
    rm -f target/tools/.cnitool-*
    touch "$stamp"
}

# CRICTL_VERSION: the CRI client the containerd system test drives in kubelet's place (built
# from the Go module proxy); it speaks CRI v1, which containerd 1.6 serves.
CRICTL_VERSION=v1.37.0
CRICTL="target/tools/crictl"

# ensure_crictl: builds crictl into target/tools/ with the machine's Go (Go 1.21 or later, as
# for cnitool), once per version (idempotent).
ensure_crictl() {
    local stamp="target/tools/.crictl-$CRICTL_VERSION"
    [ -x "$CRICTL" ] && [ -e "$stamp" ] && return 0
    if ! command -v go >/dev/null; then
        if [ -x /usr/local/go/bin/go ]; then
            export PATH="/usr/local/go/bin:$PATH"
        else
            ensure_packages golang-go
        fi
    fi
    say "building crictl $CRICTL_VERSION (Go module proxy)"
    mkdir -p target/tools
    GOBIN="$PWD/target/tools" go install "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
    rm -f target/tools/.crictl-*
    touch "$stamp"
}
