"""The benchmark testbed: two hosts on a veth wire, one guest per overlay behind each.

Built from tests/system/netlab.py (namespaces, vnetd processes, guaranteed cleanup):

    guest ka (kernel VXLAN)                                   guest kb
        eth0 -- veth -- [br-kx + vx1]  hA  eth0 ====== eth0  hB  [br-kx + vx1] -- veth -- eth0
    guest va (vnet)                      |   the "wire"     |                          guest vb
        vn-vm  (TAP of vnetd in hA) -----+   (veth pair,    +----- (TAP of vnetd in hB)  vn-vm
                                              optional tbf)

* ``native``: host to host over the wire (10.77.0.1 -> 10.77.0.2).
* ``kernel-vxlan``: Linux ``vxlan`` (UDP 4789) + bridge in the host namespaces, guests
  192.168.72.1/.2 on veth ports of the bridge.
* ``vnet-*``: one vnetd per host (UDP 4790, ``--udp-port``), guests 192.168.71.1/.2 on its TAPs;
  the three vnet configurations are the same daemons switched with ``vnetctl set mode``.
* ``vnet-encrypted``: the same daemons (adaptive mode), a second guest pair 192.168.73.1/.2 in
  VNI 2 on an encrypted link ``peer-enc`` (``encrypt PEER_KEY``, Noise; host keys made with
  ``vnetd --gen-key``), beside the plaintext link ``peer`` of VNI 1 to the same peer.

Overlay guests get MTU = wire MTU - 50 (the VXLAN overhead; - 82 on the encrypted link, whose
datagrams carry 32 bytes more), so nothing is fragmented on the wire except where a test sends
datagrams larger than the MTU on purpose.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "system"))
import netlab  # noqa: E402

VXLAN_OVERHEAD = 50
# An encrypted link's data message header (16) and authentication tag (16).
CRYPTO_OVERHEAD = 32
KERNEL_VXLAN_PORT = 4789
VNET_PORT = 4790
VNI = 1

CONFIGS = ["native", "kernel-vxlan", "vnet-kernel", "vnet-guest-driven", "vnet-polling", "vnet-adaptive",
           "vnet-encrypted"]
# The kernel fast path needs no polling dispatcher (vnetd sees only its ARP): parked mode.
VNET_MODE = {"vnet-guest-driven": "guest-driven", "vnet-polling": "polling", "vnet-adaptive": "adaptive",
             "vnet-encrypted": "adaptive", "vnet-kernel": "guest-driven"}
# Mode the daemons are parked in while another configuration is measured: no busy polling
# may steal CPU from the native or kernel-VXLAN runs.
PARK_MODE = "guest-driven"

WIRE_NET = "10.77.0"
VNET_NET = "192.168.71"
KX_NET = "192.168.72"
ENC_NET = "192.168.73"
ENC_VNI = 2
FP_NET = "192.168.74"
FP_VNI = 3
FP_MAC = ("52:54:00:b3:00:01", "52:54:00:b3:00:02")
ENC_MAC = ("52:54:00:b2:00:01", "52:54:00:b2:00:02")
VNET_MAC = ("52:54:00:b0:00:01", "52:54:00:b0:00:02")
KX_MAC = ("52:54:00:b1:00:01", "52:54:00:b1:00:02")


def is_vnet(config: str) -> bool:
    return config in VNET_MODE


def vnet_link(config: str) -> str:
    """The vnet link a configuration's traffic crosses."""
    return {"vnet-encrypted": "peer-enc", "vnet-kernel": "peer-k"}.get(config, "peer")


@dataclass
class Endpoint:
    """Where a test of one configuration runs: the client side (A) and the server side (B)."""
    config: str
    client: netlab.Netns
    server: netlab.Netns
    client_ip: str
    server_ip: str
    subnet: str  # CIDR of the path's addresses (MPI interface selection)
    mtu: int  # MTU of the path as the endpoints see it


class Testbed:
    """One testbed for one wire MTU (and optional rate limit). Use as a context manager:
    everything it made (namespaces, vnetd, servers) is removed on exit, whatever happens."""

    def __init__(self, mtu: int = 1500, rate: Optional[str] = None, vnet_settings=()):
        self.wire_mtu = mtu
        self.overlay_mtu = mtu - VXLAN_OVERHEAD
        self.rate = rate
        self.vnet_settings = list(vnet_settings)
        self.lab = netlab.Lab(tag=f"bench-mtu{mtu}")
        self.mode: Optional[str] = None
        self._servers: dict = {}

    # -- context --
    def __enter__(self):
        try:
            self.build()
        except BaseException:
            self.lab.failed = True
            self.lab.keep_workdir = True
            self.lab.close()
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.lab.failed = True
        self.close()

    def close(self):
        self.lab.close()

    @property
    def workdir(self) -> Path:
        return self.lab.workdir

    # -- building --
    def build(self) -> None:
        lab = self.lab
        self.hA = netlab.Host(lab, "hA", f"{WIRE_NET}.1")
        self.hB = netlab.Host(lab, "hB", f"{WIRE_NET}.2")
        lab.hosts += [self.hA, self.hB]
        hosts = (self.hA, self.hB)
        # the wire: one veth pair straight between the two hosts
        lab.veth(self.hA, "eth0", self.hB, "eth0", up=False)
        for h in hosts:
            h.ip_link("set", "eth0", "mtu", self.wire_mtu)
            h.ip("addr", "add", f"{h.underlay_ip}/24", "dev", "eth0")
            h.ip_link("set", "eth0", "up")
            if self.rate:
                self._tbf(h)
        macs = {h: h.links()["eth0"]["address"] for h in hosts}
        for h, o in ((self.hA, self.hB), (self.hB, self.hA)):
            h.ip("neigh", "replace", o.underlay_ip, "lladdr", macs[o], "dev", "eth0", "nud", "permanent")

        # kernel VXLAN + bridge, one guest on a veth port
        self.kx_guests = []
        for i, (h, o) in enumerate(((self.hA, self.hB), (self.hB, self.hA))):
            g = lab.guest(f"k{'ab'[i]}", ip=f"{KX_NET}.{i + 1}", mac=KX_MAC[i])
            h.ip_link("add", "vx1", "type", "vxlan", "id", VNI, "dstport", KERNEL_VXLAN_PORT,
                      "local", h.underlay_ip, "dev", "eth0", "nolearning")
            h.ip_link("set", "vx1", "mtu", self.overlay_mtu)
            h.ip_link("add", "br-kx", "type", "bridge")
            h.ip_link("set", "vx1", "master", "br-kx")
            h.ip_link("add", "kg", "type", "veth", "peer", "name", "eth0", "netns", g.name)
            h.ip_link("set", "kg", "mtu", self.overlay_mtu)
            h.ip_link("set", "kg", "master", "br-kx")
            for dev in ("vx1", "kg", "br-kx"):
                h.ip_link("set", dev, "up")
            # the remote guest's MAC lives behind the other host (no flooding, no learning)
            h.exec("bridge", "fdb", "append", "00:00:00:00:00:00", "dev", "vx1", "dst", o.underlay_ip)
            h.exec("bridge", "fdb", "append", KX_MAC[1 - i], "dev", "vx1", "dst", o.underlay_ip)
            g.ip_link("set", "eth0", "address", KX_MAC[i])
            g.configure("eth0", self.overlay_mtu)
            self.kx_guests.append(g)

        # vnet: one daemon per host, one TAP guest each on the plaintext link, one on the
        # encrypted link
        self.vnet_guests = [lab.guest(f"v{'ab'[i]}", ip=f"{VNET_NET}.{i + 1}", mac=VNET_MAC[i])
                            for i in range(2)]
        self.enc_guests = [lab.guest(f"e{'ab'[i]}", ip=f"{ENC_NET}.{i + 1}", mac=ENC_MAC[i])
                           for i in range(2)]
        self.fp_guests = [lab.guest(f"f{'ab'[i]}", ip=f"{FP_NET}.{i + 1}", mac=FP_MAC[i])
                          for i in range(2)]
        self.enc_mtu = self.overlay_mtu - CRYPTO_OVERHEAD
        keys = {}
        for h in (self.hA, self.hB):
            path = lab.workdir / f"{h.role}.key"
            r = netlab.subprocess.run([str(netlab.VNETD), "--gen-key", str(path)], capture_output=True,
                                      text=True, timeout=10, check=True)
            keys[h] = (path, r.stdout.strip())
        for i, (h, o) in enumerate(((self.hA, self.hB), (self.hB, self.hA))):
            g, og = self.vnet_guests[i], self.vnet_guests[1 - i]
            e, oe = self.enc_guests[i], self.enc_guests[1 - i]
            f, of = self.fp_guests[i], self.fp_guests[1 - i]
            lines = [f"# vnet benchmark host {h.role}, wire MTU {self.wire_mtu}",
                     f"set mode {PARK_MODE}"]
            lines += [f"set {s}" for s in self.vnet_settings]
            lines += [f"interface add vm tap mac {g.mac} mtu {self.overlay_mtu} netns {g.name}",
                      f"link add peer udp {o.underlay_ip}:{VNET_PORT} vni {VNI}",
                      f"route add any {g.mac} interface vm",
                      f"route add any {og.mac} link peer",
                      f"interface add vm-enc tap mac {e.mac} mtu {self.enc_mtu} netns {e.name} vni {ENC_VNI}",
                      f"link add peer-enc udp {o.underlay_ip}:{VNET_PORT} vni {ENC_VNI} encrypt {keys[o][1]}",
                      f"route add any {e.mac} interface vm-enc",
                      f"route add any {oe.mac} link peer-enc",
                      # the kernel fast path: a veth guest on a plain link of its own VNI
                      f"interface add vm-k veth mac {f.mac} mtu {self.overlay_mtu} netns {f.name} vni {FP_VNI}",
                      f"link add peer-k udp {o.underlay_ip}:{VNET_PORT} vni {FP_VNI}",
                      f"route add any {f.mac} interface vm-k",
                      f"route add any {of.mac} link peer-k"]
            h.start_vnetd(config="\n".join(lines) + "\n", args=["--udp-port", VNET_PORT, "--key-file", keys[h][0]])
            g.configure(h.interface("vm")["ifname"], self.overlay_mtu)
            e.configure(h.interface("vm-enc")["ifname"], self.enc_mtu)
            f.configure(h.interface("vm-k")["ifname"], self.overlay_mtu)
            if h.interface("vm-k").get("path") != "kernel":
                raise RuntimeError(f"vnet-kernel: the kernel fast path does not serve vm-k on {h.role}: "
                                   f"{h.vnetd.log_text()[-1500:]}")
        self.mode = PARK_MODE

        for gs in (self.kx_guests, self.vnet_guests, self.enc_guests, self.fp_guests):
            for i, g in enumerate(gs):
                o = gs[1 - i]
                g.ip("neigh", "replace", o.ip_addr, "lladdr", o.mac, "dev", g.ifname, "nud", "permanent")

        # every path answers before anything is measured
        for cfg in ("native", "kernel-vxlan", "vnet-adaptive", "vnet-encrypted", "vnet-kernel"):
            ep = self.endpoint(cfg)
            lab.wait_ping(ep.client, ep.server_ip, timeout=15)

    def _tbf(self, h: netlab.Host) -> None:
        """Rate-limit the host's egress onto the wire (token bucket), like a NIC of that speed."""
        bps = parse_rate(self.rate)
        # the bucket must hold at least one scheduler tick of traffic and one 64 KB GSO packet
        burst = max(int(bps / 8 / 250), 2 * 65536 + 4096)
        h.exec("tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", self.rate,
               "burst", burst, "latency", "10ms")

    # -- configurations --
    def endpoint(self, config: str) -> Endpoint:
        if config == "native":
            return Endpoint(config, self.hA, self.hB, self.hA.underlay_ip, self.hB.underlay_ip,
                            f"{WIRE_NET}.0/24", self.wire_mtu)
        if config == "kernel-vxlan":
            a, b = self.kx_guests
            return Endpoint(config, a, b, a.ip_addr, b.ip_addr, f"{KX_NET}.0/24", self.overlay_mtu)
        if config == "vnet-encrypted":
            a, b = self.enc_guests
            return Endpoint(config, a, b, a.ip_addr, b.ip_addr, f"{ENC_NET}.0/24", self.enc_mtu)
        if config == "vnet-kernel":
            a, b = self.fp_guests
            return Endpoint(config, a, b, a.ip_addr, b.ip_addr, f"{FP_NET}.0/24", self.overlay_mtu)
        if is_vnet(config):
            a, b = self.vnet_guests
            return Endpoint(config, a, b, a.ip_addr, b.ip_addr, f"{VNET_NET}.0/24", self.overlay_mtu)
        raise ValueError(config)

    def prepare(self, config: str) -> None:
        """Put the vnet daemons in the mode ``config`` needs (parked for the non-vnet ones)."""
        want = VNET_MODE.get(config, PARK_MODE)
        if want != self.mode:
            for h in (self.hA, self.hB):
                h.ctl("set", "mode", want)
            self.mode = want
            time.sleep(0.1)

    # -- long-running servers (tracked by the lab, stopped at close) --
    def server(self, kind: str, ep: Endpoint):
        key = (kind, ep.server.name)
        p = self._servers.get(key)
        if p is not None and p.poll() is None:
            return p
        if kind == "iperf3":
            argv = ["iperf3", "-s", "-B", ep.server_ip, "-p", 5201]
            port, proto = 5201, "tcp"
        elif kind == "sockperf":
            argv = ["sockperf", "server", "-i", ep.server_ip, "-p", 11111]
            port, proto = 11111, "udp"
        else:
            raise ValueError(kind)
        log = open(self.workdir / f"{kind}-{ep.server.role}.log", "ab")
        p = ep.server.popen(*argv, stdin=netlab.subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        flag = "-Htln" if proto == "tcp" else "-Huln"
        netlab.wait_until(lambda: p.poll() is None and f":{port} " in ep.server.exec("ss", flag).stdout,
                          10, 0.05, what=f"{kind} server in {ep.server.name}")
        self._servers[key] = p
        return p

    def restart_server(self, kind: str, ep: Endpoint):
        p = self._servers.pop((kind, ep.server.name), None)
        if p is not None:
            netlab.stop_pid(p, timeout=3)
        return self.server(kind, ep)

    # -- counters --
    def counters(self, config: str) -> dict:
        """Snapshot of the counters that prove which path a test's traffic took."""
        if is_vnet(config):
            return {"A": self.hA.stats(), "B": self.hB.stats()}
        dev = "vx1" if config == "kernel-vxlan" else "eth0"
        return {"A": self.hA.link_counters(dev), "B": self.hB.link_counters(dev), "dev": dev}

    def vnetd_pids(self) -> list:
        return [h.vnetd.pid for h in (self.hA, self.hB) if h.vnetd and h.vnetd.alive()]

    def daemons_alive(self) -> bool:
        return all(h.vnetd is not None and h.vnetd.alive() for h in (self.hA, self.hB))

    def logs(self) -> str:
        return self.lab.logs()


def parse_rate(rate: str) -> float:
    """'1gbit' -> 1e9 bits/s (tc's units: kbit, mbit, gbit, bit)."""
    r = rate.strip().lower()
    for suffix, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if r.endswith(suffix):
            return float(r[: -len(suffix)]) * mult
    raise ValueError(f"rate {rate!r}: use e.g. 1gbit or 10gbit")


def check_path(config: str, before: dict, after: dict, ab_bytes: int, ba_bytes: int = 0) -> dict:
    """Did ``ab_bytes`` of payload go A->B (and ``ba_bytes`` B->A) over this config's path?

    vnet: the link ``peer`` (``peer-enc`` for vnet-encrypted) of host A sent (tx_bytes) and host
    B's received (rx_bytes) at least the payload, and the same the other way; kernel VXLAN: the ``vx1`` devices; native: the
    wire's ``eth0``. Drops seen on vnet ports during the test are reported too."""
    out = {"payload_ab": int(ab_bytes), "payload_ba": int(ba_bytes)}
    if is_vnet(config):
        d = {}
        for side in ("A", "B"):
            for key in ("tx_bytes", "rx_bytes", "tx_frames", "rx_frames"):
                d[f"{side}_link_{key}"] = netlab.delta(before[side], after[side], vnet_link(config), key)
        out.update(d)
        out["path"] = f"vnet link '{vnet_link(config)}' (show stats json)"
        ok = (d["A_link_tx_bytes"] >= ab_bytes and d["B_link_rx_bytes"] >= ab_bytes
              and d["B_link_tx_bytes"] >= ba_bytes and d["A_link_rx_bytes"] >= ba_bytes)
        if config == "vnet-kernel":
            # The kernel's own share of the link's counters carried it, not vnetd.
            k = {}
            for side in ("A", "B"):
                kb = netlab.port_of(before[side], vnet_link(config)).get("kernel") or {}
                ka = netlab.port_of(after[side], vnet_link(config)).get("kernel") or {}
                for key in ("tx_bytes", "rx_bytes", "tx_frames", "rx_frames"):
                    k[f"{side}_kernel_{key}"] = ka.get(key, 0) - kb.get(key, 0)
            out.update(k)
            out["path"] = f"kernel fast path, link '{vnet_link(config)}' (show stats json: its kernel share)"
            ok = ok and (k["A_kernel_tx_bytes"] >= ab_bytes and k["B_kernel_rx_bytes"] >= ab_bytes
                         and k["B_kernel_tx_bytes"] >= ba_bytes and k["A_kernel_rx_bytes"] >= ba_bytes)
        drops = {}
        for side in ("A", "B"):
            for reason in _all_reasons(before[side], after[side]):
                n = netlab.drops(after[side], reason) - netlab.drops(before[side], reason)
                if n:
                    drops[f"{side}:{reason}"] = n
        out["drops"] = drops
    else:
        dev = before["dev"]
        d = {"A_tx_bytes": after["A"]["tx_bytes"] - before["A"]["tx_bytes"],
             "B_rx_bytes": after["B"]["rx_bytes"] - before["B"]["rx_bytes"],
             "B_tx_bytes": after["B"]["tx_bytes"] - before["B"]["tx_bytes"],
             "A_rx_bytes": after["A"]["rx_bytes"] - before["A"]["rx_bytes"]}
        out.update(d)
        out["path"] = f"kernel device {dev} in the host namespaces (ip -s link)"
        ok = (d["A_tx_bytes"] >= ab_bytes and d["B_rx_bytes"] >= ab_bytes
              and d["B_tx_bytes"] >= ba_bytes and d["A_rx_bytes"] >= ba_bytes)
    out["ok"] = bool(ok)
    return out


def _all_reasons(before: dict, after: dict) -> set:
    rs = set(after.get("daemon", {}).get("drops", {}))
    for p in after.get("ports", []):
        rs |= set(p.get("drops", {}))
    return rs


def dispatch_delta(before: dict, after: dict) -> dict:
    """Dispatcher activity of both daemons during a test: frames, wake-ups, frames per
    wake-up, mode switches, and the modes the dispatchers ended in."""
    frames = wakeups = switches = 0
    modes = []
    for side in ("A", "B"):
        b = {d["index"]: d for d in before[side].get("dispatch", {}).get("dispatchers", [])}
        for d in after[side].get("dispatch", {}).get("dispatchers", []):
            p = b.get(d["index"], {})
            frames += d.get("frames", 0) - p.get("frames", 0)
            wakeups += d.get("wakeups", 0) - p.get("wakeups", 0)
            switches += d.get("switches", 0) - p.get("switches", 0)
            modes.append(f"{side}{d['index']}:{d.get('mode')}")
    off = {}
    for side in ("A", "B"):
        ob = before[side].get("dispatch", {}).get("offload", {})
        for k, v in after[side].get("dispatch", {}).get("offload", {}).items():
            if isinstance(v, (int, float)):
                off[k] = off.get(k, 0) + v - ob.get(k, 0)
    return {"frames": frames, "wakeups": wakeups, "switches": switches,
            "frames_per_wakeup": round(frames / wakeups, 2) if wakeups else None,
            "end_modes": modes, "offload": off}


def dump(obj) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)


def have_root() -> Optional[str]:
    if os.geteuid() != 0:
        return "needs root (network namespaces, TAP devices)"
    if not os.path.exists("/dev/net/tun"):
        return "needs /dev/net/tun"
    return None
