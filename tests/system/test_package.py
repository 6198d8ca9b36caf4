"""The Debian package (issue #12): ``bash scripts/package.sh`` builds it; the test installs it
into a clean directory tree (``dpkg-deb -x``: this machine's dpkg database stays untouched),
checks what it holds, runs ``systemd-analyze verify`` and the offline ``security`` review on
its unit, and starts the installed vnetd as the unit would (its ExecStart with the installed
/etc/default/vnetd) chrooted into that tree with the installed /etc/vnet/vnet.conf.

This machine has no systemd as PID 1, so the unit cannot be started by systemd itself: what
systemd would add (the sandboxing settings) is checked offline, the daemon's start and its
configuration for real."""

import gzip
import json
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from vnetlab import httplab
from vnetlab import netlab

REPO = netlab.REPO


@pytest.fixture(scope="module")
def debs_dir(tmp_path_factory):
    """Where this module keeps the packages it built (cargo-deb may replace what is in
    target/debian/)."""
    return tmp_path_factory.mktemp("debs")


@pytest.fixture(scope="module")
def deb(debs_dir):
    r = subprocess.run(["bash", "scripts/package.sh"], cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    path = Path(r.stdout.strip().splitlines()[-1])
    assert path.exists() and path.suffix == ".deb", r.stdout
    return Path(shutil.copy(path, debs_dir / path.name))


def extract(deb: Path, root: Path) -> None:
    subprocess.run(["dpkg-deb", "-x", deb, root], check=True)


def unit_env(root: Path) -> tuple:
    """(ExecStart argv, VNETD_ARGS) as systemd would expand them for the installed unit."""
    unit = (root / "usr/lib/systemd/system/vnetd.service").read_text()
    exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1)
    env_file = re.search(r"^EnvironmentFile=-?(.*)$", unit, re.M).group(1)
    env = {}
    for line in (root / env_file.lstrip("/")).read_text().splitlines():
        m = re.match(r"^([A-Z_]+)=(.*)$", line)
        if m:
            env[m.group(1)] = " ".join(shlex.split(m.group(2)))
    # systemd: an unquoted $VAR is split at white space into several arguments.
    argv = []
    for w in exec_start.split():
        argv += env.get(w[1:], "").split() if w.startswith("$") else [w]
    return argv, env


def test_package_installs_and_starts(lab, deb, record):
    root = lab.workdir / "root"
    root.mkdir()
    extract(deb, root)
    record("deb", str(deb))
    record("deb_bytes", deb.stat().st_size)

    # What an operator gets.
    info = subprocess.run(["dpkg-deb", "--field", deb, "Package", "Depends"], capture_output=True,
                          text=True, check=True).stdout
    assert "Package: vnet" in info and "iproute2" in info
    for f in ("usr/bin/vnetd", "usr/bin/vnetctl", "usr/lib/cni/vnet-cni",
              "usr/lib/systemd/system/vnetd.service", "etc/vnet/vnet.conf", "etc/default/vnetd",
              "usr/share/doc/vnet/examples/vnet.conflist", "usr/share/doc/vnet/copyright"):
        assert (root / f).exists(), f
    conffiles = subprocess.run(["dpkg-deb", "-I", deb, "conffiles"], capture_output=True, text=True).stdout
    assert "/etc/vnet/vnet.conf" in conffiles and "/etc/default/vnetd" in conffiles
    for page, name in (("usr/share/man/man8/vnetd.8.gz", "vnetd"), ("usr/share/man/man1/vnetctl.1.gz", "vnetctl"),
                       ("usr/share/man/man8/vnet-cni.8.gz", "vnet-cni")):
        text = gzip.decompress((root / page).read_bytes()).decode()
        assert text.lstrip().startswith((".TH", ".\\\"")) and name in text, page
    assert "--etcd" in gzip.decompress((root / "usr/share/man/man8/vnetd.8.gz").read_bytes()).decode().replace("\\-", "-")
    json.loads((root / "usr/share/doc/vnet/examples/vnet.conflist").read_text())
    r = subprocess.run([root / "usr/lib/cni/vnet-cni"], env={"CNI_COMMAND": "VERSION"},
                       capture_output=True, text=True)
    assert "1.1.0" in json.loads(r.stdout)["supportedVersions"]

    # The unit, checked by systemd's own tools against the installed tree (plus this
    # machine's systemd units, which the unit's dependencies name).
    units = root / "usr/lib/systemd/system"
    for u in Path("/usr/lib/systemd/system").iterdir():
        if not (units / u.name).exists():
            if u.is_symlink():
                (units / u.name).symlink_to(u.readlink())
            elif u.is_file():
                shutil.copy(u, units / u.name)
    r = subprocess.run(["systemd-analyze", "verify", f"--root={root}", "--man=no",
                        "/usr/lib/systemd/system/vnetd.service"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(["systemd-analyze", "security", "--offline=yes", f"--root={root}", "vnetd.service"],
                       capture_output=True, text=True)
    m = re.search(r"Overall exposure level for vnetd.service: ([\d.]+)", r.stdout + r.stderr)
    assert m, r.stdout[-2000:] + r.stderr[-2000:]
    record("systemd_security_exposure", float(m.group(1)))
    assert float(m.group(1)) <= 5.0, r.stdout[-3000:]
    # verify does fail on a broken unit (so the check above means something).
    (units / "broken.service").write_text((units / "vnetd.service").read_text()
                                          .replace("ExecStart=/usr/bin/vnetd", "ExecStart=/usr/bin/vnetd-missing"))
    r = subprocess.run(["systemd-analyze", "verify", f"--root={root}", "--man=no",
                        "/usr/lib/systemd/system/broken.service"], capture_output=True, text=True)
    assert r.returncode != 0

    # The package's maintainer scripts as dpkg runs them at install: a token for the control
    # port, root only, which the installed default flags name.
    run_script(lab, deb, root, "postinst", "configure")
    token = root / "etc/vnet/token"
    assert token.exists() and (token.stat().st_mode & 0o777) == 0o600
    assert len(token.read_text().strip()) >= 32
    before = token.read_text()
    run_script(lab, deb, root, "postinst", "configure", "0.1.0-1")
    assert token.read_text() == before, "an upgrade replaced the token"

    # The installed daemon from the installed configuration, as the unit starts it, in a
    # chroot of the tree (this machine's libc bind-mounted in, in a private mount namespace
    # that goes with the process). The administrator added a link to the installed config.
    with open(root / "etc/vnet/vnet.conf", "a") as f:
        f.write("link add to-b udp 10.99.0.9\n")
    argv, env = unit_env(root)
    record("exec_start", argv)
    assert argv[0] == "/usr/bin/vnetd" and "--config" in argv and "/etc/vnet/vnet.conf" in argv
    assert "--token-file" in argv and "/etc/vnet/token" in argv
    h = lab.host("pkg")
    h.token_file = token
    proc = None
    pins = None
    try:
        proc = start_installed(lab, h, root, argv)
        pins = pin_dir(root)
        assert pins.is_dir(), f"the installed vnetd pinned nothing at {pins}"
        assert "to-b" in h.ctl("show", "links")
        assert "link add to-b udp 10.99.0.9" in h.ctl("show", "config")
        # Without the token, the control port refuses.
        r = h.exec(netlab.VNETCTL, "--token-file", "/dev/null", "show", "links", check=False)
        assert r.returncode != 0
        # The installed default turns the HTTP listener on, on loopback (the token too).
        st, _, body = httplab.http_get(h, "http://127.0.0.1:9300/metrics",
                                       headers={"Authorization": f"Bearer {token.read_text().strip()}"})
        assert st == 200 and b'vnet_link_state{link="to-b",state="up"} 1' in body
    finally:
        if proc is not None:
            netlab.stop_pid(proc)
        # A stop leaves the overlay for the next vnetd: this one is the last.
        teardown_installed(h, root)
    assert proc.returncode == 0, (lab.workdir / "vnetd-installed.log").read_text()[-3000:]
    assert pins is not None and not pins.exists()


def pin_dir(root: Path) -> Path:
    """Where the installed vnetd pinned its fast path (its own directory in bpffs, named by
    its instance and network namespace: its state directory says which)."""
    return Path(json.loads((root / "var/lib/vnet/host.json").read_text())["bpf_dir"])


def teardown_installed(h, root: Path, check: bool = True) -> None:
    """What the package's removal does: the installed vnetd's teardown of its state directory."""
    r = subprocess.run(["nsenter", f"--net=/run/netns/{h.name}", root / "usr/bin/vnetd", "--teardown",
                        "--state-dir", root / "var/lib/vnet"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 or not check, r.stderr


def run_script(lab, deb: Path, root: Path, name: str, *args, netns=None) -> None:
    """A maintainer script of ``deb`` as dpkg runs it for a package installed under ``root``
    (``DPKG_ROOT``), with systemd's helpers stubbed out (no systemd as PID 1 here: the scripts
    must not touch this machine's own units)."""
    ctrl = lab.workdir / f"ctrl-{deb.stem}"
    if not ctrl.exists():
        subprocess.run(["dpkg-deb", "-e", deb, ctrl], check=True)
    stubs = lab.workdir / "stubs"
    stubs.mkdir(exist_ok=True)
    for tool in ("deb-systemd-helper", "deb-systemd-invoke", "systemctl"):
        (stubs / tool).write_text("#!/bin/sh\nexit 0\n")
        (stubs / tool).chmod(0o755)
    argv = ["sh", "-e", str(ctrl / name), *args]
    if netns is not None:
        argv = ["nsenter", f"--net=/run/netns/{netns.name}", *argv]
    import os
    env = dict(os.environ, DPKG_ROOT=str(root), PATH=f"{stubs}:{os.environ['PATH']}")
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{name} {args}: {r.stdout[-2000:]} {r.stderr[-2000:]}"


def start_installed(lab, h, root: Path, argv: list, log_name="vnetd-installed.log"):
    """The installed vnetd as its unit starts it, chrooted into ``root``, in host ``h``'s
    network namespace and this machine's mounts (bpffs at /sys/fs/bpf, where it pins its fast
    path, and the named namespaces of the guests bound into the tree). Returns once its
    control port answers."""
    (root / "usr/lib64").mkdir(exist_ok=True)
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True, exist_ok=True)
    for link, target in (("lib64", "usr/lib64"), ("lib", "usr/lib")):
        if not (root / link).exists():
            (root / link).symlink_to(target)
    for d in ("dev", "proc", "run/vnet", "run/netns", "tmp", "sys"):
        (root / d).mkdir(parents=True, exist_ok=True)
    # /sys as systemd gives the service: libbpf reads the kernel's BTF and the CPU count there,
    # and bpffs is mounted at /sys/fs/bpf.
    binds = (("/usr/lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"), ("/usr/lib64", "usr/lib64"),
             ("/dev", "dev"), ("/proc", "proc"), ("/run/netns", "run/netns"), ("/sys", "sys"))
    # --rbind: the named namespaces are mounts of their own under /run/netns.
    mounts = " && ".join(f"mount --rbind {src} {root}/{dst}" for src, dst in binds)
    script = (f"(mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf) && {mounts} && "
              f"exec chroot {root} {shlex.join(argv)}")
    log = open(lab.workdir / log_name, "ab")
    proc = h.popen("unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, host_mounts=True)
    log.close()
    netlab.wait_until(lambda: h.ctl("show", "links", check=False, timeout=5).returncode == 0
                      or proc.poll() is not None, 15, 0.1, what="the installed vnetd")
    assert proc.poll() is None, (lab.workdir / log_name).read_text()[-3000:]
    return proc


@pytest.fixture(scope="module")
def rebuilt_deb(deb, debs_dir):
    """The same package rebuilt as the next revision (what an upgrade installs)."""
    r = subprocess.run(["cargo", "deb", "-p", "vnetd", "--no-build", "--strip", "--deb-revision", "2"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    path = Path(r.stdout.strip().splitlines()[-1])
    assert path.exists() and path.name.endswith("-2_amd64.deb"), r.stdout
    assert path.read_bytes() != deb.read_bytes()
    return Path(shutil.copy(path, debs_dir / path.name))


def test_upgrade_by_a_rebuilt_deb_loses_nothing(lab, deb, rebuilt_deb, record):
    """Issue #17: the installed vnetd serves a guest from its config file and one added at run
    time (as the CNI plugin adds a container), both on the kernel fast path, with a ping every
    10 ms and a TCP stream to another host; the package is upgraded (the new files unpacked
    over the old, its postinst, and the restart its unit gets): no ping is lost, the stream
    goes on, the guests keep their devices. Then removing the package takes the overlay away
    (its prerm tears down), and a purge deletes the token and the state."""
    from test_restart import Pinger, Stream, ifindex, addresses
    root = lab.workdir / "root"
    root.mkdir()
    extract(deb, root)
    run_script(lab, deb, root, "postinst", "configure")
    A, B = lab.host("A"), lab.host("B")
    a1 = lab.guest("a1", ip="192.168.83.11", mac=netlab.mac(9, 1, 1))
    a2 = lab.guest("a2", ip="192.168.83.12", mac=netlab.mac(9, 1, 2))
    b1 = lab.guest("b1", ip="192.168.83.21", mac=netlab.mac(9, 2, 1))
    B.start_vnetd(config=f"""
interface add vm veth mac {b1.mac} netns {b1.name} mtu 1450
link add peer udp {A.underlay_ip}
route add any {b1.mac} interface vm
route add any {a1.mac} link peer
route add any {a2.mac} link peer
""")
    b1.configure(B.interface("vm")["ifname"], 1450)
    (root / "etc/vnet/vnet.conf").write_text(f"""interface add vm-a1 veth mac {a1.mac} netns {a1.name} mtu 1450
link add peer udp {B.underlay_ip}
route add any {a1.mac} interface vm-a1
route add any {b1.mac} link peer
""")
    argv, _ = unit_env(root)
    A.token_file = root / "etc/vnet/token"
    proc = None
    try:
        proc = start_installed(lab, A, root, argv)
        A.add_vm(a2, "cni-a2", a2.mac, kind="veth", mtu=1450)
        a1.configure(A.interface("vm-a1")["ifname"], 1450)
        for g in (a1, a2):
            lab.wait_ping(g, b1.ip_addr, timeout=10)
        assert A.interface("vm-a1")["path"] == "kernel"
        pins = pin_dir(root)
        assert pins.is_dir(), f"the installed vnetd pinned nothing at {pins}"
        devs = {g.name: (ifindex(g, A.interface(n)["ifname"]), addresses(g, A.interface(n)["ifname"]))
                for g, n in ((a1, "vm-a1"), (a2, "cni-a2"))}
        pings = [Pinger(a1, b1.ip_addr), Pinger(b1, a2.ip_addr)]
        stream = Stream(lab, b1, b1.ip_addr, a1, seconds=6)
        time.sleep(1.5)
        # The upgrade as dpkg and systemd do it: the new files over the old (the running
        # binary is replaced, not written into), the new postinst, then the unit's restart.
        t0 = time.monotonic()
        # dpkg keeps conffiles the administrator changed (dpkg-deb -x would not).
        conffiles = {f: (root / f).read_bytes() for f in ("etc/vnet/vnet.conf", "etc/default/vnetd")}
        extract(rebuilt_deb, root)
        for f, data in conffiles.items():
            (root / f).write_bytes(data)
        run_script(lab, rebuilt_deb, root, "postinst", "configure", "0.1.0-1")
        netlab.stop_pid(proc)
        assert proc.returncode == 0, (lab.workdir / "vnetd-installed.log").read_text()[-3000:]
        proc = start_installed(lab, A, root, argv)
        record("upgrade_s", round(time.monotonic() - t0, 2))
        time.sleep(3)
        results = [p.stop() for p in pings]
        st = stream.result()
        record("upgrade_pings", [{k: v for k, v in r.items() if k != "tail"} for r in results])
        record("upgrade_tcp", st)
        for r in results:
            assert r["sent"] > 300 and r["lost"] == 0, r
        assert st["error"] is None and st["min_interval_gbps"] > 0, st
        assert {i["name"] for i in A.ctl_json("show", "interfaces", "json")} == {"vm-a1", "cni-a2"}
        after = {g.name: (ifindex(g, A.interface(n)["ifname"]), addresses(g, A.interface(n)["ifname"]))
                 for g, n in ((a1, "vm-a1"), (a2, "cni-a2"))}
        assert after == devs, "a guest's device was replaced"
        log = (lab.workdir / "vnetd-installed.log").read_text()
        assert "takeover complete written=0 deleted=0" in log, log[-3000:]
        assert pin_dir(root) == pins, "the upgraded vnetd pinned elsewhere"
    except BaseException:
        if proc is not None:
            netlab.stop_pid(proc)
        teardown_installed(A, root, check=False)
        raise
    netlab.stop_pid(proc)
    # Removal: the prerm stops vnetd (systemd's part, stubbed) and tears the overlay down.
    run_script(lab, rebuilt_deb, root, "prerm", "remove", netns=A)
    assert not pins.exists(), "the pinned fast path stayed after the package's removal"
    assert not [n for n in A.links() if n.startswith(("vh-", "vp-"))]
    assert not [n for n in a1.links() if n.startswith("vn-")]
    assert lab.ping(a1, b1.ip_addr, count=2, interval=0.1, wait=0.5).received == 0
    run_script(lab, rebuilt_deb, root, "postrm", "purge")
    assert not (root / "etc/vnet/token").exists() and not (root / "var/lib/vnet").exists()
