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
from pathlib import Path

import pytest

import httplab
import netlab

REPO = netlab.REPO


@pytest.fixture(scope="module")
def deb():
    r = subprocess.run(["bash", "scripts/package.sh"], cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    path = Path(r.stdout.strip().splitlines()[-1])
    assert path.exists() and path.suffix == ".deb", r.stdout
    return path


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

    # The installed daemon from the installed configuration, as the unit starts it, in a
    # chroot of the tree (this machine's libc bind-mounted in, in a private mount namespace
    # that goes with the process). The administrator added a link to the installed config.
    with open(root / "etc/vnet/vnet.conf", "a") as f:
        f.write("link add to-b udp 10.99.0.9\n")
    argv, env = unit_env(root)
    record("exec_start", argv)
    assert argv[0] == "/usr/bin/vnetd" and "--config" in argv and "/etc/vnet/vnet.conf" in argv
    (root / "usr/lib64").mkdir(exist_ok=True)
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True, exist_ok=True)
    for link, target in (("lib64", "usr/lib64"), ("lib", "usr/lib")):
        if not (root / link).exists():
            (root / link).symlink_to(target)
    for d in ("dev", "proc", "run/vnet", "tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    mounts = " && ".join(f"mount --bind {src} {root}/{dst}" for src, dst in (
        ("/usr/lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"), ("/usr/lib64", "usr/lib64"),
        ("/dev", "dev"), ("/proc", "proc")))
    script = f"{mounts} && exec chroot {root} {shlex.join(argv)}"
    h = lab.host("pkg")
    log = open(lab.workdir / "vnetd-installed.log", "wb")
    proc = h.popen("unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        netlab.wait_until(lambda: h.ctl("show", "links", check=False, timeout=5).returncode == 0
                          or proc.poll() is not None, 15, 0.1, what="the installed vnetd")
        assert proc.poll() is None, (lab.workdir / "vnetd-installed.log").read_text()[-3000:]
        assert "to-b" in h.ctl("show", "links")
        assert "link add to-b udp 10.99.0.9" in h.ctl("show", "config")
        # The installed default turns the HTTP listener on, on loopback.
        st, _, body = httplab.http_get(h, "http://127.0.0.1:9300/metrics")
        assert st == 200 and b'vnet_link_state{link="to-b",state="up"} 1' in body
    finally:
        netlab.stop_pid(proc)
    assert proc.returncode == 0, (lab.workdir / "vnetd-installed.log").read_text()[-3000:]
