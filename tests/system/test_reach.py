"""Reach (issue #31): hosts behind NATs of every kind, started as a new user starts them (only
``--etcd``), reach each other: direct where the NATs allow a hole to be punched, through a
public relay (``vnetd --relay``) where they do not, with every link encrypted too. The relay
forwards only between members and within its per-pair budget; forged probes are refused and
counted; a NAT that forgets its mapping costs a relayed moment, not the link. Built on the
wide-area lab (``vnetlab/wanlab.py``, its own tests in test_wanlab.py) through
``vnetlab/reachlab.py``."""

import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest
from test_restart import Pinger

from vnetlab import netlab, reachlab

KINDS = ["none", "full-cone", "port-restricted", "symmetric", "symmetric", "one-to-one"]


@pytest.fixture(autouse=True)
def wan_tools():
    missing = [t for t in ("nft", "conntrack") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"missing tools: {', '.join(missing)} (scripts/setup.sh installs nftables, conntrack)")


@pytest.mark.parametrize("encrypt", [False, True], ids=["plain", "encrypted"])
def test_every_nat_pair_reaches_direct_where_it_can(lab, record, encrypt):
    """Six sites (no NAT, full cone, port-restricted, two symmetric, 1:1) and a public relay:
    every pair of guests reaches every other; every pair but symmetric against port-restricted
    or symmetric on a direct path (punched or not) within 5 s of the last daemon's start, the
    rest relayed; the first reply at most 2 s after both daemons joined the overlay (and, for
    a relayed pair, the relay: CI had its agent read the overlay 1.1 s after the hosts).""" 
    bed = reachlab.Bed(lab, KINDS, relays=1, encrypt=encrypt)
    bed.start()
    t_up = max(bed.up.values())
    firsts = reachlab.first_replies(bed, deadline=10, since=bed.joined)
    # A pair that needs the relay can reply only once the relay's agent has read the overlay
    # too (it admits members it knows): from the latest of the three.
    relay_late = {(a, b): max(0.0, bed.joined["R1"] - max(bed.joined[a], bed.joined[b]))
                  for (a, b) in firsts if not reachlab.punchable(bed.kind(a), bed.kind(b))}
    firsts = {k: (None if t is None else round(t - relay_late.get(k, 0.0), 3)) for k, t in firsts.items()}
    missing = [f"{bed.kind(a)}<->{bed.kind(b)}" for (a, b), t in firsts.items() if t is None]
    assert not missing, f"no reply in 10 s: {missing}"
    settle = {h: round(bed.joined[h] - bed.up[h], 2) for h in bed.hosts}
    paths = bed.wait_paths(timeout=max(0.5, 5.0 - (time.time() - t_up)))
    took = time.time() - t_up
    replies = reachlab.ping_all(bed, count=3)
    lost = {k: v for k, v in replies.items() if v < 3}
    assert not lost, f"pairs that lost pings: {lost}"
    relayed = [k for k, p in paths.items() if p == "relayed"]
    # Every relayed pair really went through the relay, and nothing else did.
    assert sorted(relayed) == sorted(
        (a, b) for (a, b) in paths if not reachlab.punchable(bed.kind(a), bed.kind(b)))
    assert bed.counter("R1", "relay_forwarded") > 0
    if encrypt:
        for h in bed.hosts.values():
            links = h.ctl_json("show", "links", "json")
            assert links and all(l.get("encrypted") for l in links if l["name"].startswith("c-h")), links
    record(f"reach_matrix_{'encrypted' if encrypt else 'plain'}", {
        "paths": {f"{bed.kind(a)}->{bed.kind(b)}": p for (a, b), p in paths.items()},
        "first_reply_s": {f"{bed.kind(a)}<->{bed.kind(b)}": round(t, 3) for (a, b), t in firsts.items()},
        "all_paths_after_s": round(took, 2), "agent_settle_s": settle,
        "relay_joined_after_s": {f"{a}<->{b}": round(t, 3) for (a, b), t in relay_late.items()}})
    # From both agents having read the overlay (their wait for a burst of hosts to settle, up
    # to a few seconds here, is the etcd agent's, #19): the goal is 2 s at the 95th percentile
    # (bench.reach measures it over many tries); one try per pair here, on a shared CI
    # machine: 3 s.
    assert max(firsts.values()) <= 3.0, f"first replies after both joined: {firsts}"


# A UDP sink: prints the size of each datagram that arrives on port ARGV1 within ARGV2 s.
UDP_SINK = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.settimeout(float(sys.argv[2]))
try:
    while True:
        print(len(s.recv(70000)), flush=True)
except socket.timeout:
    pass
"""
# Sends ARGV4 datagrams of ARGV3 bytes to ARGV1:ARGV2 with IP_PMTUDISC_OMIT (5): fragmented
# at the device's MTU, never DF, the path MTU the kernel learned ignored.
UDP_SOURCE = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 10, 5)  # IP_MTU_DISCOVER, IP_PMTUDISC_OMIT
for _ in range(int(sys.argv[4])):
    s.sendto(b"v" * int(sys.argv[3]), (sys.argv[1], int(sys.argv[2])))
    time.sleep(0.1)
"""

def test_a_nat_that_forgets_its_mappings_costs_a_moment_not_the_link(lab, record):
    """Two sites behind port-restricted NATs punched to each other; one router forgets every
    mapping (conntrack flushed, as a NAT reboot or an expiry does): the heartbeats make new
    ones and the guests' pings come back within the path's trust time (6.5 s), the path
    punched again."""
    bed = reachlab.Bed(lab, ["port-restricted", "port-restricted"], relays=1)
    bed.start()
    bed.wait_paths(timeout=15)
    p = Pinger(bed.guests["h1"], bed.guests["h2"].ip_addr, interval=0.05)
    time.sleep(1)
    bed.sites[0].router.flush_conntrack()
    t0 = time.time()
    time.sleep(9)
    r = p.stop()
    record("mapping_flushed_pings", {k: v for k, v in r.items() if k != "tail"})
    assert r["received"] > 0 and r["max_gap_s"] < 6.5 + 1.0, r
    assert bed.path("h1", "h2") == "punched" and bed.path("h2", "h1") == "punched"
    record("flushed_at", round(t0, 3))


def test_a_site_whose_firewall_drops_all_udp_reaches_everyone_through_a_tcp_tunnel(lab, record):
    """Site S1's firewall drops every UDP datagram (TCP passes, as many corporate firewalls
    do); S2 is behind a port-restricted NAT. h1's reach gets no answer from the relay over UDP,
    opens a TCP tunnel to the relay's VXLAN port, and its links go through the relay over it:
    the guests ping each other both ways and a TCP stream runs. The relay reads nothing it
    carries (the link is encrypted end to end here: the relay has no key of theirs)."""
    bed = reachlab.Bed(lab, ["none", "port-restricted"], relays=1, encrypt=True,
                       site_kw=[{"firewall": {"drop_udp": True}}, {}])
    t0 = time.time()
    bed.start()
    paths = bed.wait_paths(timeout=20, want=lambda a, b: {"relayed-tcp"} if a == "h1" else {"relayed"})
    first = bed.first_reply("h1", "h2", 10)
    assert first is not None, "no reply through the tunnel"
    assert bed.path("h1", "r1") == "tunneled", bed.reach("h1")["peers"]
    got = reachlab.ping_all(bed, count=5)
    res = lab.iperf(bed.guests["h2"], bed.guests["h2"].ip_addr, bed.guests["h1"], seconds=3)
    h1, r1 = dict(bed.reach("h1")["counters"]), dict(bed.reach("R1")["counters"])
    fw = bed.sites[0].router.fw_counters()
    record("tcp_tunnel", {"paths": {f"{a}-{b}": p for (a, b), p in paths.items()},
                          "first_reply_s": round(first - t0, 2), "pings": {f"{a}-{b}": n for (a, b), n in got.items()},
                          "tcp_gbps": round(res.gbps, 3), "firewall": fw,
                          "h1_tunnel_out": h1.get("tunnel_datagrams_out"), "h1_tunnel_in": h1.get("tunnel_datagrams_in"),
                          "relay_tunnels_open": r1.get("tunnels_open"), "relay_forwarded": r1.get("relay_forwarded")})
    assert all(n == 5 for n in got.values()), got
    assert res.bytes > 1_000_000, res
    assert h1["tunnels_open"] == 1 and r1["tunnels_open"] == 1, (h1, r1)
    # The stream crossed the tunnel and the relay, and the firewall did drop UDP.
    assert h1["tunnel_datagrams_out"] > 500 and h1["tunnel_datagrams_in"] > 500, h1
    assert r1["relay_forwarded"] > 1000, r1
    assert any(n > 0 for n in fw.values()), fw
    # show links says each reach link's path (and its MTU: the path to the relay's).
    links = {l["name"]: l for l in bed.hosts["h1"].ctl_json("show", "links", "json")}
    to_h2 = next(l for n, l in links.items() if n.startswith("c-h2"))
    assert to_h2["reach"]["path"] == "relayed-tcp" and to_h2["reach"]["mtu"], to_h2
    assert "relayed-tcp" in bed.hosts["h1"].ctl("show", "links"), bed.hosts["h1"].ctl("show", "links")


def test_a_relay_that_stalls_while_hosts_start_costs_no_more_than_its_stall(lab, record):
    """The relay stops answering (its daemon stopped, as a loaded machine or a slow etcd agent
    stalls it) while the hosts start: they find no UDP to it for 2 s and open TCP tunnels to
    it. When it runs again, UDP answers, the links of the pair that needs the relay go over
    UDP through it, and the relay forwards their frames there too (not into the tunnels: each
    host's links accept relayed frames only from the relay's endpoint they chose). The guests'
    first reply comes soon after the relay resumes (before the fix, only at the next
    heartbeat's rebinding, 2.5 s and a guest's ARP retry later: 3.2 s)."""
    bed = reachlab.Bed(lab, ["port-restricted", "symmetric"], relays=1)
    bed.etcd.start()
    relay = bed.relays[0]
    bed.start_relay(relay)
    bed.wait_joined(relay)
    pid = relay.vnetd.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        for h in bed.hosts:
            bed.start_host(h)
        time.sleep(3.0)
        tunnels = [h for h, n in bed.hosts.items() if "opening a TCP tunnel" in n.vnetd.log_text()]
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed = time.time()
    assert tunnels == ["h1", "h2"], tunnels
    firsts = reachlab.first_replies(bed, deadline=10, since={h: resumed for h in bed.hosts})
    paths = bed.wait_paths(timeout=5)
    record("stalled_relay_first_reply_s", {f"{a}<->{b}": t for (a, b), t in firsts.items()})
    assert paths[("h1", "h2")] == "relayed" and paths[("h2", "h1")] == "relayed", paths
    assert all(t is not None and t <= 2.5 for t in firsts.values()), firsts


def test_links_move_to_another_relay_when_theirs_dies(lab, record):
    """Two hosts behind symmetric NATs (no direct path) and two relays: the one their link
    goes through is killed; the link moves to the other within the trust time and the
    guests' pings come back."""
    bed = reachlab.Bed(lab, ["symmetric", "symmetric"], relays=2)
    bed.start()
    bed.wait_paths(timeout=15)
    via = {p["host"]: p for p in bed.reach("h1")["peers"]}["h2"]["endpoint"]
    dead = next(r for r in bed.relays if via.startswith(r.underlay_ip + ":"))
    p = Pinger(bed.guests["h1"], bed.guests["h2"].ip_addr, interval=0.05)
    time.sleep(1)
    dead.stop_vnetd(signal.SIGKILL)
    time.sleep(10)
    r = p.stop()
    record("relay_killed_pings", {k: v for k, v in r.items() if k != "tail"})
    now = {p["host"]: p for p in bed.reach("h1")["peers"]}["h2"]
    assert now["path"] == "relayed" and not now["endpoint"].startswith(dead.underlay_ip + ":"), now
    assert r["max_gap_s"] < 6.5 + 2.0, r


def test_the_relay_forwards_only_for_members_within_their_budget(lab, record):
    """A relay with a 20 Mbit/s budget per pair: relay datagrams from a host that is not a
    member (no binding) are refused and counted, a stranger's binding ping too; a guest's UDP
    flood through it is held to about the budget (rate_limited counted), and one datagram
    goes out per datagram in."""
    bed = reachlab.Bed(lab, ["symmetric", "symmetric"], relays=1, relay_rate=20)
    bed.start()
    bed.wait_paths(timeout=15)
    relay = bed.relays[0]
    intruder = bed.wan.public_host("X")
    h2_tag = None  # any tag: an unbound source is refused before its tag is read
    before = dict(bed.reach("R1")["counters"])
    # Relay datagrams naming h2 (its tag, from h1's view of the relay header) from an address
    # that never bound: each refused. The tag does not matter for that refusal.
    dgram = bytes([0x22, 1, 0, 0]) + (h2_tag or bytes(8)) + bytes([0x08, 0, 0, 0, 0, 0, 1, 0]) + bytes(60)
    intruder.exec("python3", "-c",
                  "import socket,sys; s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
                  f"[s.sendto(bytes.fromhex('{dgram.hex()}'), ('{relay.underlay_ip}', 4789)) for _ in range(200)]")
    # A binding ping from a key the overlay does not know.
    stranger = bytes([0x20, 1, 1, 0]) + bytes(range(32)) + bytes(12) + bytes(40)
    intruder.exec("python3", "-c",
                  "import socket; s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
                  f"[s.sendto(bytes.fromhex('{stranger.hex()}'), ('{relay.underlay_ip}', 4789)) for _ in range(20)]")
    time.sleep(1)
    mid = dict(bed.reach("R1")["counters"])
    assert mid["relay_unbound_source"] - before["relay_unbound_source"] == 200, (before, mid)
    assert mid["unknown_sender"] - before["unknown_sender"] == 20, (before, mid)
    assert mid["relay_bindings"] == 2, mid
    # 200 Mbit/s of UDP from g1 to g2 through the relay, budget 20.
    g1, g2 = bed.guests["h1"], bed.guests["h2"]
    srv = g2.popen("iperf3", "-s", "-1", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    out = g1.exec("iperf3", "-c", g2.ip_addr, "-u", "-b", "200M", "-t", "4", "-J", check=False).stdout
    netlab.stop_pid(srv)
    res = json.loads(out)["end"]["sum"]
    got_mbps = res["bytes"] * 8 / 4 / 1e6 * (1 - res.get("lost_percent", 0) / 100)
    after = dict(bed.reach("R1")["counters"])
    record("relay_budget", {"budget_mbps": 20, "delivered_mbps": round(got_mbps, 1),
                            "rate_limited": after["relay_rate_limited"]})
    assert after["relay_rate_limited"] > 1000, after
    # The budget and its burst (256 KB) over 4 s: well under 30 Mbit/s arrive.
    assert got_mbps < 30, got_mbps
    forwarded = after["relay_forwarded"] - mid["relay_forwarded"]
    assert forwarded > 0


def test_forged_probes_and_stun_answers_are_refused(lab, record):
    """Probes with a key the overlay does not know, with a member's key but sealed by someone
    else, pongs nobody asked for and STUN answers from a server not asked: each refused and
    counted, nothing answered, no path changed."""
    bed = reachlab.Bed(lab, ["port-restricted", "none"], relays=1)
    stun_host = bed.wan.public_host("S")
    from vnetlab import stun
    stun.StunServer(stun_host, stun_host.underlay_ip)
    bed.extra_args = ["--stun", f"{stun_host.underlay_ip}:3478"]
    bed.start()
    bed.wait_paths(timeout=15)
    # The relay's path too (wait_paths waits for the sites' pairs only): the paths are
    # compared after the forgeries, so none may still be settling.
    netlab.wait_until(lambda: all(p["path"] != "unknown" for p in bed.reach("h2")["peers"]), 10, 0.1,
                      what="h2's path to every peer")
    target = bed.hosts["h2"]  # the public one: reachable by an intruder on the segment
    intruder = bed.wan.public_host("X")
    before = dict(bed.reach("h2")["counters"])
    paths = {p["host"]: p["path"] for p in bed.reach("h2")["peers"]}
    member_key = probe_key_of(bed, "h1")
    msgs = []
    for i in range(10):  # an unknown sender
        msgs.append(bytes([0x20, 1, 0, 0]) + bytes([i]) * 32 + bytes(12) + bytes(40))
    for i in range(10):  # a member's key, sealed by nobody who has the pair key
        msgs.append(bytes([0x20, 1, 0, 0]) + member_key + bytes([i]) * 12 + bytes(40))
    for i in range(10):  # pongs nobody asked for, a member's key
        msgs.append(bytes([0x21, 1, 0, 0]) + member_key + bytes([i]) * 12 + bytes(60))
    hexes = ",".join(f"'{m.hex()}'" for m in msgs)
    intruder.exec("python3", "-c",
                  "import socket; s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
                  f"[s.sendto(bytes.fromhex(m), ('{target.underlay_ip}', 4789)) for m in [{hexes}]]")
    # A STUN Binding success from a server the host did not ask (the intruder's address).
    answer = bytes.fromhex("0101000c2112a442") + bytes(12) + bytes.fromhex("0020000800011e07e112a443")
    intruder.exec("python3", "-c",
                  "import socket; s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
                  f"[s.sendto(bytes.fromhex('{answer.hex()}'), ('{target.underlay_ip}', 4789)) for _ in range(5)]")
    time.sleep(1)
    after = dict(bed.reach("h2")["counters"])
    d = {k: after[k] - before[k] for k in ("unknown_sender", "bad_auth", "unsolicited", "pongs_sent")}
    record("forged", d)
    assert d["unknown_sender"] == 10, d
    assert d["bad_auth"] == 20, d
    assert d["unsolicited"] == 5, d
    # The STUN server the host was given did answer (its own candidates came from it too).
    assert after["stun_received"] > 0, after
    assert {p["host"]: p["path"] for p in bed.reach("h2")["peers"]} == paths


def probe_key_of(bed, host: str) -> bytes:
    """A host's probe key, raw, from its record in etcd."""
    import base64
    out = bed.etcd.ns.exec("etcdctl", "--endpoints", f"http://{bed.etcd.endpoint}", "get",
                           f"/vnet/{reachlab.OVERLAY}/hosts/{host}", "--print-value-only").stdout
    return base64.b64decode(json.loads(out)["probe_key"])


def assert_kernel_carried(bed, nbytes: int) -> None:
    """h1's and h2's links to each other: the kernel fast path's share of them holds at least
    nine tenths of a stream of ``nbytes`` between their guests."""
    for h, peer in (("h1", "c-h2-v1"), ("h2", "c-h1-v1")):
        st = bed.hosts[h].ctl_json("show", "stats", "json")
        link = next(p for p in st["ports"] if p["name"] == peer)
        k = link.get("kernel") or {}
        assert k, link
        moved = k["tx_bytes"] + k["rx_bytes"]
        assert moved > 0.9 * nbytes, (h, k, nbytes)


def test_a_punched_link_runs_on_the_kernel_fast_path(lab, record):
    """Guests behind two port-restricted NATs, punched: their TCP stream is carried by the
    kernel fast path on both hosts (the links' kernel share holds the bytes), every datagram
    leaving from the VXLAN port the NATs mapped; against the same two hosts' no-NAT neighbours
    in the same run (recorded; bench.reach measures the ratio over interleaved rounds)."""
    bed = reachlab.Bed(lab, ["port-restricted", "port-restricted", "none", "none"], relays=1)
    bed.start()
    bed.wait_paths(timeout=15)
    g = bed.guests
    punched = lab.iperf(g["h2"], g["h2"].ip_addr, g["h1"], seconds=3)
    plain = lab.iperf(g["h4"], g["h4"].ip_addr, g["h3"], seconds=3)
    record("tcp_gbps", {"punched": round(punched.gbps, 2), "no_nat": round(plain.gbps, 2)})
    assert_kernel_carried(bed, punched.bytes)
    # The NAT kept one mapping per host for the link: the VXLAN port, as reach published it.
    ct = bed.sites[0].router.conntrack()
    mappings = [line for line in ct.splitlines() if "dport=4789" in line and "udp" in line]
    assert mappings, ct


def test_a_relayed_link_runs_on_the_kernel_fast_path_at_both_ends_and_the_relay(lab, record):
    """Guests behind two symmetric NATs, relayed (a relay whose budget is above the path): their
    TCP stream is carried by the kernel fast path on both hosts (the links' kernel share holds
    the bytes) and on the relay, whose vnetd admitted the pair and then read almost none of it
    (its socket's bytes a small share of what it counts forwarded, the kernel's counts added
    to its own); against the same run's no-NAT pair (recorded; bench.reach measures the ratio
    over interleaved rounds)."""
    bed = reachlab.Bed(lab, ["symmetric", "symmetric", "none", "none"], relays=1, relay_rate=20000)
    bed.start()
    bed.wait_paths(timeout=15)
    assert bed.path("h1", "h2") == "relayed", bed.reach("h1")["peers"]
    g = bed.guests
    relay = bed.relays[0]
    before = dict(bed.reach("R1")["counters"])
    rx_before = relay.ctl_json("show", "stats", "json")["daemon"]["rx_bytes"]
    relayed = lab.iperf(g["h2"], g["h2"].ip_addr, g["h1"], seconds=3)
    plain = lab.iperf(g["h4"], g["h4"].ip_addr, g["h3"], seconds=3)
    time.sleep(0.6)  # the relay adds the kernel's counts to its own every 250 ms
    after = dict(bed.reach("R1")["counters"])
    rx_after = relay.ctl_json("show", "stats", "json")["daemon"]["rx_bytes"]
    forwarded = after["relay_forwarded_bytes"] - before["relay_forwarded_bytes"]
    read = rx_after - rx_before
    record("relayed", {"tcp_gbps": {"relayed": round(relayed.gbps, 2), "no_nat": round(plain.gbps, 2)},
                       "relay_forwarded_bytes": forwarded, "relay_socket_bytes": read,
                       "rate_limited": after["relay_rate_limited"] - before["relay_rate_limited"]})
    assert_kernel_carried(bed, relayed.bytes)
    assert forwarded > 0.9 * relayed.bytes, (forwarded, relayed.bytes)
    assert read < 0.1 * forwarded, (read, forwarded)


def test_no_black_hole_on_a_small_mtu_path_that_drops_fragments(lab, record):
    """Guests with MTU 1500 behind NATs, one site's path 1280 bytes and its firewall dropping
    IP fragments: reach links carry DF, the path's MTU is learned from the router's ICMP, and a
    frame too big is answered to its guest with "fragmentation needed" (mtu = path - 50), so
    the guests' TCP adapts: a ping of 1400 bytes with DF gets that answer within 1 s of the
    first one too big, and an iperf3 TCP stream runs (on the kernel fast path)."""
    bed = reachlab.Bed(lab, ["port-restricted", "port-restricted"], relays=1, mtu=None,
                       site_kw=[{"wan_mtu": 1280, "firewall": {"drop_fragments": True}}, {}])
    bed.start()
    bed.wait_paths(timeout=15)
    g1, g2 = bed.guests["h1"], bed.guests["h2"]
    t0 = time.time()
    told = None
    while time.time() - t0 < 5 and told is None:
        r = g1.exec("ping", "-c", "1", "-s", "1400", "-M", "do", "-W", "0.3", g2.ip_addr, check=False)
        m = re.search(r"Frag needed and DF set \(mtu = (\d+)\)|message too long, mtu=(\d+)", r.stdout + r.stderr)
        if m:
            told = (time.time() - t0, int(m.group(1) or m.group(2)))
    assert told is not None, "the guest was never told its frames do not fit"
    assert told[1] == 1280 - 50, told
    res = lab.iperf(g2, g2.ip_addr, g1, seconds=3)
    # A datagram without DF is cut to fit, as a router would: 60,000-byte UDP datagrams that
    # g1's kernel fragments at its device's 1500 bytes (IP_PMTUDISC_OMIT: no DF, the learned
    # path MTU ignored) are fragmented again by vnetd and reassembled by g2.
    sink = g2.popen("python3", "-c", UDP_SINK, "9911", "3", stdout=subprocess.PIPE, text=True)
    netlab.wait_until(lambda: ":9911 " in g2.exec("ss", "-Hunl").stdout, 5, what="the UDP sink")
    g1.exec("python3", "-c", UDP_SOURCE, g2.ip_addr, "9911", "60000", "5")
    got = [int(x) for x in sink.communicate(timeout=10)[0].split()]
    fragmented = dict(bed.reach("h1")["counters"]).get("fragmented", 0)
    record("small_mtu_udp_60000_without_df", {"sent": 5, "arrived": len(got),
                                               "fragmented_by_vnetd": fragmented})
    assert got and all(n == 60000 for n in got), got
    assert fragmented >= 40 * len(got), fragmented  # 40 of each datagram's 41 fragments: too big
    st = bed.hosts["h1"].ctl_json("show", "stats", "json")
    link = next(p for p in st["ports"] if p["name"] == "c-h2-v1")
    peer = {p["host"]: p for p in bed.reach("h1")["peers"]}["h2"]
    record("small_mtu", {"told_after_s": round(told[0], 2), "mtu_told": told[1],
                         "tcp_gbps": round(res.gbps, 2), "path_mtu": peer["mtu"],
                         "too_big": link["drops"].get("too_big", 0)})
    assert told[0] < 2.0, told
    assert peer["mtu"] == 1280, peer
    assert res.bytes > 10_000_000, res
    assert (link.get("kernel") or {}).get("tx_bytes", 0) > 0.9 * res.bytes, link
    assert bed.sites[0].router.fw_counters(), "the firewall had no rule"


def peer_of(bed, a: str, b: str) -> dict:
    """Host ``a``'s `show reach` entry for host ``b``."""
    return {p["host"]: p for p in bed.reach(a)["peers"]}[b]


def told_mtu(g_from, to_ip: str, size: int, deadline: float):
    """(seconds, mtu) until a DF ping of ``size`` bytes is answered with "fragmentation
    needed", pinging every 0.3 s; None by the deadline."""
    t0 = time.time()
    while time.time() - t0 < deadline:
        r = g_from.exec("ping", "-c", "1", "-s", size, "-M", "do", "-W", "0.3", to_ip, check=False)
        m = re.search(r"Frag needed and DF set \(mtu = (\d+)\)|message too long, mtu=(\d+)", r.stdout + r.stderr)
        if m:
            return time.time() - t0, int(m.group(1) or m.group(2))
    return None


def test_path_mtu_is_probed_where_icmp_is_filtered(lab, record):
    """The small-MTU path (1280 bytes) with its routers dropping ICMP "fragmentation needed"
    (the site's router and the transit, so neither direction's kernel learns anything; its
    figure stays the route's 1500) and fragments: a black hole for every datagram over 1280.
    Reach probes the path with padded pings (RFC 8899): an iperf3 TCP stream between guests
    with MTU 1500 runs (before probing: 0 bytes, a stall), both hosts find 1280 within 1 s of the
    path, and a guest's first frames too big (sent as soon as the path is up) are answered
    with "fragmentation needed" (1230) within 1 s; when the path shrinks again (1200, still
    without ICMP), probing notices (a black hole) and finds it."""
    fw = {"drop_fragments": True, "drop_frag_needed": True}
    bed = reachlab.Bed(lab, ["port-restricted", "port-restricted"], relays=1, mtu=None,
                       site_kw=[{"wan_mtu": 1280, "firewall": fw}, {}])
    bed.start()
    bed.wait_paths(timeout=15)
    g1, g2 = bed.guests["h1"], bed.guests["h2"]
    # The guest's first frames too big, as soon as the path is up (probing may still be
    # searching): told within 1 s (ping waits up to 0.3 s for each try). A fresh guest: its
    # kernel learns 1230 from this answer and keeps it.
    told = told_mtu(g1, g2.ip_addr, 1400, 5)
    assert told is not None, "the guest was never told its frames do not fit"
    assert told[1] == 1280 - 50 and told[0] < 1.0, told
    try:
        res = lab.iperf(g2, g2.ip_addr, g1, seconds=3)
    except (netlab.LabError, subprocess.TimeoutExpired) as e:
        res = None
        record("small_mtu_no_icmp_iperf_error", str(e)[-500:])
    record("small_mtu_no_icmp_tcp", {"gbps": round(res.gbps, 3) if res else None,
                                     "bytes": res.bytes if res else 0})
    assert res is not None and res.bytes > 10_000_000, f"the TCP stream stalled: {res}"
    peers = {}
    for a, b in (("h1", "h2"), ("h2", "h1")):
        netlab.wait_until(lambda: peer_of(bed, a, b).get("pmtu") == "done", 5, 0.1,
                          what=f"{a}'s probing of {b}")
        peers[a] = p = peer_of(bed, a, b)
        # The kernel never learned the path's MTU (the ICMP was dropped): probing did.
        assert p["kernel_mtu"] == 1500 and p["probed_mtu"] == 1280 and p["mtu"] == 1280, p
        assert p["pmtu_search_ms"] <= 1000, p
    c1 = dict(bed.reach("h1")["counters"])
    drops = bed.sites[0].router.fw_counters()
    icmp_dropped = sum(v for k, v in drops.items() if "from_router" in k or "forwarded" in k)
    record("small_mtu_no_icmp", {
        "search_ms": {a: p["pmtu_search_ms"] for a, p in peers.items()},
        "told_after_s": round(told[0], 3), "mtu_told": told[1],
        "probes": {k: c1[k] for k in c1 if k.startswith("pmtu_")},
        "icmp_frag_needed_dropped": icmp_dropped})
    assert icmp_dropped > 0, drops
    assert c1["pmtu_probes_answered"] > 0 and c1["pmtu_probes_lost"] >= 3, c1
    # A route change: the path carries 1200 bytes now, and nothing says so.
    site = bed.sites[0]
    site.transit.ip_link("set", "down0", "mtu", 1200)
    site.router.ip_link("set", "wan0", "mtu", 1200)
    t0 = time.time()
    netlab.wait_until(lambda: all(peer_of(bed, a, b)["mtu"] == 1200 and peer_of(bed, a, b)["pmtu"] == "done"
                                  for a, b in (("h1", "h2"), ("h2", "h1"))), 12, 0.1,
                      what="the smaller path found")
    found = time.time() - t0
    holes = bed.counter("h2", "pmtu_black_holes")
    record("small_mtu_no_icmp_shrunk", {"found_after_s": round(found, 2), "black_holes_h2": holes})
    assert holes >= 1
