"""The suite's testbed (``bench.run``): two hosts on a veth wire, one guest per overlay behind
each. A ``testbed.Testbed`` (the lab, the wire, the kernel VXLAN, the daemons):

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
* ``vnet-encrypted-veth``: the same, with veth guests 192.168.75.1/.2 (VNI 4, link ``peer-ev``):
  what the CNI plugin gives a container; the kernel fast path passes their frames for the
  encrypted link to vnetd through the punt TAP.
* ``vnet-encrypted-guest-driven``, ``vnet-encrypted-veth-guest-driven`` (on request, not in the
  default set): the two encrypted configurations with the daemons in guest-driven mode, to see
  what adaptive polling buys or costs on an encrypted link.

Overlay guests get MTU = wire MTU - 50 (the VXLAN overhead; - 82 on the encrypted link, whose
datagrams carry 32 bytes more), so nothing is fragmented on the wire except where a test sends
datagrams larger than the MTU on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from vnetlab import netlab

from .testbed import PARK_MODE, VNET_PORT, Testbed, dispatch_activity, kernel_delta

# An encrypted link's data message header (16) and authentication tag (16).
CRYPTO_OVERHEAD = 32
VNI = 1

CONFIGS = ["native", "kernel-vxlan", "vnet-kernel", "vnet-guest-driven", "vnet-polling", "vnet-adaptive",
           "vnet-encrypted", "vnet-encrypted-veth"]
# Measured only when named in --configs: another mode on the guests and link of a default one.
SAME_GUESTS_AS = {"vnet-encrypted-guest-driven": "vnet-encrypted",
                  "vnet-encrypted-veth-guest-driven": "vnet-encrypted-veth"}
EXTRA_CONFIGS = list(SAME_GUESTS_AS)
# The kernel fast path needs no polling dispatcher (vnetd sees only its ARP): parked mode.
VNET_MODE = {"vnet-guest-driven": "guest-driven", "vnet-polling": "polling", "vnet-adaptive": "adaptive",
             "vnet-encrypted": "adaptive", "vnet-encrypted-veth": "adaptive", "vnet-kernel": "guest-driven",
             "vnet-encrypted-guest-driven": "guest-driven", "vnet-encrypted-veth-guest-driven": "guest-driven"}

WIRE_NET = "10.77.0"
VNET_NET = "192.168.71"
KX_NET = "192.168.72"
ENC_NET = "192.168.73"
ENC_VNI = 2
FP_NET = "192.168.74"
FP_VNI = 3
FP_MAC = ("52:54:00:b3:00:01", "52:54:00:b3:00:02")
EV_NET = "192.168.75"
EV_VNI = 4
EV_MAC = ("52:54:00:b4:00:01", "52:54:00:b4:00:02")
ENC_MAC = ("52:54:00:b2:00:01", "52:54:00:b2:00:02")
VNET_MAC = ("52:54:00:b0:00:01", "52:54:00:b0:00:02")
KX_MAC = ("52:54:00:b1:00:01", "52:54:00:b1:00:02")


def is_vnet(config: str) -> bool:
    return config in VNET_MODE


def vnet_link(config: str) -> str:
    """The vnet link a configuration's traffic crosses."""
    return {"vnet-encrypted": "peer-enc", "vnet-encrypted-veth": "peer-ev",
            "vnet-kernel": "peer-k"}.get(SAME_GUESTS_AS.get(config, config), "peer")


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


class SuiteBed(Testbed):
    """One testbed for one wire MTU (and optional rate limit). Use as a context manager:
    everything it made (namespaces, vnetd, servers) is removed on exit, whatever happens."""

    def __init__(self, mtu: int = 1500, rate: Optional[str] = None, vnet_settings=()):
        super().__init__(f"bench-mtu{mtu}", mtu, vnet_settings=vnet_settings)
        self.rate = rate

    # -- building --
    def setup(self) -> None:
        lab = self.lab
        self.wire_pair(WIRE_NET)
        # kernel VXLAN + bridge, one guest on a veth port
        self.kx_guests = self.guest_pair("k", KX_NET, KX_MAC)
        self.kernel_vxlan(list(zip(self.kx_guests, self.hosts)), VNI, port=lambda i: "kg")

        # vnet: one daemon per host, one TAP guest each on the plaintext link, one on the
        # encrypted link, one veth guest on the kernel fast path
        self.vnet_guests = self.guest_pair("v", VNET_NET, VNET_MAC)
        self.enc_guests = self.guest_pair("e", ENC_NET, ENC_MAC)
        self.fp_guests = self.guest_pair("f", FP_NET, FP_MAC)
        self.ev_guests = self.guest_pair("ev", EV_NET, EV_MAC)
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
            ev, oev = self.ev_guests[i], self.ev_guests[1 - i]
            lines = [f"interface add vm tap mac {g.mac} mtu {self.overlay_mtu} netns {g.name}",
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
                     f"route add any {of.mac} link peer-k",
                     # a veth guest on an encrypted link: punted to vnetd
                     f"interface add vm-ev veth mac {ev.mac} mtu {self.enc_mtu} netns {ev.name} vni {EV_VNI}",
                     f"link add peer-ev udp {o.underlay_ip}:{VNET_PORT} vni {EV_VNI} encrypt {keys[o][1]}",
                     f"route add any {ev.mac} interface vm-ev",
                     f"route add any {oev.mac} link peer-ev"]
            self.start_vnetd(h, f"vnet benchmark host {h.role}, wire MTU {self.wire_mtu}", lines,
                             args=["--key-file", keys[h][0]])
            g.configure(h.interface("vm")["ifname"], self.overlay_mtu)
            e.configure(h.interface("vm-enc")["ifname"], self.enc_mtu)
            f.configure(h.interface("vm-k")["ifname"], self.overlay_mtu)
            ev.configure(h.interface("vm-ev")["ifname"], self.enc_mtu)
            if h.interface("vm-k").get("path") != "kernel":
                raise RuntimeError(f"vnet-kernel: the kernel fast path does not serve vm-k on {h.role}: "
                                   f"{h.vnetd.log_text()[-1500:]}")
        self.pin_guest_neighbours(self.kx_guests, self.vnet_guests, self.enc_guests, self.fp_guests,
                                  self.ev_guests)

        # every path answers before anything is measured
        for cfg in ("native", "kernel-vxlan", "vnet-adaptive", "vnet-encrypted", "vnet-encrypted-veth", "vnet-kernel"):
            ep = self.endpoint(cfg)
            lab.wait_ping(ep.client, ep.server_ip, timeout=15)

    def shape_wire(self, h: netlab.Host) -> None:
        """Rate-limit the host's egress onto the wire (token bucket), like a NIC of that speed."""
        if not self.rate:
            return
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
        on = SAME_GUESTS_AS.get(config, config)
        if on == "kernel-vxlan":
            guests, net, mtu = self.kx_guests, KX_NET, self.overlay_mtu
        elif on == "vnet-encrypted":
            guests, net, mtu = self.enc_guests, ENC_NET, self.enc_mtu
        elif on == "vnet-kernel":
            guests, net, mtu = self.fp_guests, FP_NET, self.overlay_mtu
        elif on == "vnet-encrypted-veth":
            guests, net, mtu = self.ev_guests, EV_NET, self.enc_mtu
        elif is_vnet(config):
            guests, net, mtu = self.vnet_guests, VNET_NET, self.overlay_mtu
        else:
            raise ValueError(config)
        a, b = guests
        return Endpoint(config, a, b, a.ip_addr, b.ip_addr, f"{net}.0/24", mtu)

    def prepare(self, config: str) -> None:
        """Put the vnet daemons in the mode ``config`` needs (parked for the non-vnet ones)."""
        self.set_vnet_mode(VNET_MODE.get(config, PARK_MODE))

    # -- counters --
    def counters(self, config: str) -> dict:
        """Snapshot of the counters that prove which path a test's traffic took."""
        if is_vnet(config):
            return {"A": self.hA.stats(), "B": self.hB.stats()}
        return self.pair_counters("vx1" if config == "kernel-vxlan" else "eth0")


def parse_rate(rate: str) -> float:
    """'1gbit' -> 1e9 bits/s (tc's units: kbit, mbit, gbit, bit)."""
    r = rate.strip().lower()
    for suffix, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if r.endswith(suffix):
            return float(r[: -len(suffix)]) * mult
    raise ValueError(f"rate {rate!r}: use e.g. 1gbit or 10gbit")


_COUNTERS = ("tx_bytes", "rx_bytes", "tx_frames", "rx_frames")


def check_path(config: str, before: dict, after: dict, ab_bytes: int, ba_bytes: int = 0) -> dict:
    """Did ``ab_bytes`` of payload go A->B (and ``ba_bytes`` B->A) over this config's path?

    vnet: the link ``peer`` (``peer-enc`` for vnet-encrypted) of host A sent (tx_bytes) and host
    B's received (rx_bytes) at least the payload, and the same the other way; kernel VXLAN: the ``vx1`` devices; native: the
    wire's ``eth0``. Drops seen on vnet ports during the test are reported too."""
    out = {"payload_ab": int(ab_bytes), "payload_ba": int(ba_bytes)}

    def carried(d: dict, what: str) -> bool:
        return (d[f"A_{what}tx_bytes"] >= ab_bytes and d[f"B_{what}rx_bytes"] >= ab_bytes
                and d[f"B_{what}tx_bytes"] >= ba_bytes and d[f"A_{what}rx_bytes"] >= ba_bytes)

    if is_vnet(config):
        link = vnet_link(config)
        d = {f"{side}_link_{key}": netlab.delta(before[side], after[side], link, key)
             for side in ("A", "B") for key in _COUNTERS}
        out.update(d)
        out["path"] = f"vnet link '{link}' (show stats json)"
        ok = carried(d, "link_")
        if config == "vnet-kernel":
            # The kernel's own share of the link's counters carried it, not vnetd.
            k = {f"{side}_kernel_{key}": kernel_delta(before[side], after[side], link, key)
                 for side in ("A", "B") for key in _COUNTERS}
            out.update(k)
            out["path"] = f"kernel fast path, link '{link}' (show stats json: its kernel share)"
            ok = ok and carried(k, "kernel_")
        drops = {}
        for side in ("A", "B"):
            for reason in _all_reasons(before[side], after[side]):
                n = netlab.drops(after[side], reason) - netlab.drops(before[side], reason)
                if n:
                    drops[f"{side}:{reason}"] = n
        out["drops"] = drops
    else:
        dev = before["dev"]
        d = {f"{side}_{key}": after[side][key] - before[side][key]
             for side, key in (("A", "tx_bytes"), ("B", "rx_bytes"), ("B", "tx_bytes"), ("A", "rx_bytes"))}
        out.update(d)
        out["path"] = f"kernel device {dev} in the host namespaces (ip -s link)"
        ok = carried(d, "")
    out["ok"] = bool(ok)
    return out


def _all_reasons(before: dict, after: dict) -> set:
    rs = set(after.get("daemon", {}).get("drops", {}))
    for p in after.get("ports", []):
        rs |= set(p.get("drops", {}))
    return rs


def dispatch_delta(before: dict, after: dict) -> dict:
    """Dispatcher activity of both daemons during a test (``testbed.dispatch_activity``), and
    their offload counters' growth."""
    out = dispatch_activity([(side, before[side], after[side]) for side in ("A", "B")])
    off = {}
    for side in ("A", "B"):
        ob = before[side].get("dispatch", {}).get("offload", {})
        for k, v in after[side].get("dispatch", {}).get("offload", {}).items():
            if isinstance(v, (int, float)):
                off[k] = off.get(k, 0) + v - ob.get(k, 0)
    out["offload"] = off
    return out
