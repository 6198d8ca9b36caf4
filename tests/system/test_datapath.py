"""The fast data path of issue #3 on real objects: dispatch modes and adaptive switching,
offloads (TSO/GSO/GRO through the virtio-net header) against a guest without them, multi-queue
TAPs with several dispatchers, and settings changed at run time.

Speed is not asserted here (benchmarks do that, with baselines in the same run); these tests
check that each mechanism is really used, through vnet's own counters."""

import time

from vnetlab import netlab
from vnetlab.netlab import delta


def dispatch(host) -> dict:
    return host.ctl_json("show", "stats", "json")["dispatch"]


def test_modes_and_adaptive_switching(lab, record):
    """Each mode forwards; adaptive mode switches to polling under load and back when idle."""
    m = netlab.udp_mesh(lab, ("A", "B"), guests_per_host=1, mtu=1450)
    A, B = m.hosts
    a1, b1 = m.guests["A"][0], m.guests["B"][0]
    for mode in ("guest-driven", "polling", "adaptive"):
        for h in (A, B):
            h.ctl("set", "mode", mode)
        assert dispatch(A)["settings"]["mode"] == mode
        r = a1.ping(b1.ip_addr, count=3)
        assert r.received == 3, f"mode {mode}: {r.output}"
        if mode != "adaptive":
            netlab.wait_until(lambda: all(x["mode"] == mode for x in dispatch(A)["dispatchers"]), 3,
                              what=f"dispatchers in {mode} mode")

    # adaptive with thresholds a bulk transfer clearly exceeds and an idle link clearly does not
    for h in (A, B):
        h.script("set adaptive-low 200\nset adaptive-high 2000\nset adaptive-window-ms 5\n")
    s0 = dispatch(A)["dispatchers"]
    switches0 = sum(x["switches"] for x in s0)
    ip = lab.iperf(b1, b1.ip_addr, a1, seconds=2)
    assert ip.gbps > 0.05
    # idle: ping at 5/s is far below alpha_l, so the dispatcher falls back to guest-driven
    netlab.wait_until(lambda: all(x["mode"] == "guest-driven" for x in dispatch(A)["dispatchers"]), 5,
                      what="adaptive dispatcher back to guest-driven when idle")
    s1 = dispatch(A)["dispatchers"]
    switches = sum(x["switches"] for x in s1) - switches0
    assert switches >= 2, f"expected a switch to polling and back, saw {switches}: {s1}"
    fpw = max(x["frames_per_wakeup"] for x in s1)
    record("adaptive_switches_during_iperf", switches)
    record("frames_per_wakeup", fpw)
    assert fpw >= 1.0


def test_offload_paths_against_a_plain_guest(lab, record):
    """A guest with TSO (offload on) and one without (offload off) exchange TCP both ways:
    large segments are cut into wire segments (GSO) on one side and merged back (GRO) for the
    offload guest on the other, checksums are completed for the plain guest."""
    A, B = lab.host("A"), lab.host("B")
    a1 = lab.guest("a1", ip="192.168.50.11", mac=netlab.mac(1, 1, 1))
    b1 = lab.guest("b1", ip="192.168.50.21", mac=netlab.mac(1, 2, 1))
    A.start_vnetd(config=f"""
interface add vm-a1 tap mac {a1.mac} netns {a1.name} mtu 1450
link add to-b udp {B.underlay_ip}
route add any {a1.mac} interface vm-a1
route add any {b1.mac} link to-b
""")
    B.start_vnetd(config=f"""
interface add vm-b1 tap mac {b1.mac} netns {b1.name} mtu 1450 offload off
link add to-a udp {A.underlay_ip}
route add any {b1.mac} interface vm-b1
route add any {a1.mac} link to-a
""")
    a1.configure(A.interface("vm-a1")["ifname"], 1450)
    b1.configure(B.interface("vm-b1")["ifname"], 1450)
    assert [i["offload"] for i in B.ctl_json("show", "interfaces", "json")] == [False]
    sa0, sb0 = A.stats(), B.stats()
    fwd = lab.iperf(b1, b1.ip_addr, a1, seconds=2)             # offload guest -> plain guest
    rev = lab.iperf(b1, b1.ip_addr, a1, seconds=2, reverse=True)  # plain guest -> offload guest
    sa1, sb1 = A.stats(), B.stats()
    record("offload_to_plain_gbps", round(fwd.gbps, 3))
    record("plain_to_offload_gbps", round(rev.gbps, 3))
    assert fwd.gbps > 0.05 and rev.gbps > 0.05
    assert delta(sa0, sa1, "to-b", "tx_bytes") >= fwd.bytes
    assert delta(sb0, sb1, "to-a", "tx_bytes") >= rev.bytes
    oa, ob = sa1["dispatch"]["offload"], sb1["dispatch"]["offload"]
    # A's guest handed over large segments, which A cut for the wire
    assert oa["gso_frames"] > 0 and oa["gso_segments"] > oa["gso_frames"], oa
    # B's plain guest sent ordinary frames; A merged them for its offload guest
    assert oa["gro_frames"] > 0 and oa["gro_merged"] > oa["gro_frames"], oa
    # nothing large ever went to the plain guest: no oversize drops on B
    assert sb1["ports"][0]["drops"].get("oversize", 0) == 0, sb1["ports"][0]
    assert ob["gso_frames"] == 0, ob


def test_multiqueue_dispatchers_and_runtime_settings(lab, record):
    """A two-queue TAP served by two dispatchers pinned to CPUs carries four parallel streams;
    settings change at run time (dispatchers restarted) and traffic goes on."""
    m = netlab.udp_mesh(lab, ("A", "B"), guests_per_host=1, mtu=1450)
    A, B = m.hosts
    a1, b1 = m.guests["A"][0], m.guests["B"][0]
    # replace A's interface by a two-queue one (same MAC and namespace)
    A.script(f"""interface del vm-a1
interface add vm-a1 tap mac {a1.mac} netns {a1.name} mtu 1450 queues 2
route add any {a1.mac} interface vm-a1
set dispatchers 2
set cpus 0,1
""")
    a1.configure(A.interface("vm-a1")["ifname"], 1450)
    d = dispatch(A)
    assert len(d["dispatchers"]) == 2 and d["settings"]["cpus"] == [0, 1]
    # the VXLAN port's two sockets (one sets DF, for reach links; the kernel spreads the
    # port's datagrams over both) + two TAP queues, spread over the two dispatchers
    assert sorted(x["sources"] for x in d["dispatchers"]) == [2, 2], d
    lab.wait_ping(a1, b1.ip_addr, timeout=10)
    s0 = A.stats()
    ip = lab.iperf(b1, b1.ip_addr, a1, seconds=2, extra=["-P", "4"])
    s1 = A.stats()
    record("two_queue_4_streams_gbps", round(ip.gbps, 3))
    assert ip.gbps > 0.05
    assert delta(s0, s1, "vm-a1", "rx_bytes") >= ip.bytes
    busy = [x for x in s1["dispatch"]["dispatchers"] if x["frames"] > 0]
    assert len(busy) == 2, s1["dispatch"]["dispatchers"]
    # back to one dispatcher, unpinned, polling with a timed yield: traffic continues
    A.script("set dispatchers 1\nset cpus none\nset mode polling\nset yield timed\nset yield-sleep-us 20\n")
    d = dispatch(A)
    assert len(d["dispatchers"]) == 1 and d["dispatchers"][0]["sources"] == 4
    assert a1.ping(b1.ip_addr, count=3).received == 3
    cfg = A.ctl("show", "config")
    for line in ("set mode polling", "set yield timed", "set yield-sleep-us 20", "queues 2"):
        assert line in cfg, cfg
