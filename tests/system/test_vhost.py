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
import socket
import struct
import subprocess
import threading
import time

import pytest

from vnetlab import netlab
from vnetlab.netlab import delta, new_drops

from guest import qemu

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


def failed(g, host=None, peer=None):
    """What a failure shows: the guest's console, its host's vnetd log and the counters of
    that host's vhost-user ports (rings, kicks, notifications, drops); ``peer`` (guest,
    host): the same for the guest at the other end."""
    s = f"QEMU pid {g.pid}; console:\n{g.console()[-2500:]}"
    if host is not None and host.vnetd is not None:
        s += f"\n--- vnetd log ---\n{host.vnetd.log_text()[-2500:]}"
        try:
            nics = [p for p in host.stats()["ports"] if p.get("nic", {}).get("kind") == "vhost-user"]
            s += f"\n--- vhost-user ports of {host.name} ---\n{json.dumps(nics)[:3000]}"
        except Exception as e:  # a dead or hung vnetd: say so, the failure is what matters
            s += f"\n--- no stats from {host.name}: {e} ---"
    if peer is not None:
        s += f"\n=== the peer guest ===\n{failed(*peer)}"
    return s


def iperf_to_vm(client, ip, seconds=2, reverse=False, extra=()):
    """iperf3 from a namespace to a VM's ``iperf3 -s -D``. The guest's server re-opens its
    listening socket after each test, slowly under TCG: a refused or busy connection, or a
    control connection it reset while still closing the last test, is retried for a few
    seconds."""
    args = ["iperf3", "-c", ip, "-t", seconds, "-J", *extra] + (["-R"] if reverse else [])
    deadline = time.monotonic() + 15
    while True:
        r = client.exec(*args, check=False, timeout=seconds + 40)
        try:
            return netlab.parse_iperf(r.stdout)
        except (ValueError, KeyError, netlab.LabError) as e:
            retry = ("unable to connect", "busy", "unable to receive control message")
            if any(w in str(e) for w in retry) and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            raise AssertionError(f"iperf3 {'-R ' if reverse else ''}failed ({e}): {r.stdout[-1500:]} {r.stderr[-500:]}")


def two_hosts(lab, vm_sock, extra_a="", vm_options="", before_vnetd=None):
    """Host A serves a vhost-user interface ``vm1`` (MAC vm_mac(1); ``vm_options`` appended to
    its line); host B a namespace guest ``b1`` (.20) on a TAP; UDP links both ways.
    ``before_vnetd(A)`` runs before A's vnetd starts (a VM that must listen first)."""
    A, B = lab.host("A"), lab.host("B")
    b1 = lab.guest("b1", ip=f"{SUBNET}.20", mac="52:54:00:60:01:20")
    if before_vnetd is not None:
        before_vnetd(A)
    A.start_vnetd(config=f"""
interface add vm1 vhost-user {vm_sock} mac {vm_mac(1)} mtu {MTU}{vm_options}
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


def vm_to_vm_mbit(lab, image, at1, at2, check):
    """VM 2 (an iperf3 server) served by ``at2`` (host, socket), then VM 1 by ``at1``, which
    pings VM 2 and runs iperf3 to it: VM 1's receiver rate in Mbit/s. ``check()`` runs while
    both VMs still run."""
    (host1, s1), (host2, s2) = at1, at2
    g2 = boot(lab, image, host2, s2, 2)
    with g2:
        g2.wait_ready(timeout=120)
        assert g2.wait_exit(timeout=30) == 0, failed(g2, host2)
        g1 = boot(lab, image, host1, s1, 1, cmd=f"ping -c 3 -W 5 {SUBNET}.2 && iperf3 -c {SUBNET}.2 -t 2 -f m")
        with g1:
            g1.wait_ready(timeout=120)
            assert g1.wait_exit(timeout=90) == 0, failed(g1, host1, (g2, host2))
            m = re.findall(r"([0-9.]+) Mbits/sec.*receiver", g1.console())
            assert m, failed(g1, host1, (g2, host2))
            check()
            return float(m[-1])


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
    def check():
        st = A.stats()
        v1, v2 = netlab.port_of(st, "vm1"), netlab.port_of(st, "vm2")
        assert v1["rx_bytes"] > 1_000_000 and v2["tx_bytes"] > 1_000_000, (v1, v2)
        assert v1["nic"]["bad_chains"] == 0 and v2["nic"]["bad_chains"] == 0
        assert not any(p["kind"] == "link" for p in st["ports"])

    mbit = vm_to_vm_mbit(lab, image, (A, s1), (A, s2), check)
    record("vm_to_vm_same_host_mbit_tcg", round(mbit, 1))


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
    def check():
        sa, sb = A.stats(), B.stats()
        assert netlab.port_of(sa, "to-b")["tx_bytes"] > 1_000_000
        assert netlab.port_of(sb, "to-a")["rx_bytes"] > 1_000_000
        assert netlab.port_of(sb, "vm2")["nic"]["rx_cut_through"] > 0

    record("vm_to_vm_two_hosts_mbit_tcg", vm_to_vm_mbit(lab, image, (A, s1), (B, s2), check))


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


def run_hostile_frontend(lab, net: int, sock_name: str, args, timeout: int):
    """Runs crates/vnet-frontend's hostile mode (``args``) against a vhost-user interface ``hv``
    of host A's vnetd, whose namespace guests g1 and g2 (192.168.NET.1 and .2) share it with a
    flood ping from g1 to their broadcast address (which also reaches ``hv``). Returns host A,
    the two guests, the socket and the frontend's run."""
    assert os.path.exists(FRONTEND), f"{FRONTEND} missing: cargo build --release"
    A = lab.host("A")
    g1 = lab.guest("g1", ip=f"192.168.{net}.1", mac=f"52:54:00:{net}:00:01")
    g2 = lab.guest("g2", ip=f"192.168.{net}.2", mac=f"52:54:00:{net}:00:02")
    sock = lab.workdir / sock_name
    A.start_vnetd(config=f"""
interface add hv vhost-user {sock} mac 52:54:00:{net}:00:09
interface add g1 tap mac {g1.mac} netns {g1.name}
interface add g2 tap mac {g2.mac} netns {g2.name}
route add any {g1.mac} interface g1
route add any {g2.mac} interface g2
route add any 52:54:00:{net}:00:09 interface hv
""")
    g1.configure(A.interface("g1")["ifname"])
    g2.configure(A.interface("g2")["ifname"])
    flood = g1.popen("ping", "-f", "-b", "-W", "1", f"192.168.{net}.255",
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = subprocess.run([FRONTEND, "-s", str(sock), "hostile", *args],
                           capture_output=True, text=True, timeout=timeout)
    finally:
        netlab.stop_pid(flood)
    return A, g1, g2, sock, r


def test_hostile_frontend(lab, record):
    """Every misbehaviour of crates/vnet-frontend's hostile mode (descriptors outside guest
    memory, looping chains, absurd lengths, bad ring sizes and addresses, bad memory tables,
    garbage and truncated messages) against a vhost-user interface, while two namespace guests
    on the same vnetd ping each other (a flood ping to the broadcast address also reaches the
    vhost-user interface): the daemon survives, the other interfaces keep forwarding, the
    memory outside the declared regions is never touched, and each misbehaviour is refused
    (connection dropped and device reset, or the chain dropped and counted)."""
    A, g1, g2, sock, r = run_hostile_frontend(lab, 61, "hostile.sock", ["--case", "all"], timeout=900)
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


# --- cut-through receive: nothing for another guest reaches this guest's memory (issue #17) ---

MARKER = b"XFOREIGN-FRAME-X"  # carried only by frames that are not for the vhost-user guest
ISO_VM, ISO_PEER, ISO_OTHER = "52:54:00:62:00:01", "52:54:00:62:00:0b", "52:54:00:62:00:0c"


def own_frame(seq: int, n: int) -> bytes:
    """A frame for the vhost-user guest as `vhost-frontend isolation` checks it."""
    body = struct.pack("!I", seq) + bytes((seq * 7 + i) % 251 for i in range(n))
    return netlab.ether(ISO_VM, ISO_PEER, 0x88B5, body)


def foreign_frame(dst: str, seq: int, n: int) -> bytes:
    body = struct.pack("!I", seq) + (MARKER * (n // len(MARKER) + 1))[:n]
    return netlab.ether(dst, ISO_PEER, 0x88B5, body)


SO_RCVBUFFORCE = 33  # <asm-generic/socket.h>; Python's socket module does not name it


class Collector:
    """Collects the inner frames of VXLAN datagrams arriving at a socket, on a thread."""

    def __init__(self, sock):
        self.sock, self.frames, self.stop = sock, [], threading.Event()
        self.sock.settimeout(0.2)
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while not self.stop.is_set():
            try:
                d = self.sock.recv(65536)
            except socket.timeout:
                continue
            self.frames.append((struct.unpack("!I", d[4:8])[0] >> 8, d[8:]))

    def close(self):
        self.stop.set()
        self.t.join()
        self.sock.close()


def isolation_bed(lab):
    """Host A serves vhost-user ``vm`` (VNI 1, alone in it, so its UDP links' datagrams take the
    cut-through receive) and a TAP guest ``t2`` in VNI 2; links to B in VNIs 1 and 2 and to C in
    VNI 1, where the MAC ISO_OTHER lives. B and C are bare namespaces: a socket on B's VXLAN port
    plays B's daemon (so what A's connected socket receives is exactly what the test sends) and
    one on C's receives what A forwards there."""
    A, B, C = lab.host("A"), lab.host("B"), lab.host("C")
    t2 = lab.guest("t2", ip="192.168.62.2", mac="52:54:00:62:00:02")
    sock = lab.workdir / "iso.sock"
    A.start_vnetd(config=f"""
interface add vm vhost-user {sock} mac {ISO_VM}
interface add t2 tap mac {t2.mac} netns {t2.name} vni 2
link add to-b udp {B.underlay_ip}
link add to-b2 udp {B.underlay_ip} vni 2
link add to-c udp {C.underlay_ip}
route add any {ISO_VM} interface vm
route add any {ISO_OTHER} link to-c
route add any {t2.mac} interface t2
""")
    t2.configure(A.interface("t2")["ifname"])
    tx = B.socket()
    tx.bind((B.underlay_ip, netlab.VXLAN_PORT))
    rx = C.socket()
    # The tests require every frame at C, and the collector thread shares the GIL with the
    # sender: room for the whole run, not the default ~100 datagrams.
    rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
    rx.bind((C.underlay_ip, netlab.VXLAN_PORT))
    return A, sock, t2, tx, Collector(rx)


def start_isolation_frontend(A, sock, scribble: bool):
    args = [FRONTEND, "-s", str(sock), "isolation", "--marker", MARKER.decode(), "--idle", "2", "--duration", "60"]
    fe = subprocess.Popen(args + (["--scribble"] if scribble else []), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    netlab.wait_until(lambda: vhost_port(A, "vm")["nic"]["queue_pairs_started"] == 1, 10, what="frontend up")
    time.sleep(0.5)  # receive buffers posted, cut-through sockets open
    return fe


def finish_frontend(fe) -> dict:
    out, err = fe.communicate(timeout=90)
    assert fe.returncode == 0 and out.strip(), err[-2000:]
    return json.loads(out)


def isolation_run(lab, scribble: bool, rounds: int, kinds):
    """The isolation bed with its frontend (``scribble``: rewriting its receive buffers) while
    ``send_interleaved`` sends ``rounds`` of ``kinds``: the stats before and after, what was
    sent, the frontend's report, and the collector (closed) of what reached the other host."""
    assert os.path.exists(FRONTEND), f"{FRONTEND} missing: cargo build --release"
    A, sock, t2, tx, coll = isolation_bed(lab)
    try:
        fe = start_isolation_frontend(A, sock, scribble=scribble)
        s0 = A.stats()
        sent = send_interleaved(A, tx, rounds, kinds)
        rep = finish_frontend(fe)
        time.sleep(0.3)
    finally:
        coll.close()
        tx.close()
    return s0, A.stats(), sent, rep, coll


def send_interleaved(A, tx, rounds: int, kinds) -> dict:
    """Sends ``rounds`` bursts from B to A, each one frame of every kind in ``kinds`` (own,
    other_vni, other_guest) in turn: foreign frames long, own frames short, so a foreign frame's
    bytes would outlast a later own frame in the same buffer. Returns what was sent, by kind."""
    dst = (A.underlay_ip, netlab.VXLAN_PORT)
    sent = {k: [] for k in kinds}
    seq = 0
    for r in range(rounds):
        for k in kinds:
            seq += 1
            if k == "own":
                f, vni = own_frame(seq, 40 + seq % 200), 1
            elif k == "other_vni":
                f, vni = foreign_frame("52:54:00:62:00:02", seq, 900 + seq % 400), 2
            else:
                f, vni = foreign_frame(ISO_OTHER, seq, 900 + seq % 400), 1
            tx.sendto(netlab.vxlan(vni, f), dst)
            sent[k].append(f)
        if r % 8 == 7:
            time.sleep(0.002)
    # The last datagrams foreign: what is left in posted buffers is theirs, if anything.
    for _ in range(4):
        seq += 1
        f = foreign_frame(ISO_OTHER, seq, 1400)
        tx.sendto(netlab.vxlan(1, f), dst)
        sent.setdefault("other_guest", []).append(f)
    return sent


def test_cut_through_receive_writes_only_this_guests_frames(lab, record):
    """A peer sends on the cut-through path frames of another VNI and frames for another
    guest's MAC, interleaved with frames for the vhost-user guest: no run of the foreign frames'
    marker ever appears in the guest's receive buffers (every buffer scanned as the backend
    returns it, every few milliseconds, and at the end), its own frames arrive whole, and the
    foreign ones still go where they belong (the VNI 2 guest, the other host)."""
    s0, s1, sent, rep, coll = isolation_run(lab, False, 400, ("own", "other_vni", "other_guest"))
    nic0, nic1 = netlab.port_of(s0, "vm")["nic"], netlab.port_of(s1, "vm")["nic"]
    record("isolation_frontend", rep)
    assert rep["marker_hits"] == 0, f"foreign frames' bytes reached the guest's memory: {rep['marker_where']}"
    assert rep["own_ok"] == len(sent["own"]) and rep["own_bad"] == 0, rep
    assert rep["scans"] > 10, rep
    # They came the cut-through way, and the others went on from there.
    assert nic1["rx_cut_through"] - nic0["rx_cut_through"] >= len(sent["own"]) // 2, (nic0, nic1)
    assert nic1["rx_direct_fallback"] - nic0["rx_direct_fallback"] >= len(sent["other_guest"]) // 2
    got = {f for vni, f in coll.frames if vni == 1}
    assert got == set(sent["other_guest"]), f"{len(got)} of {len(sent['other_guest'])} frames for the other host arrived intact"
    assert delta(s0, s1, "t2", "tx_frames") == len(sent["other_vni"]), "VNI 2 frames from the same peer lost"


def test_a_guest_rewriting_its_receive_buffers_cannot_change_another_guests_frames(lab, record):
    """The vhost-user guest keeps rewriting the start of its posted receive buffers while the
    peer sends frames for another host through it (interleaved with its own): the other host
    receives every one of those frames exactly as sent."""
    s0, s1, sent, rep, coll = isolation_run(lab, True, 1500, ("own", "other_guest"))
    record("scribble_frontend", rep)
    want = sent["other_guest"]
    got = [f for vni, f in coll.frames if vni == 1]
    altered = [f for f in got if f not in set(want)]
    assert not altered, f"{len(altered)} frames reached the other host altered, e.g. {altered[0][:40]!r}"
    assert sorted(got) == sorted(want), f"{len(got)} of {len(want)} frames for the other host arrived"
    assert rep["scribbles"] > 100 and rep["frames"] == len(sent["own"]), rep
    nic0, nic1 = netlab.port_of(s0, "vm")["nic"], netlab.port_of(s1, "vm")["nic"]
    assert nic1["rx_cut_through"] - nic0["rx_cut_through"] == len(sent["own"]), (nic0, nic1)
    assert rep["marker_hits"] == 0, rep["marker_where"]


def test_hostile_frontend_cuts_guest_memory_short(lab, record):
    """The frontend cuts its guest memory (a memfd made without sealing) to nothing under vnetd,
    once on running rings with a transmit kick and once while traffic flows to the interface:
    touching it is SIGBUS, which vnetd survives. It drops that frontend and counts it
    (`memory_faults`), the other interfaces keep forwarding, and a new frontend connects and
    moves frames. A memfd that can be sealed is sealed by vnetd, so cutting it is refused."""
    A, g1, g2, sock, r = run_hostile_frontend(lab, 63, "cut.sock",
                                              ["--case", "mem_truncate", "--rx-wait", "1"], timeout=120)
    assert A.vnetd.alive(), f"vnetd died: {A.vnetd.log_text()[-3000:]}\n{r.stderr[-1000:]}"
    out = json.loads(r.stdout)
    res = {x["variant"]: x for x in out["results"]}
    assert set(res) == {"tx_kick", "rx_traffic", "sealed_memfd"}, res.keys()
    for v in ("tx_kick", "rx_traffic"):
        assert res[v]["mem_cut"] is True and res[v]["connection_closed"], res[v]
    assert res["sealed_memfd"]["mem_cut"] is False, "a sealable memfd was not sealed against shrinking"
    assert res["sealed_memfd"]["works_after_reinit"] is True, res["sealed_memfd"]
    assert out["failures"] == 0, out
    nic = vhost_port(A, "hv")["nic"]
    assert nic["memory_faults"] >= 2, nic
    assert "SIGBUS" in A.vnetd.log_text()
    assert lab.ping(g1, g2.ip_addr, count=3, interval=0.2, wait=2).ok, "the other interfaces stopped forwarding"
    # A well-behaved frontend gets a working device again: its frames are taken and forwarded.
    s0 = A.stats()
    b = subprocess.run([FRONTEND, "-s", str(sock), "bench", "--role", "tx", "--count", "200", "--size", "200",
                        "--src-mac", "52:54:00:63:00:09", "--dst-mac", g2.mac, "--json"],
                       capture_output=True, text=True, timeout=60)
    assert b.returncode == 0, b.stderr[-1000:]
    assert json.loads(b.stdout)["frames"] == 200
    assert delta(s0, A.stats(), "g2", "tx_frames") >= 200
    record("memory_faults", nic["memory_faults"])
    record("mem_truncate", {k: v["verdict"] for k, v in res.items()})



def refill_frontend(A, sock, send) -> dict:
    """Runs `vhost-frontend refill` on ``sock`` of host A's vnetd (one 256-byte receive buffer
    first, 15 more after 4 s), calls ``send()`` (a burst of three 1,042-byte frames for it)
    once the device is up, sees the three wait in vnetd (`rx_backlog`), and returns the
    frontend's report."""
    fe = subprocess.Popen([FRONTEND, "-s", str(sock), "refill", "--first", "1", "--then", "15",
                           "--buffer-len", "256", "--wait", "4", "--timeout", "3"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        netlab.wait_until(lambda: vhost_port(A, "hv")["nic"]["queue_pairs_started"] == 1, 10,
                          what="frontend up")
        send()
        # vnetd shows them waiting for buffers while the guest has too few.
        netlab.wait_until(lambda: vhost_port(A, "hv")["nic"]["rx_backlog"] == 3, 3,
                          what="three frames waiting for receive buffers (rx_backlog)")
        return finish_frontend(fe)
    finally:
        netlab.stop_pid(fe)


def check_refill(A, rep):
    """The burst waited for buffers and came whole after the refill, which vnetd asked to hear
    of (its `avail_event` at the index the guest had reached)."""
    assert rep["used_before_refill"] == 0, f"a frame fit the first buffer: the case was not set up {rep}"
    assert rep["frames"] == 3 and rep["bytes"] == 3 * 1042, f"{rep}\n{vhost_port(A, 'hv')['nic']}"
    assert rep["kicked_on_refill"], f"vnetd did not ask to hear of new buffers: {rep}"
    assert rep["avail_event_at_refill"] == rep["avail_before_refill"], rep


@pytest.mark.parametrize("cut_through", ["on", "off"])
def test_a_guest_that_refills_its_receive_ring_late_gets_the_frames_that_waited(lab, record, cut_through):
    """A guest offers one 256-byte receive buffer; a burst of three 1,042-byte frames comes from
    a TAP guest (each needs five merged buffers, so they wait in vnetd); after the burst the
    guest adds 15 buffers and, as a Linux guest with EVENT_IDX does, kicks only if vnetd's
    `avail_event` asks for it. vnetd must have asked (the index the guest had reached, not the
    first buffer it had not used), and the three frames must arrive with no more traffic to
    wake it. With cut-through off the frames wait in the device thread's backlog; on, the
    dispatcher finds too few buffers itself."""
    A = lab.host("A")
    g1 = lab.guest("g1", ip="192.168.64.1", mac="52:54:00:64:00:01")
    sock = lab.workdir / "refill.sock"
    A.start_vnetd(config=f"""
set cut-through {cut_through}
interface add hv vhost-user {sock} mac 52:54:00:64:00:09
interface add g1 tap mac {g1.mac} netns {g1.name}
route add any {g1.mac} interface g1
route add any 52:54:00:64:00:09 interface hv
""")
    g1.configure(A.interface("g1")["ifname"])
    s0 = A.stats()
    # Broadcast: vnetd floods it to hv; no ARP, and the guests have no IPv6 chatter.
    rep = refill_frontend(A, sock, lambda: g1.exec("ping", "-b", "-c", "3", "-i", "0.2", "-s", "1000",
                                                   "-W", "1", "192.168.64.255", check=False))
    assert delta(s0, A.stats(), "g1", "rx_frames") >= 3, "the burst did not reach vnetd"
    check_refill(A, rep)
    record(f"refill_first_frame_ms_cut_through_{cut_through}", rep["first_frame_ms"])


def test_a_guest_whose_receive_buffers_cut_through_cannot_fill_gets_a_links_frames(lab, record):
    """The same guest behind a UDP link: the only interface of its VNI, so the peer's datagrams
    come to its cut-through receive, whose next buffer (256 bytes) is too small to hold a frame
    whole. The datagrams must go the ordinary way (merged over buffers) and arrive after the
    refill; a cut-through receive that waited for a kick instead stalled for good."""
    A, B = lab.host("A"), lab.host("B")
    sock = lab.workdir / "refill-link.sock"
    hv = "52:54:00:64:00:09"
    A.start_vnetd(config=f"""
set cut-through on
interface add hv vhost-user {sock} mac {hv}
link add to-b udp {B.underlay_ip}
route add any {hv} interface hv
""")
    tx = B.socket()
    tx.bind((B.underlay_ip, netlab.VXLAN_PORT))
    frames = [netlab.ether(hv, "52:54:00:64:00:0b", 0x88B5, bytes(1028)) for _ in range(3)]

    def send():
        time.sleep(0.5)  # the cut-through socket is opened with the device
        for f in frames:
            tx.sendto(netlab.vxlan(1, f), (A.underlay_ip, netlab.VXLAN_PORT))

    try:
        s0 = A.stats()
        rep = refill_frontend(A, sock, send)
    finally:
        tx.close()
    check_refill(A, rep)
    assert delta(s0, A.stats(), "to-b", "rx_frames") >= 3, "the link did not count the datagrams"
    record("refill_first_frame_ms_link", rep["first_frame_ms"])
