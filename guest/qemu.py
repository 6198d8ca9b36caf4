#!/usr/bin/env python3
"""Boot vnet's test guest (guest/build.sh) with QEMU, from pytest or from the command line.

    from guest import qemu          # or: sys.path.insert(0, REPO / "guest"); import qemu
    img = qemu.build()              # runs guest/build.sh (idempotent), returns the Image
    with qemu.Guest(img, qemu.Tap("tap0"), ip="192.168.50.31/24", mtu=1450,
                    cmd="iperf3 -s -D", then="wait", netns="myns") as g:
        g.wait_ready(timeout=60)    # seconds from start to the VNET-GUEST-READY marker
        ...                         # talk to 192.168.50.31 from namespace myns
    # leaving the block stops QEMU by its PID (SIGTERM, then SIGKILL)

QEMU runs with TCG unless a quick probe shows that KVM really runs a guest here (see
``detect_accel``); ``VNET_GUEST_ACCEL=tcg|kvm|auto`` overrides. Every QEMU started here is
tracked by PID, gets SIGKILL if the Python process that started it dies
(PR_SET_PDEATHSIG), and is stopped by PID at exit. See guest/README.md.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import ctypes
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_OUT = Path(os.environ.get("VNET_GUEST_DIR", REPO / "target" / "guest"))
QEMU = os.environ.get("VNET_QEMU", "qemu-system-x86_64")

READY = "VNET-GUEST-READY"
EXIT_RE = re.compile(r"^VNET-GUEST-EXIT (\d+)", re.M)
# lines that mean the guest will not get where the test wants it
FAIL_MARKERS = ("VNET-GUEST-ERROR", "Kernel panic")

_live: list["Guest"] = []


class GuestError(RuntimeError):
    """The guest failed (QEMU exited, a failure marker, a timeout). ``.console`` holds the
    tail of the serial console."""

    def __init__(self, msg: str, console: str = ""):
        super().__init__(f"{msg}\n--- guest console (tail) ---\n{console[-3000:]}" if console else msg)
        self.console = console


class BuildError(RuntimeError):
    pass


# --- the image ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Image:
    kernel: Path
    initrd: Path

    @classmethod
    def at(cls, out_dir: Union[str, Path, None] = None) -> "Image":
        d = Path(out_dir or DEFAULT_OUT)
        img = cls(d / "vmlinuz", d / "initrd.img")
        for f in (img.kernel, img.initrd):
            if not f.is_file():
                raise BuildError(f"{f} not found: run guest/build.sh {d}")
        return img


def build(out_dir: Union[str, Path, None] = None, timeout: float = 900) -> Image:
    """Run guest/build.sh (installs packages with apt-get when missing; a no-op when the image
    is up to date) and return the image. Raises BuildError with the script's output."""
    out = Path(out_dir or DEFAULT_OUT)
    r = subprocess.run(["bash", str(HERE / "build.sh"), str(out)], capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        raise BuildError(f"guest/build.sh failed (rc={r.returncode}):\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return Image.at(out)


# --- NICs -----------------------------------------------------------------------------------

def _device_args(idx: int, mac: Optional[str], queues: int, device_opts: dict, msix: bool = True) -> list[str]:
    opts = [f"virtio-net-pci,netdev=n{idx},id=nic{idx}"]
    if mac:
        opts.append(f"mac={mac}")
    if queues > 1:
        opts.append("mq=on")
    if "vectors" not in device_opts:
        if not msix:
            # INTx instead of MSI-X: see VhostUser (QEMU 7.2 + TCG + vhost crash)
            opts.append("vectors=0")
        elif queues > 1:
            # one MSI-X vector per queue plus config and control
            opts.append(f"vectors={2 * queues + 2}")
    opts += [f"{k}={_onoff(v)}" for k, v in device_opts.items()]
    return ["-device", ",".join(opts)]


def _onoff(v) -> str:
    if v is True:
        return "on"
    if v is False:
        return "off"
    return str(v)


@dataclass
class Tap:
    """A TAP device that already exists (in the namespace QEMU runs in); QEMU attaches to it."""
    ifname: str
    mac: Optional[str] = None
    queues: int = 1
    vhost: bool = False          # vhost-net in the host kernel (needs /dev/vhost-net)
    device_opts: dict = field(default_factory=dict)   # extra virtio-net-pci properties
    shared_memory = False

    def qemu_args(self, idx: int, accel: str = "tcg") -> list[str]:
        nd = f"tap,id=n{idx},ifname={self.ifname},script=no,downscript=no"
        if self.queues > 1:
            nd += f",queues={self.queues}"
        if self.vhost:
            nd += ",vhost=on"
        msix = accel == "kvm" or not self.vhost
        return ["-netdev", nd, *_device_args(idx, self.mac, self.queues, self.device_opts, msix)]


@dataclass
class VhostUser:
    """A vhost-user NIC. ``server=False`` (default): QEMU connects to a backend listening on
    ``path`` (e.g. vnetd's ``interface add ... vhost-user SOCKET``), retrying every
    ``reconnect`` seconds if set. ``server=True``: QEMU listens on ``path`` and the backend
    connects (``vnetd ... client``). Either way QEMU does not finish starting (no guest code
    runs, even with ``wait=off``) until a backend has connected and answered the first
    vhost-user messages; a client without ``reconnect`` exits at once if nobody listens.
    Needs shared guest memory, which Guest adds by itself.

    Under TCG the device gets ``vectors=0`` (legacy INTx, no MSI-X): Debian 12's QEMU
    (7.2+dfsg-7+deb12u18) segfaults in msix_set_vector_notifiers() from vhost_net_start()
    when the guest driver starts a vhost device with MSI-X and no KVM irqfd."""
    path: str
    mac: Optional[str] = None
    queues: int = 1
    server: bool = False
    reconnect: Optional[int] = None
    device_opts: dict = field(default_factory=dict)
    shared_memory = True

    def qemu_args(self, idx: int, accel: str = "tcg") -> list[str]:
        cd = f"socket,id=c{idx},path={self.path}"
        if self.server:
            cd += ",server=on,wait=off"
        elif self.reconnect:
            cd += f",reconnect={self.reconnect}"
        nd = f"vhost-user,id=n{idx},chardev=c{idx}"
        if self.queues > 1:
            nd += f",queues={self.queues}"
        msix = accel == "kvm"
        return ["-chardev", cd, "-netdev", nd, *_device_args(idx, self.mac, self.queues, self.device_opts, msix)]


Nic = Union[Tap, VhostUser]


# --- processes ------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
try:
    _libc = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover
    _libc = None


def _die_with_parent():
    """preexec_fn: SIGKILL this child when the (thread of the) process that started it dies.
    Survives the execve of ``ip netns exec`` and of QEMU (neither is setuid)."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _stop_popen(p: subprocess.Popen, timeout: float = 5.0) -> Optional[int]:
    """SIGTERM the one process we started (by its PID), then SIGKILL; reap it."""
    if p.poll() is None:
        try:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
        except ProcessLookupError:
            pass
    return p.returncode


# --- accelerator --------------------------------------------------------------------------

@dataclass(frozen=True)
class Accel:
    name: str                  # "kvm" or "tcg"
    cpu: Optional[str] = None  # -cpu model (None: QEMU's default)
    reason: str = ""

    def qemu_args(self) -> list[str]:
        a = ["-accel", self.name]
        if self.cpu:
            a += ["-cpu", self.cpu]
        return a


TCG = Accel("tcg", None, "TCG (software emulation)")
_accel_memo: dict = {}


def _probe_cache_key(image: Image) -> str:
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot_id = "?"
    qemu = shutil.which(QEMU) or QEMU
    parts = [boot_id, qemu]
    for f in (qemu, image.kernel):
        try:
            st = os.stat(f)
            parts.append(f"{st.st_size}:{int(st.st_mtime)}")
        except OSError:
            parts.append("-")
    return "|".join(parts)


def _kvm_boots(image: Image, cpu: Optional[str], timeout: float) -> tuple[bool, str]:
    """Boot the guest with KVM, no NIC, a command that exits at once; True if it gets there
    within ``timeout``. The process is killed by PID on timeout."""
    with tempfile.TemporaryDirectory(prefix="vnet-kvm-probe-") as d:
        log = Path(d) / "console.log"
        argv = [QEMU, "-accel", "kvm", *(["-cpu", cpu] if cpu else []), "-machine", "q35",
                "-m", "128M", "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none",
                "-no-reboot", "-serial", f"file:{log}", "-kernel", str(image.kernel),
                "-initrd", str(image.initrd),
                "-append", "console=ttyS0 panic=-1 quiet vnet.cmd=" + base64.b64encode(b"true").decode()]
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        t0 = time.monotonic()
        timed_out = False
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _stop_popen(p, timeout=1)
        out = p.stdout.read().decode(errors="replace") if p.stdout else ""
        if p.stdout:
            p.stdout.close()
        console = log.read_text(errors="replace") if log.exists() else ""
        what = f"kvm{' -cpu ' + cpu if cpu else ''}: "
        if "VNET-GUEST-EXIT 0" in console:
            return True, what + f"guest booted in {time.monotonic() - t0:.1f}s"
        if timed_out:
            detail = f"no guest output within {timeout:.0f}s" if not console.strip() else \
                f"guest not done within {timeout:.0f}s"
        else:
            lines = [ln for ln in out.strip().splitlines() if ln.strip()]
            detail = f"QEMU exited rc={p.returncode}: " + (lines[0][:160] if lines else "no output")
        return False, what + detail


def detect_accel(image: Image, timeout: Optional[float] = None, use_cache: bool = True) -> Accel:
    """KVM if /dev/kvm can really run this guest (a boot probe with a timeout), TCG otherwise.

    ``VNET_GUEST_ACCEL`` = ``tcg`` / ``kvm`` forces a choice; ``auto`` (default) probes. The
    result is remembered per host boot in /tmp (a hanging nested KVM costs the probe timeout,
    ``VNET_GUEST_KVM_PROBE_TIMEOUT``, default 8 s, once)."""
    force = os.environ.get("VNET_GUEST_ACCEL", "auto").lower()
    if force == "tcg":
        return Accel("tcg", None, "TCG forced by VNET_GUEST_ACCEL")
    if force == "kvm":
        return Accel("kvm", "host", "KVM forced by VNET_GUEST_ACCEL")
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return Accel("tcg", None, "TCG: /dev/kvm not usable")
    key = _probe_cache_key(image)
    if key in _accel_memo:
        return _accel_memo[key]
    cache = Path(tempfile.gettempdir()) / "vnet-guest-accel.json"
    if use_cache:
        try:
            c = json.loads(cache.read_text())
            if c.get("key") == key:
                a = Accel(c["name"], c.get("cpu"), c.get("reason", "") + " (cached)")
                _accel_memo[key] = a
                return a
        except (OSError, ValueError, KeyError):
            pass
    timeout = float(timeout or os.environ.get("VNET_GUEST_KVM_PROBE_TIMEOUT", 8))
    notes = []
    result = None
    for cpu in ("host", None):
        ok, note = _kvm_boots(image, cpu, timeout)
        notes.append(note)
        if ok:
            result = Accel("kvm", cpu, "KVM probe ok: " + note)
            break
    if result is None:
        result = Accel("tcg", None, "TCG: KVM probe failed (" + "; ".join(notes) + ")")
    _accel_memo[key] = result
    try:
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "name": result.name, "cpu": result.cpu,
                                   "reason": result.reason}))
        tmp.replace(cache)
    except OSError:
        pass
    return result


# --- the guest ------------------------------------------------------------------------------

def b64(script: str) -> str:
    """A shell script as the base64 text ``vnet.cmd=`` takes."""
    return base64.b64encode(script.encode()).decode()


class Guest:
    """One QEMU VM running the test guest.

    ``nics``: a Tap / VhostUser or a list of them (the first gets ``ip``/``mtu``; the guest's
    /init picks it by ``mac`` when given, else the first virtio NIC). ``cmd``: shell text run
    in the guest once its network is up (``VNET-GUEST-EXIT <status>`` follows); ``then``:
    ``poweroff`` (default with a cmd), ``wait`` (default without) or ``reboot``. ``netns``:
    run QEMU inside that network namespace (``ip netns exec``), e.g. where its TAP lives.
    ``accel``: an Accel, "tcg", "kvm" or None (detect_accel). ``shared_memory``: back guest
    RAM with a shared memfd (forced on with a VhostUser NIC).
    """

    def __init__(self, image: Optional[Image] = None, nics: Union[Nic, Sequence[Nic], None] = (), *,
                 ip: Optional[str] = None, mtu: Optional[int] = None, mac: Optional[str] = None,
                 gw: Optional[str] = None, hostname: Optional[str] = None,
                 cmd: Optional[str] = None, then: Optional[str] = None,
                 memory_mb: int = 256, smp: int = 1, machine: str = "q35",
                 netns: Optional[str] = None, name: str = "vm", workdir: Union[str, Path, None] = None,
                 accel: Union[Accel, str, None] = None, shared_memory: Optional[bool] = None,
                 no_reboot: Optional[bool] = None, quiet: bool = True,
                 append: Sequence[str] = (), qemu_args: Sequence[str] = (), keep_workdir: bool = False):
        self.image = image or Image.at()
        if isinstance(nics, (Tap, VhostUser)):
            nics = [nics]
        self.nics = list(nics or [])
        if mac is None and self.nics and self.nics[0].mac:
            mac = self.nics[0].mac
        self.ip, self.mtu, self.mac, self.gw, self.hostname = ip, mtu, mac, gw, hostname
        self.cmd, self.then = cmd, then
        self.memory_mb, self.smp, self.machine = memory_mb, smp, machine
        self.netns, self.name = netns, name
        self._accel = accel
        self.shared_memory = shared_memory if shared_memory is not None else any(n.shared_memory for n in self.nics)
        if any(n.shared_memory for n in self.nics) and shared_memory is False:
            raise ValueError("a vhost-user NIC needs shared guest memory")
        self.no_reboot = no_reboot if no_reboot is not None else (then != "reboot")
        self.quiet = quiet
        self.extra_append, self.extra_qemu_args = list(append), list(qemu_args)
        self.keep_workdir = keep_workdir
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix=f"vnet-guest-{name}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.console_log = self.workdir / "console.log"
        self.console_sock = self.workdir / "console.sock"
        self.qmp_sock = self.workdir / "qmp.sock"
        self.stderr_log = self.workdir / "qemu.stderr"
        self.proc: Optional[subprocess.Popen] = None
        self.started_at: Optional[float] = None
        self.boot_seconds: Optional[float] = None
        self.failed = False

    # -- command line --
    @property
    def accel(self) -> Accel:
        if not isinstance(self._accel, Accel):
            if self._accel == "tcg":
                self._accel = TCG
            elif self._accel == "kvm":
                self._accel = Accel("kvm", "host", "KVM requested")
            else:
                self._accel = detect_accel(self.image)
        return self._accel

    def kernel_cmdline(self) -> str:
        words = ["console=ttyS0", "panic=-1"]
        if self.quiet:
            words.append("quiet")
        for k, v in (("ip", self.ip), ("mtu", self.mtu), ("mac", self.mac), ("gw", self.gw),
                     ("hostname", self.hostname), ("then", self.then)):
            if v is not None:
                words.append(f"vnet.{k}={v}")
        if self.cmd is not None:
            words.append(f"vnet.cmd={b64(self.cmd)}")
        words += self.extra_append
        line = " ".join(words)
        if len(line) >= 2048:
            raise ValueError(f"kernel command line too long ({len(line)} bytes, x86 limit 2047): shorten cmd")
        return line

    def qemu_argv(self, console: str = "socket") -> list[str]:
        """QEMU's argument list (without the ``ip netns exec`` prefix). ``console``: "socket"
        (a unix socket, everything also logged to console.log), "file" (console.log only)
        or "stdio" (interactive; Ctrl-A X quits)."""
        mem = f"{self.memory_mb}M"
        a = [QEMU, "-name", self.name, *self.accel.qemu_args()]
        if self.shared_memory:
            # vhost-user: the backend mmaps guest RAM through the memfd QEMU passes it;
            # the -m size must equal the backend's size.
            a += ["-object", f"memory-backend-memfd,id=mem,size={mem},share=on",
                  "-machine", f"{self.machine},memory-backend=mem"]
        else:
            a += ["-machine", self.machine]
        a += ["-m", mem, "-smp", str(self.smp), "-nodefaults", "-no-user-config", "-display", "none"]
        if self.no_reboot:
            a.append("-no-reboot")
        if console == "stdio":
            a += ["-serial", "mon:stdio"]
        elif console == "file":
            a += ["-serial", f"file:{self.console_log}"]
        else:
            a += ["-chardev", f"socket,id=con,path={self.console_sock},server=on,wait=off,"
                              f"logfile={self.console_log},logappend=on",
                  "-serial", "chardev:con"]
            a += ["-qmp", f"unix:{self.qmp_sock},server=on,wait=off"]
        a += ["-kernel", str(self.image.kernel), "-initrd", str(self.image.initrd),
              "-append", self.kernel_cmdline()]
        for i, nic in enumerate(self.nics):
            a += nic.qemu_args(i, self.accel.name)
        a += self.extra_qemu_args
        return a

    def argv(self, console: str = "socket") -> list[str]:
        pre = ["ip", "netns", "exec", self.netns] if self.netns else []
        return pre + self.qemu_argv(console)

    def command_line(self, console: str = "socket") -> str:
        return shlex.join(self.argv(console))

    # -- life cycle --
    def start(self) -> "Guest":
        if self.proc is not None:
            raise RuntimeError("guest already started")
        argv = self.argv()
        (self.workdir / "cmdline").write_text(shlex.join(argv) + "\n")
        self.console_log.write_bytes(b"")
        err = open(self.stderr_log, "wb")
        try:
            self.started_at = time.monotonic()
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT,
                                         preexec_fn=_die_with_parent)
        finally:
            err.close()
        _live.append(self)
        return self

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 5.0) -> Optional[int]:
        """Stop QEMU by its PID (SIGTERM, then SIGKILL); idempotent. Returns QEMU's exit code."""
        rc = None
        if self.proc is not None:
            rc = _stop_popen(self.proc, timeout=timeout)
        if self in _live:
            _live.remove(self)
        if self._own_workdir and not (self.keep_workdir or self.failed):
            shutil.rmtree(self.workdir, ignore_errors=True)
        return rc

    def __enter__(self) -> "Guest":
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.failed = True
        self.stop()

    # -- console --
    def console(self) -> str:
        try:
            return self.console_log.read_text(errors="replace")
        except OSError:
            return ""

    def qemu_stderr(self) -> str:
        try:
            return self.stderr_log.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for(self, pattern: Union[str, re.Pattern], timeout: float = 60.0, since: int = 0,
                 fail_on: Sequence[str] = FAIL_MARKERS, poll: float = 0.05) -> re.Match:
        """Wait until ``pattern`` (a substring or a regex) appears in the console log after
        character offset ``since``; returns the match (``.group(0)``; ``.end()`` is a good
        next ``since``). Raises GuestError if QEMU exits first, a ``fail_on`` marker shows
        up, or ``timeout`` seconds pass; the message has the console's tail."""
        rx = pattern if isinstance(pattern, re.Pattern) else re.compile(re.escape(pattern))
        deadline = time.monotonic() + timeout
        while True:
            text = self.console()
            m = rx.search(text, since)
            if m:
                return m
            for f in fail_on:
                i = text.find(f, since)
                if i >= 0:
                    self.failed = True
                    line = text[i:].splitlines()[0]
                    raise GuestError(f"guest {self.name}: {line!r} while waiting for {rx.pattern!r}", text)
            if self.proc is None or self.proc.poll() is not None:
                time.sleep(0.1)  # the last console bytes may still be on their way
                text = self.console()
                m = rx.search(text, since)
                if m:
                    return m
                self.failed = True
                rc = self.proc.returncode if self.proc else None
                raise GuestError(f"guest {self.name}: QEMU exited (rc={rc}) before {rx.pattern!r}; "
                                 f"stderr: {self.qemu_stderr().strip()[-1500:]}", text)
            if time.monotonic() > deadline:
                self.failed = True
                raise GuestError(f"guest {self.name}: no {rx.pattern!r} on the console within {timeout}s "
                                 f"(accel {self.accel.name})", text)
            time.sleep(poll)

    def wait_ready(self, timeout: float = 60.0, fail_on: Sequence[str] = FAIL_MARKERS) -> float:
        """Wait for ``VNET-GUEST-READY``; returns (and records as ``boot_seconds``) the
        seconds since start()."""
        self.wait_for(READY, timeout, fail_on=fail_on)
        self.boot_seconds = time.monotonic() - self.started_at
        return self.boot_seconds

    def wait_exit(self, timeout: float = 60.0, fail_on: Sequence[str] = FAIL_MARKERS) -> int:
        """Wait for the guest's command to finish; returns its exit status (VNET-GUEST-EXIT)."""
        m = self.wait_for(EXIT_RE, timeout, fail_on=fail_on)
        return int(m.group(1))

    def wait_stopped(self, timeout: float = 30.0) -> int:
        """Wait for QEMU itself to exit (e.g. after poweroff); returns its exit code."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.failed = True
            raise GuestError(f"guest {self.name}: QEMU still running after {timeout}s", self.console())

    def send(self, text: str) -> None:
        """Type ``text`` on the serial console (e.g. "ip -s link\\n" to the shell of
        ``then=wait``). Output shows up in console()."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(str(self.console_sock))
            s.sendall(text.encode())
            time.sleep(0.05)

    def qmp(self, command: str, **arguments) -> dict:
        """One QMP command (e.g. ``qmp("system_reset")``, ``qmp("set_link", name="nic0",
        up=False)``); returns its ``return`` value, raises on an ``error``."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(self.qmp_sock))
            f = s.makefile("rwb")

            def call(cmd, args=None):
                msg = {"execute": cmd, **({"arguments": args} if args else {})}
                f.write(json.dumps(msg).encode() + b"\n")
                f.flush()
                while True:
                    r = json.loads(f.readline())
                    if "return" in r:
                        return r["return"]
                    if "error" in r:
                        raise RuntimeError(f"QMP {cmd}: {r['error']}")

            json.loads(f.readline())  # greeting
            call("qmp_capabilities")
            return call(command, arguments)


def stop_all() -> None:
    for g in list(_live):
        try:
            g.stop(timeout=2)
        except Exception:
            pass


atexit.register(stop_all)


# --- host-side helpers ------------------------------------------------------------------------

def tap_in_netns(netns: str, ifname: str, address: Optional[str] = None, mtu: Optional[int] = None,
                 queues: int = 1) -> None:
    """Create TAP ``ifname`` inside namespace ``netns`` (for a Tap NIC of a QEMU run there),
    optionally with an address (``10.0.0.1/24``) and MTU, and bring it up. Deleted with the
    namespace."""
    def ip(*a):
        subprocess.run(["ip", "-n", netns, *map(str, a)], check=True, capture_output=True, text=True)
    ip("tuntap", "add", "dev", ifname, "mode", "tap", *(["multi_queue"] if queues > 1 else []))
    if mtu:
        ip("link", "set", "dev", ifname, "mtu", mtu)
    if address:
        ip("addr", "add", address, "dev", ifname)
    ip("link", "set", "dev", ifname, "up")


# --- command line -----------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="guest/boot.sh",
                                 description="Boot vnet's test guest with QEMU (see guest/README.md).")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="image directory (default target/guest)")
    ap.add_argument("--build", action="store_true", help="run guest/build.sh first (also done when the image is missing)")
    nic = ap.add_mutually_exclusive_group()
    nic.add_argument("--tap", metavar="IFNAME", help="attach to this existing TAP (in --netns, if given)")
    nic.add_argument("--vhost-user", metavar="SOCKET", help="vhost-user NIC on this unix socket")
    ap.add_argument("--server", action="store_true", help="vhost-user: QEMU listens on SOCKET (default: connects)")
    ap.add_argument("--reconnect", type=int, help="vhost-user client: retry every N seconds")
    ap.add_argument("--queues", type=int, default=1)
    ap.add_argument("--mac", default="52:54:00:12:34:56")
    ap.add_argument("--ip", help="guest address, e.g. 192.168.50.31/24")
    ap.add_argument("--mtu", type=int)
    ap.add_argument("--gw")
    ap.add_argument("--cmd", help="shell text to run in the guest once its network is up")
    ap.add_argument("--then", choices=("poweroff", "wait", "reboot"))
    ap.add_argument("--netns", help="run QEMU in this network namespace")
    ap.add_argument("--memory", type=int, default=256, help="MiB (default 256)")
    ap.add_argument("--smp", type=int, default=1)
    ap.add_argument("--machine", default="q35")
    ap.add_argument("--accel", choices=("auto", "tcg", "kvm"), default=os.environ.get("VNET_GUEST_ACCEL", "auto"))
    ap.add_argument("--verbose", action="store_true", help="kernel messages on the console (no 'quiet')")
    ap.add_argument("--console", choices=("stdio", "file"), default="stdio",
                    help="stdio: interactive, Ctrl-A X quits (default); file: write --log and wait for QEMU")
    ap.add_argument("--log", help="console log file (with --console file)")
    ap.add_argument("--dry-run", action="store_true", help="print the QEMU command line and exit")
    ap.add_argument("--probe", action="store_true", help="print the accelerator choice (KVM probe) and exit")
    a = ap.parse_args(argv)

    if a.build or not (Path(a.out) / "initrd.img").exists():
        image = build(a.out)
    else:
        image = Image.at(a.out)
    if a.probe:
        acc = detect_accel(image, use_cache=False)
        print(f"{acc.name}{' -cpu ' + acc.cpu if acc.cpu else ''}: {acc.reason}")
        return 0
    nics: list = []
    if a.tap:
        nics.append(Tap(a.tap, mac=a.mac, queues=a.queues))
    elif a.vhost_user:
        nics.append(VhostUser(a.vhost_user, mac=a.mac, queues=a.queues, server=a.server, reconnect=a.reconnect))
    accel = None if a.accel == "auto" else a.accel
    g = Guest(image, nics, ip=a.ip, mtu=a.mtu, gw=a.gw, cmd=a.cmd, then=a.then, memory_mb=a.memory,
              smp=a.smp, machine=a.machine, netns=a.netns, accel=accel, quiet=not a.verbose,
              workdir=tempfile.mkdtemp(prefix="vnet-guest-cli-"))
    console = a.console
    argv_ = g.argv(console=console)
    if console == "file":
        log = Path(a.log or "guest-console.log").resolve()
        argv_ = [w.replace(f"file:{g.console_log}", f"file:{log}") for w in argv_]
    print(f"# accel: {g.accel.reason}", file=sys.stderr)
    if a.dry_run:
        print(shlex.join(argv_))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    shutil.rmtree(g.workdir, ignore_errors=True)  # the stdio and file consoles do not use it
    if console == "stdio":
        os.execvp(argv_[0], argv_)
    return subprocess.call(argv_, stdin=subprocess.DEVNULL)


if __name__ == "__main__":
    sys.exit(main())
