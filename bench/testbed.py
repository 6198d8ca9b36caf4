"""What every testbed of the benchmark shares; each bed (``suite_bed``, ``fastpath_bed``,
``hpc_bed``, the one of ``vhost``) extends ``Testbed`` with its own topology.

A testbed is one ``vnetlab.netlab.Lab`` (namespaces, vnetd processes, cleanup by PID) used as
a context manager: its ``setup()`` builds the topology on entering, and everything goes on
leaving whatever happens (the work directory is kept when building failed). The parts several
beds build the same way are here once:

* the wire: two host namespaces ``hA`` and ``hB`` joined by one veth pair (``eth0``), the
  underlay MTU, static neighbour entries;
* the kernel's VXLAN as the reference overlay: a ``vxlan`` device (UDP 4789, no learning,
  static FDB) and a bridge ``br-kx`` in every host, the guests on veth ports of the bridge;
* vnet daemons (UDP 4790) started parked in guest-driven mode with the run's ``--vnet-set``
  settings, and switched between dispatcher modes at run time;
* measurement servers (iperf3, sockperf) kept running per namespace;
* the counters that show which path a test's bytes took.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Optional

from vnetlab import netlab

VXLAN_OVERHEAD = 50
KERNEL_VXLAN_PORT = 4789
VNET_PORT = 4790
# Mode the vnet daemons are parked in while another configuration is measured: a polling
# dispatcher would take CPU from the native or kernel-VXLAN runs.
PARK_MODE = "guest-driven"
# kind -> (argv of the server listening on an address, its port, the `ss` flags that list it)
SERVERS = {
    "iperf3": (lambda ip: ["iperf3", "-s", "-B", ip, "-p", 5201], 5201, "-Htln"),
    "sockperf": (lambda ip: ["sockperf", "server", "-i", ip, "-p", 11111], 11111, "-Huln"),
}


def have_root() -> Optional[str]:
    """Why a testbed cannot be built here (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, TAP devices)"
    if not os.path.exists("/dev/net/tun"):
        return "needs /dev/net/tun"
    return None


class Testbed:
    """The lab of one testbed and the parts beds share. Subclasses build in ``setup()``."""

    def __init__(self, tag: str, mtu: int = 1500, subnet: str = "10.99.0", vnet_settings=()):
        self.wire_mtu = mtu
        self.overlay_mtu = mtu - VXLAN_OVERHEAD
        self.vnet_settings = list(vnet_settings)
        self.lab = netlab.Lab(tag=tag, subnet=subnet)
        self.hosts: list = []
        self.vnet_mode: Optional[str] = None  # the daemons' dispatcher mode, once started
        self._servers: dict = {}

    def setup(self) -> None:
        """The bed's topology (run on entering)."""

    # -- context --
    def __enter__(self):
        try:
            self.setup()
        except BaseException:
            self.lab.failed = self.lab.keep_workdir = True
            self.close()
            raise
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.lab.failed = True
        self.close()

    def close(self) -> None:
        self.lab.close()

    @property
    def workdir(self):
        return self.lab.workdir

    def logs(self) -> str:
        return self.lab.logs()

    def keep_logs(self, raw: Path, phase: str) -> None:
        """Copy every vnetd's log to ``raw`` (``<phase>-<log name>``), evidence kept with the results."""
        for h in self.hosts:
            for d in h.all_vnetd:
                shutil.copy(d.log, raw / f"{phase}-{d.log.name}")

    # -- the wire --
    def wire_pair(self, net: str, pin_neighbours: bool = True) -> tuple:
        """Hosts ``hA`` (``net``.1) and ``hB`` (``net``.2) joined by one veth pair, their
        ``eth0``, at the wire MTU; with ``pin_neighbours``, each knows the other's MAC
        (no ARP on the wire while measuring)."""
        lab = self.lab
        self.hA = netlab.Host(lab, "hA", f"{net}.1")
        self.hB = netlab.Host(lab, "hB", f"{net}.2")
        pair = (self.hA, self.hB)
        lab.hosts += pair
        self.hosts += pair
        lab.veth(self.hA, "eth0", self.hB, "eth0", up=False)
        for h in pair:
            h.ip_link("set", "eth0", "mtu", self.wire_mtu)
            h.ip("addr", "add", f"{h.underlay_ip}/24", "dev", "eth0")
            h.ip_link("set", "eth0", "up")
            self.shape_wire(h)
        if pin_neighbours:
            macs = {h: h.links()["eth0"]["address"] for h in pair}
            for h, o in ((self.hA, self.hB), (self.hB, self.hA)):
                h.ip("neigh", "replace", o.underlay_ip, "lladdr", macs[o], "dev", "eth0", "nud", "permanent")
        return pair

    def shape_wire(self, host: netlab.Host) -> None:
        """A hook to shape a host's egress onto the wire (the suite's rate limit)."""

    def pair_counters(self, dev: str) -> dict:
        """Kernel counters of ``dev`` in hA and hB (the wire, or the kernel VXLAN device)."""
        return {"A": self.hA.link_counters(dev), "B": self.hB.link_counters(dev), "dev": dev}

    # -- guests --
    def guest_pair(self, prefix: str, net: str, macs: tuple) -> list:
        """Two guests ``<prefix>a`` and ``<prefix>b`` at ``net``.1 and .2."""
        return [self.lab.guest(f"{prefix}{'ab'[i]}", ip=f"{net}.{i + 1}", mac=macs[i]) for i in range(2)]

    @staticmethod
    def pin_guest_neighbours(*pairs) -> None:
        """Each guest of each pair knows the other's MAC (no ARP while measuring)."""
        for gs in pairs:
            for i, g in enumerate(gs):
                o = gs[1 - i]
                g.ip("neigh", "replace", o.ip_addr, "lladdr", o.mac, "dev", g.ifname, "nud", "permanent")

    # -- the kernel's VXLAN --
    def kernel_vxlan(self, placed: list, vni: int, port=lambda i: f"kg{i}") -> None:
        """The kernel VXLAN overlay: in every host a ``vx1`` (UDP 4789, no learning) on
        ``eth0`` in bridge ``br-kx``, floods to every other host and each remote guest's MAC
        to its host in the FDB; each guest of ``placed`` ([(guest, host)], guests with their
        MAC set) on a veth port ``port(i)`` of its host's bridge, at the overlay MTU."""
        mtu = self.overlay_mtu
        for h in self.hosts:
            h.ip_link("add", "vx1", "type", "vxlan", "id", vni, "dstport", KERNEL_VXLAN_PORT,
                      "local", h.underlay_ip, "dev", "eth0", "nolearning")
            h.ip_link("set", "vx1", "mtu", mtu)
            h.ip_link("add", "br-kx", "type", "bridge")
            h.ip_link("set", "vx1", "master", "br-kx")
            for dev in ("vx1", "br-kx"):
                h.ip_link("set", dev, "up")
            for o in self.hosts:
                if o is not h:
                    h.exec("bridge", "fdb", "append", "00:00:00:00:00:00", "dev", "vx1", "dst", o.underlay_ip)
            for g, gh in placed:
                if gh is not h:
                    h.exec("bridge", "fdb", "append", g.mac, "dev", "vx1", "dst", gh.underlay_ip)
        for i, (g, h) in enumerate(placed):
            p = port(i)
            h.ip_link("add", p, "type", "veth", "peer", "name", "eth0", "netns", g.name)
            h.ip_link("set", p, "mtu", mtu)
            h.ip_link("set", p, "master", "br-kx")
            h.ip_link("set", p, "up")
            g.ip_link("set", "eth0", "address", g.mac)
            g.configure("eth0", mtu)

    # -- vnet daemons --
    def start_vnetd(self, host: netlab.Host, comment: str, lines=(), args=()) -> None:
        """vnetd on ``host`` (UDP 4790) parked in guest-driven mode, with the run's settings,
        then ``lines`` of configuration."""
        cfg = [f"# {comment}", f"set mode {PARK_MODE}", *[f"set {s}" for s in self.vnet_settings], *lines]
        host.start_vnetd(config="\n".join(cfg) + "\n", args=["--udp-port", VNET_PORT, *args])
        self.vnet_mode = PARK_MODE

    def set_vnet_mode(self, mode: str) -> None:
        """Switch every daemon's dispatchers to ``mode`` (nothing to do when they are there,
        or no daemon runs yet)."""
        if self.vnet_mode is None or self.vnet_mode == mode:
            return
        for h in self.hosts:
            if h.vnetd is not None:
                h.ctl("set", "mode", mode)
        self.vnet_mode = mode
        time.sleep(0.1)

    def vnetd_pids(self) -> list:
        return [h.vnetd.pid for h in self.hosts if h.vnetd and h.vnetd.alive()]

    def daemons_alive(self) -> bool:
        return all(h.vnetd.alive() for h in self.hosts if h.vnetd is not None)

    # -- long-running servers (tracked by the lab, stopped at close) --
    def server(self, kind: str, ns: netlab.Netns, ip: str):
        """The ``kind`` server listening on ``ip`` in ``ns``, started (and waited for) if it
        does not run."""
        key = (kind, ns.name)
        p = self._servers.get(key)
        if p is not None and p.poll() is None:
            return p
        argv, port, flag = SERVERS[kind]
        log = open(self.workdir / f"{kind}-{ns.role}.log", "ab")
        p = ns.popen(*argv(ip), stdin=netlab.subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        netlab.wait_until(lambda: p.poll() is None and f":{port} " in ns.exec("ss", flag).stdout,
                          10, 0.05, what=f"{kind} server in {ns.name}")
        self._servers[key] = p
        return p

    def restart_server(self, kind: str, ns: netlab.Netns, ip: str):
        p = self._servers.pop((kind, ns.name), None)
        if p is not None:
            netlab.stop_pid(p, timeout=3)
        return self.server(kind, ns, ip)


# --- what the counters say ------------------------------------------------------------------

def kernel_delta(before: dict, after: dict, port: str, key: str) -> int:
    """Growth of the kernel fast path's share of one counter of a vnet port (``show stats
    json``: a port's ``kernel`` section)."""
    def share(stats):
        return (netlab.port_of(stats, port).get("kernel") or {}).get(key, 0)
    return share(after) - share(before)


def dispatch_activity(snapshots) -> dict:
    """The dispatchers' work between two ``show stats json`` of each daemon: frames, wake-ups,
    mode switches, frames per wake-up and the modes they ended in (``<label><index>:<mode>``).
    ``snapshots``: [(label, before, after)], one per daemon."""
    frames = wakeups = switches = 0
    modes = []
    for label, before, after in snapshots:
        b = {d["index"]: d for d in before.get("dispatch", {}).get("dispatchers", [])}
        for d in after.get("dispatch", {}).get("dispatchers", []):
            p = b.get(d["index"], {})
            frames += d.get("frames", 0) - p.get("frames", 0)
            wakeups += d.get("wakeups", 0) - p.get("wakeups", 0)
            switches += d.get("switches", 0) - p.get("switches", 0)
            modes.append(f"{label}{d['index']}:{d.get('mode')}")
    return {"frames": frames, "wakeups": wakeups, "switches": switches,
            "frames_per_wakeup": round(frames / wakeups, 2) if wakeups else None, "end_modes": modes}
