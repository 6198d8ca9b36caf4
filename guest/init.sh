#!/bin/sh
# /init of the vnet test guest (busybox sh). Built into initrd.img by guest/build.sh.
#
# Kernel command-line parameters (all optional; see guest/README.md):
#   vnet.ip=A.B.C.D/N    address of the NIC            vnet.mtu=N       its MTU
#   vnet.mac=MAC         pick the NIC by MAC           vnet.dev=NAME    pick the NIC by name
#   vnet.gw=A.B.C.D      default route                 vnet.hostname=H
#   vnet.cmd=BASE64      shell script run after the network is up (base64 of its text)
#   vnet.then=poweroff|wait|reboot   after the cmd (default: poweroff with a cmd, wait without)
#   vnet.debug=1         trace this script (set -x)
#
# Console markers (one line each, at the start of a line):
#   VNET-GUEST-BOOT <kernel>                    /init started
#   VNET-GUEST-READY <ip|none> dev=<d> mac=<m> mtu=<n>   network configured
#   VNET-GUEST-ERROR <message>                  something the test asked for could not be done
#   VNET-GUEST-EXIT <status>                    vnet.cmd finished with this exit status
#   VNET-GUEST-POWEROFF / VNET-GUEST-WAIT / VNET-GUEST-REBOOT   what happens next

export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=vt100

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
exec </dev/console >/dev/console 2>&1

echo "VNET-GUEST-BOOT $(uname -r)"

err() { echo "VNET-GUEST-ERROR $*"; }

# --- parameters: vnet.KEY=VALUE words of /proc/cmdline become VNET_KEY=VALUE ---------------
VNET_ip="" VNET_mtu="" VNET_mac="" VNET_dev="" VNET_gw="" VNET_hostname="" VNET_cmd="" VNET_then="" VNET_debug=""
for w in $(cat /proc/cmdline); do
    case "$w" in
    vnet.*=*)
        k=${w%%=*}; k=${k#vnet.}; v=${w#*=}
        case "$k" in
        ip|mtu|mac|dev|gw|hostname|cmd|then|debug) eval "VNET_$k=\$v" ;;
        *) err "unknown parameter vnet.$k" ;;
        esac
        ;;
    esac
done
[ -n "$VNET_debug" ] && set -x
[ -n "$VNET_hostname" ] && hostname "$VNET_hostname"

# --- modules (list and order written by build.sh from modules.dep) ---------------------------
KVER=$(uname -r)
while read -r m; do
    [ -n "$m" ] || continue
    insmod "/lib/modules/$KVER/$m" || err "insmod $m failed"
done < /etc/vnet-modules

ip link set lo up

# --- the NIC ------------------------------------------------------------------------------
is_virtio_nic() {
    case "$(readlink "/sys/class/net/$1/device/driver" 2>/dev/null)" in
    */virtio_net) return 0 ;;
    esac
    return 1
}

find_nic() {
    want_mac=$(echo "$VNET_mac" | tr 'A-F' 'a-f')
    for p in /sys/class/net/*; do
        n=${p##*/}
        [ "$n" = lo ] && continue
        if [ -n "$want_mac" ]; then
            [ "$(cat "$p/address")" = "$want_mac" ] && { echo "$n"; return 0; }
        elif [ -n "$VNET_dev" ]; then
            [ "$n" = "$VNET_dev" ] && { echo "$n"; return 0; }
        elif is_virtio_nic "$n"; then
            echo "$n"; return 0
        fi
    done
    return 1
}

# virtio-net PCI functions present (vendor 0x1af4, device 0x1000 legacy / 0x1041 modern)?
have_virtio_net_pci() {
    for d in /sys/bus/pci/devices/*; do
        [ "$(cat "$d/vendor" 2>/dev/null)" = 0x1af4 ] || continue
        case "$(cat "$d/device" 2>/dev/null)" in 0x1000|0x1041) return 0 ;; esac
    done
    return 1
}

DEV=""
# the NIC may show up a little after insmod: wait up to 10 s, if there is one at all
i=0
have_virtio_net_pci || i=100
while [ $i -lt 100 ]; do
    DEV=$(find_nic) && break
    DEV=""
    i=$((i + 1))
    sleep 0.1
done

if [ -z "$DEV" ]; then
    err "no matching virtio NIC (mac=${VNET_mac:-any} dev=${VNET_dev:-any}); have: $(ls /sys/class/net | tr '\n' ' ')"
    echo "VNET-GUEST-READY none dev=none mac=none mtu=0"
else
    ok=1
    [ -n "$VNET_mtu" ] && { ip link set dev "$DEV" mtu "$VNET_mtu" || { err "mtu $VNET_mtu on $DEV failed"; ok=0; }; }
    if [ -n "$VNET_ip" ]; then
        ip addr add "$VNET_ip" dev "$DEV" || { err "address $VNET_ip on $DEV failed"; ok=0; }
    fi
    ip link set dev "$DEV" up || { err "link up $DEV failed"; ok=0; }
    [ -n "$VNET_gw" ] && { ip route add default via "$VNET_gw" dev "$DEV" || err "default route via $VNET_gw failed"; }
    echo "VNET-GUEST-READY ${VNET_ip:-none} dev=$DEV mac=$(cat "/sys/class/net/$DEV/address") mtu=$(cat "/sys/class/net/$DEV/mtu")"
fi

# --- the command --------------------------------------------------------------------------
if [ -n "$VNET_cmd" ]; then
    if echo "$VNET_cmd" | base64 -d > /tmp/vnet-cmd.sh 2>/dev/null; then
        (cd /root && exec sh /tmp/vnet-cmd.sh)
        rc=$?
    else
        err "vnet.cmd is not valid base64"
        rc=127
    fi
    echo "VNET-GUEST-EXIT $rc"
    [ -n "$VNET_then" ] || VNET_then=poweroff
fi
[ -n "$VNET_then" ] || VNET_then=wait

case "$VNET_then" in
poweroff)
    echo "VNET-GUEST-POWEROFF"
    sync
    poweroff -f
    ;;
reboot)
    echo "VNET-GUEST-REBOOT"
    sync
    reboot -f
    ;;
wait) ;;
*) err "unknown vnet.then=$VNET_then (using wait)" ;;
esac

echo "VNET-GUEST-WAIT"
# A shell on the serial console, again and again; the guest keeps running until stopped.
while :; do
    setsid cttyhack sh -l
    sleep 1
done
