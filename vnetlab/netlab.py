"""netlab: throw-away network topologies built from real Linux objects.

Used by vnet's system tests (tests/system), the benchmark suite (bench/) and
scripts/demo.py, which import it as ``from vnetlab import netlab``.

The model (everything lives in network namespaces this module creates; nothing
is ever added to, or changed in, the root namespace):

* a *wire* namespace holds a Linux bridge ``br0``: the physical underlay;
* every *host* namespace is joined to that bridge by a veth pair, its end being
  ``eth0`` with an address of the underlay subnet (10.99.0.0/24 by default);
* *guest* namespaces play the VMs: a TAP created by vnetd (``interface add ...
  netns GUEST``) or a veth from a kernel-VXLAN host ends up inside them;
* vnetd processes run in host namespaces (``ip netns exec HOST vnetd ...``,
  control port 127.0.0.1:7600 on the host's own loopback), are tracked by PID,
  log to files under the lab's work directory and are stopped by PID only
  (SIGTERM, then SIGKILL).

Names are unique per run (``vl<5 hex>-<role>``). ``Lab.close()`` always removes
every process and namespace the lab created; it runs from the pytest fixture
finalizer, from ``with Lab(...)``, and from ``atexit``. A state file per lab
(``/tmp/vnetlab-state``) lets a later run sweep what a killed run left behind.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

# Part of netlab's interface (the tests call netlab.wait_until, netlab.delta, netlab.mac, ...),
# each defined in the module for its job.
from .frames import ether, mac, mac_bytes, stream_hello, stream_record, vxlan  # noqa: F401
from .procs import LabError, in_netns, pid_alive, sh, stop_pid, wait_until  # noqa: F401
from .results import IperfResult, PingResult, parse_iperf, parse_ping  # noqa: F401
from .stats import delta, drops, new_drops, port_of  # noqa: F401
from .control import ControlClient  # noqa: F401

REPO = Path(__file__).resolve().parents[1]


def _bin(env: str, default: str) -> Path:
    p = Path(os.environ.get(env, default))
    return p if p.is_absolute() else REPO / p


VNETD = _bin("VNETD", "target/release/vnetd")
VNETCTL = _bin("VNETCTL", "target/release/vnetctl")
CONTROL = "127.0.0.1:7600"
VXLAN_PORT = 4789
STATE_DIR = Path(tempfile.gettempdir()) / "vnetlab-state"

_live_labs: list["Lab"] = []


class CtlError(RuntimeError):
    """vnetctl exited non-zero; ``.stderr`` holds the daemon's error message."""

    def __init__(self, words, rc, stdout, stderr):
        super().__init__(f"vnetctl {' '.join(map(str, words))!r} failed (rc={rc}): {stderr.strip()}")
        self.rc, self.stdout, self.stderr = rc, stdout, stderr


# --- namespaces -----------------------------------------------------------------------------

class Netns:
    """A network namespace made by this lab (``/run/netns/<name>``)."""

    def __init__(self, lab: "Lab", role: str):
        self.lab, self.role = lab, role
        self.name = f"{lab.prefix}-{role}"
        sh("ip", "netns", "add", self.name)
        lab._namespaces.append(self.name)
        lab._save_state()
        self.ip_link("set", "lo", "up")
        # no IPv6 chatter (router solicitations, MLD): keeps frame counters deterministic
        self.sysctl("net.ipv6.conf.all.disable_ipv6", 1)
        self.sysctl("net.ipv6.conf.default.disable_ipv6", 1)

    def __repr__(self):
        return f"<{type(self).__name__} {self.name}>"

    def exec(self, *args, check=True, timeout=30, input=None) -> subprocess.CompletedProcess:
        """Run a command inside the namespace."""
        return sh("ip", "netns", "exec", self.name, *args, check=check, timeout=timeout, input=input)

    def popen(self, *args, host_mounts: bool = False, **kw) -> subprocess.Popen:
        """Start a background process inside the namespace; the lab stops it by PID at close.
        With ``host_mounts`` it joins the network namespace only (``nsenter --net``) and keeps
        the machine's mounts: ``ip netns exec`` mounts a /sys of its own, without the bpffs at
        /sys/fs/bpf where vnetd pins its kernel fast path (a bpffs mounted there would go with
        the process, and the pins with it)."""
        argv = (["nsenter", f"--net=/run/netns/{self.name}"] if host_mounts
                else ["ip", "netns", "exec", self.name])
        p = subprocess.Popen([*argv, *map(str, args)], **kw)
        self.lab._procs.append(p)
        return p

    def ip(self, *args, check=True) -> subprocess.CompletedProcess:
        return sh("ip", "-n", self.name, *args, check=check)

    def ip_link(self, *args, check=True):
        return self.ip("link", *args, check=check)

    def sysctl(self, key: str, value) -> None:
        self.exec("sysctl", "-qw", f"{key}={value}")

    def links(self) -> dict:
        """Interfaces of the namespace: ifname -> ``ip -j link`` entry."""
        return {l["ifname"]: l for l in json.loads(self.ip("-j", "link", "show").stdout)}

    def link_counters(self, dev: str) -> dict:
        """Kernel counters of one device as seen in this namespace (rx/tx packets, bytes...)."""
        j = json.loads(self.ip("-j", "-s", "link", "show", "dev", dev).stdout)[0]
        return {"rx_packets": j["stats64"]["rx"]["packets"], "tx_packets": j["stats64"]["tx"]["packets"],
                "rx_bytes": j["stats64"]["rx"]["bytes"], "tx_bytes": j["stats64"]["tx"]["bytes"]}

    def socket(self, family=socket.AF_INET, type=socket.SOCK_DGRAM, proto=0) -> socket.socket:
        """A socket that lives in this namespace."""
        with in_netns(self.name):
            return socket.socket(family, type, proto)

    def ping(self, dst: str, count: int = 2, interval: float = 0.2, wait: float = 1.0) -> PingResult:
        return self.lab.ping(self, dst, count=count, interval=interval, wait=wait)


class Guest(Netns):
    """A namespace that plays a VM: one NIC (``ifname``), one overlay address."""

    def __init__(self, lab, role, ip: Optional[str] = None, mac: Optional[str] = None, prefix_len: int = 24):
        super().__init__(lab, role)
        self.ip_addr, self.mac, self.prefix_len = ip, mac, prefix_len
        self.ifname: Optional[str] = None

    def configure(self, ifname: str, mtu: Optional[int] = None) -> None:
        """(Re)assign the guest's overlay address to ``ifname`` and bring it up."""
        wait_until(lambda: ifname in self.links(), 10, what=f"{ifname} to appear in {self.name}")
        self.ifname = ifname
        if mtu:
            self.ip_link("set", ifname, "mtu", mtu)
        self.ip_link("set", ifname, "up")
        if self.ip_addr:
            self.ip("addr", "replace", f"{self.ip_addr}/{self.prefix_len}", "dev", ifname)

    def neigh_flush(self) -> None:
        if self.ifname:
            self.ip("neigh", "flush", "dev", self.ifname, check=False)


class Vnetd:
    """One vnetd process in a host namespace (the Popen pid is vnetd itself: ``ip netns exec`` execs)."""

    def __init__(self, host: "Host", proc: subprocess.Popen, log: Path, args: list):
        self.host, self.proc, self.log, self.args = host, proc, log, args

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, sig=signal.SIGTERM, timeout: float = 5.0) -> Optional[int]:
        return stop_pid(self.proc, sig, timeout)


def own_args(d: "Vnetd") -> list:
    """The arguments a daemon was started with beyond those ``start_vnetd`` adds itself."""
    extra = d.args[d.args.index(str(VNETD)) + 1:]
    for opt in ("--control", "--config", "--token-file", "--state-dir"):
        while opt in extra:
            i = extra.index(opt)
            del extra[i:i + 2]
    return extra


class Host(Netns):
    """A machine on the underlay: ``eth0`` with ``underlay_ip``; may run vnetd."""

    def __init__(self, lab, role, underlay_ip: Optional[str]):
        super().__init__(lab, role)
        self.underlay_ip = underlay_ip
        self.control = CONTROL
        self.token_file: Optional[Path] = None
        self.vnetd: Optional[Vnetd] = None
        self.config_path: Optional[Path] = None
        self.all_vnetd: list[Vnetd] = []
        # vnetd's state directory (its configuration, what it made, its lock): one per host,
        # kept across restarts of the daemon, torn down with the lab.
        self.state_dir: Path = lab.workdir / f"{role}.state"

    # -- the daemon --
    def start_vnetd(self, config: Optional[str] = None, config_path: Optional[Path] = None,
                    args: Iterable = (), token: Optional[str] = None, wait: bool = True,
                    control: Optional[str] = None, popen_kw: Optional[dict] = None) -> Vnetd:
        """Start vnetd here. ``config`` is written to a file (kept in ``config_path`` so a
        restart can reuse it). With ``wait``, returns once the control port answers.
        ``popen_kw``: more for subprocess.Popen (``group``, ``umask``: vnetd as a service
        unit's ``Group=`` and ``UMask=`` start it)."""
        if not VNETD.exists():
            raise LabError(f"vnetd binary not found at {VNETD} (build with `cargo build --release` or set VNETD)")
        if config is not None:
            config_path = self.lab.workdir / f"{self.role}.conf"
            config_path.write_text(config)
        if config_path is not None:
            self.config_path = Path(config_path)
        if control:
            self.control = control
        if token is not None:
            self.token_file = self.lab.workdir / f"{self.role}.token"
            self.token_file.write_text(token + "\n")
        argv = [VNETD, "--control", self.control, "--state-dir", self.state_dir]
        if self.config_path is not None:
            argv += ["--config", self.config_path]
        if self.token_file is not None:
            argv += ["--token-file", self.token_file]
        argv += list(args)
        n = len(self.all_vnetd)
        log = self.lab.workdir / f"vnetd-{self.role}{'-' + str(n) if n else ''}.log"
        env = dict(os.environ, RUST_LOG=os.environ.get("VNET_LOG", os.environ.get("RUST_LOG", "info")))
        with open(log, "wb") as f:
            proc = self.popen(*argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env,
                              host_mounts=True, **(popen_kw or {}))
        self.vnetd = Vnetd(self, proc, log, [str(a) for a in argv])
        self.all_vnetd.append(self.vnetd)
        if wait:
            self.wait_ready()
        return self.vnetd

    def wait_ready(self, timeout: float = 10.0) -> None:
        def ready():
            if not self.vnetd.alive():
                raise LabError(f"vnetd in {self.name} exited (rc={self.vnetd.proc.returncode}):\n"
                               f"{self.vnetd.log_text()[-3000:]}")
            return self.ctl("show", "stats", check=False, timeout=5).returncode == 0
        wait_until(ready, timeout, 0.05, what=f"vnetd control port in {self.name}")

    def stop_vnetd(self, sig=signal.SIGTERM, timeout: float = 5.0) -> Optional[int]:
        return self.vnetd.stop(sig, timeout) if self.vnetd else None

    def teardown_vnetd(self, timeout: float = 15.0) -> subprocess.CompletedProcess:
        """``vnetd --teardown`` for this host's state directory (its daemon stopped): removes
        every device, pinned kernel object and state file vnet made here."""
        return sh("nsenter", f"--net=/run/netns/{self.name}", VNETD, "--teardown", "--state-dir",
                  self.state_dir, check=False, timeout=timeout)

    def restart_vnetd(self, **kw) -> Vnetd:
        """SIGTERM the daemon and start it again with the same config file and arguments."""
        old = self.vnetd
        old.stop()
        return self.start_vnetd(args=own_args(old), **kw)

    # -- the control port --
    def _ctl_argv(self) -> list:
        if not VNETCTL.exists():
            raise LabError(f"vnetctl binary not found at {VNETCTL} (build with `cargo build --release` or set VNETCTL)")
        argv = [VNETCTL, "--control", self.control]
        if self.token_file is not None:
            argv += ["--token-file", self.token_file]
        return argv

    def ctl(self, *words, check=True, timeout=15):
        """``vnetctl COMMAND...`` inside this host. With ``check`` returns stdout or raises
        CtlError; without, returns the CompletedProcess."""
        r = self.exec(*self._ctl_argv(), *words, check=False, timeout=timeout)
        if not check:
            return r
        if r.returncode != 0:
            raise CtlError(words, r.returncode, r.stdout, r.stderr)
        return r.stdout

    def ctl_json(self, *words):
        return json.loads(self.ctl(*words))

    def script(self, text: str, check=True):
        """Apply a script atomically (``vnetctl --file -``)."""
        r = self.exec(*self._ctl_argv(), "--file", "-", check=False, input=text)
        if not check:
            return r
        if r.returncode != 0:
            raise CtlError(["--file", "-"], r.returncode, r.stdout, r.stderr)
        return r.stdout

    def stats(self) -> dict:
        return self.ctl_json("show", "stats", "json")

    def port(self, name: str, stats: Optional[dict] = None) -> dict:
        """Stats entry of the interface or link ``name``."""
        for p in (stats or self.stats())["ports"]:
            if p["name"] == name:
                return p
        raise KeyError(f"no port {name!r} in show stats of {self.name}")

    def add_vm(self, guest: Guest, name: str, mac: str, vni: int = 1, mtu: Optional[int] = None,
               ifname: Optional[str] = None, route: bool = True, kind: str = "tap") -> str:
        """``interface add NAME KIND mac MAC netns GUEST [vni] [mtu]`` (KIND ``tap`` or
        ``veth``), route the MAC to it, then give the guest its address. Returns the guest's
        ifname."""
        words = ["interface", "add", name, kind, "mac", mac, "netns", guest.name, "vni", vni]
        if mtu:
            words += ["mtu", mtu]
        if ifname:
            words += ["ifname", ifname]
        self.ctl(*words)
        if route:
            self.ctl("route", "add", "any", mac, "interface", name)
        ifname = self.interface(name)["ifname"]
        guest.mac = mac
        guest.configure(ifname, mtu)
        return ifname

    def interface(self, name: str) -> dict:
        for i in self.ctl_json("show", "interfaces", "json"):
            if i["name"] == name:
                return i
        raise KeyError(f"no interface {name!r} on {self.name}")

    def link_state(self, name: str) -> Optional[str]:
        for l in self.ctl_json("show", "links", "json"):
            if l["name"] == name:
                return l["state"]
        return None


class KernelVxlanHost(Host):
    """A host running only the Linux kernel VXLAN: ``vx<VNI>`` + bridge ``br0``; guests are
    attached to the bridge with veth pairs (guest side ``eth0``). Made by Lab.kernel_vxlan_host."""

    def setup_vxlan(self, vni: int = 1, peers: Iterable[str] = ()) -> None:
        """Create the VXLAN device (needs the underlay address to exist) and the bridge."""
        self.vni, self.vxdev, self._nguests = vni, f"vx{vni}", 0
        self.ip_link("add", self.vxdev, "type", "vxlan", "id", vni, "dstport", VXLAN_PORT,
                     "local", self.underlay_ip, "dev", "eth0", "nolearning")
        self.ip_link("add", "br0", "type", "bridge")
        self.ip_link("set", self.vxdev, "master", "br0")
        self.ip_link("set", self.vxdev, "up")
        self.ip_link("set", "br0", "up")
        for p in peers:
            self.add_peer(p)

    def add_peer(self, ip: str) -> None:
        """Head-end replication: floods and unknown unicast go to ``ip`` too."""
        self.exec("bridge", "fdb", "append", "00:00:00:00:00:00", "dev", self.vxdev, "dst", ip)

    def add_vm(self, guest: Guest, name: str = "", mac: str = "", vni: int = 1, mtu: Optional[int] = 1450,
               ifname: Optional[str] = None, route: bool = True, kind: str = "veth") -> str:
        """Attach ``guest`` to the bridge through a veth (MTU 1450 fits the kernel VXLAN).
        Same signature as Host.add_vm; ``name``, ``vni``, ``ifname`` and ``route`` are unused."""
        self._nguests += 1
        port = f"vg{self._nguests}"
        self.ip_link("add", port, "type", "veth", "peer", "name", "eth0", "netns", guest.name)
        self.ip_link("set", port, "mtu", mtu or 1450)
        self.ip_link("set", port, "master", "br0")
        self.ip_link("set", port, "up")
        guest.ip_link("set", "eth0", "address", mac)
        guest.mac = mac
        guest.configure("eth0", mtu or 1450)
        return "eth0"


# --- the lab --------------------------------------------------------------------------------

class Lab:
    """A set of namespaces, devices and processes with one owner and one guaranteed cleanup."""

    def __init__(self, tag: str = "lab", subnet: str = "10.99.0", keep_workdir: bool = False):
        sweep_stale()
        self.id = secrets.token_hex(3)[:5]
        self.prefix = f"vl{self.id}"
        self.tag, self.subnet = tag, subnet
        self.workdir = Path(tempfile.mkdtemp(prefix=f"vnetlab-{tag[:40]}-{self.id}-"))
        self.keep_workdir = keep_workdir
        self._namespaces: list[str] = []
        self._procs: list[subprocess.Popen] = []
        self._next_host = 1
        self.wire: Optional[Netns] = None
        self.hosts: list[Host] = []
        self.closed = False
        self.failed = False  # set by the test harness: keep logs when true
        _live_labs.append(self)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.failed = True
        self.close()

    # -- building --
    def _underlay(self) -> Netns:
        if self.wire is None:
            self.wire = Netns(self, "wire")
            self.wire.ip_link("add", "br0", "type", "bridge")
            self.wire.ip_link("set", "br0", "up")
        return self.wire

    def _attach(self, host: Host, ip: Optional[str]) -> str:
        """veth from the wire bridge to ``eth0`` of ``host``, address ``ip`` (next free if None)."""
        wire = self._underlay()
        n = self._next_host
        self._next_host += 1
        ip = ip or f"{self.subnet}.{n}"
        port = f"h{n}"
        wire.ip_link("add", port, "type", "veth", "peer", "name", "eth0", "netns", host.name)
        wire.ip_link("set", port, "master", "br0")
        wire.ip_link("set", port, "up")
        host.ip("addr", "add", f"{ip}/24", "dev", "eth0")
        host.ip_link("set", "eth0", "up")
        return ip

    def underlay(self) -> Netns:
        """The wire namespace (its bridge ``br0`` is the underlay), made on first use."""
        return self._underlay()

    def wire_port(self, ip: Optional[str] = None) -> tuple:
        """A fresh bridge-port name on the wire and an underlay address (``ip``, or the next
        free one): (port, ip), for builders that attach a namespace their own way
        (``wanlab``)."""
        n = self._next_host
        self._next_host += 1
        return f"h{n}", ip or f"{self.subnet}.{n}"

    def register_host(self, host: Host) -> None:
        """A host built elsewhere (``wanlab``'s site hosts) joins the lab's hosts: its daemons
        are torn down at close and its logs attached to failure reports."""
        if host not in self.hosts:
            self.hosts.append(host)
        self._save_state()

    def host(self, role: str, ip: Optional[str] = None) -> Host:
        """A new host namespace on the underlay."""
        h = Host(self, role, None)
        h.underlay_ip = self._attach(h, ip)
        self.hosts.append(h)
        self._save_state()
        return h

    def kernel_vxlan_host(self, role: str, vni: int = 1, peers: Iterable[str] = (), ip: Optional[str] = None) -> KernelVxlanHost:
        """A host namespace running the kernel VXLAN + bridge (created after its underlay address)."""
        # The vxlan device needs its `local` address to exist first, so build the namespace
        # and underlay, then the VXLAN parts.
        h = KernelVxlanHost(self, role, None)
        h.underlay_ip = self._attach(h, ip)
        h.setup_vxlan(vni, peers)
        self.hosts.append(h)
        self._save_state()
        return h

    def netns(self, role: str) -> Netns:
        return Netns(self, role)

    def guest(self, role: str, ip: Optional[str] = None, mac: Optional[str] = None) -> Guest:
        return Guest(self, role, ip, mac)

    def adopt_netns(self, name: str) -> None:
        """A namespace someone else made for this lab (a container runtime's, in /run/netns):
        if it is still there at close, what runs in it is killed and it is deleted, as ours."""
        if name not in self._namespaces:
            self._namespaces.append(name)
            self._save_state()

    def veth(self, a: Netns, a_dev: str, b: Netns, b_dev: str, up: bool = True) -> None:
        """A veth pair between two of the lab's namespaces (created directly inside ``a``)."""
        a.ip_link("add", a_dev, "type", "veth", "peer", "name", b_dev, "netns", b.name)
        if up:
            a.ip_link("set", a_dev, "up")
            b.ip_link("set", b_dev, "up")

    # -- measuring --
    def ping(self, src: Netns, dst: str, count: int = 2, interval: float = 0.2, wait: float = 1.0,
             deadline: Optional[float] = None) -> PingResult:
        """``count`` pings. With ``deadline`` (seconds), ping keeps sending until ``count`` are
        answered or the deadline passes, so late replies count (``sent`` may exceed ``count``)."""
        extra = ["-w", deadline] if deadline is not None else []
        r = src.exec("ping", "-c", count, "-i", interval, "-W", wait, *extra, "-q", dst, check=False,
                     timeout=(deadline if deadline is not None else count * (interval + wait)) + 15)
        return parse_ping(r.stdout + r.stderr)

    def ping_many(self, pairs: Iterable[tuple], count: int = 2, interval: float = 0.2, wait: float = 1.0) -> dict:
        """Ping several (src_ns, dst_ip) pairs concurrently; returns {(src, dst): PingResult}."""
        procs = {}
        for src, dst in pairs:
            procs[(src, dst)] = subprocess.Popen(
                ["ip", "netns", "exec", src.name, "ping", "-c", str(count), "-i", str(interval),
                 "-W", str(wait), "-q", dst], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self._procs.append(procs[(src, dst)])
        out = {}
        for k, p in procs.items():
            try:
                o, _ = p.communicate(timeout=count * (interval + wait) + 20)
            except subprocess.TimeoutExpired:
                stop_pid(p, signal.SIGKILL)
                o = ""
            out[k] = parse_ping(o)
        return out

    def wait_ping(self, src: Netns, dst: str, timeout: float = 15.0) -> float:
        """Ping once per attempt until a reply comes back; returns seconds it took."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        while True:
            if self.ping(src, dst, count=1, wait=1).ok:
                return time.monotonic() - t0
            if time.monotonic() > deadline:
                raise TimeoutError(f"no ping reply from {dst} (in {src.name}) within {timeout}s")
            time.sleep(0.2)

    def iperf(self, server: Netns, server_ip: str, client: Netns, seconds: float = 3,
              reverse: bool = False, port: int = 5201, extra: Iterable = ()) -> IperfResult:
        """iperf3 TCP test: a one-shot server (``-s -1``, tracked PID) in ``server``, the client
        in ``client``. Returns the receiver's goodput."""
        srv = server.popen("iperf3", "-s", "-1", "-p", port, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: f":{port} " in server.exec("ss", "-Htln").stdout, 10,
                       what=f"iperf3 server in {server.name}")
            args = ["iperf3", "-c", server_ip, "-p", port, "-t", seconds, "-J", *extra]
            if reverse:
                args.append("-R")
            r = client.exec(*args, check=False, timeout=seconds + 30)
            try:
                res = parse_iperf(r.stdout)
            except (ValueError, KeyError) as e:
                raise LabError(f"iperf3 failed ({e}): {r.stdout[-2000:]} {r.stderr[-2000:]}")
            return res
        finally:
            stop_pid(srv, timeout=3)

    # -- teardown --
    def logs(self, tail: int = 4000) -> str:
        """Tail of every vnetd log of this lab (for failure reports)."""
        parts = []
        for h in self.hosts:
            for d in getattr(h, "all_vnetd", []):
                parts.append(f"--- {d.log.name} (pid {d.pid}, rc {d.proc.returncode}) ---\n{d.log_text()[-tail:]}")
        return "\n".join(parts)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        # 1. our processes, by PID: vnetd first, then the rest
        daemons = {d.proc.pid for h in self.hosts for d in getattr(h, "all_vnetd", [])}
        for p in sorted(self._procs, key=lambda p: p.pid not in daemons):
            try:
                stop_pid(p, timeout=5)
            except Exception:
                pass
        # vnetd leaves its devices and pinned kernel objects for the next vnetd when it stops:
        # tear them down (the pins live on the machine's one bpffs, not in a namespace).
        for h in self.hosts:
            if getattr(h, "all_vnetd", None):
                try:
                    h.teardown_vnetd()
                except Exception:
                    pass
        # 2. namespaces (deleting one deletes its devices; veth peers go with them)
        _delete_namespaces(self._namespaces)
        self._namespaces.clear()
        try:
            (STATE_DIR / f"{self.id}.json").unlink()
        except OSError:
            pass
        if not (self.failed or self.keep_workdir):
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self in _live_labs:
            _live_labs.remove(self)

    def _save_state(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = STATE_DIR / f".{self.id}.tmp"
        tmp.write_text(json.dumps({"owner": os.getpid(), "namespaces": self._namespaces,
                                   "state_dirs": [str(h.state_dir) for h in self.hosts]}))
        tmp.replace(STATE_DIR / f"{self.id}.json")


def _netns_pids(name: str) -> list[int]:
    r = sh("ip", "netns", "pids", name, check=False)
    return [int(x) for x in r.stdout.split()] if r.returncode == 0 else []


def _delete_namespaces(names: Iterable[str]) -> None:
    """Delete namespaces; any process still inside one (necessarily started by us there)
    is killed by its PID first."""
    names = list(names)
    for n in names:
        for pid in _netns_pids(n):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    for n in reversed(names):  # guests/hosts before the wire
        if os.path.exists(f"/run/netns/{n}"):
            sh("ip", "netns", "del", n, check=False)


def sweep_stale() -> None:
    """Remove namespaces left by earlier labs whose owning process is gone."""
    if not STATE_DIR.is_dir():
        return
    for f in STATE_DIR.glob("*.json"):
        try:
            st = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if pid_alive(int(st.get("owner", 0))):
            continue
        # The pinned kernel objects of the dead lab's daemons (outside any namespace).
        for d in st.get("state_dirs", []):
            if os.path.isdir(d) and VNETD.exists():
                sh(VNETD, "--teardown", "--state-dir", d, check=False, timeout=15)
        _delete_namespaces(st.get("namespaces", []))
        try:
            f.unlink()
        except OSError:
            pass


def close_all() -> None:
    for lab in list(_live_labs):
        try:
            lab.close()
        except Exception:
            pass


atexit.register(close_all)


def install_signal_cleanup() -> None:
    """Make SIGTERM/SIGHUP behave like Ctrl-C so finalizers and atexit run."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    for s in (signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(s, handler)
        except ValueError:  # not the main thread
            pass


# --- ready-made topologies ------------------------------------------------------------------

@dataclass
class Mesh:
    """Hosts running vnetd, joined by links of one kind, each with guests on one VNI."""
    hosts: list
    guests: dict  # host role -> [Guest]
    vni: int

    def all_guests(self) -> list:
        return [g for gs in self.guests.values() for g in gs]

    def host_of(self, guest: Guest) -> Host:
        for h in self.hosts:
            if guest in self.guests[h.role]:
                return h
        raise KeyError(guest)

    @staticmethod
    def link_name(to: Host) -> str:
        return f"to-{to.role.lower()}"

    @staticmethod
    def vm_name(guest: Guest) -> str:
        return f"vm-{guest.role}"


def udp_mesh(lab: Lab, roles=("A", "B", "C"), guests_per_host: int = 2, vni: int = 1,
             subnet: str = "192.168.50", mtu: Optional[int] = None, kind: str = "tap") -> Mesh:
    """The spec's worked example: every host has ``guests_per_host`` guests (MAC
    52:54:00:VNI:HOST:N, IP SUBNET.<10*host+N>) on interfaces of ``kind`` (``tap`` or
    ``veth``) and a udp link to every other host; each guest MAC is routed to its interface or
    to the link of its host. Every vnetd starts from a config file (kept for restarts)."""
    hosts = [lab.host(r) for r in roles]
    guests = {}
    for hi, h in enumerate(hosts, 1):
        guests[h.role] = [lab.guest(f"{h.role.lower()}{j}", ip=f"{subnet}.{10 * hi + j}",
                                    mac=mac(vni, hi, j)) for j in range(1, guests_per_host + 1)]
    m = Mesh(hosts, guests, vni)
    for h in hosts:
        lines = [f"# host {h.role} ({h.underlay_ip}), VNI {vni}"]
        for g in guests[h.role]:
            lines.append(f"interface add {m.vm_name(g)} {kind} mac {g.mac} netns {g.name} vni {vni}"
                         + (f" mtu {mtu}" if mtu else ""))
        for o in hosts:
            if o is not h:
                lines.append(f"link add {m.link_name(o)} udp {o.underlay_ip} vni {vni}")
        for o in hosts:
            for g in guests[o.role]:
                dest = f"interface {m.vm_name(g)}" if o is h else f"link {m.link_name(o)}"
                lines.append(f"route add any {g.mac} {dest}")
        h.start_vnetd(config="\n".join(lines) + "\n")
        for g in guests[h.role]:
            g.configure(h.interface(m.vm_name(g))["ifname"], mtu)
    return m


def tcp_pair(lab: Lab) -> tuple:
    """Two hosts on a TCP link: A listens on its underlay address (port 7700) and accepts B,
    B dials; one guest each (a1 192.168.50.11 on A's ``vm-a1``, b1 .21 on B's ``vm-b1``), on
    links ``to-b`` and ``to-a``. Returns (A, B, a1, b1) once the link is up on both sides."""
    A, B = lab.host("A"), lab.host("B")
    a1 = lab.guest("a1", ip="192.168.50.11", mac=mac(1, 1, 1))
    b1 = lab.guest("b1", ip="192.168.50.21", mac=mac(1, 2, 1))
    A.start_vnetd(config=f"""
interface add vm-a1 tap mac {a1.mac} netns {a1.name}
listen tcp {A.underlay_ip}:7700
link add to-b tcp accept {B.underlay_ip}
route add any {a1.mac} interface vm-a1
route add any {b1.mac} link to-b
""")
    B.start_vnetd(config=f"""
interface add vm-b1 tap mac {b1.mac} netns {b1.name}
link add to-a tcp {A.underlay_ip}:7700
route add any {b1.mac} interface vm-b1
route add any {a1.mac} link to-a
""")
    a1.configure(A.interface("vm-a1")["ifname"])
    b1.configure(B.interface("vm-b1")["ifname"])
    wait_until(lambda: A.link_state("to-b") == "up" and B.link_state("to-a") == "up", 10,
               what="tcp link up on both sides")
    return A, B, a1, b1
