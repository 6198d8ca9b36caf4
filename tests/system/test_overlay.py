"""The overlay carrying real traffic between namespaces: UDP and TCP links, the kernel VXLAN
as a peer, a direct link onto a LAN, run-time route changes and VNI isolation.

Every test checks the outcome the guests see (ping, iperf3) *and* vnet's own counters, so
traffic that took some other path cannot make a test pass."""

import signal
import subprocess
import time

from vnetlab import netlab
from vnetlab.netlab import delta, drops, new_drops, port_of

MIN_GBPS = 0.05  # a floor that only shows the path works; the figure goes to the results file


def assert_pings(results: dict, min_ratio: float = 0.9):
    """Every pair got at least one reply, and nearly all echo requests were answered."""
    dead = [f"{s.role}->{d}" for (s, d), r in results.items() if not r.ok]
    assert not dead, f"no reply at all for: {dead}"
    sent = sum(r.sent for r in results.values())
    recv = sum(r.received for r in results.values())
    assert recv >= min_ratio * sent, f"only {recv}/{sent} echo replies"


def matrix_bytes(host, vni, src, dst) -> int:
    for p in host.ctl_json("show", "matrix", "json")["pairs"]:
        if p["vni"] == vni and p["src"].lower() == src and p["dst"].lower() == dst:
            return p["bytes"]
    return 0


def test_udp_three_hosts_full_mesh(lab, record, guest_kind):
    """3 hosts x 2 guests over UDP links: all 30 ordered guest pairs ping, iperf3 across hosts."""
    m = netlab.udp_mesh(lab, ("A", "B", "C"), guests_per_host=2, kind=guest_kind)
    A, B, C = m.hosts
    guests = m.all_guests()
    before = {h.role: h.stats() for h in m.hosts}

    res = lab.ping_many([(g, d.ip_addr) for g in guests for d in guests if g is not d], count=2)
    assert_pings(res)
    by_ip = {g.ip_addr: g for g in guests}
    rtts = [r.avg_ms for (s, d), r in res.items() if r.avg_ms and m.host_of(s) is not m.host_of(by_ip[d])]
    record("cross_host_ping_avg_ms", round(sum(rtts) / len(rtts), 3))

    # every pair of hosts: 2x2 guest pairs x 2 pings each way -> >= 8 requests + 8 replies
    # crossed each link in each direction
    after = {h.role: h.stats() for h in m.hosts}
    for h in m.hosts:
        for o in m.hosts:
            if o is not h:
                ln = m.link_name(o)
                for key in ("tx_frames", "rx_frames"):
                    d = delta(before[h.role], after[h.role], ln, key)
                    assert d >= 16, f"{h.role}:{ln} {key} grew by {d} only"
        for g in m.guests[h.role]:
            d = delta(before[h.role], after[h.role], m.vm_name(g), "tx_frames")
            assert d >= 2 * 5, f"{h.role}:{m.vm_name(g)} delivered only {d} frames to its guest"

    # bulk TCP from a guest on A to a guest on B
    a1, b1 = m.guests["A"][0], m.guests["B"][0]
    s0a, s0b = A.stats(), B.stats()
    r = lab.iperf(b1, b1.ip_addr, a1, seconds=3)
    s1a, s1b = A.stats(), B.stats()
    record("udp_iperf3_gbps", round(r.gbps, 3))
    assert r.gbps > MIN_GBPS, f"iperf3 over UDP links: {r.gbps:.3f} Gbit/s"
    # the bytes crossed vnet: link counters include Ethernet/IP/TCP headers, so >= payload
    assert delta(s0a, s1a, "to-b", "tx_bytes") >= r.bytes
    assert delta(s0b, s1b, "to-a", "rx_bytes") >= r.bytes
    assert delta(s0b, s1b, m.vm_name(b1), "tx_bytes") >= r.bytes
    # and vnet's traffic matrix saw the flow (it is merged from the forwarding threads
    # asynchronously: allow it a moment)
    try:
        netlab.wait_until(lambda: matrix_bytes(A, 1, a1.mac, b1.mac) >= r.bytes, 2, what="matrix")
    except TimeoutError:
        raise AssertionError(f"show matrix: a1->b1 {matrix_bytes(A, 1, a1.mac, b1.mac)} bytes after 2 s, "
                             f"iperf3 moved {r.bytes}, link to-b sent {port_of(A.stats(), 'to-b')['tx_bytes']}") from None
    # well-behaved guests cause no drops
    for h in m.hosts:
        assert not new_drops(before[h.role], h.stats()), f"drops on {h.role}: {new_drops(before[h.role], h.stats())}"


def test_kernel_vxlan_peer(lab, record, guest_kind):
    """A vnet host and a host that runs only the Linux kernel VXLAN + bridge talk both ways."""
    A = lab.host("A")
    K = lab.kernel_vxlan_host("K", vni=1, peers=[A.underlay_ip])
    a1 = lab.guest("a1", ip="192.168.50.11", mac=netlab.mac(1, 1, 1))
    k1 = lab.guest("k1", ip="192.168.50.21", mac=netlab.mac(1, 2, 1))
    K.add_vm(k1, mac=k1.mac, mtu=1450)
    A.start_vnetd(config=f"""
interface add vm-a1 {guest_kind} mac {a1.mac} netns {a1.name} mtu 1450
link add to-k udp {K.underlay_ip}
route add any {a1.mac} interface vm-a1
route add any {k1.mac} link to-k
""")
    a1.configure(A.interface("vm-a1")["ifname"], 1450)

    s0, kv0 = A.stats(), K.link_counters(K.vxdev)
    for src, dst in ((a1, k1), (k1, a1)):
        r = src.ping(dst.ip_addr, count=2)
        assert r.received == 2, f"{src.role} -> {dst.role}: {r.output}"
    fwd = lab.iperf(k1, k1.ip_addr, a1, seconds=3)          # vnet -> kernel
    rev = lab.iperf(a1, a1.ip_addr, k1, seconds=3, port=5202)  # kernel -> vnet
    s1, kv1 = A.stats(), K.link_counters(K.vxdev)
    record("vnet_to_kernel_gbps", round(fwd.gbps, 3))
    record("kernel_to_vnet_gbps", round(rev.gbps, 3))
    # guests that respect the 1450 MTU cause no drops (the kernel peer's TSO/GSO super-packets
    # cross the veth underlay unsegmented: vnet has to cope with them)
    assert not new_drops(s0, s1), f"drops on the vnet host: {new_drops(s0, s1)}"
    assert fwd.gbps > MIN_GBPS and rev.gbps > MIN_GBPS, (fwd.gbps, rev.gbps)
    assert delta(s0, s1, "to-k", "tx_bytes") >= fwd.bytes
    assert delta(s0, s1, "to-k", "rx_bytes") >= rev.bytes
    # the kernel's VXLAN device saw the same traffic arrive and leave
    assert kv1["rx_bytes"] - kv0["rx_bytes"] >= fwd.bytes
    assert kv1["tx_bytes"] - kv0["tx_bytes"] >= rev.bytes


def test_tcp_link_and_peer_restart(lab, record):
    """A TCP link (listen + accept on A, dial from B): ping, iperf3, then each side's vnetd is
    restarted (SIGTERM, same config file) under a running ping and traffic must resume."""
    A, B, a1, b1 = netlab.tcp_pair(lab)

    s0a, s0b = A.stats(), B.stats()
    r = a1.ping(b1.ip_addr, count=2)
    assert r.received == 2, r.output
    sp_a, sp_b = A.stats(), B.stats()
    assert not new_drops(s0a, sp_a) and not new_drops(s0b, sp_b), (new_drops(s0a, sp_a), new_drops(s0b, sp_b))
    ip = lab.iperf(a1, a1.ip_addr, b1, seconds=3)
    s1a, s1b = A.stats(), B.stats()
    record("tcp_link_iperf3_gbps", round(ip.gbps, 3))
    assert ip.gbps > MIN_GBPS, ip.gbps
    assert delta(s0b, s1b, "to-a", "tx_bytes") >= ip.bytes
    assert delta(s0a, s1a, "to-b", "rx_bytes") >= ip.bytes
    assert delta(s0a, s1a, "to-b", "tx_frames") >= 2
    # The link's queue (1024 records) is the bottleneck buffer of the guest's TCP flow: when
    # the link's writer falls behind (a busy machine), the queue overflows and the frames are
    # dropped and counted, the guest's TCP retransmits and slows down. So `queue_full` on the
    # sending link (B's to-a) is congestion, allowed but bounded; any other drop is a fault.
    drops_a, drops_b = new_drops(sp_a, s1a), new_drops(sp_b, s1b)
    congestion = drops_b.pop("to-a:queue_full", 0)
    sent = delta(sp_b, s1b, "to-a", "tx_frames")
    record("tcp_link_iperf3_queue_full", f"{congestion} of {sent + congestion} frames")
    assert not drops_a and not drops_b, (drops_a, drops_b)
    assert congestion <= 0.05 * (sent + congestion), (congestion, sent)

    for restarted, other_guest, own_guest, vm in ((B, a1, b1, "vm-b1"), (A, b1, a1, "vm-a1")):
        # background traffic across the link while the peer goes away and comes back
        bg = other_guest.popen("ping", "-i", "0.1", "-W", "1", "-c", "400", own_guest.ip_addr,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        t0 = time.monotonic()
        rc = restarted.stop_vnetd()
        assert rc == 0, f"vnetd on {restarted.role} exited with {rc} on SIGTERM"
        restarted.start_vnetd()  # same config file
        # the guest's TAP is new: give it its address again
        own_guest.configure(restarted.interface(vm)["ifname"])
        waited = lab.wait_ping(other_guest, own_guest.ip_addr, timeout=15)
        record(f"resume_after_restart_{restarted.role}_s", round(time.monotonic() - t0, 2))
        netlab.stop_pid(bg)
        st = restarted.stats()
        link = "to-b" if restarted is A else "to-a"
        assert port_of(st, link)["rx_frames"] > 0 and port_of(st, link)["tx_frames"] > 0, st
        assert waited <= 15


def test_direct_link_to_lan(lab):
    """A plain host on a 'physical LAN' (veth into host A's lan0, `link add lan direct lan0`)
    and a guest behind vnet on host B reach each other across the overlay + LAN."""
    A, B = lab.host("A"), lab.host("B")
    lan = lab.guest("lan", ip="192.168.50.100", mac="02:00:00:00:01:00")
    lab.veth(A, "lan0", lan, "eth0")
    lan.ip_link("set", "eth0", "address", lan.mac)
    lan.configure("eth0")
    b1 = lab.guest("b1", ip="192.168.50.21", mac=netlab.mac(1, 2, 1))
    A.start_vnetd(config=f"""
link add to-b udp {B.underlay_ip}
link add lan direct lan0
route add any {lan.mac} link lan
route add any {b1.mac} link to-b
""")
    B.start_vnetd(config=f"""
interface add vm-b1 tap mac {b1.mac} netns {b1.name}
link add to-a udp {A.underlay_ip}
route add any {b1.mac} interface vm-b1
route add any {lan.mac} link to-a
""")
    b1.configure(B.interface("vm-b1")["ifname"])

    s0 = A.stats()
    for src, dst in ((lan, b1), (b1, lan)):
        r = src.ping(dst.ip_addr, count=2)
        assert r.received == 2, f"{src.role} -> {dst.role}: {r.output}"
    s1 = A.stats()
    for ln in ("lan", "to-b"):
        for key in ("rx_frames", "tx_frames"):
            assert delta(s0, s1, ln, key) >= 4, f"A:{ln} {key}: {delta(s0, s1, ln, key)}"

    # LAN traffic to a MAC the overlay does not route is ignored and counted
    lan.ip("neigh", "replace", "192.168.50.77", "lladdr", "02:00:00:00:77:77", "dev", "eth0", "nud", "permanent")
    sb0 = B.stats()
    lan.ping("192.168.50.77", count=3, wait=1)
    s2, sb1 = A.stats(), B.stats()
    netlab.wait_until(lambda: drops(A.stats(), "not_for_overlay") - drops(s1, "not_for_overlay") >= 3, 3,
                      what="not_for_overlay drops on A")
    assert delta(s1, s2, "to-b", "tx_frames") == 0, "unrouted LAN unicast leaked onto the overlay"
    assert delta(sb0, sb1, "to-a", "rx_frames") == 0


def test_migration_route_change(lab, record, guest_kind):
    """Guest a1 moves from host A to host B at run time (same namespace, MAC and IP) following
    the spec's migration example; pings from guests on all three hosts resume."""
    m = netlab.udp_mesh(lab, ("A", "B", "C"), guests_per_host=2, kind=guest_kind)
    A, B, C = m.hosts
    a1, a2 = m.guests["A"]
    b1, c1 = m.guests["B"][0], m.guests["C"][0]
    for src in (a2, b1, c1):
        assert src.ping(a1.ip_addr, count=2).received == 2

    bg = c1.popen("ping", "-i", "0.1", "-W", "1", "-c", "300", a1.ip_addr,
                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(0.5)
    t0 = time.monotonic()
    A.ctl("interface", "del", "vm-a1")
    B.ctl("interface", "add", "vm-a1", guest_kind, "mac", a1.mac, "netns", a1.name)
    B.ctl("route", "replace", "any", a1.mac, "interface", "vm-a1")
    A.ctl("route", "add", "any", a1.mac, "link", "to-b")
    C.ctl("route", "replace", "any", a1.mac, "link", "to-b")
    a1.configure(B.interface("vm-a1")["ifname"])  # same IP on the new NIC

    lab.wait_ping(c1, a1.ip_addr, timeout=10)
    record("migration_resume_s", round(time.monotonic() - t0, 2))
    netlab.stop_pid(bg, signal.SIGINT)
    assert netlab.parse_ping(bg.stdout.read()).received > 0

    # the routing tables say what we asked for
    routes = {(r["dst"].lower(), r["vni"]): (r["to"], r["name"]) for r in C.ctl_json("show", "routes", "json")}
    assert routes[(a1.mac, 1)] == ("link", "to-b")
    assert not any(i["name"] == "vm-a1" for i in A.ctl_json("show", "interfaces", "json"))

    sa, sb, sc = A.stats(), B.stats(), C.stats()
    for src in (a2, b1, c1):
        r = src.ping(a1.ip_addr, count=2)
        assert r.received == 2, f"{src.role} -> a1 after the move: {r.output}"
    sa2, sb2, sc2 = A.stats(), B.stats(), C.stats()
    # a2's pings now leave A over to-b; c1's go to B, not A; B delivers to the moved guest
    assert delta(sa, sa2, "to-b", "tx_frames") >= 2
    assert delta(sc, sc2, "to-b", "tx_frames") >= 2
    # (to-a may at most see an ARP broadcast left over from the outage)
    assert delta(sc, sc2, "to-a", "tx_frames") < delta(sc, sc2, "to-b", "tx_frames")
    assert delta(sb, sb2, "vm-a1", "tx_frames") >= 6


def test_vni_isolation(lab, guest_kind):
    """Two VNIs on the same two hosts, same subnet and even the same MACs: traffic stays in
    its VNI, floods included."""
    A, B = lab.host("A"), lab.host("B")
    # VNI 1: x on A, y on B.  VNI 2: same MACs, other addresses of the same /24.
    ga = {1: lab.guest("x1", ip="192.168.50.11", mac=netlab.mac(0, 1, 1)),
          2: lab.guest("x2", ip="192.168.50.21", mac=netlab.mac(0, 1, 1))}
    gb = {1: lab.guest("y1", ip="192.168.50.12", mac=netlab.mac(0, 2, 1)),
          2: lab.guest("y2", ip="192.168.50.22", mac=netlab.mac(0, 2, 1))}
    for h, mine, theirs, peer in ((A, ga, gb, B), (B, gb, ga, A)):
        cfg = []
        for v in (1, 2):
            cfg += [f"interface add vm{v} {guest_kind} mac {mine[v].mac} netns {mine[v].name} vni {v}",
                    f"link add peer{v} udp {peer.underlay_ip} vni {v}",
                    f"route add any {mine[v].mac} interface vm{v}",
                    f"route add any {theirs[v].mac} link peer{v}"]
        h.start_vnetd(config="\n".join(cfg) + "\n")
        for v in (1, 2):
            mine[v].configure(h.interface(f"vm{v}")["ifname"])

    def vni_ports(v):
        return [(A, f"vm{v}"), (A, f"peer{v}"), (B, f"vm{v}"), (B, f"peer{v}")]

    for v, other in ((1, 2), (2, 1)):
        for g in (ga[1], ga[2], gb[1], gb[2]):
            g.neigh_flush()  # force ARP broadcasts
        before = {(h.role, p): h.port(p) for h, p in vni_ports(other)}
        kern0 = {g.name: g.link_counters(g.ifname) for g in (ga[other], gb[other])}
        r = ga[v].ping(gb[v].ip_addr, count=2)
        assert r.received == 2, f"VNI {v}: {r.output}"
        r = ga[v].ping(gb[other].ip_addr, count=2)
        assert r.received == 0, f"VNI {v} guest reached a VNI {other} guest: {r.output}"
        r = gb[v].ping(ga[other].ip_addr, count=2)
        assert r.received == 0, f"VNI {v} guest reached a VNI {other} guest: {r.output}"
        # nothing of VNI v (ARP floods included) touched VNI `other`
        for h, p in vni_ports(other):
            now = h.port(p)
            for key in ("rx_frames", "tx_frames"):
                assert now[key] == before[(h.role, p)][key], f"VNI {other} port {h.role}:{p} {key} moved"
        for g in (ga[other], gb[other]):
            assert g.link_counters(g.ifname)["rx_packets"] == kern0[g.name]["rx_packets"], \
                f"guest {g.role} of VNI {other} received frames from VNI {v}"
        # and the VNI v ports did carry the traffic
        st = A.stats()
        assert port_of(st, f"peer{v}")["tx_frames"] > 0 and port_of(st, f"vm{v}")["rx_frames"] > 0
