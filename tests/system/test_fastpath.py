"""The kernel fast path (crate vnet-fastpath, issue #10) on real traffic, driven by its `fplab`
example in two host namespaces (bench/fastpath_bed.py builds the topology): TCP across the
overlay with GSO kept whole end to end and no checksum errors in the receiving guest; hostile
frames from a guest counted and not forwarded; a rate limit that holds; and a SIGKILLed loader
that leaves no program, map or attachment behind.

Needs root and `cargo build --release -p vnet-fastpath --examples` (FPLAB overrides the path)."""

import json
import signal
import socket
import time

import pytest

from bench import fastpath_bed
from bench.fastpath_bed import FP_MAC, FastpathBed, Fplab
from vnetlab import netlab

pytestmark = pytest.mark.no_vnetd


@pytest.fixture
def bed(tools):
    if not fastpath_bed.FPLAB.exists():
        pytest.fail(f"{fastpath_bed.FPLAB} not found: cargo build --release -p vnet-fastpath --examples")
    with FastpathBed(1500, tag="fptest") as b:
        yield b


def iperf3(client, server, sip, cip, *extra, seconds=3) -> dict:
    srv = server.popen("iperf3", "-s", "-1", "-B", sip, "-p", 5201, stdout=netlab.subprocess.DEVNULL,
                       stderr=netlab.subprocess.DEVNULL)
    netlab.wait_until(lambda: ":5201 " in server.exec("ss", "-Htln").stdout, 10, 0.05, what="iperf3 server")
    r = client.exec("iperf3", "-c", sip, "-B", cip, "-p", 5201, "-t", seconds, "-J", *extra,
                    check=False, timeout=seconds + 30)
    netlab.stop_pid(srv, timeout=3)
    return json.loads(r.stdout)


def csum_errors(ns) -> dict:
    j = json.loads(ns.exec("nstat", "-az", "--json").stdout)["kernel"]
    return {k: v for k, v in j.items() if "CsumErrors" in k}


def test_tcp_crosses_in_the_kernel_with_gso_whole(bed, record):
    bed.start_fastpath("fp-cache")
    fa, fb = bed.fp_guests
    c0 = bed.counters("fp-cache")
    e0 = csum_errors(fb)
    j = iperf3(fa, fb, fb.ip_addr, fa.ip_addr)
    c1 = bed.counters("fp-cache")
    e1 = csum_errors(fb)
    recv = j["end"]["sum_received"]
    record("tcp_gbps", round(recv["bits_per_second"] / 1e9, 2))

    def d(h, port, key):
        return c1[h]["ports"][port][key] - c0[h]["ports"][port][key]
    enc_frames, enc_bytes = d("hA", "link2", "tx_frames"), d("hA", "link2", "tx_bytes")
    dec_frames, dec_bytes = d("hB", "link2", "rx_frames"), d("hB", "link2", "rx_bytes")
    got_frames, got_bytes = d("hB", "port1", "tx_frames"), d("hB", "port1", "tx_bytes")
    # every byte iperf3 moved went through the programs, on both hosts
    assert enc_bytes >= recv["bytes"] and dec_bytes >= recv["bytes"] and got_bytes >= recv["bytes"]
    # GSO whole: the skbs the programs saw average far above one MTU (guest TSO ~64 KB)
    per_skb = [enc_bytes / enc_frames, dec_bytes / dec_frames, got_bytes / got_frames]
    record("bytes_per_skb_encap_decap_delivered", [round(x) for x in per_skb])
    assert all(x > 8 * 1500 for x in per_skb), per_skb
    assert d("hA", "port1", "punted_frames") == 0
    # the receiving guest's stack accepted what arrived (checksums)
    assert {k: e1[k] - e0.get(k, 0) for k in e1 if e1[k] != e0.get(k, 0)} == {}
    # the traffic matrix saw the pair
    m = {(e["src"], e["dst"]): e for e in c1["hA"]["matrix"]}
    assert m[(FP_MAC[0], FP_MAC[1])]["bytes"] >= recv["bytes"]


def test_hostile_frames_at_a_port_are_counted_not_forwarded(bed):
    bed.start_fastpath("fp-cache")
    fa, fb = bed.fp_guests
    # let frames longer than the port's MTU (1450) reach the program, as a VM's TAP would
    bed.hA.ip_link("set", "fp", "mtu", 9000)
    fa.ip_link("set", "eth0", "mtu", 9000)
    before = bed.counters("fp-cache")["hA"]["ports"]["port1"]
    fb_rx0 = fb.link_counters("eth0")["rx_packets"]
    me, peer = bytes.fromhex(FP_MAC[0].replace(":", "")), bytes.fromhex(FP_MAC[1].replace(":", ""))
    spoof = bytes.fromhex("525400ffffee")
    ip = b"\x08\x00" + b"\x45" + bytes(40)
    frames = {
        "spoofed": peer + spoof + ip + bytes(40),
        "oversize": peer + me + ip + bytes(2000),
        "vlan": peer + me + b"\x81\x00\x00\x05" + ip + bytes(40),
        "broadcast": b"\xff" * 6 + me + b"\x08\x06" + bytes(28),
    }
    with netlab.in_netns(fa.name):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind(("eth0", 0))
    for f in frames.values():
        for _ in range(5):
            s.send(f)
    s.close()
    time.sleep(0.3)
    after = bed.counters("fp-cache")["hA"]["ports"]["port1"]
    drops = {k: after["drops"].get(k, 0) - before["drops"].get(k, 0) for k in after["drops"]}
    assert drops.get("spoofed_src") == 5, drops
    assert drops.get("oversize") == 5, drops
    # VLAN and broadcast go to the slow path (the punt TAP), never to the other guest
    assert after["punted_frames"] - before["punted_frames"] == 10
    assert after["rx_frames"] == before["rx_frames"]
    assert fb.link_counters("eth0")["rx_packets"] == fb_rx0


def test_rate_limit_holds(bed, record):
    fa, fb = bed.fp_guests
    bed.stop_fastpath()
    # 50 Mbit/s with a 256 KB bucket on what guest A sends
    fps = {}
    for i, h in enumerate((bed.hA, bed.hB)):
        args = bed.fplab_args("fp-cache", i) + (["--rate", "1:50:256"] if i == 0 else [])
        fps[h] = Fplab(h, args, bed.lab.workdir / f"rate-{h.role}.json")
    bed.running, bed.variant = fps, "fp-cache"
    bed.lab.wait_ping(fa, fb.ip_addr, timeout=10)
    c0 = fps[bed.hA].counters()["ports"]["port1"]
    j = iperf3(fa, fb, fb.ip_addr, fa.ip_addr, "-u", "-b", "300M", "-l", "1400", seconds=3)
    c1 = fps[bed.hA].counters()["ports"]["port1"]
    recv = j["end"]["sum_received"]
    mbit = recv["bits_per_second"] / 1e6
    record("udp_300M_offered_through_rate_50_mbit", round(mbit, 1))
    limited = c1["drops"].get("rate_limited", 0) - c0["drops"].get("rate_limited", 0)
    record("rate_limited_drops", limited)
    assert limited > 0
    # the limit holds: at most the rate plus one bucket over the run (and the path works)
    assert 20 < mbit <= 50 * 1.05 + 256 * 1024 * 8 / 1e6 / recv["seconds"], mbit


def test_sigkill_leaves_nothing_behind(bed):
    def ids(kind):
        return {x["id"] for x in json.loads(bed.hA.exec("bpftool", "-j", kind, "show").stdout or "[]")}
    links0, progs0, maps0 = ids("link"), ids("prog"), ids("map")
    bed.start_fastpath("fp-cache")
    ours = ids("link") - links0, ids("prog") - progs0, ids("map") - maps0
    assert all(ours), ours
    for f in bed.running.values():
        f.stop(signal.SIGKILL)
    bed.running, bed.variant = {}, None

    def gone():
        return not (ours[0] & ids("link") or ours[1] & ids("prog") or ours[2] & ids("map"))
    netlab.wait_until(gone, 5, 0.1, what="the killed loader's programs, maps and tcx links to go")
    # and the next start attaches and forwards as before
    bed.start_fastpath("fp-cache")
    fa, fb = bed.fp_guests
    assert bed.lab.ping(fa, fb.ip_addr, count=3, interval=0.1).ok
