"""VMs the way libvirt starts them (issue #33): Debian's libvirt (libvirtd 9.0 + virtlogd,
started by the test, stopped by PID; ``vnetlab/virtlab.py``) boots the project's guest image in
two ``<domain type='qemu'>`` on host A of a two-host overlay (udp links, static routes), each
pinging a namespace guest on host B (a veth on B's kernel fast path) across the overlay:

- ``vm1`` on a vhost-user interface of vnetd (``<interface type='vhostuser'>``, QEMU the
  client, ``reconnect`` every second; the guest's memory a shared memfd);
- ``vm2`` on a TAP the test made (``<interface type='ethernet'>``, ``managed='no'``, vhost
  off: this kernel has no vhost-net) that vnetd serves with the ``netdev`` kind, forwarded by
  the kernel fast path.

A's vnetd runs as the packaged unit would with the README's change for libvirt (``Group=
libvirt-qemu``, ``UMask=0007``, its socket directory root:libvirt-qemu 0750 as systemd makes
/run/vnet then): libvirt runs QEMU as libvirt-qemu, which must be able to connect to the
socket vnetd makes, also after vnetd restarts. Checked: both domains boot and ping B's guest
both ways (the guest pings at boot; B's guest pings the VMs), on the paths they should take
(vm1's vhost-user device connected, vm2's frames in the kernel's share); ``virsh destroy`` and
``virsh start`` (vnetd sees the vhost-user device go and come back, the unmanaged TAP stays);
vnetd SIGTERMed, SIGKILLed and SIGTERMed again under a ping every 10 ms to each VM: vm1 back
within 2 s of the new vnetd (median; QEMU reconnects), vm2 loses nothing (the pinned kernel
fast path forwards while no vnetd runs); and a vnetd started without the group: QEMU is
refused the new socket ("Permission denied") and vm1 stays cut off until vnetd runs with it
again."""

import grp
import json
import os
import pwd
import signal
import statistics
import stat
import time

import pytest

from vnetlab import netlab, virtlab
from guest import qemu
from test_restart import Pinger

MTU = 1450
SUBNET = "192.168.62"
B1 = f"{SUBNET}.20"
VMS = {"vm1": ("52:54:00:62:00:01", f"{SUBNET}.1"), "vm2": ("52:54:00:62:00:02", f"{SUBNET}.2")}
TAP = "vm2tap"
# vnetd as the packaged unit runs it for libvirt (README): Group=libvirt-qemu, UMask=0007.
PACKAGED_FOR_LIBVIRT = {"group": virtlab.QEMU_USER, "umask": 0o007}
# ... and as it runs without that change (the unit's UMask=0077, root's group).
PACKAGED = {"umask": 0o077}


class Bed:
    def __init__(self, lab, A, B, b1, libvirt, socket, vmdir):
        self.lab, self.A, self.B, self.b1, self.libvirt = lab, A, B, b1, libvirt
        self.socket, self.vmdir = socket, vmdir
        self.names = {vm: f"{lab.prefix}-{vm}" for vm in VMS}
        self.consoles = {vm: vmdir / f"{vm}.console" for vm in VMS}

    def failed(self, vm: str) -> str:
        """What a failure shows: the console's tail, QEMU's log, vnetd's vhost-user port."""
        name = self.names[vm]
        try:
            console = self.consoles[vm].read_text(errors="replace")[-1500:]
        except OSError:
            console = ""
        try:
            port = json.dumps(self.A.port(vm))[:1500]
        except Exception as e:
            port = str(e)
        return (f"\n--- {vm} console ---\n{console}\n--- QEMU's log ---\n{self.libvirt.qemu_log(name)[-1500:]}"
                f"\n--- vnetd's {vm} ---\n{port}")

    def start(self, vm: str) -> int:
        """``virsh start``; returns the console's offset to wait from."""
        try:
            since = len(self.consoles[vm].read_text(errors="replace"))
        except OSError:
            since = 0
        self.libvirt.virsh("start", self.names[vm])
        return since

    def booted(self, vm: str, since: int, timeout: float = 150) -> None:
        """Ready, and its boot command (pinging B's guest) exited 0."""
        end = virtlab.wait_console(self.consoles[vm], r"^VNET-GUEST-READY", timeout, since, lambda: self.failed(vm))
        virtlab.wait_console(self.consoles[vm], r"^VNET-GUEST-EXIT 0", 60, end, lambda: self.failed(vm))

    def restart_vnetd(self, sig, identity=PACKAGED_FOR_LIBVIRT) -> float:
        """Stops A's vnetd with ``sig`` and starts it again at once; returns when the new one
        answered, as ``time.time()`` (ping -D's clock)."""
        self.A.stop_vnetd(sig=sig)
        self.A.start_vnetd(args=netlab.own_args(self.A.vnetd), popen_kw=identity)
        return time.time()


@pytest.fixture(scope="module")
def bed():
    missing = virtlab.missing_tools()
    if missing:
        pytest.fail("; ".join(missing))
    try:
        image = qemu.build()
    except qemu.BuildError as e:
        pytest.fail(str(e))
    lab = netlab.Lab(tag="libvirt")
    cgroups = virtlab.machine_cgroups()
    lv = None
    try:
        # The QEMU user reaches the VMs' files and (through its group) vnetd's socket
        # directory; nothing else of the work directory.
        lab.workdir.chmod(0o711)
        vmdir = lab.workdir / "vms"
        vmdir.mkdir()
        vmdir.chmod(0o755)
        run = lab.workdir / "run-vnet"  # as systemd makes /run/vnet with Group=libvirt-qemu
        run.mkdir()
        virtlab.share_with_qemu(run, 0o750)
        sock = run / "vm1.sock"
        A, B = lab.host("A"), lab.host("B")
        b1 = lab.guest("b1", ip=B1, mac="52:54:00:62:01:20")
        A.ip("tuntap", "add", "dev", TAP, "mode", "tap", "vnet_hdr")
        A.ip_link("set", TAP, "mtu", MTU)
        A.ip_link("set", TAP, "up")
        (m1, _), (m2, _) = VMS["vm1"], VMS["vm2"]
        A.start_vnetd(config=f"""
interface add vm1 vhost-user {sock} mac {m1} mtu {MTU}
interface add vm2 netdev {TAP} mac {m2}
link add to-b udp {B.underlay_ip}
route add any {m1} interface vm1
route add any {m2} interface vm2
route add any {b1.mac} link to-b
""", popen_kw=PACKAGED_FOR_LIBVIRT)
        B.start_vnetd(config=f"""
interface add b1 veth mac {b1.mac} netns {b1.name} mtu {MTU}
link add to-a udp {A.underlay_ip}
route add any {b1.mac} interface b1
route add any {m1} link to-a
route add any {m2} link to-a
""")
        b1.configure(B.interface("b1")["ifname"], MTU)
        kernel, initrd = virtlab.guest_files(image.kernel.parent, vmdir)
        lv = virtlab.Libvirt(lab, A, lab.workdir / "libvirt")
        lv.start()
        b = Bed(lab, A, B, b1, lv, sock, vmdir)
        boot_cmd = f"ping -c 3 -W 5 {B1}"
        lv.define(b.names["vm1"], virtlab.domain_xml(
            b.names["vm1"], kernel, initrd, virtlab.kernel_cmdline(f"{VMS['vm1'][1]}/24", m1, MTU, boot_cmd),
            virtlab.vhost_user_interface(m1, sock), b.consoles["vm1"], shared_memory=True,
            override=virtlab.TCG_VHOST_USER_OVERRIDE))
        lv.define(b.names["vm2"], virtlab.domain_xml(
            b.names["vm2"], kernel, initrd, virtlab.kernel_cmdline(f"{VMS['vm2'][1]}/24", m2, MTU, boot_cmd),
            virtlab.tap_interface(m2, TAP), b.consoles["vm2"]))
        yield b
    finally:
        if lv is not None:
            lv.cleanup()
        lab.close()
        for d in virtlab.machine_cgroups() - cgroups:
            try:
                d.rmdir()
            except OSError:
                pass


@pytest.fixture
def virt(bed, request):
    request.node._lab = bed.lab
    yield bed
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        bed.lab.failed = True


def owner(path) -> str:
    st = os.stat(path)
    return f"{pwd.getpwuid(st.st_uid).pw_name}:{grp.getgrgid(st.st_gid).gr_name} {stat.filemode(st.st_mode)}"


def lost_before_the_end(loss: dict, interval: float = 0.01, tail_s: float = 0.5) -> list:
    """The pings of a ``Pinger.stop()`` never answered, but for those sent in its last
    ``tail_s``: a TCG guest on a loaded machine answers up to ~0.15 s late, and ping stopped by
    SIGINT counts the requests still on their way as lost (more than the one ``Pinger``
    allows for). With more than the 20 it lists, all count."""
    if loss["lost"] > len(loss["unanswered"]):
        return loss["unanswered"]
    return [s for s in loss["unanswered"] if s < loss["sent"] - tail_s / interval]


def test_domains_boot_and_ping_across_the_overlay(virt, record):
    t0 = time.monotonic()
    since = {vm: virt.start(vm) for vm in VMS}
    for vm in VMS:
        virt.booted(vm, since[vm])
    record("both_domains_start_to_guest_ping_s", round(time.monotonic() - t0, 1))
    # QEMU runs as libvirt's user, connected to the socket vnetd made root:libvirt-qemu 0770.
    pid = virt.libvirt.qemu_pid(virt.names["vm1"])
    uid = [l.split()[1] for l in open(f"/proc/{pid}/status") if l.startswith("Uid:")][0]
    assert pwd.getpwuid(int(uid)).pw_name == virtlab.QEMU_USER, uid
    assert owner(virt.socket) == "root:libvirt-qemu srwxrwx---", owner(virt.socket)
    record("vhost_user_socket", owner(virt.socket))
    s0 = virt.A.stats()
    for vm, (mac, ip) in VMS.items():
        r = virt.lab.ping(virt.b1, ip, count=5, interval=0.2, wait=3)
        assert r.received == 5, f"{r.output}{virt.failed(vm)}"
        record(f"{vm}_ping_avg_ms", r.avg_ms)
    s1 = virt.A.stats()
    nic = virt.A.port("vm1")["nic"]
    assert nic["connected"] and nic["kind"] == "vhost-user", nic
    assert netlab.delta(s0, s1, "vm1", "tx_frames") >= 5 and netlab.delta(s0, s1, "vm1", "rx_frames") >= 5
    assert virt.A.interface("vm2")["path"] == "kernel"

    def kernel(st, key):
        return netlab.port_of(st, "vm2").get("kernel", {}).get(key, 0)
    assert kernel(s1, "rx_frames") - kernel(s0, "rx_frames") >= 5, "vm2's frames were not in the kernel's share"


def test_virsh_destroy_and_start(virt, record):
    for vm in VMS:
        if virt.libvirt.state(virt.names[vm]) != "running":
            virt.booted(vm, virt.start(vm))
    for vm in VMS:
        virt.libvirt.virsh("destroy", virt.names[vm])
    # vnetd: the vhost-user device waits for its next frontend; the unmanaged TAP stays.
    netlab.wait_until(lambda: not virt.A.port("vm1")["nic"]["connected"], 10, what="vm1's device to go")
    assert TAP in virt.A.links(), "libvirt deleted a TAP it did not make"
    assert virt.A.interface("vm2")["path"] == "kernel"
    times = {}
    t0 = time.monotonic()
    since = {vm: virt.start(vm) for vm in VMS}
    for vm, (mac, ip) in VMS.items():
        virt.booted(vm, since[vm])
        virt.lab.wait_ping(virt.b1, ip, timeout=30)
        times[vm] = round(time.monotonic() - t0, 1)
    record("virsh_start_to_ping_s", times)
    assert virt.A.port("vm1")["nic"]["connections"] >= 2


def test_vnetd_restarts_under_running_domains(virt, record):
    for vm in VMS:
        if virt.libvirt.state(virt.names[vm]) != "running":
            virt.booted(vm, virt.start(vm))
    for vm, (mac, ip) in VMS.items():
        virt.lab.wait_ping(virt.b1, ip, timeout=30)
    back, losses = {}, {}
    for n, sig in enumerate((signal.SIGTERM, signal.SIGKILL, signal.SIGTERM)):
        p1, p2 = Pinger(virt.b1, VMS["vm1"][1]), Pinger(virt.b1, VMS["vm2"][1])
        time.sleep(1.0)
        ready = virt.restart_vnetd(sig)
        key = f"{n + 1}_{sig.name}"
        back[key] = round(p1.back_after(ready, 5, lambda: virt.failed("vm1")), 3)
        loss = p2.stop()
        losses[key] = {k: v for k, v in loss.items() if k != "tail"}
        assert owner(virt.socket) == "root:libvirt-qemu srwxrwx---", owner(virt.socket)
        assert not lost_before_the_end(loss), f"vm2 lost pings across vnetd's {sig.name}: {loss}"
        assert virt.A.port("vm1")["nic"]["connected"], virt.failed("vm1")
    record("vhost_user_back_after_vnetd_ready_s", back)
    record("netdev_ping_10ms_across_restarts", losses)
    assert statistics.median(back.values()) <= 2.0, f"vm1 back after {back} s (goal: 2 s)"
    assert max(back.values()) <= 4.0, f"vm1 back after {back} s"


def test_a_vnetd_without_the_qemu_group_locks_the_vm_out(virt, record):
    """The packaged unit as it is (UMask=0077, root's group): the socket of the new vnetd is
    root's alone, QEMU (libvirt-qemu) cannot reconnect, vm1 stays cut off; with the README's
    Group= and UMask= again, it is back."""
    if virt.libvirt.state(virt.names["vm1"]) != "running":
        virt.booted("vm1", virt.start("vm1"))
    virt.lab.wait_ping(virt.b1, VMS["vm1"][1], timeout=30)
    log_before = len(virt.libvirt.qemu_log(virt.names["vm1"]))
    p1 = Pinger(virt.b1, VMS["vm1"][1])
    ready = virt.restart_vnetd(signal.SIGTERM, identity=PACKAGED)
    record("socket_without_the_group", owner(virt.socket))
    with pytest.raises(AssertionError, match="no reply after the restart"):
        p1.back_after(ready, 5)
    assert not virt.A.port("vm1")["nic"]["connected"]
    refused = virt.libvirt.qemu_log(virt.names["vm1"])[log_before:]
    assert "Permission denied" in refused, refused[-1000:]
    record("qemu_without_the_group", [l for l in refused.splitlines() if "Permission denied" in l][:1])
    p1 = Pinger(virt.b1, VMS["vm1"][1])
    ready = virt.restart_vnetd(signal.SIGTERM)
    record("back_with_the_group_s", round(p1.back_after(ready, 5, lambda: virt.failed("vm1")), 3))
