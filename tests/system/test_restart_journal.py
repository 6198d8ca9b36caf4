"""The local configuration's journal across a crash (issue #19): every change vnetd
acknowledged on its control port is in the state directory the moment it is acknowledged,
appended to the journal rather than written whole; a SIGKILL right after the last change loses
none of them, a record torn by the crash is ignored, and a plain stop folds the journal into
`config.vnet` (so an older vnetd, which reads only that file, finds everything).

Read from the system: the files in the state directory, the restarted daemon's `show config`,
its devices and a guest's ping.

Issue 32: nothing acknowledged is lost. A state directory that fills up (a real tmpfs of
1 MiB) refuses the changes it cannot hold, and takes them back, instead of acknowledging them;
a configuration as large as the control port takes (100,000 routes over 64 links, in batches)
restarts; the CNI deletion queue is consumed only once the configuration without its
interfaces is on disk."""

import contextlib
import errno
import signal
import time

from vnetlab import netlab
from test_restart import MTU, overlay
from vnetlab.etcdlab import TTL


def segments(host) -> list:
    return sorted(p for p in host.state_dir.iterdir() if p.name.startswith("config.journal."))


def test_acknowledged_changes_survive_sigkill_through_the_journal(lab, record):
    A, B, a1, a2, b1 = overlay(lab, "veth")
    a3 = lab.guest("a3", ip="192.168.81.13", mac=netlab.mac(8, 1, 3))
    B.ctl("route", "add", "any", a3.mac, "link", "peer")
    # Runtime changes, each acknowledged: a container's interface (as the CNI plugin adds
    # one), routes added, one replaced, one deleted, a setting, a link.
    A.add_vm(a3, "cni-a3", a3.mac, kind="veth", mtu=MTU)
    routes = [netlab.mac(9, 1, g) for g in range(1, 41)]
    for m in routes:
        A.ctl("route", "add", "any", m, "link", "peer")
    A.ctl("route", "replace", "any", routes[0], "interface", "cni-a3")
    A.ctl("route", "del", "any", routes[1], "link", "peer")
    A.ctl("link", "add", "spare", "udp", "10.99.0.250", "vni", 1)
    A.ctl("set", "learn", "on")
    want = A.ctl("show", "config")
    # Those changes are in the journal, not yet in config.vnet (written whole at the start).
    saved = (A.state_dir / "config.vnet").read_text()
    assert routes[5] not in saved and "cni-a3" not in saved, saved
    segs = segments(A)
    assert segs, sorted(p.name for p in A.state_dir.iterdir())
    record("journal_bytes_before_the_crash", sum(p.stat().st_size for p in segs))
    # The crash, right after the last acknowledgement, with a record torn half-way by it.
    A.stop_vnetd(sig=signal.SIGKILL)
    with open(segs[-1], "ab") as f:
        f.write(b"\x40\x00\x00\x00\x12\x34\x56\x78\x99\x00\x00\x00\x00\x00\x00\x00Droute add any")
    A.start_vnetd(args=netlab.own_args(A.vnetd))
    log = A.vnetd.log_text()
    assert A.ctl("show", "config") == want, log[-3000:]
    assert "journal" in log and "torn" in log, log[-3000:]
    # The container's device came back (adopted) and its guest is on the overlay.
    assert A.interface("cni-a3")["path"] == "kernel"
    lab.wait_ping(a3, b1.ip_addr, timeout=10)
    # The start folded the journal into the file; a plain stop leaves no journal behind.
    A.ctl("route", "add", "any", netlab.mac(9, 2, 1), "link", "peer")
    assert segments(A), "the change after the start is not in the journal"
    assert A.stop_vnetd() == 0
    assert not segments(A), [p.name for p in segments(A)]
    saved = (A.state_dir / "config.vnet").read_text()
    assert netlab.mac(9, 2, 1) in saved and routes[5] in saved and "cni-a3" in saved, saved
    A.start_vnetd(args=netlab.own_args(A.vnetd))
    assert A.ctl("show", "config") == want + f"route add any {netlab.mac(9, 2, 1)} link peer\n"


@contextlib.contextmanager
def tmpfs_state_dir(lab, host, size: str):
    """``host``'s state directory on a tmpfs of ``size`` of its own (a small file system that
    really fills up), unmounted at the end (the daemon stopped first)."""
    host.state_dir.mkdir(mode=0o700)
    netlab.sh("mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", f"{lab.prefix}-state",
              host.state_dir)
    try:
        yield host.state_dir
    finally:
        if host.vnetd is not None and host.vnetd.alive():
            host.stop_vnetd(sig=signal.SIGKILL)
        netlab.sh("umount", host.state_dir, check=False)


def fill(path) -> int:
    """Writes ``path`` until its file system is full; returns the bytes written."""
    n = 0
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                n += f.write(b"\xa5" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
    return n


def routes_of(host) -> list:
    return [line for line in host.ctl("show", "config").splitlines() if line.startswith("route ")]


def test_a_full_state_directory_refuses_changes_and_loses_none(lab, record):
    """Issue 32: a change whose journal record could not be written was acknowledged all the
    same, and lost at the next crash. On a state directory that is full (a tmpfs), a change
    is refused with the reason and taken back (not in the running configuration either);
    `show stats` and its JSON say the state is not being saved; once there is room again,
    changes are taken and saved; after a SIGKILL the new daemon restores exactly the changes
    that were acknowledged."""
    A = lab.host("A")
    with tmpfs_state_dir(lab, A, "1m") as state:
        A.start_vnetd()
        A.ctl("link", "add", "peer", "udp", "10.99.0.250")
        acked, refused = [], []
        for i in range(10):
            m = netlab.mac(9, 3, i)
            A.ctl("route", "add", "any", m, "link", "peer")
            acked.append(m)
        record("filler_bytes", fill(state / "filler"))
        for i in range(10, 210):
            m = netlab.mac(9, 3, i)
            r = A.ctl("route", "add", "any", m, "link", "peer", check=False)
            if r.returncode == 0:
                acked.append(m)  # a record that still fit a page the segment had
            else:
                assert "not applied" in r.stderr and "No space left on device" in r.stderr, r.stderr
                refused.append(m)
        record("refused_on_a_full_disk", len(refused))
        # Once one is refused, every one after it is (a page the segment had may take some
        # records first).
        tried = [netlab.mac(9, 3, i) for i in range(10, 210)]
        assert refused and refused == tried[len(tried) - len(refused):], (len(acked), len(refused))
        assert len(refused) >= 100, (len(acked), len(refused))
        running = "\n".join(routes_of(A))
        assert not [m for m in refused if m in running], "a refused change is in effect"
        st = A.stats()["state"]
        assert st["failing"] and st["errors"] >= len(refused), st
        assert "No space left on device" in st["last_error"], st
        assert "state: NOT BEING SAVED" in A.ctl("show", "stats")
        # Room again: taken and saved.
        (state / "filler").unlink()
        m = netlab.mac(9, 4, 1)
        A.ctl("route", "add", "any", m, "link", "peer")
        acked.append(m)
        assert not A.stats()["state"]["failing"]
        A.stop_vnetd(sig=signal.SIGKILL)
        A.start_vnetd(args=netlab.own_args(A.vnetd))
        got = routes_of(A)
        assert got == [f"route add any {m} link peer" for m in acked], (len(got), len(acked))


def test_a_configuration_as_large_as_the_control_port_takes_restarts(lab, record):
    """Issue 32: the control port took 100,000 routes over 64 links (in batches within its
    1 MiB), but the next start read the saved configuration as one script, refused it for
    being longer than 100,000 lines, and vnetd could not start at all. It restarts, with every
    route, after a SIGTERM and after a SIGKILL."""
    A = lab.host("A")
    # The user-space path: the state directory is the subject, not the kernel's table.
    A.start_vnetd(args=["--no-kernel-fastpath"])
    A.script("".join(f"link add l{k} udp 10.98.{k}.1\n" for k in range(64)))
    n = 100_000
    for first in range(0, n, 20_000):
        t0 = time.monotonic()
        A.script("".join(f"route add any 02:00:00:{r >> 16:02x}:{(r >> 8) & 255:02x}:{r & 255:02x} link l{r % 64}\n"
                         for r in range(first, first + 20_000)))
        record(f"batch_of_20000_routes_from_{first}_s", round(time.monotonic() - t0, 2))
    assert len(A.ctl_json("show", "routes", "json")) == n
    want = A.ctl("show", "config")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        A.stop_vnetd(sig=sig, timeout=30)
        A.start_vnetd(args=netlab.own_args(A.vnetd), wait=False)
        t0 = time.monotonic()
        A.wait_ready(timeout=120)
        record(f"start_after_{sig.name}_s", round(time.monotonic() - t0, 2))
        assert A.ctl("show", "config") == want


def test_the_cni_deletion_queue_outlives_a_start_that_could_not_save(lab):
    """Issue 32: the CNI deletion queue was consumed before the restore that used it was on
    disk: a start whose configuration could not be written, then a crash, brought the deleted
    container's interface back. The queue now stays until the configuration without the
    interface is saved. (The write fails for real: a directory where the configuration's
    temporary file must go.)"""
    A = lab.host("A")
    A.start_vnetd()
    A.ctl("interface", "add", "cni-gone", "tap", "mac", netlab.mac(9, 5, 1))
    A.ctl("interface", "add", "cni-kept", "tap", "mac", netlab.mac(9, 5, 2))
    assert A.stop_vnetd() == 0
    # The CNI plugin's DEL while no vnetd ran.
    (A.state_dir / "cni-deleted").mkdir(exist_ok=True)
    (A.state_dir / "cni-deleted" / "cni-gone").write_text("")
    blocker = A.state_dir / ".config.vnet.tmp"
    blocker.mkdir()
    A.start_vnetd(args=netlab.own_args(A.vnetd))
    names = [i["name"] for i in A.ctl_json("show", "interfaces", "json")]
    assert names == ["cni-kept"], names
    assert "cni-gone" in (A.state_dir / "config.vnet").read_text()
    assert (A.state_dir / "cni-deleted" / "cni-gone").exists(), "the queue went before it was saved"
    assert A.stats()["state"]["unsaved"]
    # A crash, and the disk is fine again.
    A.stop_vnetd(sig=signal.SIGKILL)
    blocker.rmdir()
    A.start_vnetd(args=netlab.own_args(A.vnetd))
    names = [i["name"] for i in A.ctl_json("show", "interfaces", "json")]
    assert names == ["cni-kept"], names
    assert "cni-gone" not in (A.state_dir / "config.vnet").read_text()
    assert not (A.state_dir / "cni-deleted" / "cni-gone").exists()
    assert not A.stats()["state"]["unsaved"]


def test_a_route_to_a_derived_link_is_kept_across_restarts(lab, etcd):
    """Issue 32: a route of the local configuration to a link the etcd agent derived was
    accepted and journaled, but a restart restores the local configuration before the derived
    links exist: the route was left out, and the start's rewritten state file lost it for good.
    Now it waits for its link (saved, `pending` in `show stats`, a comment in `show config`)
    and is in effect again once the agent derives the link: after a SIGTERM and a SIGKILL,
    and when the link's host leaves the overlay (and the daemon restarts meanwhile) and comes
    back."""
    from test_etcd import Overlay, agent_args
    ov = Overlay(lab, etcd, 2)
    ov.wait_mesh()
    h1, h2 = ov.hosts
    extra = netlab.mac(9, 7, 1)
    line = f"route add any {extra} link c-h2-v1"
    h1.ctl(*line.split())
    assert line in h1.ctl("show", "config")

    def in_effect():
        return ov.routes(h1).get(extra) == ("link", "c-h2-v1")

    for sig in (signal.SIGTERM, signal.SIGKILL):
        h1.stop_vnetd(sig=sig)
        h1.start_vnetd(config_path=h1.config_path, args=agent_args(etcd, h1))
        ov.wait_mesh()
        netlab.wait_until(in_effect, 10, 0.1, what=f"the route to the derived link after a {sig.name}")
        assert line in h1.ctl("show", "config")
        assert h1.stats()["state"]["pending_routes"] == 0
    # h2 leaves (killed, its lease expires): the route waits, saved, across a restart of h1.
    h2.stop_vnetd(sig=signal.SIGKILL)
    netlab.wait_until(lambda: "c-h2-v1" not in ov.derived_links(h1), int(TTL) + 10, 0.2,
                      what="h2's link to go")
    assert h1.stats()["state"]["pending_routes"] == 1
    assert f"# {line}" in h1.ctl("show", "config")
    h1.stop_vnetd()
    h1.start_vnetd(config_path=h1.config_path, args=agent_args(etcd, h1))
    assert h1.stats()["state"]["pending_routes"] == 1
    assert line in (h1.state_dir / "config.vnet").read_text()
    # h2 is back: so is the route.
    h2.start_vnetd(config_path=h2.config_path, args=agent_args(etcd, h2))
    ov.wait_mesh()
    netlab.wait_until(in_effect, 10, 0.1, what="the route back with its link")
    assert h1.stats()["state"]["pending_routes"] == 0
