"""virtlab: VMs the way libvirt starts them, for the lab. Debian's libvirt (libvirtd 9.0 with
its QEMU driver, and virtlogd, which that driver sends QEMU's output to) started by hand and
stopped by PID, in a host namespace of the lab (the QEMU processes it starts inherit it: a
TAP of ``<interface type='ethernet'>`` must be in that namespace, where vnetd attaches to it),
with the project's guest image (guest/build.sh) booted by direct kernel boot in ``<domain
type='qemu'>`` (software emulation: KVM does not run a guest here). Used by
tests/system/test_libvirt.py.

What is the machine's and what is the lab's: libvirtd's sockets, its log and PID file are in
the lab's directory (``unix_sock_dir``, ``--pid-file``); a privileged libvirtd keeps its QEMU
driver's state in the system's places (/run/libvirt, /var/lib/libvirt, the persistent
definitions in /etc/libvirt/qemu, QEMU's log in /var/log/libvirt/qemu), so the domains are
named by the lab's prefix and destroyed, undefined and their logs removed at the end. The
VMs' files (a copy of the kernel and initrd, which libvirt's DAC driver chowns to the QEMU
user while the VM runs, and the serial console's log) are in a directory of the lab's that
the QEMU user (``libvirt-qemu``) can reach."""

from __future__ import annotations

import base64
import grp
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional
from xml.sax.saxutils import escape

from . import netlab

LIBVIRTD = Path("/usr/sbin/libvirtd")
VIRTLOGD = Path("/usr/sbin/virtlogd")
VIRSH = Path(shutil.which("virsh") or "/usr/bin/virsh")
QEMU = Path(shutil.which("qemu-system-x86_64") or "/usr/bin/qemu-system-x86_64")
QEMU_USER = "libvirt-qemu"  # Debian's libvirt runs QEMU as libvirt-qemu:libvirt-qemu
QEMU_LOGS = Path("/var/log/libvirt/qemu")
VIRTLOGD_SOCK = Path("/run/libvirt/virtlogd-sock")
READY = "VNET-GUEST-READY"


def missing_tools() -> list:
    need = ((LIBVIRTD, "libvirtd (libvirt-daemon-system; scripts/setup.sh installs it)"),
            (VIRTLOGD, "virtlogd (libvirt-daemon-system)"),
            (VIRSH, "virsh (libvirt-clients)"),
            (QEMU, "qemu-system-x86_64 (qemu-system-x86; guest/build.sh installs it)"))
    out = [f"{p} is missing: {what}" for p, what in need if not p.exists()]
    try:
        grp.getgrnam(QEMU_USER)
    except KeyError:
        out.append(f"no group {QEMU_USER} (Debian's libvirt-daemon-system makes it)")
    return out


def qemu_gid() -> int:
    return grp.getgrnam(QEMU_USER).gr_gid


def machine_cgroups() -> set:
    """The cgroup directories libvirt makes for its VMs without systemd (``machine``)."""
    return set(Path("/sys/fs/cgroup").glob("*/machine"))


class Libvirt:
    """libvirtd and virtlogd in ``host``'s network namespace (the machine's mounts), its
    sockets and log in ``dir``."""

    def __init__(self, lab: netlab.Lab, host: netlab.Host, dir: Path):
        self.lab, self.host, self.dir = lab, host, dir
        dir.mkdir(parents=True, exist_ok=True)
        (dir / "sock").mkdir()
        self.uri = f"qemu:///system?socket={dir / 'sock' / 'libvirt-sock'}"
        self.conf = dir / "libvirtd.conf"
        self.conf.write_text(f"""unix_sock_dir = "{dir / 'sock'}"
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:file:{dir / 'libvirtd.log'}"
""")
        self.libvirtd: Optional[subprocess.Popen] = None
        self.virtlogd: Optional[subprocess.Popen] = None
        self.domains: list[str] = []
        self.starts = 0

    def start(self, timeout: float = 120) -> float:
        """virtlogd (unless it runs), then libvirtd; returns the seconds until virsh answers
        (the first start on a machine probes QEMU's capabilities, which libvirt caches in
        /var/cache/libvirt/qemu: seconds under software emulation)."""
        t0 = time.monotonic()
        if self.virtlogd is None or self.virtlogd.poll() is not None:
            if VIRTLOGD_SOCK.exists() and _answers(VIRTLOGD_SOCK):
                raise netlab.LabError(f"another virtlogd answers on {VIRTLOGD_SOCK}: stop it first")
            VIRTLOGD_SOCK.unlink(missing_ok=True)  # left by a virtlogd that was killed
            with open(self.dir / "virtlogd.out", "ab") as out:
                self.virtlogd = self.host.popen(VIRTLOGD, "--pid-file", self.dir / "virtlogd.pid",
                                                host_mounts=True, stdin=subprocess.DEVNULL, stdout=out,
                                                stderr=subprocess.STDOUT)
            netlab.wait_until(VIRTLOGD_SOCK.exists, 10, what="virtlogd's socket")
        self.starts += 1
        with open(self.dir / "libvirtd.out", "ab") as out:
            self.libvirtd = self.host.popen(LIBVIRTD, "--config", self.conf, "--pid-file", self.dir / "libvirtd.pid",
                                            host_mounts=True, stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=subprocess.STDOUT)

        def ready():
            if self.libvirtd.poll() is not None:
                raise netlab.LabError(f"libvirtd exited (rc={self.libvirtd.returncode}):\n{self.log()[-3000:]}")
            return self.virsh("version", check=False, timeout=60).returncode == 0
        netlab.wait_until(ready, timeout, 0.1, what="libvirtd to answer")
        return time.monotonic() - t0

    def stop(self) -> None:
        if self.libvirtd is not None:
            netlab.stop_pid(self.libvirtd, timeout=15)
            self.libvirtd = None
        if self.virtlogd is not None:
            netlab.stop_pid(self.virtlogd, timeout=10)
            self.virtlogd = None

    def log(self) -> str:
        parts = []
        for f in ("libvirtd.out", "libvirtd.log"):
            p = self.dir / f
            if p.exists():
                parts.append(p.read_text(errors="replace")[-6000:])
        return "\n".join(parts)

    def virsh(self, *args, check=True, timeout=60) -> subprocess.CompletedProcess:
        r = netlab.sh(VIRSH, "-c", self.uri, *args, check=False, timeout=timeout)
        if check and r.returncode != 0:
            raise netlab.LabError(f"virsh {' '.join(map(str, args))}: rc={r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def define(self, name: str, xml: str) -> Path:
        """``virsh define`` (a persistent domain: ``destroy`` and ``start`` again work)."""
        path = self.dir / f"{name}.xml"
        path.write_text(xml)
        self.domains.append(name)
        self.virsh("define", path)
        return path

    def state(self, name: str) -> str:
        return self.virsh("domstate", name).stdout.strip()

    def qemu_pid(self, name: str) -> Optional[int]:
        p = Path(f"/run/libvirt/qemu/{name}.pid")
        try:
            return int(p.read_text().strip())
        except (OSError, ValueError):
            return None

    def qemu_log(self, name: str) -> str:
        try:
            return (QEMU_LOGS / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""

    def cleanup(self) -> None:
        """Our domains destroyed and undefined (libvirtd started again for that if it had
        stopped), libvirtd and virtlogd stopped, QEMU's logs of our domains removed."""
        if self.domains:
            if self.libvirtd is None or self.libvirtd.poll() is not None:
                try:
                    self.start()
                except Exception:
                    pass
            for d in self.domains:
                self.virsh("destroy", d, check=False)
                self.virsh("undefine", d, check=False)
        self.stop()
        for d in self.domains:
            for p in (QEMU_LOGS / f"{d}.log", *QEMU_LOGS.glob(f"{d}.log.*")):
                try:
                    p.unlink()
                except OSError:
                    pass


def _answers(path: Path) -> bool:
    """Whether something listens on the unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        try:
            s.connect(str(path))
            return True
        except OSError:
            return False


# --- the domains ----------------------------------------------------------------------------

def guest_files(image_dir: Path, dest: Path) -> tuple:
    """A copy of the guest's kernel and initrd in ``dest`` (libvirt chowns what it boots while
    the VM runs; the build's own files stay as they are)."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for f in ("vmlinuz", "initrd.img"):
        shutil.copy(image_dir / f, dest / f)
        (dest / f).chmod(0o644)
        out.append(dest / f)
    return tuple(out)


def kernel_cmdline(ip: str, mac: str, mtu: int, cmd: Optional[str] = None, then: str = "wait") -> str:
    """The guest's command line (guest/README.md): its address, NIC, MTU and what it does."""
    words = ["console=ttyS0", "panic=-1", "quiet", f"vnet.ip={ip}", f"vnet.mac={mac}", f"vnet.mtu={mtu}",
             f"vnet.then={then}"]
    if cmd:
        words.append("vnet.cmd=" + base64.b64encode(cmd.encode()).decode())
    return " ".join(words)


def vhost_user_interface(mac: str, socket: Path) -> str:
    """A NIC on vnetd's vhost-user socket: QEMU connects (``mode='client'``) and reconnects
    every second after vnetd restarts."""
    return f"""    <interface type='vhostuser'>
      <mac address='{mac}'/>
      <source type='unix' path='{escape(str(socket))}' mode='client'>
        <reconnect enabled='yes' timeout='1'/>
      </source>
      <model type='virtio'/>
    </interface>"""


def tap_interface(mac: str, tap: str) -> str:
    """A NIC on an existing TAP (``managed='no'``: libvirt opens it as it is, neither making
    nor deleting it), vhost off (``driver name='qemu'``: this kernel has no vhost-net)."""
    return f"""    <interface type='ethernet'>
      <mac address='{mac}'/>
      <target dev='{escape(tap)}' managed='no'/>
      <model type='virtio'/>
      <driver name='qemu'/>
    </interface>"""


# Under software emulation QEMU 7.2 crashes in vhost_net_start (msix_set_vector_notifiers)
# when a vhost-user NIC uses MSI-X without KVM's irqfds (guest/README.md): the NIC (libvirt's
# alias net0) gets vectors=0. Not for KVM.
TCG_VHOST_USER_OVERRIDE = """  <qemu:override>
    <qemu:device alias='net0'>
      <qemu:frontend>
        <qemu:property name='vectors' type='unsigned' value='0'/>
      </qemu:frontend>
    </qemu:device>
  </qemu:override>"""


def domain_xml(name: str, kernel: Path, initrd: Path, cmdline: str, interface: str, console: Path,
               memory_mib: int = 256, shared_memory: bool = False, override: str = "") -> str:
    """A ``type='qemu'`` domain booting the guest image directly, its serial console in a
    file. ``shared_memory``: guest RAM a shared memfd (vhost-user needs it)."""
    memory = """  <memoryBacking>
    <source type='memfd'/>
    <access mode='shared'/>
  </memoryBacking>
""" if shared_memory else ""
    return f"""<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{escape(name)}</name>
  <memory unit='MiB'>{memory_mib}</memory>
{memory}  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>{escape(str(kernel))}</kernel>
    <initrd>{escape(str(initrd))}</initrd>
    <cmdline>{escape(cmdline)}</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>{QEMU}</emulator>
{interface}
    <serial type='file'>
      <source path='{escape(str(console))}' append='on'/>
      <target port='0'/>
    </serial>
    <memballoon model='none'/>
  </devices>
{override}
</domain>
"""


def wait_console(console: Path, pattern: str, timeout: float, since: int = 0, detail=lambda: "") -> int:
    """Waits for ``pattern`` (a regex) in the console log after offset ``since``; returns the
    offset after the match."""
    rx = re.compile(pattern, re.M)
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = console.read_text(errors="replace")
        except OSError:
            text = ""
        m = rx.search(text, since)
        if m:
            return m.end()
        for bad in ("VNET-GUEST-ERROR", "Kernel panic"):
            if bad in text[since:]:
                raise netlab.LabError(f"{console.name}: {bad} on the console:\n{text[-2000:]}{detail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {pattern!r} on {console.name} within {timeout}s:\n{text[-2000:]}{detail()}")
        time.sleep(0.1)


def share_with_qemu(path: Path, mode: int = 0o750) -> None:
    """``path`` (a directory of the lab's) reachable by the QEMU user's group, as the
    packaged vnetd's /run/vnet is with ``Group=libvirt-qemu``."""
    os.chown(path, 0, qemu_gid())
    path.chmod(mode)

