"""The kernel fast path's testbed (issue #10): the suite's topology (suite_bed.py) with guests on
veth ports driven by the eBPF fast path (crate vnet-fastpath, through its `fplab` example
standing in for vnetd's control plane), beside the kernel VXLAN + bridge and the native wire.

    guest ka -- veth -- [br-kx + vx1]  hA  eth0 ====== eth0  hB  [br-kx + vx1] -- veth -- guest kb
    guest fa -- veth fp (tcx)  -------+   the wire (veth)   +------- veth fp (tcx) -- guest fb
                 punt TAP fpt, vxfp (variant a)                       punt TAP fpt, vxfp

Variants of the fast path (one `fplab` per host, started for the measurement of that variant
only, so no program of another variant runs on the wire meanwhile):

* ``fp-cache``: encapsulation in the program (bpf_skb_adjust_room), outer next hop cached per
  CPU for 1 s (ONCache-style), bpf_redirect to the wire; decapsulation in underlay_ingress,
  bpf_redirect_peer into the guest.
* ``fp-fib``: the same with bpf_fib_lookup for every packet.
* ``fp-vxdev``: variant (a), bpf_skb_set_tunnel_key + redirect to a collect-metadata VXLAN
  device (UDP 4791: it cannot share a port with a UDP socket, see ``coexistence()``), and
  tunnel_ingress on that device delivering with bpf_redirect_peer.

A ``testbed.Testbed`` (unique names, processes stopped by PID, cleanup always; the wire and
the kernel VXLAN as every bed builds them).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

from vnetlab import netlab

from . import REPO
from .testbed import KERNEL_VXLAN_PORT, Testbed

FPLAB = Path(os.environ.get("FPLAB", REPO / "target" / "release" / "examples" / "fplab"))
if not FPLAB.is_absolute():
    FPLAB = REPO / FPLAB

WIRE_NET = "10.77.0"
KX_NET = "192.168.72"
FP_NET = "192.168.74"
KX_MAC = ("52:54:00:b1:00:01", "52:54:00:b1:00:02")
FP_MAC = ("52:54:00:b4:00:01", "52:54:00:b4:00:02")
KX_VNI, FP_VNI = 1, 10
VXDEV_PORT = 4791
FP_VARIANTS = ["fp-cache", "fp-fib", "fp-vxdev"]
CONFIGS = ["native", "kernel-vxlan"] + FP_VARIANTS


class Fplab:
    """One running fplab (the fast path of one host)."""

    def __init__(self, host: netlab.Host, argv: list, stats: Path):
        self.host, self.stats = host, stats
        log = open(host.lab.workdir / f"fplab-{host.role}.log", "ab")
        self.proc = host.popen(str(FPLAB), *argv, "--stats", str(stats), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=log)
        log.close()
        deadline = time.monotonic() + 20
        line = b""
        while time.monotonic() < deadline:
            r, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if r:
                line = self.proc.stdout.readline()
                break
            if self.proc.poll() is not None:
                break
        if line.strip() != b"ready":
            self.stop()
            raise netlab.LabError(f"fplab in {host.name} did not start: see {host.lab.workdir}/fplab-{host.role}.log")

    def counters(self) -> dict:
        """The fast path's counters now (SIGUSR1 makes fplab write them)."""
        before = self.stats.stat().st_mtime_ns if self.stats.exists() else 0
        self.proc.send_signal(signal.SIGUSR1)
        netlab.wait_until(lambda: self.stats.exists() and self.stats.stat().st_mtime_ns != before, 5, 0.02,
                          what="fplab stats")
        return json.loads(self.stats.read_text())

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            netlab.stop_pid(self.proc, sig=sig, timeout=5)


class FastpathBed(Testbed):
    """Two hosts on a veth wire with kernel-VXLAN guests and fast-path guests. Context manager."""

    def __init__(self, mtu: int = 1500, tag: str = "fpbed"):
        super().__init__(f"{tag}-mtu{mtu}", mtu)
        self.running: dict = {}  # host -> Fplab
        self.variant: Optional[str] = None

    def close(self) -> None:
        self.stop_fastpath()
        super().close()

    def setup(self) -> None:
        lab = self.lab
        hosts = self.wire_pair(WIRE_NET)
        # kernel VXLAN + bridge, as the suite's bed builds it
        self.kx_guests = self.guest_pair("k", KX_NET, KX_MAC)
        self.kernel_vxlan(list(zip(self.kx_guests, hosts)), KX_VNI, port=lambda i: "kg")

        # fast-path guests: a veth whose host end gets the programs, a punt TAP (nobody reads
        # it here: nothing in these tests needs the slow path), and a collect-metadata VXLAN
        # device for variant (a)
        self.fp_guests = self.guest_pair("f", FP_NET, FP_MAC)
        for g, h in zip(self.fp_guests, hosts):
            h.ip_link("add", "fp", "type", "veth", "peer", "name", "eth0", "netns", g.name)
            h.ip_link("set", "fp", "mtu", self.overlay_mtu)
            h.ip_link("set", "fp", "up")
            h.ip("tuntap", "add", "fpt", "mode", "tap")
            h.ip_link("set", "fpt", "up")
            h.ip_link("add", "name", "vxfp", "type", "vxlan", "external", "dstport", VXDEV_PORT)
            h.ip_link("set", "vxfp", "mtu", self.overlay_mtu)
            h.ip_link("set", "vxfp", "up")
            g.ip_link("set", "eth0", "address", g.mac)
            g.configure("eth0", self.overlay_mtu)
        self.pin_guest_neighbours(self.kx_guests, self.fp_guests)
        for cfg in ("native", "kernel-vxlan"):
            a, _, _, ip = self.endpoint(cfg)
            lab.wait_ping(a, ip, timeout=15)

    # -- the fast path --
    def fplab_args(self, variant: str, i: int) -> list:
        h, o = ((self.hA, self.hB), (self.hB, self.hA))[i]
        me, peer = FP_MAC[i], FP_MAC[1 - i]
        args = ["--port", f"1:fp:fpt:{me}:{FP_VNI}:{self.overlay_mtu}:peer",
                "--route", f"{me}=1", "--route", f"{peer}=2"]
        link = f"2:{o.underlay_ip}:{h.underlay_ip}:{KERNEL_VXLAN_PORT}:{FP_VNI}"
        if variant == "fp-vxdev":
            args += ["--link", f"{link}:via=vxfp", "--tunnel-dev", "vxfp"]
        else:
            args += ["--underlay", "eth0", "--link", link,
                     "--outer-cache-ms", "1000" if variant == "fp-cache" else "0"]
        return args

    def start_fastpath(self, variant: str) -> None:
        if self.variant == variant:
            return
        self.stop_fastpath()
        for i, h in enumerate((self.hA, self.hB)):
            self.running[h] = Fplab(h, self.fplab_args(variant, i), self.lab.workdir / f"fp-{h.role}.json")
        self.variant = variant
        a, _, _, ip = self.endpoint(variant)
        self.lab.wait_ping(a, ip, timeout=10)

    def stop_fastpath(self, sig=signal.SIGTERM) -> None:
        for f in self.running.values():
            f.stop(sig)
        self.running = {}
        self.variant = None

    def prepare(self, config: str) -> None:
        if config in FP_VARIANTS:
            self.start_fastpath(config)
        else:
            self.stop_fastpath()

    def endpoint(self, config: str):
        """(client ns, server ns, client ip, server ip)"""
        if config == "native":
            return self.hA, self.hB, self.hA.underlay_ip, self.hB.underlay_ip
        if config == "kernel-vxlan":
            a, b = self.kx_guests
        else:
            a, b = self.fp_guests
        return a, b, a.ip_addr, b.ip_addr

    def counters(self, config: str) -> dict:
        """What proves a test's path: the fast path's own counters, or the kernel devices'."""
        if config in FP_VARIANTS:
            return {h.role: f.counters() for h, f in self.running.items()}
        return self.pair_counters("vx1" if config == "kernel-vxlan" else "eth0")


def coexistence(host: netlab.Netns, port: int = 4792) -> dict:
    """Variant (a)'s problem, shown: a collect-metadata VXLAN device and a UDP socket (vnetd's)
    cannot hold the same port in one namespace, in either order."""
    host.ip_link("add", "name", "vxco", "type", "vxlan", "external", "dstport", port)
    code = f"""
import socket, subprocess, json
out = {{}}
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", {port}))
r = subprocess.run(["ip", "link", "set", "vxco", "up"], capture_output=True, text=True)
out["device_up_while_socket_bound"] = (r.returncode, r.stderr.strip())
s.close()
r = subprocess.run(["ip", "link", "set", "vxco", "up"], capture_output=True, text=True)
out["device_up_alone"] = (r.returncode, r.stderr.strip())
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.bind(("0.0.0.0", {port})); out["socket_bind_while_device_up"] = "ok"
except OSError as e:
    out["socket_bind_while_device_up"] = str(e)
print(json.dumps(out))
"""
    r = host.exec("python3", "-c", code)
    host.ip_link("del", "vxco")
    return json.loads(r.stdout)
