"""The local configuration's journal across a crash (issue #19): every change vnetd
acknowledged on its control port is in the state directory the moment it is acknowledged,
appended to the journal rather than written whole; a SIGKILL right after the last change loses
none of them, a record torn by the crash is ignored, and a plain stop folds the journal into
`config.vnet` (so an older vnetd, which reads only that file, finds everything).

Read from the system: the files in the state directory, the restarted daemon's `show config`,
its devices and a guest's ping."""

import signal

from vnetlab import netlab
from test_restart import MTU, overlay


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
