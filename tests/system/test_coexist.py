"""A vnetd removes and takes over only what is its own (issue #32).

- Two vnetds in one network namespace (each with its state directory, control and UDP ports,
  and the same interface names), each with two veth guests and a TAP guest: a ping every
  10 ms between each one's guests loses nothing while the other starts, restarts (SIGTERM and
  SIGKILL) and tears down.
- A state directory used from another network namespace starts afresh there and leaves the
  pinned fast path of the first namespace alone, also when it is torn down.
- A teardown removes only a pin directory of vnet's own making, whatever host.json names,
  and says why it leaves one.
- A damaged host.json is set aside: the start goes on, and the guests are adopted.
- A vnetd whose bpffs is its own (``ip netns exec``) says at warning level that its pins will
  not outlive it.
- An upgrade from a vnetd without instances (devices marked ``vnet:NAME``, pins named by the
  state directory's path) adopts everything and loses no ping of its fast-path guests.

Every claim is read from the system (devices, their aliases, bpffs, the guests' own pings)."""

import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from vnetlab import netlab
from test_restart import Pinger, addresses, ifindex

MTU = 1450
KINDS = ("veth", "veth", "tap")


class SecondDaemon(netlab.Host):
    """A vnetd in another host's network namespace (no namespace of its own): its own state
    directory, control port and UDP port, as a second vnetd beside the first needs."""

    def __init__(self, lab, host: netlab.Host, role: str, control: str, udp_port: int):
        # Not Host.__init__: that would make a namespace.
        self.lab, self.role, self.name = lab, role, host.name
        self.underlay_ip = host.underlay_ip
        self.control = control
        self.token_file = None
        self.vnetd = None
        self.config_path = None
        self.all_vnetd = []
        self.state_dir = lab.workdir / f"{role}.state"
        self.udp_port = udp_port
        lab.hosts.append(self)
        lab._save_state()


def make_guests(lab, tag: str, net: int) -> list:
    return [lab.guest(f"{tag}{n}", ip=f"192.168.{net}.{10 + n}", mac=netlab.mac(net, 1, n))
            for n in (1, 2, 3)]


def config(guests, prefix: str) -> str:
    """Interfaces PREFIX1, PREFIX2 (veth) and PREFIX3 (tap)."""
    lines = []
    for n, (g, kind) in enumerate(zip(guests, KINDS), 1):
        lines.append(f"interface add {prefix}{n} {kind} mac {g.mac} netns {g.name} mtu {MTU}")
        lines.append(f"route add any {g.mac} interface {prefix}{n}")
    return "\n".join(lines) + "\n"


def start(daemon, guests, udp_port=None, prefix="g"):
    args = ["--udp-port", udp_port] if udp_port else []
    daemon.start_vnetd(config=config(guests, prefix), args=args)
    for n, g in enumerate(guests, 1):
        g.configure(daemon.interface(f"{prefix}{n}")["ifname"], MTU)


def pairs(guests) -> list:
    """veth to veth (the kernel's) and veth to TAP (through vnetd)."""
    return [(guests[0], guests[1].ip_addr), (guests[0], guests[2].ip_addr)]


def quiet_through(pairs_, action, settle: float = 1.0) -> list:
    """Pings every 10 ms over ``pairs_`` while ``action()`` runs: each pair's result."""
    for src, dst in pairs_:
        netlab.wait_until(lambda: src.ping(dst, count=1, wait=0.5).received == 1, 10,
                          what=f"{src.name} -> {dst}")
    pings = [Pinger(src, dst) for src, dst in pairs_]
    time.sleep(settle)
    action()
    time.sleep(settle)
    return [p.stop() for p in pings]


def assert_none_lost(results, what: str):
    for r in results:
        assert r["sent"] > 150 and r["lost"] == 0, f"{what}: {r}"


def aliases(ns) -> dict:
    """Device name -> alias of every device of ``ns`` that has one."""
    links = json.loads(ns.exec("ip", "-j", "link", "show").stdout)
    return {link["ifname"]: link["ifalias"] for link in links if link.get("ifalias")}


def devices_of(ns, instance: str) -> set:
    return {d for d, a in aliases(ns).items() if a.startswith(f"vnet:{instance}:")}


def instance_of(daemon) -> str:
    return (daemon.state_dir / "instance").read_text().strip()


def pin_dir_of(daemon) -> Path:
    return Path(json.loads((daemon.state_dir / "host.json").read_text())["bpf_dir"])


def devices(guests) -> dict:
    return {g.name: (ifindex(g, g.ifname), addresses(g, g.ifname)) for g in guests}


def restart(daemon, sig):
    daemon.stop_vnetd(sig=sig)
    daemon.start_vnetd(args=netlab.own_args(daemon.vnetd))


@pytest.mark.parametrize("names", ["same", "other"])
def test_two_vnetds_in_one_namespace_keep_each_others_guests(lab, record, names):
    """``names``: Y names its interfaces as X does, or otherwise."""
    H = lab.host("H")
    Y = SecondDaemon(lab, H, "Y", "127.0.0.1:7601", 4790)
    xs, ys = make_guests(lab, "x", 91), make_guests(lab, "y", 92)
    start(H, xs)
    x_devs = devices(xs)
    # Y's start under X's pings.
    y_prefix = "g" if names == "same" else "y"
    results = quiet_through(pairs(xs), lambda: start(Y, ys, udp_port=4790, prefix=y_prefix))
    record("x_pings_across_y_start", [{k: v for k, v in r.items() if k != "tail"} for r in results])
    assert_none_lost(results, "X's guests while Y started")
    x_id, y_id = instance_of(H), instance_of(Y)
    assert x_id != y_id
    mine_x, mine_y = devices_of(H, x_id), devices_of(H, y_id)
    assert len(mine_x) == 4 and len(mine_y) == 4, aliases(H)
    for src, dst in pairs(ys):
        lab.wait_ping(src, dst, timeout=10)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        results = quiet_through(pairs(xs), lambda: restart(Y, sig))
        record(f"x_pings_across_y_{sig.name}", [r["lost"] for r in results])
        assert_none_lost(results, f"X's guests while Y restarted ({sig.name})")
        results = quiet_through(pairs(ys), lambda: restart(H, sig))
        record(f"y_pings_across_x_{sig.name}", [r["lost"] for r in results])
        assert_none_lost(results, f"Y's guests while X restarted ({sig.name})")
        # X's guests back after its own restart (its TAP guest is served again).
        for src, dst in pairs(xs):
            netlab.wait_until(lambda: src.ping(dst, count=1, wait=0.5).received == 1, 10,
                              what=f"{src.name} -> {dst} after X's restart")
    assert devices(xs) == x_devs, "a guest of X's got a new device"
    assert devices_of(H, x_id) == mine_x and devices_of(H, y_id) == mine_y
    for d in (H, Y):
        log = d.vnetd.log_text()
        assert "bad state" not in log and "removed a device" not in log, log[-3000:]
    # Y's teardown, from its control port, under X's pings.
    x_pins, y_pins = pin_dir_of(H), pin_dir_of(Y)
    assert x_pins != y_pins and x_pins.is_dir() and y_pins.is_dir()

    def teardown_y():
        Y.ctl("teardown")
        netlab.wait_until(lambda: not Y.vnetd.alive(), 15, what="Y to exit after its teardown")
    results = quiet_through(pairs(xs), teardown_y)
    assert_none_lost(results, "X's guests while Y tore down")
    assert Y.vnetd.proc.returncode == 0
    assert not devices_of(H, y_id) and not y_pins.exists()
    assert devices_of(H, x_id) == mine_x and x_pins.is_dir()
    for g in ys:
        assert not [n for n in g.links() if n.startswith("vn-")], g.links()
    # And X's offline teardown leaves Y's nothing to lose, and nothing of its own.
    assert H.stop_vnetd() == 0
    r = H.teardown_vnetd()
    assert r.returncode == 0, r.stderr
    assert not [d for d, a in aliases(H).items() if a.startswith("vnet:")]
    assert not x_pins.exists()


def test_a_state_directory_used_from_another_namespace_leaves_the_first_ones_pins(lab, record):
    """A's guests (veth, added at run time) talk through the pinned fast path while A's vnetd
    is stopped; the same state directory is then used in B's namespace, and torn down there."""
    A, B = lab.host("A"), lab.host("B")
    a1 = lab.guest("a1", ip="192.168.93.11", mac=netlab.mac(93, 1, 1))
    a2 = lab.guest("a2", ip="192.168.93.12", mac=netlab.mac(93, 1, 2))
    A.start_vnetd()
    A.add_vm(a1, "g1", a1.mac, kind="veth", mtu=MTU)
    A.add_vm(a2, "g2", a2.mac, kind="veth", mtu=MTU)
    assert A.interface("g1")["path"] == "kernel"
    lab.wait_ping(a1, a2.ip_addr, timeout=10)
    a_pins = pin_dir_of(A)
    A.stop_vnetd()
    B.state_dir = A.state_dir

    def elsewhere():
        B.start_vnetd()
        B.ctl("teardown")
        netlab.wait_until(lambda: not B.vnetd.alive(), 15, what="B to exit after its teardown")
    try:
        results = quiet_through([(a1, a2.ip_addr), (a2, a1.ip_addr)], elsewhere)
        record("pings_while_used_elsewhere", [r["lost"] for r in results])
        assert_none_lost(results, "A's guests while its state directory was used in B")
        assert a_pins.is_dir(), "A's pins were removed from B's namespace"
        assert "another network namespace" in B.vnetd.log_text()
    finally:
        # A's state went with B's teardown: what A pinned is this test's to remove.
        shutil.rmtree(a_pins, ignore_errors=True)


@pytest.mark.parametrize("named", ["tmp", "bpffs", "own-name"])
def test_teardown_removes_only_a_pin_directory_vnet_made(lab, record, named):
    A = lab.host("A")
    A.start_vnetd()
    assert A.stop_vnetd() == 0
    own = pin_dir_of(A)
    assert own.is_dir(), own
    if named == "tmp":
        victim = lab.workdir / "precious"
        why = "not on a bpffs"
    elif named == "bpffs":
        victim = Path("/sys/fs/bpf") / f"{lab.prefix}-precious"
        why = "its name is not"
    else:
        # vnet's name, another's contents.
        victim = Path("/sys/fs/bpf") / f"vnet-{instance_of(A)}-ffff"
        why = "which vnet does not pin"
    (victim / "data").mkdir(parents=True)
    try:
        rec = json.loads((A.state_dir / "host.json").read_text())
        rec["bpf_dir"] = str(victim)
        (A.state_dir / "host.json").write_text(json.dumps(rec))
        r = A.teardown_vnetd()
        record("teardown_says", [line for line in r.stderr.splitlines() if "not removing" in line])
        assert r.returncode == 0, r.stderr
        assert (victim / "data").is_dir(), f"teardown removed {victim}: {r.stderr}"
        assert "not removing" in r.stderr and why in r.stderr, r.stderr
        assert not own.exists(), "its own pins stayed"
    finally:
        shutil.rmtree(victim, ignore_errors=True)


def test_a_damaged_host_json_is_set_aside(lab, record):
    A = lab.host("A")
    gs = make_guests(lab, "a", 94)
    start(A, gs)
    before = devices(gs)
    assert A.stop_vnetd() == 0
    garbage = '{"netns": 4026531992, "made": [[null, "vh-'
    (A.state_dir / "host.json").write_text(garbage)
    A.start_vnetd(args=netlab.own_args(A.vnetd))
    log = A.vnetd.log_text()
    assert "host.json is damaged" in log and "set aside" in log, log[-3000:]
    assert (A.state_dir / "host.json.damaged").read_text() == garbage
    for src, dst in pairs(gs):
        lab.wait_ping(src, dst, timeout=10)
    assert devices(gs) == before, "the guests got new devices"
    assert "veth adopted" in log and "TAP adopted" in log, log[-3000:]
    # Written whole again; the next start is an ordinary one.
    netlab.wait_until(lambda: (A.state_dir / "host.json").exists(), 5, what="host.json")
    json.loads((A.state_dir / "host.json").read_text())
    A.restart_vnetd()
    assert "is damaged" not in A.vnetd.log_text()


def test_a_vnetd_whose_bpffs_is_its_own_warns(lab, record):
    """``ip netns exec`` mounts a /sys of its own: the bpffs vnetd mounts there dies with the
    process's mount namespace, and the pins with it."""
    A = lab.host("A")
    argv = [netlab.VNETD, "--control", A.control, "--state-dir", A.state_dir]
    log = lab.workdir / "vnetd-private.log"
    with open(log, "wb") as f:
        proc = A.popen(*argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                       host_mounts=False, env=dict(os.environ, RUST_LOG="info"))
    A.vnetd = netlab.Vnetd(A, proc, log, [str(a) for a in argv])
    A.all_vnetd.append(A.vnetd)
    A.wait_ready()
    text = log.read_text()
    warned = [line for line in text.splitlines() if "will not outlive" in line]
    record("warning", warned[:1])
    assert warned and " WARN " in warned[0], text[-3000:]
    assert A.stop_vnetd() == 0


# --- the upgrade from a vnetd without instances --------------------------------------------

# The last commit of vnet whose vnetd had no instances (devices marked `vnet:NAME`, pins in
# /sys/fs/bpf/vnet-HASH of the state directory's path, maps in `maps/`).
LEGACY_COMMIT = "bdb276f"


@pytest.fixture(scope="module")
def legacy_vnetd():
    """A vnetd from before instances: ``VNETD_LEGACY``, or built once from LEGACY_COMMIT (its
    tree from git, a target directory of its own under target/; about 20 minutes on 2 busy
    cores): the binary is kept there for later runs."""
    given = os.environ.get("VNETD_LEGACY")
    if given:
        return Path(given)
    out = netlab.REPO / "target" / f"legacy-{LEGACY_COMMIT}"
    binary = out / "vnetd"
    if binary.exists():
        return binary
    if shutil.which("cargo") is None or shutil.which("git") is None:
        pytest.fail("building the legacy vnetd needs cargo and git (or set VNETD_LEGACY)")
    src = Path(tempfile.mkdtemp(prefix="vnet-legacy-src-"))
    try:
        archive = subprocess.run(["git", "-C", netlab.REPO, "archive", LEGACY_COMMIT],
                                 capture_output=True, check=True).stdout
        tar = src / "src.tar"
        tar.write_bytes(archive)
        with tarfile.open(tar) as t:
            t.extractall(src, filter="data")
        r = subprocess.run(["cargo", "build", "--release", "-p", "vnetd", "--target-dir", out / "build"],
                           cwd=src, capture_output=True, text=True, timeout=3600)
        assert r.returncode == 0, r.stderr[-3000:]
        shutil.copy(out / "build" / "release" / "vnetd", binary)
    finally:
        shutil.rmtree(src, ignore_errors=True)
        # Only the binary is kept (the build directory is over a gigabyte).
        shutil.rmtree(out / "build", ignore_errors=True)
    return binary


def test_an_upgrade_from_a_vnetd_without_instances_adopts_everything(lab, record, legacy_vnetd, monkeypatch):
    A = lab.host("A")
    gs = make_guests(lab, "u", 95)
    new_vnetd = netlab.VNETD
    monkeypatch.setattr(netlab, "VNETD", legacy_vnetd)
    start(A, gs)
    # A runtime guest too (as the CNI plugin adds one), on the fast path.
    extra = lab.guest("u4", ip="192.168.95.14", mac=netlab.mac(95, 1, 4))
    A.add_vm(extra, "cni-u4", extra.mac, kind="veth", mtu=MTU)
    gs.append(extra)
    legacy_pins = pin_dir_of(A)
    assert legacy_pins.is_dir() and (legacy_pins / "maps").is_dir(), legacy_pins
    old_aliases = aliases(A)
    assert old_aliases and all(a.count(":") == 1 for a in old_aliases.values()), old_aliases
    before = devices(gs)
    monkeypatch.setattr(netlab, "VNETD", new_vnetd)
    kernel_pairs = [(gs[0], gs[1].ip_addr), (gs[1], gs[3].ip_addr)]
    tap_pinger = Pinger(gs[0], gs[2].ip_addr)
    ready = []

    def upgrade():
        A.stop_vnetd()
        A.start_vnetd()
        ready.append(time.time())
    results = quiet_through(kernel_pairs, upgrade)
    record("upgrade_pings", [{k: v for k, v in r.items() if k != "tail"} for r in results])
    assert_none_lost(results, "the fast-path guests across the upgrade")
    back = tap_pinger.back_after(ready[0], settle=0)
    record("tap_back_after_ready_s", round(back, 3))
    assert back < 1.0, f"the TAP guest {back:.2f} s after the new vnetd was ready"
    assert devices(gs) == before, "a guest got a new device"
    log = A.vnetd.log_text()
    assert "veth adopted" in log and "TAP adopted" in log, log[-3000:]
    assert "removed a device" not in log, log[-3000:]
    # Its maps are of another layout (reach's link keys carry the remote's port, #31): not
    # reused but filled anew before the pinned attachments take the new programs, so the
    # guests above lost nothing all the same. (A vnet of the layout before the hash would have
    # reused them: `layout::reusable_maps_dirs`, unit-tested, and test_restart's restarts.)
    assert "maps=\"new\"" in log or "maps=new" in log, log[-3000:]
    # Everything is marked as this instance's now, the pins are in its directory.
    me = instance_of(A)
    assert set(aliases(A)) == set(old_aliases)
    assert all(a.startswith(f"vnet:{me}:") for a in aliases(A).values()), aliases(A)
    new_pins = pin_dir_of(A)
    assert new_pins.name.startswith(f"vnet-{me}-") and new_pins.is_dir()
    assert not legacy_pins.exists(), "the old pin directory stayed beside the new one"
    # A second restart of the new vnetd: an ordinary one.
    results = quiet_through(kernel_pairs, lambda: restart(A, signal.SIGKILL))
    assert_none_lost(results, "the fast-path guests across a restart after the upgrade")
    assert A.stop_vnetd() == 0
    r = A.teardown_vnetd()
    assert r.returncode == 0, r.stderr
    assert not [d for d, a in aliases(A).items() if a.startswith("vnet:")]
    assert not new_pins.exists()
