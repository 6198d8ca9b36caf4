"""Real VMs on vnet over vhost-user (issue #4): QEMU guests (TCG) whose virtio-net device is
served by vnetd, talking to namespace guests and to each other, across restarts of either
side, plus a hostile frontend (crates/vnet-frontend) that must not hurt the daemon.

Every test checks what the guests see (ping, iperf3) and vnet's own counters (the vhost-user
interface's cut-through/copy and notification counters), so traffic on another path cannot
make a test pass. TCG makes the VMs slow: figures here only show the path works; the data
path is measured by the benchmark (bench/, `vhost` section) without an emulated CPU.
"""

import json
import os
import re
import subprocess
import sys
import time

import pytest

import netlab
from netlab import delta, new_drops

sys.path.insert(0, str(netlab.REPO))
from guest import qemu  # noqa: E402

SUBNET = "192.168.60"
MTU = 1450  # guest MTU on a 1500-byte underlay: no IP fragmentation of VXLAN datagrams


@pytest.fixture(scope="module")
def image():
    try:
        return qemu.build()
    except qemu.BuildError as e:
        pytest.fail(str(e))


def vm_mac(n: int) -> str:
    return f"52:54:00:60:00:{n:02x}"


def vhost_port(host, name: str) -> dict:
    p = host.port(name)
    assert "nic" in p and p["nic"]["kind"] == "vhost-user", p
    return p


def boot(lab, image, host, sock, n: int, cmd: str = "iperf3 -s -D", reconnect=None, queues: int = 1,
         no_reboot=None):
    g = qemu.Guest(image, qemu.VhostUser(str(sock), mac=vm_mac(n), reconnect=reconnect, queues=queues),
                   ip=f"{SUBNET}.{n}/24", mtu=MTU, cmd=cmd, then="wait", netns=host.name,
                   name=f"{lab.prefix}-vm{n}", no_reboot=no_reboot)
    g.start()
    return g


def failed(g, host=None):
    s = f"QEMU pid {g.pid}; console:\n{g.console()[-2500:]}"
    if host is not None and host.vnetd is not None:
        s += f"\n--- vnetd log ---\n{host.vnetd.log_text()[-2500:]}"
    return s


def iperf_to_vm(client, ip, seconds=2, reverse=False):
    """iperf3 from a namespace to a VM's ``iperf3 -s -D`` (slow to re-listen under TCG)."""
    args = ["iperf3", "-c", ip, "-t", seconds, "-J"] + (["-R"] if reverse else [])
    deadline = time.monotonic() + 15
    while True:
        r = client.exec(*args, check=False, timeout=seconds + 40)
        try:
            return netlab.parse_iperf(r.stdout)
        except (ValueError, KeyError, netlab.LabError) as e:
            if ("unable to connect" in str(e) or "busy" in str(e)) and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            raise AssertionError(f"iperf3 failed ({e}): {r.stdout[-1500:]} {r.stderr[-500:]}")


def two_hosts(lab, vm_sock, extra_a=""):
    """Host A serves a vhost-user interface ``vm1`` (MAC vm_mac(1)); host B a namespace guest
    ``b1`` (.20) on a TAP; UDP links both ways."""
    A, B = lab.host("A"), lab.host("B")
    b1 = lab.guest("b1", ip=f"{SUBNET}.20", mac="52:54:00:60:01:20")
    A.start_vnetd(config=f"""
interface add vm1 vhost-user {vm_sock} mac {vm_mac(1)} mtu {MTU}
link add to-b udp {B.underlay_ip}
route add any {vm_mac(1)} interface vm1
route add any {b1.mac} link to-b
{extra_a}
""")
    B.start_vnetd(config=f"""
interface add b1 tap mac {b1.mac} netns {b1.name} mtu {MTU}
link add to-a udp {A.underlay_ip}
route add any {b1.mac} interface b1
route add any {vm_mac(1)} link to-a
""")
    b1.configure(B.interface("b1")["ifname"], MTU)
    return A, B, b1


def test_vm_to_namespace_guest_across_hosts(lab, image, record):
    """A QEMU VM on host A (vhost-user) and a namespace guest on host B: ping and iperf3 both
    ways; the frames crossed the vhost-user interface (cut-through counters) and the link."""
    sock = lab.workdir / "vm1.sock"
    A, B, b1 = two_hosts(lab, sock)
    g = boot(lab, image, A, sock, 1)
    with g:
        boot_s = g.wait_ready(timeout=120)
        assert g.wait_exit(timeout=30) == 0, failed(g, A)
        s0 = A.stats()
        ping = lab.ping(b1, f"{SUBNET}.1", count=5, interval=0.2, wait=3)
        assert ping.ok and ping.received >= 4, f"{ping}\n{failed(g, A)}"
        up = iperf_to_vm(b1, f"{SUBNET}.1", seconds=2)
        down = iperf_to_vm(b1, f"{SUBNET}.1", seconds=2, reverse=True)
        s1 = A.stats()
        assert up.bytes > 0 and down.bytes > 0
        assert delta(s0, s1, "vm1", "tx_bytes") >= up.bytes, "frames to the VM went through vm1"
        assert delta(s0, s1, "vm1", "rx_bytes") >= down.bytes, "frames from the VM came through vm1"
        nic = vhost_port(A, "vm1")["nic"]
        assert nic["connected"] and not nic["broken"], nic
        assert nic["tx_cut_through"] > 0 and nic["rx_cut_through"] > 0, nic
        assert nic["rx_notifications"] > 0, nic
        assert nic["bad_chains"] == 0 and nic["protocol_errors"] == 0, nic
        assert not new_drops(s0, s1), new_drops(s0, s1)
        record("boot_to_ready_s", round(boot_s, 2))
        record("ping_vm_rtt_ms_tcg", ping.avg_ms)
        record("iperf3_to_vm_mbit_tcg", round(up.gbps * 1000, 1))
        record("iperf3_from_vm_mbit_tcg", round(down.gbps * 1000, 1))
        record("vm1_nic", nic)


def test_two_vms_same_host_switch_locally(lab, image, record):
    """Two QEMU VMs on one vnetd: they ping and run iperf3 between them with no link at all,
    so the frames were switched locally between the two vhost-user devices."""
    A = lab.host("A")
    s1, s2 = lab.workdir / "vm1.sock", lab.workdir / "vm2.sock"
    A.start_vnetd(config=f"""
interface add vm1 vhost-user {s1} mac {vm_mac(1)} mtu {MTU}
interface add vm2 vhost-user {s2} mac {vm_mac(2)} mtu {MTU}
route add any {vm_mac(1)} interface vm1
route add any {vm_mac(2)} interface vm2
""")
    g2 = boot(lab, image, A, s2, 2)
    with g2:
        g2.wait_ready(timeout=120)
        assert g2.wait_exit(timeout=30) == 0, failed(g2, A)
        g1 = boot(lab, image, A, s1, 1, cmd=f"ping -c 3 -W 5 {SUBNET}.2 && iperf3 -c {SUBNET}.2 -t 2 -f m")
        with g1:
            g1.wait_ready(timeout=120)
            assert g1.wait_exit(timeout=90) == 0, failed(g1, A)
            m = re.findall(r"([0-9.]+) Mbits/sec.*receiver", g1.console())
            assert m, failed(g1, A)
            bps = float(m[-1]) * 1e6
            st = A.stats()
            v1, v2 = netlab.port_of(st, "vm1"), netlab.port_of(st, "vm2")
            assert v1["rx_bytes"] > 1_000_000 and v2["tx_bytes"] > 1_000_000, (v1, v2)
            assert v1["nic"]["bad_chains"] == 0 and v2["nic"]["bad_chains"] == 0
            assert not any(p["kind"] == "link" for p in st["ports"])
            record("vm_to_vm_same_host_mbit_tcg", round(bps / 1e6, 1))


def test_two_vms_on_two_hosts(lab, image, record):
    """A QEMU VM on each of two hosts over a UDP link."""
    A, B = lab.host("A"), lab.host("B")
    s1, s2 = lab.workdir / "vm1.sock", lab.workdir / "vm2.sock"
    A.start_vnetd(config=f"""
interface add vm1 vhost-user {s1} mac {vm_mac(1)} mtu {MTU}
link add to-b udp {B.underlay_ip}
route add any {vm_mac(1)} interface vm1
route add any {vm_mac(2)} link to-b
""")
    B.start_vnetd(config=f"""
interface add vm2 vhost-user {s2} mac {vm_mac(2)} mtu {MTU}
link add to-a udp {A.underlay_ip}
route add any {vm_mac(2)} interface vm2
route add any {vm_mac(1)} link to-a
""")
    g2 = boot(lab, image, B, s2, 2)
    with g2:
        g2.wait_ready(timeout=120)
        assert g2.wait_exit(timeout=30) == 0, failed(g2, B)
        g1 = boot(lab, image, A, s1, 1, cmd=f"ping -c 3 -W 5 {SUBNET}.2 && iperf3 -c {SUBNET}.2 -t 2 -f m")
        with g1:
            g1.wait_ready(timeout=120)
            assert g1.wait_exit(timeout=90) == 0, failed(g1, A)
            m = re.findall(r"([0-9.]+) Mbits/sec.*receiver", g1.console())
            assert m, failed(g1, A)
            sa, sb = A.stats(), B.stats()
            assert netlab.port_of(sa, "to-b")["tx_bytes"] > 1_000_000
            assert netlab.port_of(sb, "to-a")["rx_bytes"] > 1_000_000
            assert netlab.port_of(sb, "vm2")["nic"]["rx_cut_through"] > 0
            record("vm_to_vm_two_hosts_mbit_tcg", float(m[-1]))


def test_vm_restart_and_vnetd_restart(lab, image, record):
    """The VM powers off and boots again on the same socket; it reboots inside (QEMU resets
    the device on the same connection); then vnetd restarts under the running VM (QEMU
    reconnects): traffic resumes every time."""
    sock = lab.workdir / "vm1.sock"
    A, B, b1 = two_hosts(lab, sock)
    g = boot(lab, image, A, sock, 1)
    with g:
        g.wait_ready(timeout=120)
        assert g.wait_exit(timeout=30) == 0, failed(g, A)
        assert lab.ping(b1, f"{SUBNET}.1", count=2, interval=0.2, wait=3).ok, failed(g, A)
    # QEMU stopped: the device is reset and vnetd waits for the next frontend
    netlab.wait_until(lambda: not vhost_port(A, "vm1")["nic"]["connected"], 10, what="vm1 disconnected")
    g = boot(lab, image, A, sock, 1, reconnect=1, no_reboot=False)
    with g:
        g.wait_ready(timeout=120)
        assert g.wait_exit(timeout=30) == 0, failed(g, A)
        assert lab.ping(b1, f"{SUBNET}.1", count=2, interval=0.2, wait=3).ok, failed(g, A)
        assert vhost_port(A, "vm1")["nic"]["connections"] == 2
        # a reboot inside the VM: QEMU resets the device on the same connection
        mark = len(g.console())
        g.qmp("system_reset")
        g.wait_for("VNET-GUEST-READY", timeout=120, since=mark)
        t0 = time.monotonic()
        lab.wait_ping(b1, f"{SUBNET}.1", timeout=60)
        record("vm_reboot_ping_resumed_s", round(time.monotonic() - t0, 2))
        assert vhost_port(A, "vm1")["nic"]["connections"] == 2, "a reboot is not a new connection"
        A.restart_vnetd()
        t0 = time.monotonic()
        gap = lab.wait_ping(b1, f"{SUBNET}.1", timeout=30)
        record("vnetd_restart_ping_resumed_s", round(time.monotonic() - t0, 2))
        up = iperf_to_vm(b1, f"{SUBNET}.1", seconds=1)
        assert up.bytes > 0
        nic = vhost_port(A, "vm1")["nic"]
        assert nic["connected"] and nic["rx_cut_through"] > 0, nic
        assert "is not a head" not in g.console(), failed(g, A)
        assert g.alive(), failed(g, A)
        del gap


def test_multiqueue_vm(lab, image, record):
    """A VM with two queue pairs: both negotiated, traffic flows (several iperf3 streams)."""
    sock = lab.workdir / "vm1.sock"
    A, B, b1 = two_hosts(lab, sock.with_name("unused.sock"))
    A.ctl("interface", "add", "vmq", "vhost-user", str(sock), "mac", vm_mac(3), "mtu", MTU, "queues", 2)
    A.ctl("route", "add", "any", vm_mac(3), "interface", "vmq")
    B.ctl("route", "add", "any", vm_mac(3), "link", "to-a")
    g = qemu.Guest(image, qemu.VhostUser(str(sock), mac=vm_mac(3), queues=2), ip=f"{SUBNET}.3/24", mtu=MTU,
                   cmd="ethtool -L eth0 combined 2 2>/dev/null; iperf3 -s -D", then="wait", netns=A.name,
                   name=f"{lab.prefix}-vmq", smp=2)
    with g:
        g.wait_ready(timeout=120)
        assert g.wait_exit(timeout=30) == 0, failed(g, A)
        assert lab.ping(b1, f"{SUBNET}.3", count=3, interval=0.2, wait=3).ok, failed(g, A)
        r = b1.exec("iperf3", "-c", f"{SUBNET}.3", "-t", "2", "-P", "4", "-J", check=False, timeout=60)
        up = netlab.parse_iperf(r.stdout)
        assert up.bytes > 0
        nic = vhost_port(A, "vmq")["nic"]
        assert nic["queue_pairs_started"] == 2, nic
        record("multiqueue_iperf3_mbit_tcg", round(up.gbps * 1000, 1))


FRONTEND = os.environ.get("VHOST_FRONTEND", str(netlab.REPO / "target" / "release" / "vhost-frontend"))


def test_hostile_frontend(lab, record):
    """Every misbehaviour of crates/vnet-frontend's hostile mode (descriptors outside guest
    memory, looping chains, absurd lengths, bad ring sizes and addresses, bad memory tables,
    garbage and truncated messages) against a vhost-user interface, while two namespace guests
    on the same vnetd ping each other (a flood ping to the broadcast address also reaches the
    vhost-user interface): the daemon survives, the other interfaces keep forwarding, the
    memory outside the declared regions is never touched, and each misbehaviour is refused
    (connection dropped and device reset, or the chain dropped and counted)."""
    assert os.path.exists(FRONTEND), f"{FRONTEND} missing: cargo build --release"
    A = lab.host("A")
    g1 = lab.guest("g1", ip="192.168.61.1", mac="52:54:00:61:00:01")
    g2 = lab.guest("g2", ip="192.168.61.2", mac="52:54:00:61:00:02")
    sock = lab.workdir / "hostile.sock"
    A.start_vnetd(config=f"""
interface add hv vhost-user {sock} mac 52:54:00:61:00:09
interface add g1 tap mac {g1.mac} netns {g1.name}
interface add g2 tap mac {g2.mac} netns {g2.name}
route add any {g1.mac} interface g1
route add any {g2.mac} interface g2
route add any 52:54:00:61:00:09 interface hv
""")
    g1.configure(A.interface("g1")["ifname"])
    g2.configure(A.interface("g2")["ifname"])
    flood = g1.popen("ping", "-f", "-b", "-W", "1", "192.168.61.255",
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = subprocess.run([FRONTEND, "-s", str(sock), "hostile", "--case", "all"],
                           capture_output=True, text=True, timeout=900)
    finally:
        netlab.stop_pid(flood)
    assert r.stdout.strip(), r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert A.vnetd.alive(), A.vnetd.log_text()[-3000:]
    results = out["results"]
    assert len(results) >= 40, out
    damaged = [x["description"] for x in results if x.get("canary_intact") is False or x.get("guard_intact") is False]
    assert not damaged, f"memory outside the guest's regions was written: {damaged}"
    assert out["failures"] == 0, [x for x in results if x.get("failure") or x.get("failures")][:5]
    ping = lab.ping(g1, g2.ip_addr, count=3, interval=0.2, wait=2)
    assert ping.ok, "the other interfaces stopped forwarding"
    nic = vhost_port(A, "hv")["nic"]
    assert nic["protocol_errors"] > 0 and nic["connections"] >= len(results) // 2, nic
    # after all that, a well-behaved frontend still gets a working device
    p = subprocess.run([FRONTEND, "-s", str(sock), "probe"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    record("hostile_variants", len(results))
    record("hostile_connections", nic["connections"])
    record("hostile_bad_chains", nic["bad_chains"])
    record("hostile_protocol_errors", nic["protocol_errors"])
