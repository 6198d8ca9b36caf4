"""The HPC testbed: 4 MPI ranks on 4 guests spread over 2-4 hosts, one testbed for every
configuration, so a job can be run on each in turn and compared within one run.

A ``testbed.Testbed`` (the lab and its cleanup, the kernel VXLAN, the vnet daemons):

    wire namespace: bridge br0 (the underlay switch), one veth per host, MTU 1500 or 9000
      |             |             |             |
     h1 eth0       h2 eth0       h3 eth0       h4 eth0      10.88.0.N/24   (native ranks here)
      |- vx1 + br-kx (kernel VXLAN, UDP 4789) -- veth -- guest kx<i>   192.168.82.<i+1>/24
      |- vnetd (UDP 4790), VNI 1: TAP r<i> -------------- guest vn<i>   192.168.81.<i+1>/24
      |                    VNI 3: veth kr<i> (kernel fast path) -- guest kvn<i>  192.168.83.<i+1>/24

One vnetd per host serves both vnet overlays, each with its own udp links (``to-h<N>``,
``kto-h<N>``): the TAP guests are the ``vnet-<mode>`` configurations (the dispatchers switched
with ``set mode``), the veth guests ``vnet-kernel`` (forwarded by the kernel's eBPF programs, #10).

Guests are placed in blocks (ranks 0,1 on h1 and 2,3 on h2 with two hosts; one per host with
four), so rank 0 and rank 3 are always on the first and the last host: the most distant pair,
where NetPIPE runs. With fewer than four hosts the ``native`` ranks sharing a host talk over
that host's loopback (TCP, never shared memory), as co-located processes of a real cluster do.

**Adding a configuration** is one function that builds it and one line in ``CONFIGS``. The
function receives the ``Bed`` (hosts, underlay, MTUs, ``bed.shared`` for parts several
configurations share, such as the vnet daemons: ``vnet_overlay`` adds a VNI of guests to them)
and returns a ``Placement``: where the 4 ranks
run (namespace + address each), the subnet MPI must use, a ``prepare`` hook run before every
measurement (the vnet modes switch the shared daemons there), and ``counters`` (a snapshot of
the counters that prove which path a job's bytes took; ``check`` compares two snapshots).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from vnetlab import netlab

from .machine import proc_cpu
from .testbed import PARK_MODE, VNET_PORT, Testbed, dispatch_activity, kernel_delta

RANKS = 4
VNI = 1
WIRE_NET = "10.88.0"
VNET_NET = "192.168.81"
KX_NET = "192.168.82"
VETH_NET = "192.168.83"


def kx_mac(i: int) -> str:
    return f"52:54:00:82:00:{i + 1:02x}"


@dataclass
class Rank:
    """Where one MPI rank runs."""
    ns: netlab.Netns
    ip: str
    host: int  # index of the host (0-based) it lives on


@dataclass
class Placement:
    """One configuration, built: what a job needs to run on it and to prove its path."""
    config: str
    ranks: list  # [Rank] x RANKS, rank order
    subnet: str  # CIDR the MPI traffic must use (btl_tcp_if_include)
    path: str  # what the counters check reads, for the report
    counters: Callable[[], dict]
    # (before, after, need) -> {"ok": bool, ...}; need = {"per_pair": bytes every ordered pair
    # of the job's ranks on different hosts moved at least, "ranks": the job's rank indexes}
    check: Callable[[dict, dict, dict], dict]
    prepare: Callable[[], None] = lambda: None
    mtu: int = 1500  # MTU the ranks' NICs have
    info: Callable[[dict, dict], dict] = field(default=lambda b, a: {})  # extra per-sample facts


class Bed(Testbed):
    """Hosts on an underlay bridge; configurations are built on it on demand by name.

    Use as a context manager: everything made (namespaces, daemons) goes on exit."""

    def __init__(self, hosts: int = 4, mtu: int = 1500, vnet_settings=()):
        if not 2 <= hosts <= RANKS:
            raise ValueError(f"hosts must be 2..{RANKS}")
        super().__init__(f"hpc-{hosts}h-mtu{mtu}", mtu, subnet=WIRE_NET, vnet_settings=vnet_settings)
        self.nhosts = hosts
        self.shared: dict = {}  # parts several configurations share (vnet daemons, ...)
        self.placements: dict = {}

    def host_of(self, rank: int) -> int:
        """Block placement: ranks fill hosts in order, so rank 0 is on the first host and
        rank RANKS-1 on the last."""
        return rank * self.nhosts // RANKS

    def setup(self) -> None:
        """The underlay: the hosts on the lab's wire bridge, at the wire MTU."""
        for n in range(self.nhosts):
            self.hosts.append(self.lab.host(f"h{n + 1}"))
        wire = self.lab.wire
        for name in wire.links():
            if name != "lo":
                wire.ip_link("set", name, "mtu", self.wire_mtu)
        for h in self.hosts:
            h.ip_link("set", "eth0", "mtu", self.wire_mtu)

    def build(self, config: str) -> Placement:
        """The configuration's Placement, building it the first time it is asked for."""
        if config not in self.placements:
            if config not in CONFIGS:
                raise ValueError(f"unknown configuration {config!r} (known: {', '.join(CONFIGS)})")
            p = CONFIGS[config](self)
            # every rank answers every other before anything is measured
            for r in p.ranks:
                for o in p.ranks:
                    if o is not r and o.ns is not r.ns:
                        self.lab.wait_ping(r.ns, o.ip, timeout=20)
            self.placements[config] = p
        return self.placements[config]


# --- counters checks ---------------------------------------------------------------------

def need_between(ranks: list, need: dict) -> dict:
    """Bytes host a must at least have sent to host b, {(a, b): n}: ``need["per_pair"]`` for
    every ordered pair of the job's ranks (``need["ranks"]``) with one on a and one on b."""
    job = [ranks[i] for i in need["ranks"]]
    out: dict = {}
    for x in job:
        for y in job:
            if x.host != y.host:
                out[(x.host, y.host)] = out.get((x.host, y.host), 0) + need["per_pair"]
    return out


def _device_counters(bed: Bed, dev: str) -> dict:
    return {i: h.link_counters(dev) for i, h in enumerate(bed.hosts)}


def _device_check(bed: Bed, ranks: list, dev: str, before: dict, after: dict, need: dict) -> dict:
    """Every host's ``dev`` sent and received at least the bytes the job must have moved
    between it and the other hosts (``need_between``)."""
    pairs = need_between(ranks, need)
    per = {}
    ok = True
    for i in range(bed.nhosts):
        tx = after[i]["tx_bytes"] - before[i]["tx_bytes"]
        rx = after[i]["rx_bytes"] - before[i]["rx_bytes"]
        want_tx = sum(n for (a, _), n in pairs.items() if a == i)
        want_rx = sum(n for (_, b), n in pairs.items() if b == i)
        per[f"h{i + 1}"] = {"tx_bytes": tx, "rx_bytes": rx, "need_tx": want_tx, "need_rx": want_rx}
        ok = ok and tx >= want_tx and rx >= want_rx
    return {"ok": bool(ok), "path": f"kernel device {dev} in each host namespace (ip -s link)",
            "hosts": per, "total_tx_bytes": sum(p["tx_bytes"] for p in per.values())}


# --- the configurations -------------------------------------------------------------------

def build_native(bed: Bed) -> Placement:
    """The ranks on the hosts themselves, over the underlay (no overlay)."""
    ranks = []
    for i in range(RANKS):
        h = bed.host_of(i)
        ranks.append(Rank(bed.hosts[h], bed.hosts[h].underlay_ip, h))
    return Placement(
        "native", ranks, f"{WIRE_NET}.0/24", "eth0 (underlay) in each host",
        counters=lambda: _device_counters(bed, "eth0"),
        check=lambda b, a, need: _device_check(bed, ranks, "eth0", b, a, need),
        prepare=lambda: bed.set_vnet_mode(PARK_MODE), mtu=bed.wire_mtu)


def build_kernel_vxlan(bed: Bed) -> Placement:
    """Linux ``vxlan`` (UDP 4789, no learning, static FDB) + a bridge in every host, the
    guests on veth ports of the bridge."""
    ranks = []
    for i in range(RANKS):
        h = bed.host_of(i)
        g = bed.lab.guest(f"kx{i}", ip=f"{KX_NET}.{i + 1}", mac=kx_mac(i))
        ranks.append(Rank(g, g.ip_addr, h))
    bed.kernel_vxlan([(r.ns, bed.hosts[r.host]) for r in ranks], VNI)
    return Placement(
        "kernel-vxlan", ranks, f"{KX_NET}.0/24", "vx1 (kernel VXLAN device) in each host",
        counters=lambda: _device_counters(bed, "vx1"),
        check=lambda b, a, need: _device_check(bed, ranks, "vx1", b, a, need),
        prepare=lambda: bed.set_vnet_mode(PARK_MODE), mtu=bed.overlay_mtu)


@dataclass
class VnetOverlay:
    """One overlay on the shared vnet daemons: its own VNI, guests of one NIC kind, a udp link
    from every host to every other (``{prefix}to-h<N>``) and routes to every guest's MAC."""
    kind: str  # interface kind: tap (vnetd's user-space path) or veth (the kernel fast path)
    vni: int
    net: str  # the guests' /24
    mac_byte: int  # the guests' MACs: 52:54:00:<mac_byte>:00:<rank + 1>
    prefix: str  # of the interface (<prefix>r<rank>) and link names

    def mac(self, i: int) -> str:
        return f"52:54:00:{self.mac_byte:02x}:00:{i + 1:02x}"

    def link(self, to_host: int) -> str:
        return f"{self.prefix}to-h{to_host + 1}"

    def iface(self, i: int) -> str:
        return f"{self.prefix}r{i}"


TAP_OVERLAY = VnetOverlay("tap", VNI, VNET_NET, 0x81, "")
VETH_OVERLAY = VnetOverlay("veth", 3, VETH_NET, 0x83, "k")


def vnet_daemons(bed: Bed) -> None:
    """One vnetd per host (UDP 4790), started once in the parked mode; the ``vnet-*``
    configurations add their overlays to these daemons at run time."""
    if "vnetd" in bed.shared:
        return
    for hi, host in enumerate(bed.hosts):
        bed.start_vnetd(host, f"HPC benchmark host h{hi + 1}, wire MTU {bed.wire_mtu}")
    bed.shared["vnetd"] = True


def vnet_overlay(bed: Bed, ov: VnetOverlay) -> list:
    """``ov`` on the shared daemons (built once, one atomic script per host); its ranks."""
    key = f"overlay-{ov.vni}"
    if key in bed.shared:
        return bed.shared[key]
    vnet_daemons(bed)
    ranks = []
    for i in range(RANKS):
        h = bed.host_of(i)
        g = bed.lab.guest(f"{ov.prefix}vn{i}", ip=f"{ov.net}.{i + 1}", mac=ov.mac(i))
        ranks.append(Rank(g, g.ip_addr, h))
    for hi, host in enumerate(bed.hosts):
        lines = [f"link add {ov.link(oi)} udp {o.underlay_ip}:{VNET_PORT} vni {ov.vni}"
                 for oi, o in enumerate(bed.hosts) if oi != hi]
        for i, r in enumerate(ranks):
            if r.host == hi:
                lines.append(f"interface add {ov.iface(i)} {ov.kind} mac {ov.mac(i)} mtu {bed.overlay_mtu} "
                             f"netns {r.ns.name} vni {ov.vni}")
                lines.append(f"route add any {ov.mac(i)} interface {ov.iface(i)}")
            else:
                lines.append(f"route add any {ov.mac(i)} link {ov.link(r.host)}")
        host.script("\n".join(lines) + "\n")
        for i, r in enumerate(ranks):
            if r.host == hi:
                r.ns.configure(host.interface(ov.iface(i))["ifname"], bed.overlay_mtu)
    bed.shared[key] = ranks
    return ranks


def _vnet_counters(bed: Bed) -> dict:
    """``show stats json`` of every host (by index) and the daemons' CPU seconds so far."""
    snap: dict = {i: h.stats() for i, h in enumerate(bed.hosts)}
    snap["vnetd_cpu_s"] = sum(proc_cpu(h.vnetd.pid) for h in bed.hosts if h.vnetd is not None)
    return snap


def _vnet_check(bed: Bed, ov: VnetOverlay, ranks: list, before: dict, after: dict, need: dict,
                kernel: bool) -> dict:
    """vnet's own counters (``show stats json``): for every ordered pair of hosts (a, b)
    the job's ranks span, a's link to b sent (tx_bytes) and b's link to a received (rx_bytes)
    at least what the job must have moved from a to b (``need_between``); with ``kernel``,
    the kernel's share of those links' counters must show it (the fast path carried it, not
    vnetd). Drops on any vnet port are reported."""
    links = {}
    ok = True
    for (a, b), want in sorted(need_between(ranks, need).items()):
        tx = netlab.delta(before[a], after[a], ov.link(b), "tx_bytes")
        rx = netlab.delta(before[b], after[b], ov.link(a), "rx_bytes")
        links[f"h{a + 1}->h{b + 1}"] = entry = {"tx_bytes": tx, "rx_bytes": rx, "need": want}
        ok = ok and tx >= want and rx >= want
        if kernel:
            entry["kernel_tx_bytes"] = kernel_delta(before[a], after[a], ov.link(b), "tx_bytes")
            entry["kernel_rx_bytes"] = kernel_delta(before[b], after[b], ov.link(a), "rx_bytes")
            ok = ok and entry["kernel_tx_bytes"] >= want and entry["kernel_rx_bytes"] >= want
    drops = {}
    for i in range(bed.nhosts):
        for k, n in netlab.new_drops(before[i], after[i]).items():
            drops[f"h{i + 1}:{k}"] = n
    # what the guests handed to vnet (their interfaces' rx), for the cross-host share
    guest_rx = sum(netlab.delta(before[ranks[i].host], after[ranks[i].host], ov.iface(i), "rx_bytes")
                   for i in need["ranks"])
    path = ("kernel fast path: the kernel's share of vnet's udp links (vnetctl show stats json)" if kernel
            else "vnet udp links between hosts (vnetctl show stats json)")
    return {"ok": bool(ok), "path": path, "links": links, "drops": drops,
            "total_tx_bytes": sum(v["tx_bytes"] for v in links.values()), "guest_tx_bytes": guest_rx}


def _dispatch_info(bed: Bed, before: dict, after: dict) -> dict:
    """Dispatcher activity over the job: frames, wake-ups, mode switches, end modes; and the
    daemons' CPU time."""
    snaps = [(f"h{i + 1}/", before[i], after[i]) for i in range(bed.nhosts)]
    return {"dispatch": dispatch_activity(snaps),
            "vnetd_cpu_s": round(after["vnetd_cpu_s"] - before["vnetd_cpu_s"], 2)}


def _vnet_placement(bed: Bed, name: str, ov: VnetOverlay, mode: str, kernel: bool) -> Placement:
    ranks = vnet_overlay(bed, ov)
    return Placement(
        name, ranks, f"{ov.net}.0/24",
        "kernel fast path (vnet link counters, kernel share)" if kernel else "vnet udp links (vnetctl show stats json)",
        counters=lambda: _vnet_counters(bed),
        check=lambda b, a, need: _vnet_check(bed, ov, ranks, b, a, need, kernel),
        prepare=lambda: bed.set_vnet_mode(mode), mtu=bed.overlay_mtu,
        info=lambda b, a: _dispatch_info(bed, b, a))


def vnet_mode(mode: str) -> Callable[[Bed], Placement]:
    """A ``vnet-<mode>`` configuration: TAP guests served by vnetd in user space, the shared
    daemons' dispatchers switched to ``mode``."""
    def build(bed: Bed) -> Placement:
        return _vnet_placement(bed, f"vnet-{mode}", TAP_OVERLAY, mode, kernel=False)
    build.__doc__ = f"vnetd TAP guests on udp links, dispatchers in {mode} mode."
    return build


def build_vnet_kernel(bed: Bed) -> Placement:
    """``veth`` guests on plain udp links of their own VNI, forwarded by the kernel fast path
    (#10); the daemons stay parked (they see only what the kernel hands them)."""
    p = _vnet_placement(bed, "vnet-kernel", VETH_OVERLAY, PARK_MODE, kernel=True)
    for i, r in enumerate(p.ranks):
        path = bed.hosts[r.host].interface(VETH_OVERLAY.iface(i)).get("path")
        if path != "kernel":
            raise netlab.LabError(f"vnet-kernel: the kernel fast path does not serve {VETH_OVERLAY.iface(i)} "
                                  f"(path {path!r}): {bed.hosts[r.host].vnetd.log_text()[-1500:]}")
    return p


# Every configuration, in report order. To add one: write `def build_X(bed) -> Placement`
# and add its line here.
CONFIGS: dict = {
    "native": build_native,
    "kernel-vxlan": build_kernel_vxlan,
    "vnet-kernel": build_vnet_kernel,
    "vnet-guest-driven": vnet_mode("guest-driven"),
    "vnet-adaptive": vnet_mode("adaptive"),
    "vnet-polling": vnet_mode("polling"),
}
