#!/usr/bin/env bash
# Build the vnet test guest: a Debian cloud kernel and a small busybox initramfs.
#
#   guest/build.sh [OUT_DIR]        (default OUT_DIR: target/guest under the repository)
#
# Produces OUT_DIR/vmlinuz, OUT_DIR/initrd.img (gzip'd newc cpio) and OUT_DIR/manifest.txt.
# Installs what it needs with apt-get (root). Idempotent: when nothing it is built from has
# changed, it says so and leaves the files alone. See guest/README.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
OUT=${1:-$REPO/target/guest}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

say() { printf '[guest/build] %s\n' "$*" >&2; }
die() { printf '[guest/build] error: %s\n' "$*" >&2; exit 1; }

# --- packages --------------------------------------------------------------------------------
# linux-image-cloud-amd64: the guest kernel (virtio, 8250 serial); busybox-static: the whole
# userland; qemu-system-x86: to boot it; cpio/gzip/kmod: to build the initramfs; iperf3 and
# ethtool: copied into the guest with their shared libraries.
PKGS=(linux-image-cloud-amd64 busybox-static qemu-system-x86 cpio gzip kmod iperf3 ethtool iproute2)

missing=()
for p in "${PKGS[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
if ((${#missing[@]})); then
    [ "$(id -u)" = 0 ] || die "missing packages (${missing[*]}) and not root: run as root or apt-get install them"
    say "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt_install() { apt-get install -y -q --no-install-recommends "${missing[@]}" >"$OUT/apt.log" 2>&1; }
    if ! apt_install; then
        say "apt-get install failed; running apt-get update and trying again"
        apt-get update -q >>"$OUT/apt.log" 2>&1 || true
        apt_install || { tail -n 30 "$OUT/apt.log" >&2; die "apt-get install ${missing[*]} failed (log: $OUT/apt.log)"; }
    fi
fi

# --- which kernel ----------------------------------------------------------------------------
# The metapackage depends on exactly one linux-image-<version>-cloud-amd64.
KPKG=$(dpkg-query -W -f='${Depends}' linux-image-cloud-amd64 | grep -o 'linux-image-[^ ,]*-cloud-amd64' | head -n1)
KVER=${KPKG#linux-image-}
[ -n "$KVER" ] && [ -f "/boot/vmlinuz-$KVER" ] || die "cannot find the cloud kernel (package $KPKG, /boot/vmlinuz-$KVER)"
[ -d "/lib/modules/$KVER" ] || die "/lib/modules/$KVER missing"

BUSYBOX=/bin/busybox
[ -x "$BUSYBOX" ] || die "$BUSYBOX missing (busybox-static)"
file_is_static() { ! ldd "$1" >/dev/null 2>&1; }
file_is_static "$BUSYBOX" || die "$BUSYBOX is not statically linked: is busybox-static installed (it replaces busybox)?"

# Modules for a virtio-net NIC on virtio-pci, in load order, with everything they depend on
# (from modules.dep via modprobe; built-in ones are skipped). The serial console (8250) and
# packet sockets are built into the cloud kernel.
MODULES=(virtio_pci virtio_net)
mapfile -t MODFILES < <(modprobe -a -S "$KVER" --show-depends "${MODULES[@]}" | awk '$1 == "insmod" {print $2}' | awk '!seen[$0]++')
((${#MODFILES[@]})) || die "modprobe --show-depends found no modules for ${MODULES[*]} in $KVER"

# Binaries copied with their libraries (ldd).
EXTRA_BINS=(/usr/bin/iperf3 /usr/sbin/ethtool)

# --- up to date? -----------------------------------------------------------------------------
stamp_input() {
    echo "kernel $KVER $(dpkg-query -W -f='${Version}' "$KPKG")"
    sha256sum "$HERE/build.sh" "$HERE/init.sh" "$BUSYBOX" "${MODFILES[@]}" | awk '{print $1}'
    for b in "${EXTRA_BINS[@]}"; do
        sha256sum "$b" | awk '{print $1}'
        ldd "$b" | awk '/=>/ {print $3} /ld-linux/ {print $1}' | xargs -r sha256sum | awk '{print $1}'
    done
}
STAMP=$(stamp_input | sha256sum | awk '{print $1}')
if [ -f "$OUT/vmlinuz" ] && [ -f "$OUT/initrd.img" ] && [ "$(cat "$OUT/.stamp" 2>/dev/null)" = "$STAMP" ]; then
    say "up to date: $OUT (kernel $KVER, initrd $(stat -c %s "$OUT/initrd.img") bytes)"
    exit 0
fi

# --- the initramfs tree ----------------------------------------------------------------------
STAGE=$(mktemp -d "${TMPDIR:-/tmp}/vnet-guest-build.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
R=$STAGE/root
mkdir -p "$R"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,run,root,lib64,lib/x86_64-linux-gnu,var/run}
chmod 1777 "$R/tmp"

install -m 0755 "$BUSYBOX" "$R/bin/busybox"
for a in $("$BUSYBOX" --list); do
    [ "$a" = busybox ] && continue
    [ -e "$R/bin/$a" ] || ln -s busybox "$R/bin/$a"
done

install -m 0755 "$HERE/init.sh" "$R/init"

# Kernel modules, at their usual paths, plus the load order for /init and a modules.dep so
# busybox modprobe works too.
: >"$R/etc/vnet-modules"
for f in "${MODFILES[@]}"; do
    rel=${f#/lib/modules/$KVER/}
    mkdir -p "$R/lib/modules/$KVER/$(dirname "$rel")"
    cp "$f" "$R/lib/modules/$KVER/$rel"
    echo "$rel" >>"$R/etc/vnet-modules"
done
cp "/lib/modules/$KVER/modules.order" "/lib/modules/$KVER/modules.builtin" "$R/lib/modules/$KVER/" 2>/dev/null || true
[ -f "/lib/modules/$KVER/modules.builtin.modinfo" ] && cp "/lib/modules/$KVER/modules.builtin.modinfo" "$R/lib/modules/$KVER/"
depmod -b "$R" "$KVER"

# iperf3, ethtool and their shared libraries (the dynamic loader included).
copy_with_libs() {
    local bin=$1
    install -D -m 0755 "$bin" "$R$bin"
    ldd "$bin" | awk '/=>/ && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}' | while read -r lib; do
        # keep the name the binary asks for (a symlink's name), copy the content
        local dst=$R/lib/x86_64-linux-gnu/$(basename "$lib")
        case "$lib" in */ld-linux*) dst=$R/lib64/$(basename "$lib") ;; esac
        [ -e "$dst" ] || cp -L "$lib" "$dst"
    done
}
for b in "${EXTRA_BINS[@]}"; do
    [ -x "$b" ] || die "$b missing"
    copy_with_libs "$b"
done
strip_ok=$(command -v strip || true)
if [ -n "$strip_ok" ]; then
    # debug symbols are already split off in Debian; this only drops leftover symbol tables
    find "$R/lib" "$R/lib64" "$R/usr" -type f \( -name '*.so*' -o -perm -u+x \) -exec strip --strip-unneeded {} + 2>/dev/null || true
fi

cat >"$R/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
EOF
cat >"$R/etc/group" <<'EOF'
root:x:0:
EOF
cat >"$R/etc/profile" <<'EOF'
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
PS1='vnet-guest:\w# '
EOF
echo "127.0.0.1 localhost" >"$R/etc/hosts"
: >"$R/etc/resolv.conf"

# /dev/console must exist before devtmpfs is mounted: the kernel opens it for /init.
if [ "$(id -u)" = 0 ]; then
    mknod -m 600 "$R/dev/console" c 5 1
    mknod -m 666 "$R/dev/null" c 1 3
fi

# --- pack ------------------------------------------------------------------------------------
# Reproducible: sorted names, fixed times and owners.
find "$R" -exec touch -h -d @0 {} +
(cd "$R" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0 --reproducible) \
    | gzip -9 -n >"$STAGE/initrd.img"

install -m 0644 "/boot/vmlinuz-$KVER" "$STAGE/vmlinuz"
{
    echo "kernel: $KVER ($(dpkg-query -W -f='${Version}' "$KPKG"))"
    echo "busybox: $(dpkg-query -W -f='${Version}' busybox-static)"
    echo "iperf3: $(dpkg-query -W -f='${Version}' iperf3)"
    echo "modules (load order):"
    sed 's/^/  /' "$R/etc/vnet-modules"
    echo "initrd.img: $(stat -c %s "$STAGE/initrd.img") bytes; unpacked $(du -sb "$R" | awk '{print $1}') bytes"
    echo "vmlinuz: $(stat -c %s "$STAGE/vmlinuz") bytes"
} >"$STAGE/manifest.txt"

mv -f "$STAGE/vmlinuz" "$OUT/vmlinuz"
mv -f "$STAGE/initrd.img" "$OUT/initrd.img"
mv -f "$STAGE/manifest.txt" "$OUT/manifest.txt"
echo "$STAMP" >"$OUT/.stamp"
say "built $OUT: kernel $KVER, initrd.img $(stat -c %s "$OUT/initrd.img") bytes"
cat "$OUT/manifest.txt" >&2
