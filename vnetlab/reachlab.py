"""reachlab: overlays across the wide-area lab (``wanlab``) as a new user starts them: etcd on
a public host, relays on public hosts (``vnetd --relay``), and one host per site behind its
NAT, each started with only ``--etcd`` (and what it requires) and one veth guest. Shared by
``tests/system/test_reach.py`` and ``bench.reach``.

    bed = reachlab.Bed(lab, kinds=["port-restricted", "symmetric"], relays=1)
    bed.start()                         # etcd, relays, every host's vnetd, the guests
    bed.wait_paths()                    # every pair has a path (direct, punched or relayed)
    bed.reach("h1")["peers"]            # `show reach json` of a host
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from typing import Optional

from . import netlab, wanlab
from .etcdlab import EtcdServer
from .procs import LabError, wait_until
from .results import parse_ping

OVERLAY = "reach"
GUEST_NET = "192.168.80"

# Pairs of NAT kinds no hole punching without port prediction gets through: an
# endpoint-dependent mapping (symmetric) against port-restricted filtering or another
# endpoint-dependent mapping. Linux's `masquerade random` picks ports at random, so nothing can
# be predicted either; these pairs go through a relay.
UNPUNCHABLE = {frozenset(["symmetric", "port-restricted"]), frozenset(["symmetric"])}


def punchable(a: str, b: str) -> bool:
    """Whether two hosts behind these NAT kinds can find a direct path."""
    return frozenset([a, b]) not in UNPUNCHABLE


class Bed:
    """A public etcd, ``relays`` public relay hosts, and one site per entry of ``kinds`` (a
    ``wanlab`` NAT kind) with one host (``h1``, ``h2``, ...) and its veth guest (``g1``, ...)."""

    def __init__(self, lab: netlab.Lab, kinds: list, relays: int = 1, encrypt: bool = False,
                 relay_rate: Optional[int] = None, extra_args: tuple = (), mtu: Optional[int] = 1450,
                 site_kw: Optional[list] = None):
        self.lab = lab
        self.wan = wanlab.WanLab(lab)
        self.kinds = list(kinds)
        self.encrypt = encrypt
        self.relay_rate = relay_rate
        self.extra_args = list(extra_args)
        # The guests' MTU: 1450 leaves room for VXLAN's 50 bytes on a 1500-byte underlay, as
        # on any VXLAN overlay (None: the interface's default, 1500).
        self.mtu = mtu
        self.etcd = EtcdServer(lab, overlay=OVERLAY)
        self.wan.adopt(self.etcd.ns)
        self.relays = [self.wan.public_host(f"R{i}") for i in range(1, relays + 1)]
        self.sites, self.hosts, self.guests = [], {}, {}
        for i, k in enumerate(self.kinds, 1):
            # site_kw[i-1]: more of wanlab's site options (wan_mtu, firewall, path)
            s = self.wan.site(f"S{i}", nat=k, **((site_kw or [])[i - 1:i] or [{}])[0])
            self.sites.append(s)
            self.hosts[f"h{i}"] = s.host(f"h{i}")
            self.guests[f"h{i}"] = lab.guest(f"g{i}", ip=f"{GUEST_NET}.{i}", mac=netlab.mac(1, i, 1))
        self.up: dict = {}  # vnetd answered
        self.joined: dict = {}  # its agent had read the overlay

    def kind(self, host: str) -> str:
        return self.kinds[int(host[1:]) - 1]

    def _args(self, host_id: str, ns: netlab.Host) -> list:
        args = ["--etcd", self.etcd.endpoint, "--overlay", OVERLAY, "--host-id", host_id, *self.extra_args]
        if self.encrypt:
            key = self.lab.workdir / f"{host_id}.key"
            if not key.exists():
                ns.exec(str(netlab.VNETD), "--gen-key", str(key))
            args += ["--key-file", str(key)]
        return args

    def start_relay(self, r: netlab.Host) -> None:
        args = self._args(r.role.lower(), r) + ["--relay"]
        if self.relay_rate:
            args += ["--relay-rate", str(self.relay_rate)]
        r.start_vnetd(config="", args=args)

    def start_host(self, name: str) -> None:
        h, g = self.hosts[name], self.guests[name]
        mtu = f" mtu {self.mtu}" if self.mtu else ""
        h.start_vnetd(config=f"interface add vm veth mac {g.mac} netns {g.name} vni 1{mtu}\n",
                      args=self._args(name, h))
        g.configure(h.interface("vm")["ifname"], self.mtu)
        self.up[name] = time.time()
        self.joined[name] = self.wait_joined(h)

    @staticmethod
    def wait_joined(h: netlab.Host, timeout: float = 20.0) -> float:
        """When the host's etcd agent had read the overlay (its first synchronisation): the
        agent waits for a burst of hosts starting together to settle before it reads (issue
        #19), which no reach work can shorten."""
        def synced():
            a = json.loads(h.ctl("show", "cluster", "json")).get("agent") or {}
            return a.get("syncs", 0) > 0
        wait_until(synced, timeout, 0.02, what=f"{h.role}'s agent to read the overlay")
        return time.time()

    def start(self) -> None:
        """etcd, the relays, then every host at once (as hosts of several sites come up)."""
        self.etcd.start()
        for r in self.relays:
            self.start_relay(r)
        errors = []

        def one(name):
            try:
                self.start_host(name)
            except Exception as e:  # noqa: BLE001 (re-raised below, in the caller's thread)
                errors.append(e)
        def relay_joined(r):
            try:
                self.joined[r.role] = self.wait_joined(r)
            except Exception as e:  # noqa: BLE001 (re-raised below, in the caller's thread)
                errors.append(e)
        # A relay's agent waits for the burst of starting hosts to settle too (#19): when it
        # has read the overlay is when it can admit them (``joined`` of ``R1``...).
        threads = [threading.Thread(target=one, args=(n,)) for n in self.hosts]
        threads += [threading.Thread(target=relay_joined, args=(r,)) for r in self.relays]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def reach(self, host: str) -> dict:
        """`show reach json` of a site host (``h1``...) or a relay (``R1``...)."""
        ns = self.hosts.get(host) or next(r for r in self.relays if r.role == host)
        return json.loads(ns.ctl("show", "reach", "json"))

    def path(self, a: str, b: str) -> Optional[str]:
        """The path host ``a``'s links to host ``b`` take (direct, punched, relayed, unknown)."""
        for p in self.reach(a)["peers"]:
            if p["host"] == b:
                return p["path"]
        return None

    def counter(self, host: str, name: str) -> int:
        return dict(self.reach(host)["counters"]).get(name, 0)

    def wait_paths(self, timeout: float = 15.0, want=None) -> dict:
        """Waits until every pair of site hosts has the path it should (``want(a, b)`` -> a set
        of acceptable words; default: direct or punched where the NATs allow it, relayed where
        they do not); returns {(a, b): path}."""
        want = want or (lambda a, b: {"direct", "punched"} if punchable(self.kind(a), self.kind(b)) else {"relayed"})
        names = list(self.hosts)
        paths: dict = {}

        def done():
            for a in names:
                for b in names:
                    if a != b:
                        paths[(a, b)] = self.path(a, b)
            return all(paths[(a, b)] in want(a, b) for (a, b) in paths)
        try:
            wait_until(done, timeout, 0.25, what="every pair's path")
        except LabError as e:
            raise LabError(f"{e}: {paths}") from None
        return paths

    def first_reply(self, a: str, b: str, deadline: float) -> Optional[float]:
        """Pings guest ``b`` from guest ``a`` every 50 ms until it answers: when it did (the
        time, in seconds since the epoch), or None by the deadline."""
        t0 = time.time()
        ga, gb = self.guests[a], self.guests[b]
        while time.time() - t0 < deadline:
            r = ga.exec("ping", "-c", "1", "-W", "0.2", gb.ip_addr, check=False)
            if r.returncode == 0:
                return time.time()
            time.sleep(0.05)
        return None


def ping_all(bed: Bed, count: int = 3) -> dict:
    """Every ordered pair of guests: (a, b) -> replies out of ``count`` (pings in parallel)."""
    procs = {}
    for a in bed.hosts:
        for b in bed.hosts:
            if a != b:
                procs[(a, b)] = bed.guests[a].popen("ping", "-c", count, "-i", "0.2", "-W", "1", "-q",
                                                    bed.guests[b].ip_addr, stdout=subprocess.PIPE,
                                                    stderr=subprocess.STDOUT)
    out = {}
    for k, p in procs.items():
        text = p.communicate(timeout=30)[0].decode(errors="replace")
        out[k] = parse_ping(text).received
    return out


def first_replies(bed: Bed, deadline: float, since: Optional[dict] = None) -> dict:
    """Every pair of site hosts (a < b) probed at once: seconds from the later of the two
    daemons' moments in ``since`` (default: when they answered) to the first reply (None: none
    by the deadline)."""
    since = since or bed.up
    out: dict = {}

    def run(a, b):
        t = bed.first_reply(a, b, deadline)
        out[(a, b)] = None if t is None else round(t - max(since[a], since[b]), 3)
    threads = [threading.Thread(target=run, args=(a, b)) for a in bed.hosts for b in bed.hosts if a < b]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out
