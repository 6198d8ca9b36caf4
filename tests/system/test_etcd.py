"""Distributed control from a real etcd (issue #5): overlays whose daemons hold only their own
interfaces and take every link and route to the other hosts from etcd.

Each test starts its own etcd (Debian's /usr/bin/etcd) in a namespace of its own on the lab's
underlay (client port 2379 of that namespace's address, peer port on its loopback, data
directory in the test's work directory), stops it by PID, and the lab removes everything at
the end whatever happens. vnetctl --etcd runs in the etcd namespace (the root namespace has
no route to the underlay). Measured times go to results/system-tests.json; the asserts are
only sane bounds."""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from vnetlab import netlab
from vnetlab.etcdlab import ETCD, OVERLAY, TTL, EtcdServer, etcd_argv  # noqa: F401 (the etcd tests' names)
from vnetlab.netlab import delta



@pytest.fixture(autouse=True)
def need_etcd():
    if not Path(ETCD).exists():
        pytest.fail("etcd is not installed: run scripts/setup.sh (installs etcd-server, etcd-client)")


def agent_args(etcd, host):
    return ["--etcd", etcd.endpoint, "--overlay", OVERLAY, "--host-id", host.role,
            "--advertise-addr", host.underlay_ip, "--etcd-lease-ttl", TTL,
            "--etcd-matrix-interval", 1]


class Overlay:
    def __init__(self, lab, etcd, n, kind="tap"):
        self.lab, self.etcd = lab, etcd
        self.hosts, self.guests = [], []
        for i in range(1, n + 1):
            h = lab.host(f"h{i}")
            g = lab.guest(f"g{i}", ip=f"192.168.60.{i}", mac=netlab.mac(1, i, 1))
            # The local configuration: this host's own interface, nothing else.
            h.start_vnetd(config=f"interface add vm {kind} mac {g.mac} netns {g.name} vni 1\n",
                          args=agent_args(etcd, h))
            g.configure(h.interface("vm")["ifname"])
            self.hosts.append(h)
            self.guests.append(g)

    def derived_links(self, h) -> set:
        return {l["name"] for l in h.ctl_json("show", "links", "json") if l["name"].startswith("c-")}

    def routes(self, h) -> dict:
        return {r["dst"].lower(): (r["to"], r["name"]) for r in h.ctl_json("show", "routes", "json")}

    def full_mesh(self) -> bool:
        for h in self.hosts:
            want = {f"c-{o.role}-v1" for o in self.hosts if o is not h}
            if self.derived_links(h) != want:
                return False
            r = self.routes(h)
            for o, g in zip(self.hosts, self.guests):
                if r.get(g.mac) != (("interface", "vm") if o is h else ("link", f"c-{o.role}-v1")):
                    return False
        return True

    def wait_mesh(self, timeout=20):
        netlab.wait_until(self.full_mesh, timeout, 0.1, what="the derived full mesh on every host")

    def all_pairs(self):
        return [(g, d.ip_addr) for g in self.guests for d in self.guests if g is not d]


def assert_all_ping(lab, pairs, count=2):
    res = lab.ping_many(pairs, count=count)
    dead = [f"{s.role}->{d}" for (s, d), r in res.items() if not r.ok]
    assert not dead, f"no reply for {dead}"
    return res


def ping_gap(output: str) -> tuple:
    """(largest gap between two replies in seconds, replies) from `ping -D` output."""
    times = [float(t) for t in re.findall(r"^\[(\d+\.\d+)\] \d+ bytes from", output, re.M)]
    gaps = [b - a for a, b in zip(times, times[1:])]
    return (max(gaps) if gaps else float("inf")), len(times)


def test_five_hosts_from_etcd_and_operator_route(lab, etcd, record, guest_kind):
    """(a) Five hosts configured only from etcd: every guest pair pings and the counters show
    the derived links carried it. (f) An operator route added with vnetctl --etcd takes effect
    on every host (frames for its MAC leave over the link it names); deleted, it goes away."""
    t0 = time.monotonic()
    ov = Overlay(lab, etcd, 5, kind=guest_kind)
    ov.wait_mesh()
    record("five_host_mesh_converged_s", round(time.monotonic() - t0, 2))
    # show config is the local configuration only
    for h in ov.hosts:
        cfg = h.ctl("show", "config")
        assert "link add" not in cfg and "c-h" not in cfg, cfg
        assert json.loads(h.ctl("show", "cluster", "json"))["agent"]["connected"] is True

    hosts = etcd.ctl("hosts", "json")
    assert {h["host_id"] for h in json.loads(hosts)} == {h.role for h in ov.hosts}
    assert len(json.loads(etcd.ctl("interfaces", "json"))) == 5

    before = {h.role: h.stats() for h in ov.hosts}
    assert_all_ping(lab, ov.all_pairs(), count=2)
    after = {h.role: h.stats() for h in ov.hosts}
    for h in ov.hosts:
        for o in ov.hosts:
            if o is h:
                continue
            link = f"c-{o.role}-v1"
            for key in ("tx_frames", "rx_frames"):
                d = delta(before[h.role], after[h.role], link, key)
                assert d >= 4, f"{h.role}:{link} {key} grew by {d} only"

    # (f) an operator route: a MAC no guest has, sent to host h2 from everywhere.
    x_mac, x_ip = "52:54:00:99:99:01", "192.168.60.99"
    g1, h1 = ov.guests[0], ov.hosts[0]
    g1.ip("neigh", "replace", x_ip, "lladdr", x_mac, "dev", g1.ifname, "nud", "permanent")
    s0 = h1.stats()
    g1.ping(x_ip, count=3, interval=0.1, wait=0.5)
    s1 = h1.stats()
    assert delta(s0, s1, "c-h2-v1", "tx_frames") == 0, "unrouted MAC left over a link"

    t0 = time.monotonic()
    etcd.ctl("route", "add", "to-x", "any", x_mac, "link", "c-h2-v1")
    others = [h for h in ov.hosts if h.role != "h2"]
    netlab.wait_until(lambda: all(ov.routes(h).get(x_mac) == ("link", "c-h2-v1") for h in others),
                      10, 0.05, what="the operator route on every host")
    record("operator_route_visible_s", round(time.monotonic() - t0, 3))
    assert [r["id"] for r in json.loads(etcd.ctl("routes", "json"))] == ["to-x"]
    # h2 has no link to itself: the route does not apply there, and nothing else changed
    assert x_mac not in ov.routes(ov.hosts[1])
    s2 = h1.stats()
    g1.ping(x_ip, count=3, interval=0.1, wait=0.5)
    s3 = h1.stats()
    assert delta(s2, s3, "c-h2-v1", "tx_frames") >= 3, "the operator route did not take effect"

    etcd.ctl("route", "del", "to-x")
    netlab.wait_until(lambda: all(x_mac not in ov.routes(h) for h in others), 10, 0.05,
                      what="the operator route to go")
    assert_all_ping(lab, [(ov.guests[0], ov.guests[4].ip_addr)], count=2)

    # the traffic matrices are published and suggest runs on them (mesh: nothing to suggest)
    netlab.wait_until(lambda: "no direct links" in etcd.ctl("suggest"), 10, what="vnetctl suggest")

    # Hostile or broken entries in the store are ignored and counted; nothing else changes.
    def bad_entries():
        return [json.loads(h.ctl("show", "cluster", "json"))["agent"]["bad_entries"] for h in ov.hosts]
    bad0 = bad_entries()
    for key, value in ((f"/vnet/{OVERLAY}/hosts/evil", "not json"),
                       (f"/vnet/{OVERLAY}/interfaces/01/52:54:00:00:00:01", "{}"),
                       (f"/vnet/{OVERLAY}/routes/bad", '{"line":"route add nowhere"}'),
                       (f"/vnet/{OVERLAY}/hosts/h9", '{"host_id":"h1","addr":"10.99.0.9","udp_port":4789}'),
                       (f"/vnet/{OVERLAY}/policy", '{"template":"ring"}')):
        etcd.ns.exec("etcdctl", "--endpoints", f"http://{etcd.endpoint}", "put", key, value)
    netlab.wait_until(lambda: all(n >= b + 5 for n, b in zip(bad_entries(), bad0)), 10, 0.1,
                      what="every daemon to count the 5 bad entries")
    assert all(h.vnetd.alive() for h in ov.hosts)
    assert ov.full_mesh()
    assert_all_ping(lab, [(ov.guests[0], ov.guests[4].ip_addr), (ov.guests[2], ov.guests[1].ip_addr)])


def test_host_killed_and_restarted(lab, etcd, record):
    """(b) A host's daemon is SIGKILLed: after its lease's TTL its link and routes disappear on
    every other host; restarted, it rejoins and its guest is reachable again."""
    ov = Overlay(lab, etcd, 5)
    ov.wait_mesh()
    h5, g5 = ov.hosts[4], ov.guests[4]
    others = ov.hosts[:4]
    assert_all_ping(lab, [(ov.guests[0], g5.ip_addr)])

    t0 = time.monotonic()
    h5.stop_vnetd(signal.SIGKILL)
    netlab.wait_until(
        lambda: all("c-h5-v1" not in ov.derived_links(h) and g5.mac not in ov.routes(h) for h in others),
        TTL + 10, 0.1, what="h5's link and routes to disappear")
    gone = time.monotonic() - t0
    record("host_death_routes_gone_s", round(gone, 2))
    assert gone >= TTL - 1.5, f"routes went after {gone:.2f}s, before the lease could expire"
    # the others still reach each other
    assert_all_ping(lab, [(ov.guests[0], ov.guests[3].ip_addr)])
    assert json.loads(etcd.ctl("hosts", "json")) and "h5" not in etcd.ctl("hosts")

    t0 = time.monotonic()
    h5.start_vnetd(config_path=h5.config_path, args=agent_args(etcd, h5))
    g5.configure(h5.interface("vm")["ifname"])
    ov.wait_mesh()
    lab.wait_ping(ov.guests[0], g5.ip_addr, timeout=15)
    record("host_rejoin_recovery_s", round(time.monotonic() - t0, 2))
    assert_all_ping(lab, [(g, g5.ip_addr) for g in ov.guests[:4]])


def test_migration_under_traffic(lab, etcd, record, guest_kind):
    """(c) Guest g1 moves from h1 to h2 under a running ping (from h3's guest) and iperf3 (from
    h4's guest): the placement moves in one etcd transaction (vnetctl --etcd move), h2 announces
    the MAC, every host reroutes. The largest ping gap and the iperf3 dip are measured."""
    ov = Overlay(lab, etcd, 4, kind=guest_kind)
    ov.wait_mesh()
    h1, h2, h3, h4 = ov.hosts
    g1, g3, g4 = ov.guests[0], ov.guests[2], ov.guests[3]
    # The destination NIC is prepared on h2 (the VM's NIC on the new host): placed on h1,
    # so h2 routes the MAC to h1 until the move.
    h2.ctl("interface", "add", "vmig", guest_kind, "mac", g1.mac, "netns", g1.name, "vni", 1)
    new_if = h2.interface("vmig")["ifname"]
    netlab.wait_until(lambda: new_if in g1.links(), 10, what="the new NIC in g1")
    g1.ip_link("set", new_if, "up")
    netlab.wait_until(lambda: ov.routes(h2).get(g1.mac) == ("link", "c-h1-v1"), 10,
                      what="h2 to route the placed-elsewhere MAC to h1")

    srv = g1.popen("iperf3", "-s", "-1", "-p", 5202, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    netlab.wait_until(lambda: ":5202 " in g1.exec("ss", "-Htln").stdout, 10, what="iperf3 server")
    iperf = g4.popen("iperf3", "-c", g1.ip_addr, "-p", 5202, "-t", 8, "-i", 0.5, "-J",
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ping = g3.popen("ping", "-D", "-i", "0.02", "-W", "1", "-c", 500, g1.ip_addr,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # a move to a host that is not registered is refused and changes nothing
    r = etcd.ctl("move", 1, g1.mac, "h9", check=False)
    assert r.returncode != 0 and "not registered" in r.stderr, r.stderr
    r = etcd.ctl("move", 1, "52:54:00:77:77:77", "h2", check=False)
    assert r.returncode != 0 and "no interface" in r.stderr, r.stderr
    time.sleep(3)
    ann0 = json.loads(h2.ctl("show", "cluster", "json"))["agent"]["announcements"]
    t_move = time.time()
    out = etcd.ctl("move", 1, g1.mac, "h2", "vmig")
    assert "moved" in out, out
    h1.ctl("interface", "del", "vm")     # the VM is gone from the source host
    g1.configure(new_if)                 # and runs on the destination's NIC
    netlab.wait_until(lambda: all(ov.routes(h).get(g1.mac) == ("link", "c-h2-v1") for h in (h3, h4)),
                      10, 0.05, what="every host to route g1's MAC to h2")
    assert ov.routes(h2).get(g1.mac) == ("interface", "vmig")
    try:
        iperf_out, _ = iperf.communicate(timeout=30)
        ping_out, _ = ping.communicate(timeout=30)
    finally:
        netlab.stop_pid(srv, timeout=3)

    gap, replies = ping_gap(ping_out)
    record("migration_ping_gap_s", round(gap, 3))
    assert replies > 100, ping_out[-500:]
    assert gap < 5, f"ping gap {gap:.2f}s"

    j = json.loads(iperf_out)
    assert "error" not in j, j.get("error")
    ivals = [(i["sum"]["start"], i["sum"]["bits_per_second"] / 1e9) for i in j["intervals"]]
    start = j["start"]["timestamp"]["timesecs"]
    before = [g for (s, g) in ivals if start + s + 0.5 <= t_move]
    after = [g for (s, g) in ivals if start + s >= t_move + 1.5]
    dip = min(g for (s, g) in ivals if t_move - 0.5 <= start + s <= t_move + 2.5)
    record("migration_iperf_before_gbps", round(sum(before) / max(len(before), 1), 3))
    record("migration_iperf_dip_gbps", round(dip, 3))
    record("migration_iperf_after_gbps", round(sum(after) / max(len(after), 1), 3))
    assert after and sum(after) / len(after) > 0.05, f"iperf3 did not recover: {ivals}"

    # h2 announced the MAC (gratuitous RARP) when the placement moved to it
    assert json.loads(h2.ctl("show", "cluster", "json"))["agent"]["announcements"] > ann0
    placed = {i["mac"]: i for i in json.loads(etcd.ctl("interfaces", "json"))}
    assert placed[g1.mac]["host_id"] == "h2" and placed[g1.mac]["epoch"] == 1
    # h1 serves no interface any more: nobody keeps a link to it, and it needs none
    netlab.wait_until(lambda: not ov.derived_links(h1), 10, what="h1 to drop its links")
    for h in (h2, h3, h4):
        assert "c-h1-v1" not in ov.derived_links(h)
    # the counters show the new path: h3 sends g1's traffic over its link to h2
    s0 = h3.stats()
    assert g3.ping(g1.ip_addr, count=3, interval=0.1).received == 3
    s1 = h3.stats()
    assert delta(s0, s1, "c-h2-v1", "tx_frames") >= 3


def test_move_before_the_nic_exists(lab, etcd):
    """The placement moves first, the NIC appears on the new host afterwards (the other order
    of a migration): in between the MAC is routed to the new host, which has nothing for it;
    once the NIC is there the host routes it locally and announces it."""
    ov = Overlay(lab, etcd, 3)
    ov.wait_mesh()
    h1, h2, h3 = ov.hosts
    g1, g3 = ov.guests[0], ov.guests[2]
    assert "moved" in etcd.ctl("move", 1, g1.mac, "h2", "vmig")
    netlab.wait_until(lambda: all(ov.routes(h).get(g1.mac) == ("link", "c-h2-v1") for h in (h1, h3)),
                      10, 0.05, what="the MAC routed to h2")
    cluster = json.loads(h2.ctl("show", "cluster", "json"))["agent"]
    assert any("names this host" in c for c in cluster["conflicts"]), cluster["conflicts"]
    assert cluster["announcements"] == 0
    h1.ctl("interface", "del", "vm")
    h2.ctl("interface", "add", "vmig", "tap", "mac", g1.mac, "netns", g1.name, "vni", 1)
    g1.configure(h2.interface("vmig")["ifname"])
    netlab.wait_until(lambda: ov.routes(h2).get(g1.mac) == ("interface", "vmig"), 10, 0.05,
                      what="h2 to route the MAC to its new NIC")
    lab.wait_ping(g3, g1.ip_addr, timeout=10)
    netlab.wait_until(lambda: json.loads(h2.ctl("show", "cluster", "json"))["agent"]["announcements"] >= 1,
                      5, 0.1, what="h2 to announce the MAC")
    # the placement stays h2's, under h2's lease (h1 no longer has the interface)
    placed = {i["mac"]: i for i in json.loads(etcd.ctl("interfaces", "json"))}
    assert placed[g1.mac]["host_id"] == "h2"


def test_encrypted_overlay_from_etcd(lab, etcd, record):
    """Keys through the control plane: hosts started with --key-file publish capability noise
    and their public key, and the links derived between two such hosts are encrypted (no key
    configured by hand anywhere). A host without a key is linked to none of them (a host with
    a key links only encrypted); it shows the refusal in `show cluster`."""
    hosts, guests, keys = [], [], {}
    for i in range(1, 5):
        h = lab.host(f"h{i}")
        g = lab.guest(f"g{i}", ip=f"192.168.61.{i}", mac=netlab.mac(2, i, 1))
        args = agent_args(etcd, h)
        if i <= 3:  # h4 has no key
            path = lab.workdir / f"h{i}.key"
            r = subprocess.run([str(netlab.VNETD), "--gen-key", str(path)], capture_output=True,
                               text=True, timeout=10, check=True)
            keys[h.role] = r.stdout.strip()
            args += ["--key-file", path]
        h.start_vnetd(config=f"interface add vm tap mac {g.mac} netns {g.name} vni 1\n", args=args)
        g.configure(h.interface("vm")["ifname"])
        hosts.append(h)
        guests.append(g)
    keyed = hosts[:3]

    published = {r["host_id"]: r for r in json.loads(etcd.ctl("hosts", "json"))}
    for h in keyed:
        assert published[h.role]["public_key"] == keys[h.role]
        assert "noise" in published[h.role]["capabilities"]

    def links(h):
        return {l["name"]: l for l in h.ctl_json("show", "links", "json") if l["name"].startswith("c-")}

    def encrypted_mesh():
        for h in keyed:
            ls = links(h)
            if set(ls) != {f"c-{o.role}-v1" for o in keyed if o is not h}:
                return False
            for name, l in ls.items():
                peer = name.split("-")[1]
                enc = l.get("encrypted")
                if not enc or enc["peer_key"] != keys[peer]:
                    return False
        return True

    t0 = time.monotonic()
    netlab.wait_until(encrypted_mesh, 20, 0.1, what="encrypted links derived between the keyed hosts")
    assert_all_ping(lab, [(g, d.ip_addr) for g in guests[:3] for d in guests[:3] if g is not d])
    record("etcd_encrypted_mesh_ready_s", round(time.monotonic() - t0, 2))
    for h in keyed:
        for name, l in links(h).items():
            enc = l["encrypted"]
            assert enc["session"] == "established" and enc["sealed"] > 0 and enc["opened"] > 0, (h.role, name, enc)
    # The keyless host is linked to nobody, and nobody links to it.
    assert links(hosts[3]) == {}
    assert all("c-h4-v1" not in links(h) for h in keyed)
    conflicts = json.loads(hosts[3].ctl("show", "cluster", "json"))["agent"]["conflicts"]
    assert any("encryption key" in c for c in conflicts), conflicts
    r = lab.ping_many([(guests[3], guests[0].ip_addr)], count=2)
    assert not next(iter(r.values())).ok, "a keyless host reached a keyed one"


def test_duplicate_host_id_does_not_fight(lab, etcd):
    """A second daemon started with a host id another live daemon holds does not overwrite
    its record (no back-and-forth that would make the others' links flap and grow etcd's
    history): it says so in `show cluster` and keeps trying, and takes over once the first
    one is gone."""
    ov = Overlay(lab, etcd, 2)
    ov.wait_mesh()
    h1, h2 = ov.hosts
    intruder = lab.host("dup")
    # Same host id as h1, another address.
    args = agent_args(etcd, h1)
    args[args.index("--advertise-addr") + 1] = intruder.underlay_ip
    intruder.start_vnetd(config="", args=args)

    def status():
        return json.loads(intruder.ctl("show", "cluster", "json"))["agent"]

    netlab.wait_until(lambda: status()["host_id_in_use"], 10, 0.1, what="the intruder to see h1's id taken")
    def revision():
        return json.loads(h2.ctl("show", "cluster", "json"))["agent"]["revision"]

    rev0 = revision()
    time.sleep(2)
    hosts = {r["host_id"]: r for r in json.loads(etcd.ctl("hosts", "json"))}
    assert hosts["h1"]["addr"] == h1.underlay_ip, hosts["h1"]
    # A fight over the key would be hundreds of writes a second; matrix updates are a few.
    assert revision() - rev0 < 20, (rev0, revision())
    # h2 kept its link to the real h1 all along.
    assert ov.routes(h2).get(ov.guests[0].mac) == ("link", "c-h1-v1")
    lab.wait_ping(ov.guests[1], ov.guests[0].ip_addr, timeout=5)
    # Once h1 is gone (a teardown revokes its lease; a plain stop would keep it for the next
    # vnetd until the TTL), the id is free and the intruder takes it.
    h1.ctl("teardown")
    netlab.wait_until(lambda: not h1.vnetd.alive(), 10, what="h1's vnetd to exit")
    netlab.wait_until(
        lambda: {r["host_id"]: r for r in json.loads(etcd.ctl("hosts", "json"))}.get("h1", {}).get("addr")
        == intruder.underlay_ip, 15, 0.2, what="the second daemon to take the free host id")
    assert not status()["host_id_in_use"]


def test_host_cut_off_from_etcd(lab, etcd, record):
    """A host cut off from etcd (iptables drops its etcd traffic) for longer than its lease's
    TTL: the others drop its link and routes when the lease expires, while it keeps its own
    derived configuration; reconnected, it registers again under a new lease and every host
    routes to it again."""
    ov = Overlay(lab, etcd, 3)
    ov.wait_mesh()
    h3, g3 = ov.hosts[2], ov.guests[2]
    others = ov.hosts[:2]
    routes_h3 = ov.routes(h3)
    lease0 = json.loads(h3.ctl("show", "cluster", "json"))["agent"]["lease"]
    rule = ["OUTPUT", "-d", etcd.ns.underlay_ip, "-p", "tcp", "--dport", "2379", "-j", "DROP"]
    h3.exec("iptables", "-A", *rule)
    t0 = time.monotonic()
    try:
        netlab.wait_until(
            lambda: all("c-h3-v1" not in ov.derived_links(h) and g3.mac not in ov.routes(h) for h in others),
            TTL + 15, 0.1, what="the cut-off host's routes to disappear elsewhere")
        record("cut_off_host_routes_gone_s", round(time.monotonic() - t0, 2))
        netlab.wait_until(lambda: not json.loads(h3.ctl("show", "cluster", "json"))["agent"]["connected"],
                          10, 0.1, what="h3 to notice")
        assert ov.routes(h3) == routes_h3, "the cut-off host changed its routes"
    finally:
        h3.exec("iptables", "-D", *rule, check=False)
    t0 = time.monotonic()
    ov.wait_mesh(timeout=30)
    record("cut_off_host_rejoin_s", round(time.monotonic() - t0, 2))
    assert json.loads(h3.ctl("show", "cluster", "json"))["agent"]["lease"] != lease0
    assert_all_ping(lab, ov.all_pairs())


def test_late_keepalive_answers_keep_the_lease(lab, etcd, record):
    """A host whose lease renewals reach etcd but whose answers come back later than the lease's
    TTL (a busy gRPC proxy, a congested path; here a relay that holds etcd's answers back for
    3 TTLs): it ends its session, but keeps the lease that etcd kept alive and asks the store
    about it once answers flow again, so no other host ever drops it. Before, it registered
    again under a new lease while the old one still held its keys, and every other host saw it
    leave and come back (issue #19: 1,000 agents through 4 proxies)."""
    relay_port = 23790
    h1, h2 = lab.host("h1"), lab.host("h2")
    g1 = lab.guest("g1", ip="192.168.60.1", mac=netlab.mac(1, 1, 1))
    g2 = lab.guest("g2", ip="192.168.60.2", mac=netlab.mac(1, 2, 1))
    relay = h2.popen("python3", Path(__file__).resolve().parents[2] / "vnetlab" / "relay.py",
                     f"127.0.0.1:{relay_port}", etcd.endpoint, stdout=subprocess.PIPE, text=True)
    assert relay.stdout is not None and relay.stdout.readline().strip() == "ready"
    for h, g, endpoint in ((h1, g1, etcd.endpoint), (h2, g2, f"127.0.0.1:{relay_port}")):
        args = ["--etcd", endpoint, "--overlay", OVERLAY, "--host-id", h.role,
                "--advertise-addr", h.underlay_ip, "--etcd-lease-ttl", TTL, "--etcd-matrix-interval", 0]
        h.start_vnetd(config=f"interface add vm tap mac {g.mac} netns {g.name} vni 1\n", args=args)
        g.configure(h.interface("vm")["ifname"])

    def h1_has_h2():
        return "c-h2-v1" in {l["name"] for l in h1.ctl_json("show", "links", "json")}

    def agent(h):
        return json.loads(h.ctl("show", "cluster", "json"))["agent"]

    netlab.wait_until(h1_has_h2, 30, 0.1, what="h1 to link to h2")
    lease0 = agent(h2)["lease"]
    os.kill(relay.pid, signal.SIGUSR1)
    t0 = time.monotonic()
    noticed, lost_at = False, None
    try:
        while time.monotonic() - t0 < 3 * TTL:
            if not h1_has_h2():
                lost_at = time.monotonic() - t0
                break
            noticed |= not agent(h2)["connected"]
            time.sleep(0.1)
    finally:
        os.kill(relay.pid, signal.SIGUSR2)
    assert lost_at is None, f"h1 dropped h2 {lost_at:.1f}s after h2's answers were held back"
    assert noticed, "h2 never noticed that its renewals went unanswered (the relay held nothing back?)"
    netlab.wait_until(lambda: agent(h2)["connected"], 20, 0.1, what="h2 to reconnect")
    assert agent(h2)["lease"] == lease0, "h2 registered again under a new lease"
    # And it stays: a second lease of this host would let the first expire now.
    time.sleep(TTL + 1)
    assert h1_has_h2(), "h1 dropped h2 after the answers came again"
    assert agent(h2)["lease"] == lease0
    record("late_keepalive_answers_held_s", 3 * TTL)
    assert_all_ping(lab, [(g1, g2.ip_addr), (g2, g1.ip_addr)])


def test_etcd_outage_and_resync(lab, etcd, record):
    """(d) etcd stopped for ~10 s: traffic keeps flowing and no route is lost; etcd back: every
    daemon resynchronises, and an operator route added after the restart reaches all hosts."""
    ov = Overlay(lab, etcd, 5)
    ov.wait_mesh()
    routes0 = {h.role: ov.routes(h) for h in ov.hosts}
    g1, g4 = ov.guests[0], ov.guests[3]
    ping = g1.popen("ping", "-D", "-i", "0.1", "-W", "1", "-c", 130, g4.ip_addr,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(1)
    etcd.stop()
    netlab.wait_until(lambda: all(not json.loads(h.ctl("show", "cluster", "json"))["agent"]["connected"]
                                  for h in ov.hosts), 10, 0.1, what="every agent to notice the outage")
    time.sleep(10)
    for h in ov.hosts:
        assert ov.routes(h) == routes0[h.role], f"{h.role} lost or changed routes during the outage"
    assert_all_ping(lab, ov.all_pairs()[:8], count=2)

    t0 = time.monotonic()
    etcd.start()  # returns once etcd answers
    t_ready = time.monotonic()
    record("etcd_restart_to_serving_s", round(t_ready - t0, 2))
    netlab.wait_until(lambda: all(json.loads(h.ctl("show", "cluster", "json"))["agent"]["connected"]
                                  for h in ov.hosts), 20, 0.05, what="every agent to reconnect")
    record("etcd_outage_reconnect_s", round(time.monotonic() - t0, 2))
    record("etcd_outage_reconnect_after_serving_s", round(time.monotonic() - t_ready, 2))
    x_mac = "52:54:00:99:99:02"
    etcd.ctl("route", "add", "after-outage", "any", x_mac, "link", "c-h3-v1")
    others = [h for h in ov.hosts if h.role != "h3"]
    netlab.wait_until(lambda: all(ov.routes(h).get(x_mac) == ("link", "c-h3-v1") for h in others),
                      20, 0.05, what="the operator route after the outage on every host")
    record("etcd_outage_resync_s", round(time.monotonic() - t0, 2))
    # nothing flapped: apart from the new route, the routing tables are the ones from before
    for h in ov.hosts:
        now = ov.routes(h)
        now.pop(x_mac, None)
        assert now == routes0[h.role]
    out, _ = ping.communicate(timeout=30)
    r = netlab.parse_ping(out)
    gap, _ = ping_gap(out)
    record("etcd_outage_ping_loss_pct", r.loss)
    record("etcd_outage_ping_gap_s", round(gap, 3))
    assert r.received >= 0.95 * r.sent, f"traffic suffered from the etcd outage: {r.received}/{r.sent}"


def test_star_through_proxy(lab, etcd, record):
    """(e) The star template set at run time: every host links only to the proxy h1, which
    relays; all guest pairs still ping, and the counters show the frames going through h1."""
    ov = Overlay(lab, etcd, 4)
    ov.wait_mesh()
    t0 = time.monotonic()
    etcd.ctl("policy", "star", "h1")

    def star():
        for h in ov.hosts:
            want = {f"c-{o.role}-v1" for o in ov.hosts if o is not h} if h.role == "h1" else {"c-h1-v1"}
            if ov.derived_links(h) != want:
                return False
            for g in ov.guests:
                r = ov.routes(h).get(g.mac)
                if h.role != "h1" and g is not ov.guests[int(h.role[1]) - 1] and r != ("link", "c-h1-v1"):
                    return False
        return True

    netlab.wait_until(star, 15, 0.1, what="the star on every host")
    record("star_converged_s", round(time.monotonic() - t0, 2))
    assert json.loads(etcd.ctl("policy")) == {"template": "star", "proxy": "h1"}
    h1 = ov.hosts[0]
    s0 = h1.stats()
    for g in ov.guests:
        g.neigh_flush()  # ARP broadcasts must be relayed by the proxy too
    assert_all_ping(lab, ov.all_pairs(), count=2)
    s1 = h1.stats()
    # h2's guest to h3's guest went through h1: in over c-h2-v1, out over c-h3-v1
    assert delta(s0, s1, "c-h2-v1", "rx_frames") >= 8
    assert delta(s0, s1, "c-h3-v1", "tx_frames") >= 8

    # Under the star, h2 and h3 talk through h1: the published traffic matrices make
    # `vnetctl suggest` propose a direct link between them, with the lines for both hosts.
    def suggested():
        return {tuple(x["hosts"]): x for x in json.loads(etcd.ctl("suggest", "json"))}
    pairs = netlab.wait_until(lambda: ("h2", "h3") in suggested() and suggested(), 10, 0.3,
                              what="vnetctl suggest to propose h2-h3")
    s23 = pairs[("h2", "h3")]
    assert s23["vnis"] == [1] and s23["bytes"] > 0
    lines = {x["host"]: x["lines"] for x in s23["script"]}
    assert lines["h2"][0] == f"link add d-h3-v1 udp {ov.hosts[2].underlay_ip}:4789 vni 1"
    assert f"route add any {ov.guests[2].mac} link d-h3-v1" in lines["h2"]
    assert not any("h1" in p for p in pairs), "suggested a link the star already has"

    etcd.ctl("policy", "mesh")
    ov.wait_mesh()


def make_certs(dir: Path, server_ip: str) -> dict:
    """A CA, a server certificate for server_ip and a client certificate (openssl)."""
    dir.mkdir(parents=True, exist_ok=True)
    p = {k: dir / f"{k}.pem" for k in ("ca", "ca-key", "server", "server-key", "client", "client-key")}

    def ossl(*args, input=None):
        netlab.sh("openssl", *args, input=input)

    ossl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", p["ca-key"], "-out", p["ca"], "-days", "2", "-subj", "/CN=vnet-test-ca")
    # (the server certificate also allows clientAuth, as etcd's own JSON gateway dials etcd's
    # gRPC with it; the client certificate has no CommonName, which etcd would take for a user
    # name when a call carries no token)
    for name, subject, ext in (
            ("server", "/CN=vnet-server", f"subjectAltName=IP:{server_ip}\nextendedKeyUsage=serverAuth,clientAuth\n"),
            ("client", "/O=vnet-client", "extendedKeyUsage=clientAuth\n")):
        csr, extf = dir / f"{name}.csr", dir / f"{name}.ext"
        extf.write_text(ext)
        ossl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", p[f"{name}-key"], "-out", csr, "-subj", subject)
        ossl("x509", "-req", "-in", csr, "-CA", p["ca"], "-CAkey", p["ca-key"], "-CAcreateserial",
             "-out", p[name], "-days", "2", "-extfile", extf)
    return p


def test_etcd_tls_and_credentials(lab, record):
    """(g) etcd over TLS with client certificates and authentication: daemons and vnetctl with
    --etcd-ca/--etcd-cert/--etcd-key and --etcd-user/--etcd-password-file build the overlay;
    without the password, or with a wrong one, vnetctl is refused and changes nothing."""
    e = EtcdServer(lab)
    certs = make_certs(lab.workdir / "pki", e.ns.underlay_ip)
    url, peer = f"https://{e.endpoint}", "http://127.0.0.1:2380"
    log = open(lab.workdir / "etcd.log", "ab")
    proc = e.ns.popen(
        *etcd_argv("vnet-tls", e.data, url, peer),
        "--cert-file", certs["server"], "--key-file", certs["server-key"],
        "--trusted-ca-file", certs["ca"], "--client-cert-auth",
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        tls = ["--cacert", certs["ca"], "--cert", certs["client"], "--key", certs["client-key"]]

        def etcdctl(*args, user="root:rootpw", check=True):
            argv = ["etcdctl", "--endpoints", url, *tls]
            if user:
                argv += ["--user", user]
            return e.ns.exec(*argv, *args, check=check)

        netlab.wait_until(lambda: etcdctl("endpoint", "health", user=None, check=False).returncode == 0,
                          20, what="etcd over TLS")
        etcdctl("user", "add", "root:rootpw", "--interactive=false", user=None)
        etcdctl("role", "add", "vnet", user=None)
        etcdctl("role", "grant-permission", "vnet", "--prefix=true", "readwrite", f"/vnet/{OVERLAY}/", user=None)
        etcdctl("user", "add", "vnet:vnetpw", "--interactive=false", user=None)
        etcdctl("user", "grant-role", "vnet", "vnet", user=None)
        etcdctl("auth", "enable", user=None)
        pw = lab.workdir / "etcd-password"
        pw.write_text("vnetpw\n")
        bad = lab.workdir / "etcd-bad-password"
        bad.write_text("nope\n")
        sec = ["--etcd-ca", certs["ca"], "--etcd-cert", certs["client"], "--etcd-key", certs["client-key"]]

        hosts, guests = [], []
        for i in (1, 2):
            h = lab.host(f"h{i}")
            g = lab.guest(f"g{i}", ip=f"192.168.60.{i}", mac=netlab.mac(1, i, 1))
            h.start_vnetd(config=f"interface add vm tap mac {g.mac} netns {g.name} vni 1\n",
                          args=["--etcd", url, "--overlay", OVERLAY, "--host-id", h.role,
                                "--advertise-addr", h.underlay_ip, "--etcd-lease-ttl", TTL,
                                *sec, "--etcd-user", "vnet", "--etcd-password-file", pw])
            g.configure(h.interface("vm")["ifname"])
            hosts.append(h)
            guests.append(g)
        netlab.wait_until(lambda: all({l["name"] for l in h.ctl_json("show", "links", "json")}
                                      == {f"c-{o.role}-v1" for o in hosts if o is not h} for h in hosts),
                          20, 0.1, what="the derived links over TLS")
        assert lab.ping(guests[0], guests[1].ip_addr, count=2).received == 2

        def vnetctl(*words, password=pw, user="vnet"):
            argv = [netlab.VNETCTL, "--etcd", url, "--overlay", OVERLAY, "--timeout", "5", *sec]
            if password:
                argv += ["--etcd-user", user, "--etcd-password-file", password]
            return e.ns.exec(*argv, *map(str, words), check=False)

        r = vnetctl("hosts", "json")
        assert r.returncode == 0, r.stderr
        assert {h["host_id"] for h in json.loads(r.stdout)} == {"h1", "h2"}
        r = vnetctl("hosts", password=bad)
        assert r.returncode != 0 and "authentication failed" in r.stderr, r.stderr
        r = vnetctl("policy", "explicit", password=None)
        assert r.returncode != 0, "a write without credentials was accepted"
        # and without the CA the server's certificate is not trusted
        r = e.ns.exec(netlab.VNETCTL, "--etcd", url, "--overlay", OVERLAY, "--timeout", "3",
                      "--etcd-user", "vnet", "--etcd-password-file", pw, "hosts", check=False)
        assert r.returncode != 0
        assert json.loads(vnetctl("policy").stdout) == {"template": "mesh"}
    finally:
        netlab.stop_pid(proc)
