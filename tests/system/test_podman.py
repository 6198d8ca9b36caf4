"""The CNI plugin through podman (issue #17), a runtime users run: real podman containers on
a vnet overlay of two hosts from etcd, each host's podman (Debian's 4.3, CNI backend) given a
network whose conflist is ``vnet-cni`` + Debian's ``host-local``. Checked: the containers get
their addresses and ping each other across the overlay (vnet's link counters, the kernel's
share, carry the pings); a ping every 10 ms between them loses nothing while the first host's
vnetd is SIGKILLed and started again, and SIGTERMed and started again (the containers' veth
are forwarded by the pinned kernel fast path meanwhile) and the container keeps its eth0;
``podman stop`` and a container exiting on its own detach it from vnetd and the host, and a
``podman rm`` while vnetd is down queues the DEL in vnetd's state directory for the next
vnetd. Every container is removed by name at the end, also on failure; podman's storage, run
and tmp directories are in the lab's work directory.

How podman runs here (what failed, and why):
- runc, not crun (crun refuses this machine's hybrid cgroups); ``--cgroup-manager cgroupfs``.
- No image registry: ``--storage-driver vfs --rootfs DIR``, a busybox-static tree.
- podman's default rlimits for root's containers (nofile 1048576, nproc 4194304) are above
  those of conmon (nproc 32768, nofile 20000 here), and root here lacks CAP_SYS_RESOURCE to
  raise them: runc fails with "error setting rlimit type 6 (nproc): operation not permitted"
  (also with nproc 60000). The containers get ``--ulimit nofile=1024:1024 nproc=1024:1024``.
- podman refuses a run root longer than 50 characters (conmon's socket paths) and the lab's
  work directory is longer: the run root is a short link in /tmp to a directory in it.
- ``cniVersion`` 1.1.0 fails (podman 4.3's libcni: "unsupported CNI result version"): 1.0.0.
- podman runs in the host's namespace through ``nsenter --net``, not ``ip netns exec``
  (which mounts a /sys of its own and hides the cgroup mounts), in the mount namespace vnetd
  runs in: podman 4.3 names the container's namespace /run/netns/netns-UUID and vnetd moves
  the veth there by that name.
- The network settings (backend ``cni``, ``cni_plugin_dirs`` with vnet-cni and /usr/lib/cni,
  ``network_config_dir``) are in a containers.conf of the test's (``CONTAINERS_CONF``), which
  conmon's exit command (``podman container cleanup``, the DEL of a container that exits on
  its own) inherits.
- Outside the work directory podman 4.3 still uses libcni's result cache
  (/var/lib/cni/results) and runc's state (/run/runc): one entry per container, gone with it.
- The DEL runs when the container stops (``podman stop``, its process exiting, ``rm -f`` of a
  running one), not at ``rm`` of a stopped one."""

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from vnetlab import netlab
from test_cni import CniHost, CNI_DIR, NET, VNET_CNI
from test_etcd import EtcdServer, TTL

PODMAN = shutil.which("podman") or "/usr/bin/podman"
BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "ping", "ip", "sleep", "cat")
PING_INTERVAL = 0.01


def _limits() -> list:
    """``--ulimit`` options within the test's own limits (podman's defaults are above them)."""
    out = []
    for name, res in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        n = min(resource.getrlimit(res)[0], 1024)
        out += ["--ulimit", f"{name}={n}:{n}"]
    return out


class Podman:
    """podman in a host's network namespace, everything of its own in the lab's work
    directory; the containers it ran are removed by name at the end."""

    def __init__(self, lab, host: CniHost):
        self.lab, self.host = lab, host
        self.dir = lab.workdir / f"podman-{host.h.role}"
        self.rootfs = self.dir / "rootfs"
        (self.rootfs / "bin").mkdir(parents=True)
        shutil.copy(BUSYBOX, self.rootfs / "bin" / "busybox")
        for a in APPLETS:
            os.symlink("busybox", self.rootfs / "bin" / a)
        # podman 4.3's libcni speaks CNI up to 1.0.0.
        conflist = host.dir / "net.d" / f"{NET}.conflist"
        conf = json.loads(conflist.read_text())
        conf["cniVersion"] = "1.0.0"
        conflist.write_text(json.dumps(conf, indent=1))
        self.conf = self.dir / "containers.conf"
        self.conf.write_text(
            "[network]\n"
            'network_backend = "cni"\n'
            f'cni_plugin_dirs = ["{host.dir / "bin"}", "{CNI_DIR}"]\n'
            f'network_config_dir = "{host.dir / "net.d"}"\n')
        # podman refuses a run root of more than 50 characters (conmon's socket paths): a
        # short link to the one in the work directory.
        (self.dir / "run").mkdir()
        self.runroot = Path(f"/tmp/vnetlab-pm-{lab.id}-{host.h.role}")
        self.runroot.symlink_to(self.dir / "run")
        self.names: list[str] = []

    def argv(self, *args) -> list:
        """``podman ARGS`` with our configuration, to run in the host's network namespace."""
        return ["env", f"CONTAINERS_CONF={self.conf}",
                PODMAN, "--root", self.dir / "root", "--runroot", self.runroot,
                "--tmpdir", self.dir / "tmp", "--storage-driver", "vfs", "--runtime", "runc",
                "--cgroup-manager", "cgroupfs", "--events-backend", "none", *args]

    def __call__(self, *args, check=True, timeout=60) -> subprocess.CompletedProcess:
        r = netlab.sh("nsenter", f"--net=/run/netns/{self.host.h.name}", *self.argv(*args),
                      check=False, timeout=timeout)
        if check and r.returncode != 0:
            raise netlab.LabError(f"podman {' '.join(map(str, args))} on {self.host.h.role}: "
                                  f"rc={r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def run(self, name: str, *cmd) -> str:
        """``podman run -d`` on the vnet network; returns the container's network namespace
        (its name in /run/netns), which the lab deletes if podman leaves it behind."""
        self.names.append(name)
        self("run", "-d", "--name", name, "--network", NET, *_limits(), "--rootfs", self.rootfs,
             *(cmd or ("sleep", "600")))
        sandbox = self.inspect(name, "{{.NetworkSettings.SandboxKey}}")
        assert sandbox.startswith("/run/netns/"), sandbox
        self.lab.adopt_netns(Path(sandbox).name)
        return Path(sandbox).name

    def inspect(self, name: str, fmt: str) -> str:
        return self("inspect", name, "--format", fmt).stdout.strip()

    def exec(self, name: str, *cmd, check=True, timeout=60) -> subprocess.CompletedProcess:
        return self("exec", name, *cmd, check=check, timeout=timeout)

    def popen(self, name: str, *cmd) -> subprocess.Popen:
        """``podman exec`` in the background (stopped by PID by the lab at the latest)."""
        return self.host.h.popen(*self.argv("exec", name, *cmd), host_mounts=True, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)

    def containers(self) -> list:
        return self("ps", "-a", "--format", "{{.Names}}").stdout.split()

    def eth0(self, name: str) -> dict:
        """The container's eth0 as ``podman exec NAME ip`` (busybox) shows it."""
        out = self.exec(name, "ip", "addr", "show", "eth0").stdout
        m = re.search(r"^(\d+): eth0(?:@\S+)?: .*? mtu (\d+).*?link/ether (\S+).*?inet (\S+)", out, re.S | re.M)
        assert m, f"no eth0 with an IPv4 address in {name}:\n{out}"
        return {"ifindex": int(m.group(1)), "mtu": int(m.group(2)), "mac": m.group(3), "inet": m.group(4)}

    def mounts(self) -> list:
        """Mount points podman left in its directories."""
        with open("/proc/self/mountinfo") as f:
            return [l.split()[4] for l in f if l.split()[4].startswith(str(self.dir))]

    def cleanup(self) -> None:
        """Remove our containers by name (a running one is stopped: its DEL runs, or is
        queued while vnetd is down), then anything podman left mounted."""
        if self.names:
            self("rm", "-f", "-i", "-t", "0", *self.names, check=False)
        for m in sorted(self.mounts(), key=len, reverse=True):
            netlab.sh("umount", "-l", m, check=False)
        self.runroot.unlink(missing_ok=True)


@pytest.fixture
def overlay(lab):
    """etcd, and a function making a host of its overlay with its podman."""
    for p, what in ((Path(PODMAN), "podman (scripts/setup.sh installs it)"),
                    (Path("/usr/sbin/runc"), "runc (scripts/setup.sh installs it)"),
                    (BUSYBOX, "busybox (busybox-static, scripts/setup.sh installs it)"),
                    (CNI_DIR / "host-local", "host-local (Debian's containernetworking-plugins)"),
                    (VNET_CNI, "vnet-cni (cargo build --release)")):
        if not p.exists() and not shutil.which(p.name):
            pytest.fail(f"{p} is missing: {what}")
    etcd = EtcdServer(lab)
    etcd.start()
    made = []

    def host(role, first, last):
        h = CniHost(lab, etcd, role, first, last)
        pm = Podman(lab, h)
        made.append(pm)
        return h, pm

    host.etcd = etcd
    try:
        yield host
    finally:
        for pm in made:
            pm.cleanup()
        etcd.stop()


def vnetd_interface(host: CniHost, netns: str) -> dict:
    """vnetd's interface for the container whose namespace is ``netns``."""
    found = [i for i in host.cni_interfaces() if i["netns"] == netns]
    assert len(found) == 1, f"vnetd on {host.h.role} has {len(found)} interfaces in {netns}: {host.cni_interfaces()}"
    return found[0]


def placed(etcd, mac: str) -> bool:
    return any(i["mac"] == mac for i in json.loads(etcd.ctl("interfaces", "json")))


def assert_detached(host: CniHost, netns: str, mac: str, devices: set, etcd) -> None:
    """Nothing left of an attachment: in vnetd, on the host, in host-local's store, in etcd."""
    assert not [i for i in host.cni_interfaces() if i["netns"] == netns], host.cni_interfaces()
    assert set(host.h.links()) == devices, f"devices left on {host.h.role}: {set(host.h.links()) ^ devices}"
    assert host.allocations() == [], host.allocations()
    assert not os.path.exists(f"/run/netns/{netns}"), f"the container's namespace {netns} stayed"
    netlab.wait_until(lambda: not placed(etcd, mac), 10, what=f"the placement of {mac} to leave etcd")


def kernel_share(before: dict, after: dict, link: str, key: str) -> int:
    """What the kernel fast path counted on a link between two ``show stats json``."""
    def get(st):
        return netlab.port_of(st, link).get("kernel", {}).get(key, 0)
    return get(after) - get(before)


def ping_counts(out: str) -> tuple:
    m = re.search(r"(\d+) packets transmitted, (\d+) packets received", out)
    assert m, f"no ping summary in:\n{out[-800:]}"
    return int(m.group(1)), int(m.group(2))


def test_podman_containers_on_the_overlay_outlive_vnetd(lab, overlay, record):
    a, pa = overlay("h1", "10.77.0.10", "10.77.0.59")
    b, pb = overlay("h2", "10.77.0.60", "10.77.0.109")
    devices = {a: set(a.h.links()), b: set(b.h.links())}
    ns1 = pa.run("c1")
    ns2 = pb.run("c2")
    # podman's answer, the container's own view and vnetd's agree.
    e1, e2 = pa.eth0("c1"), pb.eth0("c2")
    assert e1["inet"] == "10.77.0.10/24" and e2["inet"] == "10.77.0.60/24", (e1, e2)
    assert json.loads(pa.inspect("c1", "{{json .NetworkSettings.Networks}}"))[NET]["IPAddress"] == "10.77.0.10"
    i1, i2 = vnetd_interface(a, ns1), vnetd_interface(b, ns2)
    assert i1["kind"] == "veth" and i1["path"] == "kernel" and i1["vni"] == 5, i1
    assert i1["mac"] == e1["mac"] and i2["mac"] == e2["mac"] and e1["mtu"] == 1400

    # Across the overlay: the pings are on the link between the hosts, in the kernel's share.
    t = time.monotonic()
    netlab.wait_until(lambda: pa.exec("c1", "ping", "-c", "1", "-W", "1", "10.77.0.60", check=False).returncode == 0,
                      20, interval=0.2, what="c1 to ping c2")
    record("first_ping_s", round(time.monotonic() - t, 2))
    count, size = 50, 1000
    before_a, before_b = a.h.stats(), b.h.stats()
    out = pa.exec("c1", "ping", "-c", count, "-i", PING_INTERVAL, "-s", size, "-q", "10.77.0.60").stdout
    after_a, after_b = a.h.stats(), b.h.stats()
    assert ping_counts(out) == (count, count), out
    record("ping_rtt_ms", re.search(r"= ([\d.]+/[\d.]+/[\d.]+) ms", out).group(1))
    ka = kernel_share(before_a, after_a, "c-h2-v5", "tx_bytes")
    kb = kernel_share(before_b, after_b, "c-h1-v5", "rx_bytes")
    assert netlab.delta(before_a, after_a, "c-h2-v5", "tx_bytes") >= count * size
    assert ka >= count * size and kb >= count * size, \
        f"the pings were not on the overlay link in the kernel: h1 sent {ka} B, h2 received {kb} B"

    # vnetd on h1 SIGKILLed, then SIGTERMed, each time down for a second and started again,
    # under a ping every 10 ms from c1 to c2 (both ways through h1's fast path).
    down_s = 1.0
    # (5 s of slack: the restarts' own time, two podman execs and control calls, varies)
    n = int((0.5 + 2 * (down_s + 0.5) + (TTL + 1) + 2 + 5) / PING_INTERVAL)
    before = a.h.stats()
    pinger = pa.popen("c1", "ping", "-c", n, "-i", PING_INTERVAL, "-W", 2, "10.77.0.60")
    time.sleep(0.5)
    restarts = {}
    for sig, hold in ((signal.SIGKILL, TTL + 1), (signal.SIGTERM, 1)):
        t0 = time.monotonic()
        a.h.stop_vnetd(sig=sig)
        time.sleep(down_s)  # no vnetd: only the pinned kernel fast path forwards
        a.h.start_vnetd(args=netlab.own_args(a.h.vnetd))
        restarts[sig.name] = round(time.monotonic() - t0 - down_s, 3)
        assert pinger.poll() is None, "the ping ended before the restarts did: raise its count"
        # The container keeps its NIC and address; the new vnetd adopted the interface.
        assert pa.eth0("c1") == e1, (pa.eth0("c1"), e1)
        i = vnetd_interface(a, ns1)
        assert (i["name"], i["mac"], i["path"]) == (i1["name"], i1["mac"], "kernel"), i
        time.sleep(hold)  # past the killed daemon's lease (TTL) in etcd
    assert pinger.poll() is None, "the ping ended before the restarts did: raise its count"
    out, _ = pinger.communicate(timeout=n * PING_INTERVAL * 3 + 30)
    after = a.h.stats()
    sent, received = ping_counts(out)
    seqs = {int(s) for s in re.findall(r"seq=(\d+)", out)}
    lost = sorted(set(range(sent)) - seqs)
    record("vnetd_down_s", down_s)
    record("vnetd_stop_and_start_s", restarts)
    record("ping_10ms_across_restarts", {"sent": sent, "received": received, "lost_seq": lost[:20]})
    assert sent == n and received == sent and not lost, \
        f"{sent - received} of {sent} pings lost across vnetd's restarts (seq {lost[:20]}): {out[-300:]}"
    kernel_tx = kernel_share(before, after, "c-h2-v5", "tx_frames")
    assert kernel_tx >= n, f"the kernel fast path sent {kernel_tx} frames on the link for {n} pings"

    # Removed by name: nothing left in podman, vnetd, the hosts, host-local's store or etcd.
    for host, pm, name, ns, iface in ((a, pa, "c1", ns1, i1), (b, pb, "c2", ns2, i2)):
        pm("rm", "-f", "-t", "0", name)
        assert pm.containers() == [] and pm.mounts() == [], (pm.containers(), pm.mounts())
        assert_detached(host, ns, iface["mac"], devices[host], overlay.etcd)


def test_podman_stop_and_rm_detach_also_while_vnetd_is_down(lab, overlay, record):
    a, pa = overlay("h1", "10.77.0.10", "10.77.0.59")
    devices = set(a.h.links())

    # podman stop: its DEL takes the interface out of vnetd and the devices off the host.
    ns = pa.run("c1")
    mac = vnetd_interface(a, ns)["mac"]
    assert a.allocations() == ["10.77.0.10"]
    netlab.wait_until(lambda: placed(overlay.etcd, mac), 10, what="the container's placement in etcd")
    pa("stop", "-t", "0", "c1")
    assert_detached(a, ns, mac, devices, overlay.etcd)
    pa("rm", "c1")
    assert pa.containers() == []

    # A container whose command exits: conmon's exit command (podman container cleanup) runs DEL.
    ns = pa.run("c2", "sleep", "1")
    mac = vnetd_interface(a, ns)["mac"]
    netlab.wait_until(lambda: pa.inspect("c2", "{{.State.Status}}") == "exited", 15, what="c2 to exit")
    netlab.wait_until(lambda: not os.path.exists(f"/run/netns/{ns}"), 10, what="c2's cleanup")
    assert_detached(a, ns, mac, devices, overlay.etcd)
    pa("rm", "c2")

    # podman rm -f while no vnetd runs: the DEL is queued in its state directory (stateDir in
    # the conflist) and the next vnetd takes the interface out. (podman deletes the namespace,
    # so the next vnetd could not restore the interface anyway: the queue is checked itself.)
    ns = pa.run("c3")
    iface = vnetd_interface(a, ns)
    assert a.h.stop_vnetd() == 0
    pa("rm", "-f", "-t", "0", "c3")
    assert pa.containers() == []
    queue = a.h.state_dir / "cni-deleted"
    queued = sorted(p.name for p in queue.iterdir()) if queue.is_dir() else []
    assert queued == [iface["name"]], f"DEL while vnetd was down not queued in {queue}: {queued}"
    assert a.allocations() == [] and not os.path.exists(f"/run/netns/{ns}")
    t0 = time.monotonic()
    a.h.start_vnetd(args=netlab.own_args(a.h.vnetd))
    record("queued_del_start_s", round(time.monotonic() - t0, 3))
    assert a.cni_interfaces() == [], f"the next vnetd kept the deleted container's interface: {a.cni_interfaces()}"
    assert not (queue / iface["name"]).exists(), "the queued deletion stayed in the state directory"
    assert_detached(a, ns, iface["mac"], devices, overlay.etcd)
    assert pa.mounts() == [], pa.mounts()
