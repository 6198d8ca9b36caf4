"""Guest-facing and underlay security, for real: forged VXLAN from an attacker on the
underlay, guests sending with spoofed source MACs, a flooding guest against a victim on the
same host (per-interface rate limit), and an underlay link cut and lossy (iptables in the host
namespace) under UDP and TCP links. What vnet drops it must count; what it must not deliver
is checked where it would arrive (a raw capture socket inside the guest namespaces)."""

import json
import os
import re
import shutil
import socket
import struct
import subprocess
import time

import pytest

from vnetlab import netlab
from vnetlab.netlab import delta, drops, ether, vxlan

ETH_P_EXP = 0x88B5  # IEEE local experimental ethertype: nothing else in the lab sends it


class Capture:
    """Counts frames of ETH_P_EXP carrying ``marker`` that arrive on a guest's NIC (an
    AF_PACKET socket inside the guest namespace, so it sees exactly what the guest gets)."""

    def __init__(self, guest: netlab.Guest):
        self.sock = guest.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_EXP))
        self.sock.bind((guest.ifname, ETH_P_EXP))
        self.sock.setblocking(False)
        self.seen: list[bytes] = []

    def count(self, marker: bytes) -> int:
        while True:
            try:
                data, addr = self.sock.recvfrom(65535)
            except BlockingIOError:
                break
            if addr[2] != socket.PACKET_OUTGOING:
                self.seen.append(data)
        return sum(1 for f in self.seen if marker in f)

    def close(self):
        self.sock.close()


def raw_sender(guest: netlab.Guest) -> socket.socket:
    """An AF_PACKET socket that sends whole Ethernet frames out of the guest's NIC."""
    s = guest.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    s.bind((guest.ifname, 0))
    return s


def payload(marker: bytes, i: int) -> bytes:
    return (marker + b"-%05d-" % i).ljust(64, b".")


def ipv4_udp(src: str, dst: str, sport: int, dport: int, data: bytes) -> bytes:
    """A hand-built IPv4/UDP packet for a raw socket (IP_HDRINCL: the kernel fills in the IP
    checksum; UDP checksum 0 means none, which IPv4 allows)."""
    udp = struct.pack("!HHHH", sport, dport, 8 + len(data), 0) + data
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0x1234, 0, 64, socket.IPPROTO_UDP, 0,
                     socket.inet_aton(src), socket.inet_aton(dst))
    return ip + udp


def wait_counter(get, want: int, timeout: float = 5.0, what: str = "counter") -> int:
    """Waits until ``get()`` reaches ``want``, then a little longer to catch any excess."""
    try:
        netlab.wait_until(lambda: get() >= want, timeout, what=what)
    except TimeoutError:
        pass
    time.sleep(0.3)
    return get()


# --- (a) forged VXLAN from the underlay ------------------------------------------------------

def test_forged_vxlan_from_a_stranger_is_dropped(lab, record):
    m = netlab.udp_mesh(lab, ("A", "B"), guests_per_host=1)
    A, B = m.hosts
    a1, b1 = m.guests["A"][0], m.guests["B"][0]
    X = lab.host("X")  # the attacker: on the underlay, no link names it
    assert a1.ping(b1.ip_addr, count=2).received == 2
    cap = Capture(a1)
    dst = (A.underlay_ip, netlab.VXLAN_PORT)
    n = 50

    # Control: the same frames from B's real address reach the guest, so the capture works.
    tx = B.socket()
    tx.bind((B.underlay_ip, 0))
    for i in range(5):
        tx.sendto(vxlan(1, ether(a1.mac, b1.mac, ETH_P_EXP, payload(b"legit", i))), dst)
    assert wait_counter(lambda: cap.count(b"legit"), 5, what="legitimate frames at a1") == 5

    # 1. From the attacker's own address (a plain UDP socket).
    s0 = A.stats()
    g0 = a1.link_counters(a1.ifname)
    stranger = X.socket()
    stranger.bind((X.underlay_ip, 0))
    for i in range(n):
        stranger.sendto(vxlan(1, ether(a1.mac, b1.mac, ETH_P_EXP, payload(b"forged-own", i))), dst)
    got = wait_counter(lambda: drops(A.stats(), "unknown_peer") - drops(s0, "unknown_peer"), n,
                       what="unknown_peer drops")
    assert got == n, f"unknown_peer grew by {got}, sent {n}"

    # 2. From a made-up underlay address that is no overlay host (hand-built IP header).
    raw = X.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    fake = f"{lab.subnet}.77"
    for i in range(n):
        pkt = ipv4_udp(fake, A.underlay_ip, 40000 + i, netlab.VXLAN_PORT,
                       vxlan(1, ether(a1.mac, b1.mac, ETH_P_EXP, payload(b"forged-fake", i))))
        raw.sendto(pkt, (A.underlay_ip, 0))
    got = wait_counter(lambda: drops(A.stats(), "unknown_peer") - drops(s0, "unknown_peer"), 2 * n,
                       what="unknown_peer drops")
    assert got == 2 * n, f"unknown_peer grew by {got}, sent {2 * n}"

    s1 = A.stats()
    assert cap.count(b"forged") == 0, "a forged frame reached the guest"
    assert delta(s0, s1, m.vm_name(a1), "tx_frames") == 0
    assert delta(s0, s1, m.link_name(B), "rx_frames") == 0
    assert a1.link_counters(a1.ifname)["rx_packets"] == g0["rx_packets"]
    record("forged_vxlan_sent", 2 * n)
    record("forged_vxlan_unknown_peer", got)
    record("forged_vxlan_reached_guest", cap.count(b"forged"))

    # What is NOT protected (README, Security): plaintext VXLAN whose source address is an
    # overlay host's is accepted. An attacker able to spoof B's address gets frames through.
    for i in range(5):
        pkt = ipv4_udp(B.underlay_ip, A.underlay_ip, 40000, netlab.VXLAN_PORT,
                       vxlan(1, ether(a1.mac, b1.mac, ETH_P_EXP, payload(b"spoofed-peer", i))))
        raw.sendto(pkt, (A.underlay_ip, 0))
    spoofed = wait_counter(lambda: cap.count(b"spoofed-peer"), 5, what="frames with a peer's address")
    record("forged_with_overlay_host_ip_delivered", spoofed)
    assert spoofed == 5, "a datagram with a peer's source address should pass (plaintext VXLAN)"

    for s in (tx, stranger, raw):
        s.close()
    cap.close()
    assert a1.ping(b1.ip_addr, count=2).received == 2


# --- (b) spoofed source MACs from a guest ----------------------------------------------------

def test_spoofed_source_macs_are_dropped_unless_allowed(lab, record, guest_kind):
    m = netlab.udp_mesh(lab, ("A", "B"), guests_per_host=2, kind=guest_kind)
    A, B = m.hosts
    a1, a2 = m.guests["A"]
    b1 = m.guests["B"][0]
    vm = m.vm_name(a1)
    caps = {g.role: Capture(g) for g in (a2, b1)}
    tx = raw_sender(a1)
    n = 40
    fake_src = "52:54:00:ee:ee:01"  # not a1's MAC (and not any interface's)

    def send(tag: bytes, src: str):
        for i in range(n):
            tx.send(ether(a2.mac, src, ETH_P_EXP, payload(tag + b"-u", i)))  # unicast, routed to a2
            tx.send(ether("ff:ff:ff:ff:ff:ff", src, ETH_P_EXP, payload(tag + b"-b", i)))  # flooded

    def seen(tag: bytes) -> dict:
        return {r: c.count(tag) for r, c in caps.items()}

    # Control: a1's own source MAC: unicast reaches a2, broadcast reaches a2 and b1.
    send(b"own", a1.mac)
    netlab.wait_until(lambda: seen(b"own")["a2"] >= 2 * n and seen(b"own")["b1"] >= n, 5,
                      what="frames with a1's own MAC")

    # Spoofed: every one dropped at a1's interface and counted exactly; nobody sees any.
    s0 = A.stats()
    send(b"spoof1", fake_src)
    spoofed = lambda: port_drop(A.stats(), vm, "spoofed_src") - port_drop(s0, vm, "spoofed_src")
    got = wait_counter(spoofed, 2 * n, what="spoofed_src drops")
    assert got == 2 * n, f"spoofed_src grew by {got}, sent {2 * n}"
    assert seen(b"spoof1") == {"a2": 0, "b1": 0}
    s1 = A.stats()
    assert delta(s0, s1, m.vm_name(a2), "tx_frames") == 0
    assert delta(s0, s1, m.link_name(B), "tx_frames") == 0
    # ... and the spoofed MAC was learned nowhere: it is not in the traffic matrix either
    assert not any(p["src"] == fake_src for p in A.ctl_json("show", "matrix", "json")["pairs"])
    record("spoofed_frames_sent", 2 * n)
    record("spoofed_src_drops", got)

    # The operator allows it at run time: the same frames pass.
    A.ctl("interface", "set", vm, "any-source", "on")
    assert A.interface(vm)["any_source"] is True
    assert A.port(vm)["policy"]["any_source"] is True
    s2 = A.stats()
    send(b"spoof2", fake_src)
    netlab.wait_until(lambda: seen(b"spoof2")["a2"] >= 2 * n and seen(b"spoof2")["b1"] >= n, 5,
                      what="spoofed frames with any-source on")
    assert port_drop(A.stats(), vm, "spoofed_src") == port_drop(s2, vm, "spoofed_src")
    assert "any-source" in A.ctl("show", "config")

    # ... and forbids it again.
    A.ctl("interface", "set", vm, "any-source", "off")
    s3 = A.stats()
    send(b"spoof3", fake_src)
    got = wait_counter(lambda: port_drop(A.stats(), vm, "spoofed_src") - port_drop(s3, vm, "spoofed_src"),
                       2 * n, what="spoofed_src drops after any-source off")
    assert got == 2 * n
    assert seen(b"spoof3") == {"a2": 0, "b1": 0}

    # A guest that changes its own MAC is cut off until the operator follows.
    a1.ip_link("set", a1.ifname, "address", fake_src)
    a1.neigh_flush()
    assert a1.ping(b1.ip_addr, count=2, wait=0.5).received == 0
    a1.ip_link("set", a1.ifname, "address", a1.mac)
    assert a1.ping(b1.ip_addr, count=2).received == 2
    tx.close()
    for c in caps.values():
        c.close()


def test_vhost_user_guest_source_mac_and_rate(lab, record):
    """The same guards on a vhost-user interface (the shared ingress path): a frontend playing
    the VM (``vhost-frontend bench``) sends broadcasts with a foreign source MAC, then its own;
    then floods into a rate limit. A namespace guest on the same host counts what arrives."""
    fe = os.environ.get("VHOST_FRONTEND", str(netlab.REPO / "target" / "release" / "vhost-frontend"))
    if not os.path.exists(fe):
        pytest.fail(f"{fe} not found: run `cargo build --release` first")
    A = lab.host("A")
    g = lab.guest("g1", ip="192.168.50.11")
    vm_mac, g_mac = "52:54:00:01:01:01", "52:54:00:01:01:02"
    sock = lab.workdir / "vm.sock"
    A.start_vnetd(config=f"""
interface add vm vhost-user {sock} mac {vm_mac}
interface add g1 tap mac {g_mac} netns {g.name}
route add any {vm_mac} interface vm
route add any {g_mac} interface g1
""")
    g.configure(A.interface("g1")["ifname"])

    def send(src: str, count: int = 0, duration: float = 0) -> int:
        args = [fe, "-s", str(sock), "bench", "--role", "tx", "--size", "64", "--json",
                "--src-mac", src, "--dst-mac", "ff:ff:ff:ff:ff:ff"]
        args += ["--count", str(count)] if count else ["--duration", str(duration)]
        r = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr[-2000:]
        return int(json.loads(r.stdout)["frames"])

    n = 500
    s0 = A.stats()
    sent = send("52:54:00:ee:ee:02", count=n)
    assert sent == n
    got = wait_counter(lambda: port_drop(A.stats(), "vm", "spoofed_src") - port_drop(s0, "vm", "spoofed_src"),
                       n, what="spoofed_src drops on the vhost-user interface")
    s1 = A.stats()
    assert got == n, f"spoofed_src grew by {got}, sent {n}"
    assert delta(s0, s1, "g1", "tx_frames") == 0
    record("vhost_spoofed_sent", n)
    record("vhost_spoofed_src_drops", got)

    sent = send(vm_mac, count=n)
    netlab.wait_until(lambda: delta(s1, A.stats(), "g1", "tx_frames") >= n, 5,
                      what="the VM's own broadcasts at the namespace guest")
    assert port_drop(A.stats(), "vm", "spoofed_src") == port_drop(s1, "vm", "spoofed_src")

    # 64-byte frames as fast as the frontend goes, into 1 Mbit/s with a 64 KB bucket
    A.ctl("interface", "set", "vm", "rate", "1", "burst", "64")
    s2, t2 = A.stats(), time.monotonic()
    sent = send(vm_mac, duration=2)
    time.sleep(0.5)
    s3, t3 = A.stats(), time.monotonic()
    limited = port_drop(s3, "vm", "rate_limited") - port_drop(s2, "vm", "rate_limited")
    passed_bytes = delta(s2, s3, "g1", "tx_bytes")
    record("vhost_rate_1mbit_sent", sent)
    record("vhost_rate_1mbit_rate_limited", limited)
    record("vhost_rate_1mbit_passed_bytes", passed_bytes)
    assert limited > 0 and limited + delta(s2, s3, "g1", "tx_frames") == sent
    # at most one bucket plus the rate over the window (and one frame)
    assert passed_bytes <= 64 * 1024 + 1e6 / 8 * (t3 - t2) + 64


def port_drop(stats: dict, name: str, reason: str) -> int:
    return netlab.port_of(stats, name).get("drops", {}).get(reason, 0)


# --- (c) a flooding guest against a victim on the same host ----------------------------------

_RTT = re.compile(r"= ([\d.]+)/([\d.]+)/([\d.]+)/")


def ping_stats(out: str) -> dict:
    p = netlab.parse_ping(out)
    m = _RTT.search(out)
    return {"sent": p.sent, "received": p.received, "loss_pct": p.loss,
            "avg_ms": float(m.group(2)) if m else None, "max_ms": float(m.group(3)) if m else None}


def test_rate_limit_protects_a_victim_from_a_flooding_guest(lab, record, guest_kind):
    m = netlab.udp_mesh(lab, ("A", "B"), guests_per_host=2, kind=guest_kind)
    A, B = m.hosts
    flooder, victim = m.guests["A"]
    peer, sink = m.guests["B"]
    vm_f = m.vm_name(flooder)
    flood_port = 5301
    limit_mbit = 50
    assert victim.ping(peer.ip_addr, count=2).received == 2
    assert flooder.ping(sink.ip_addr, count=2).received == 2

    def measure(label: str, flood: bool) -> dict:
        fl = srv = None
        if flood:
            srv = sink.popen("iperf3", "-s", "-1", "-p", flood_port, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
            netlab.wait_until(lambda: f":{flood_port} " in sink.exec("ss", "-Hltn").stdout, 10,
                              what="flood sink iperf3 server")
        s0, t0 = B.stats(), time.monotonic()
        if flood:
            # UDP as fast as iperf3 can send, for longer than the victim's measurements.
            fl = flooder.popen("iperf3", "-c", sink.ip_addr, "-p", flood_port, "-u", "-b", "0",
                               "-l", "1400", "-t", "12", stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        r = victim.exec("ping", "-c", "40", "-i", "0.05", "-W", "1", "-q", peer.ip_addr,
                        check=False, timeout=30)
        ping = ping_stats(r.stdout)
        tcp = lab.iperf(peer, peer.ip_addr, victim, seconds=3)
        s1, t1 = B.stats(), time.monotonic()
        for p in (fl, srv):
            if p is not None:
                netlab.stop_pid(p, timeout=3)
        flood_mbit = delta(s0, s1, m.vm_name(sink), "tx_bytes") * 8 / (t1 - t0) / 1e6
        res = {"victim_tcp_mbit": round(tcp.gbps * 1000, 1), "victim_ping_avg_ms": ping["avg_ms"],
               "victim_ping_max_ms": ping["max_ms"], "victim_ping_loss_pct": ping["loss_pct"],
               "flood_delivered_mbit": round(flood_mbit, 1)}
        for k, v in res.items():
            record(f"{label}_{k}", v)
        time.sleep(1.0)  # let queues drain between phases
        return res

    base = measure("no_flood", flood=False)
    unlimited = measure("flood_no_limit", flood=True)
    A.ctl("interface", "set", vm_f, "rate", limit_mbit)
    assert A.interface(vm_f)["rate"]["mbit"] == limit_mbit
    assert A.port(vm_f)["policy"]["rate"]["mbit"] == limit_mbit
    r0 = port_drop(A.stats(), vm_f, "rate_limited")
    limited = measure(f"flood_limit_{limit_mbit}mbit", flood=True)
    rate_limited = port_drop(A.stats(), vm_f, "rate_limited") - r0
    record("rate_limited_drops", rate_limited)
    A.ctl("interface", "set", vm_f, "rate", "off")
    assert A.interface(vm_f)["rate"] is None

    # Sane bounds only (2 shared cores): the path works without a flood; with the limit the
    # flood is cut to about its rate and counted, and the victim keeps a fair share.
    assert base["victim_tcp_mbit"] > 50
    assert unlimited["flood_delivered_mbit"] > limit_mbit, "the flood did not flood"
    assert rate_limited > 0
    # the flooder's delivered rate over the window, with the bucket's burst as slack
    assert limited["flood_delivered_mbit"] < limit_mbit * 1.5
    assert limited["victim_tcp_mbit"] > 0.2 * base["victim_tcp_mbit"], (base, unlimited, limited)
    assert limited["victim_ping_loss_pct"] <= 10
    assert limited["victim_ping_avg_ms"] is not None and limited["victim_ping_avg_ms"] < 50


def test_link_rate_limit(lab, record, guest_kind):
    """A rate on a link limits what arrives from that peer, set at run time and removed again."""
    m = netlab.udp_mesh(lab, ("A", "B"), guests_per_host=1, kind=guest_kind)
    A, B = m.hosts
    a1, b1 = m.guests["A"][0], m.guests["B"][0]
    link = m.link_name(A)  # B's link to A: what A's guests send arrives on it
    limit_mbit = 20
    burst_kb = 1024
    free = lab.iperf(b1, b1.ip_addr, a1, seconds=3)
    # A small bucket: the limit holds, but TCP (64 KB TSO bursts) loses whole bursts to it.
    B.ctl("link", "set", link, "rate", limit_mbit, "burst", 64)
    small = lab.iperf(b1, b1.ip_addr, a1, seconds=3)
    B.ctl("link", "set", link, "rate", limit_mbit, "burst", burst_kb)
    rates = {l["name"]: l["rate"] for l in B.ctl_json("show", "links", "json")}
    assert rates[link] == {"mbit": limit_mbit, "burst_kb": burst_kb}
    r0 = port_drop(B.stats(), link, "rate_limited")
    limited = lab.iperf(b1, b1.ip_addr, a1, seconds=3)
    dropped = port_drop(B.stats(), link, "rate_limited") - r0
    # the other direction is not limited (the bucket is on what arrives from the link)
    reverse = lab.iperf(a1, a1.ip_addr, b1, seconds=3)
    B.ctl("link", "set", link, "rate", "off")
    after = lab.iperf(b1, b1.ip_addr, a1, seconds=3)
    record("link_free_tcp_mbit", round(free.gbps * 1000, 1))
    record(f"link_limit_{limit_mbit}mbit_burst64_tcp_mbit", round(small.gbps * 1000, 1))
    record(f"link_limit_{limit_mbit}mbit_burst{burst_kb}_tcp_mbit", round(limited.gbps * 1000, 1))
    record(f"link_limit_{limit_mbit}mbit_reverse_tcp_mbit", round(reverse.gbps * 1000, 1))
    record("link_rate_limited_drops", dropped)
    record("link_after_rate_off_tcp_mbit", round(after.gbps * 1000, 1))
    assert free.gbps * 1000 > 50 and after.gbps * 1000 > 50
    # at most the rate plus one bucket over the 3 s (and 10% for timing); TCP gets a fair part
    ceiling = limit_mbit * 1.1 + burst_kb * 1024 * 8 / 3 / 1e6
    assert 0.5 * limit_mbit < limited.gbps * 1000 < ceiling
    assert 0 < small.gbps * 1000 < limit_mbit * 1.1 + 64 * 1024 * 8 / 3 / 1e6
    assert dropped > 0
    assert reverse.gbps * 1000 > 2 * limit_mbit


# --- (d) an underlay link cut, then lossy, then restored --------------------------------------

def first_reply_after(out: str, t: float) -> float | None:
    """Seconds from ``t`` (time.time()) to the first reply in ``ping -D`` output after it."""
    for line in out.splitlines():
        m = re.match(r"\[(\d+\.\d+)\] \d+ bytes from", line)
        if m and float(m.group(1)) >= t:
            return float(m.group(1)) - t
    return None


def test_underlay_cut_and_random_loss(lab, record):
    if shutil.which("iptables") is None:
        pytest.fail("iptables is missing (scripts/setup.sh installs it: apt-get install iptables)")
    A, B = lab.host("A"), lab.host("B")
    ga = {"udp": lab.guest("au", ip="192.168.50.11", mac=netlab.mac(1, 1, 1)),
          "tcp": lab.guest("at", ip="192.168.60.11", mac=netlab.mac(2, 1, 1))}
    gb = {"udp": lab.guest("bu", ip="192.168.50.21", mac=netlab.mac(1, 2, 1)),
          "tcp": lab.guest("bt", ip="192.168.60.21", mac=netlab.mac(2, 2, 1))}
    A.start_vnetd(config=f"""
listen tcp {A.underlay_ip}:7700
interface add vm-au tap mac {ga['udp'].mac} netns {ga['udp'].name} vni 1
interface add vm-at tap mac {ga['tcp'].mac} netns {ga['tcp'].name} vni 2
link add to-b-udp udp {B.underlay_ip} vni 1
link add to-b-tcp tcp accept {B.underlay_ip} vni 2
route add any {ga['udp'].mac} interface vm-au
route add any {ga['tcp'].mac} interface vm-at
route add any {gb['udp'].mac} link to-b-udp
route add any {gb['tcp'].mac} link to-b-tcp
""")
    B.start_vnetd(config=f"""
interface add vm-bu tap mac {gb['udp'].mac} netns {gb['udp'].name} vni 1
interface add vm-bt tap mac {gb['tcp'].mac} netns {gb['tcp'].name} vni 2
link add to-a-udp udp {A.underlay_ip} vni 1
link add to-a-tcp tcp {A.underlay_ip}:7700 vni 2
route add any {gb['udp'].mac} interface vm-bu
route add any {gb['tcp'].mac} interface vm-bt
route add any {ga['udp'].mac} link to-a-udp
route add any {ga['tcp'].mac} link to-a-tcp
""")
    for h, gs, pre in ((A, ga, "vm-a"), (B, gb, "vm-b")):
        for kind, g in gs.items():
            g.configure(h.interface(pre + kind[0])["ifname"])
    netlab.wait_until(lambda: A.link_state("to-b-tcp") == "up" and B.link_state("to-a-tcp") == "up",
                      15, what="tcp link up")
    for k in ("udp", "tcp"):
        lab.wait_ping(ga[k], gb[k].ip_addr, timeout=10)

    def ipt(*rule, delete=False):
        # On arrival in each host's namespace (INPUT), so that the sender's packets leave as on
        # a real cut: a drop in the sender's own OUTPUT chain is a local send error, which TCP
        # retries every 500 ms without backing off, and would hide the link's real recovery.
        for h, o in ((A, B), (B, A)):
            h.exec("iptables", "-D" if delete else "-A", "INPUT", "-s", o.underlay_ip, *rule)

    # 1. Cut: every packet between A and B dropped in A's namespace, with pings running;
    # then restored, and the time to the first reply measured on each link kind. A cut shorter
    # than a tcp link's user timeout (4 s: the connection survives it), one a bit longer, and
    # one long enough for TCP's retransmission timer to back off far.
    for cut_s in (3, 5, 15):
        pings = {k: ga[k].popen("ping", "-D", "-i", "0.1", "-W", "1", "-w", cut_s + 45, gb[k].ip_addr,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for k in ("udp", "tcp")}
        time.sleep(1.0)
        ipt("-j", "DROP")
        cut_at = time.time()  # every rule in place
        time.sleep(cut_s)
        restore_at = time.time()
        ipt("-j", "DROP", delete=True)
        restored_at = time.time()  # every rule gone
        # both kinds answer again (coarse: an upper bound), then the continuous pings give
        # the precise time when they caught a reply
        coarse = {}
        for k in ("udp", "tcp"):
            lab.wait_ping(ga[k], gb[k].ip_addr, timeout=40)
            coarse[k] = time.time() - restored_at
        time.sleep(0.5)
        outs = {}
        for k, p in pings.items():
            netlab.stop_pid(p, timeout=3)
            outs[k] = p.stdout.read()
        for k, out in outs.items():
            replies = [float(x) for x in re.findall(r"^\[(\d+\.\d+)\] \d+ bytes from", out, re.M)]
            during = sum(1 for t in replies if cut_at + 0.2 < t < restore_at)
            rec = first_reply_after(out, restored_at)
            rec = coarse[k] if rec is None else min(rec, coarse[k])
            record(f"cut_{cut_s}s_{k}_recovery_s", round(rec, 2))
            # A udp link has no state to recover. A tcp link's connection fails within ~4 s of
            # the cut (user timeout, keepalive) and the dialing side retries unanswered
            # connects at once (SYN retransmitted at 1 s), so it is back within ~2 s of the
            # restore however long the cut; without that it waited out the kernel's
            # retransmission backoff (11-12 s after a 15 s cut).
            assert rec < 4.0, f"{k} link recovered {rec:.2f} s after a {cut_s} s cut"
            assert during == 0, f"{k} link: {during} replies during the cut (the cut did not cut)"

    # 2. Random loss (30% each way, statistic match): the links work, degraded. A guest pings
    # until 40 pings are answered, for at most 30 s. A tcp link delivers every frame, but late:
    # each waits behind the oldest unacknowledged one, a second or more when retransmissions
    # are lost in a row, so what a fixed 2-4 s window catches is luck (CI once caught 0 of 40).
    ipt("-m", "statistic", "--mode", "random", "--probability", "0.3", "-j", "DROP")
    for k in ("udp", "tcp"):
        r = lab.ping(ga[k], gb[k].ip_addr, count=40, interval=0.05, wait=5, deadline=30)
        took = re.search(r"received.*time (\d+)ms", r.output)
        record(f"loss30_{k}_ping_loss_pct", r.loss)
        record(f"loss30_{k}_ping_avg_ms", r.avg_ms)
        record(f"loss30_{k}_40_answered_s", int(took.group(1)) / 1000 if took else None)
        # (ping keeps sending until 40 are answered, so a few more may be answered as it stops)
        assert r.received >= 40, f"{k} link under 30% loss: {r.received} answered in 30 s\n{r.output}"
        # A guest's TCP over a udp link sees ~50% round-trip loss: it may not even finish
        # connecting in a few seconds, so its figure is recorded, not asserted.
        try:
            tcp = lab.iperf(gb[k], gb[k].ip_addr, ga[k], seconds=4)
            record(f"loss30_{k}_iperf_tcp_mbit", round(tcp.gbps * 1000, 2))
        except (netlab.LabError, subprocess.TimeoutExpired) as e:
            # (iperf3's own control connection can stall for good under this loss)
            record(f"loss30_{k}_iperf_tcp_mbit", f"failed: {str(e)[:80]}")
    ipt("-m", "statistic", "--mode", "random", "--probability", "0.3", "-j", "DROP", delete=True)

    # 3. Restored: both kinds whole again.
    for k in ("udp", "tcp"):
        lab.wait_ping(ga[k], gb[k].ip_addr, timeout=15)
        r = lab.ping(ga[k], gb[k].ip_addr, count=10, interval=0.05)
        assert r.received == 10, f"{k} link after restore: {r.output}"
    assert "DROP" not in A.exec("iptables", "-S").stdout + B.exec("iptables", "-S").stdout
