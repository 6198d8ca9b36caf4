"""etcd faults the agent must survive (issue #13): a member that stops answering without closing
anything (frozen with SIGSTOP: its kernel still holds the TCP connections, so the watch on it
just goes silent), with a real 3-member etcd cluster.

The three members run in one namespace of the lab (client ports 2379/2479/2579 on its underlay
address, peer ports on its loopback), data in the test's work directory, each stopped by PID;
a frozen member is always resumed (SIGCONT) before it is stopped. Measured times go to
results/system-tests.json."""

import json
import os
import signal
import subprocess
import time

import pytest

from vnetlab import netlab
from test_etcd import ETCD, OVERLAY, TTL
from vnetlab.etcdlab import etcd_argv, etcd_ctl

MEMBERS = ("m1", "m2", "m3")


class EtcdCluster:
    """Three etcd members in one namespace of the lab."""

    def __init__(self, lab):
        self.lab = lab
        self.ns = lab.host("etcd")
        self.client = {m: f"{self.ns.underlay_ip}:{2379 + 100 * i}" for i, m in enumerate(MEMBERS)}
        self.peer = {m: f"http://127.0.0.1:{2380 + 100 * i}" for i, m in enumerate(MEMBERS)}
        self.procs = {}
        self.frozen = set()

    def start(self):
        cluster = ",".join(f"{m}={self.peer[m]}" for m in MEMBERS)
        for m in MEMBERS:
            url = f"http://{self.client[m]}"
            log = open(self.lab.workdir / f"etcd-{m}.log", "ab")
            self.procs[m] = self.ns.popen(*etcd_argv(m, self.lab.workdir / f"etcd-{m}", url, self.peer[m], cluster),
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            log.close()
        netlab.wait_until(lambda: self.ctl("m1", "hosts", check=False).returncode == 0, 30,
                          what="the etcd cluster to answer")

    def endpoints(self, first: str) -> str:
        order = [first] + [m for m in MEMBERS if m != first]
        return ",".join(self.client[m] for m in order)

    def freeze(self, m):
        os.kill(self.procs[m].pid, signal.SIGSTOP)
        self.frozen.add(m)

    def resume(self, m):
        if m in self.frozen:
            os.kill(self.procs[m].pid, signal.SIGCONT)
            self.frozen.discard(m)

    def stop(self):
        for m in list(self.frozen):
            self.resume(m)
        for p in self.procs.values():
            netlab.stop_pid(p)
        self.procs.clear()

    def ctl(self, via, *words, check=True):
        """vnetctl --etcd through member `via` only (in the etcd namespace)."""
        return etcd_ctl(self.ns, self.client[via], OVERLAY, *words, check=check)


@pytest.fixture
def cluster(lab):
    if not os.path.exists(ETCD):
        pytest.fail("etcd is not installed: run scripts/setup.sh (installs etcd-server, etcd-client)")
    c = EtcdCluster(lab)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def test_watch_on_a_frozen_member_moves_to_another(lab, cluster, record):
    """h1 watches through m1 (first in its list); m1 is frozen. A change made through m2 must
    still reach h1: its lease keep-alive goes to the watch's member, times out, and h1 watches
    through another member. Its lease must survive meanwhile (keep-alives fail over at once),
    so the other hosts never lose it."""
    hosts = []
    guests = []
    for i in (1, 2, 3):
        h = lab.host(f"h{i}")
        g = lab.guest(f"g{i}", ip=f"192.168.61.{i}", mac=netlab.mac(1, i, 1))
        first = "m1" if i == 1 else "m2"
        args = ["--etcd", cluster.endpoints(first), "--overlay", OVERLAY, "--host-id", h.role,
                "--advertise-addr", h.underlay_ip, "--etcd-lease-ttl", TTL, "--etcd-matrix-interval", 0]
        h.start_vnetd(config=f"interface add vm tap mac {g.mac} netns {g.name} vni 1\n", args=args)
        g.configure(h.interface("vm")["ifname"])
        hosts.append(h)
        guests.append(g)
    h1, h2, h3 = hosts

    def links(h):
        return {l["name"] for l in h.ctl_json("show", "links", "json") if l["name"].startswith("c-")}

    netlab.wait_until(lambda: all(len(links(h)) == 2 for h in hosts), 30, what="the mesh")
    lab.wait_ping(guests[0], guests[1].ip_addr, timeout=15)

    cluster.freeze("m1")
    mac = "52:54:00:00:ff:01"
    # If m1 led the cluster, the others elect a new leader first: retry until the put lands.
    netlab.wait_until(lambda: cluster.ctl("m2", "route", "add", "r1", "any", mac, "link", "c-h2-v1",
                                          check=False).returncode == 0, 20, 0.2, what="a put through m2")
    t0 = time.monotonic()
    h1_lost = False
    deadline = t0 + 30
    got = None
    while time.monotonic() < deadline:
        routes = {r["dst"].lower() for r in h1.ctl_json("show", "routes", "json")}
        if "c-h1-v1" not in links(h2) or "c-h1-v1" not in links(h3):
            h1_lost = True
        if mac in routes:
            got = time.monotonic() - t0
            break
        time.sleep(0.1)
    status = json.loads(h1.ctl("show", "cluster", "json"))
    cluster.resume("m1")
    assert got is not None, f"h1 never saw the change made while m1 was frozen: {status}"
    record("frozen_member_change_reached_s", round(got, 2))
    assert not h1_lost, "h1's lease expired while its etcd member was frozen"
    # The data path went on all along.
    lab.wait_ping(guests[0], guests[2].ip_addr, timeout=10)
    # h3 (watching through m2) has it too; on h2 the route names h2's own link, so not there.
    netlab.wait_until(lambda: mac in {r["dst"].lower() for r in h3.ctl_json("show", "routes", "json")},
                      10, 0.1, what="h3 (watching through m2) to have the route")


def test_lease_survives_a_frozen_member_for_longer_than_its_ttl(lab, cluster, record):
    """A host whose every etcd call starts at m1 keeps its lease while m1 stays frozen for
    three TTLs: renewals go on, from their own thread, through the members that answer."""
    h = lab.host("h1")
    o = lab.host("h2")
    g = lab.guest("g1", ip="192.168.62.1", mac=netlab.mac(1, 1, 1))
    go = lab.guest("g2", ip="192.168.62.2", mac=netlab.mac(1, 2, 1))
    for host, guest, first in ((h, g, "m1"), (o, go, "m2")):
        args = ["--etcd", cluster.endpoints(first), "--overlay", OVERLAY, "--host-id", host.role,
                "--advertise-addr", host.underlay_ip, "--etcd-lease-ttl", TTL, "--etcd-matrix-interval", 0]
        host.start_vnetd(config=f"interface add vm tap mac {guest.mac} netns {guest.name} vni 1\n", args=args)
        guest.configure(host.interface("vm")["ifname"])

    def has_h1():
        return "c-h1-v1" in {l["name"] for l in o.ctl_json("show", "links", "json")}

    netlab.wait_until(has_h1, 30, what="h2 to link to h1")
    cluster.freeze("m1")
    t0 = time.monotonic()
    lost_at = None
    while time.monotonic() - t0 < 3 * TTL:
        if not has_h1():
            lost_at = time.monotonic() - t0
            break
        time.sleep(0.1)
    status = json.loads(h.ctl("show", "cluster", "json"))
    cluster.resume("m1")
    assert lost_at is None, f"h1 dropped out of the overlay {lost_at:.1f}s into the freeze: {status}"
    record("frozen_member_lease_kept_s", round(3 * TTL, 1))
    lab.wait_ping(g, go.ip_addr, timeout=10)
