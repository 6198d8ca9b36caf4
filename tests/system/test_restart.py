"""An overlay that outlives its daemon (issue #17): vnetd stopped, killed or replaced under
running traffic, and what it leaves behind.

- Fast-path guests (`veth`, one from the config file and one added at run time as the CNI
  plugin does) keep every ping (10 ms apart) and their TCP stream across SIGTERM + start and
  SIGKILL + start: the kernel keeps forwarding from pinned programs and maps while no vnetd
  runs, and the next vnetd adopts the devices, the pins and the state instead of making them
  anew. (The upgrade through a rebuilt .deb is in test_package.py.)
- TAP guests keep their device (same ifindex, the address their owner gave it) and are served
  again within a second of the new vnetd being ready; vhost-user VMs reconnect.
- A second vnetd refuses to start and touches nothing; an edited config file is applied as a
  difference on top of the runtime changes; `vnetctl teardown` and `vnetd --teardown` leave
  nothing behind, and the next start is a first start again.

Every claim is read from the system (the devices, bpffs, the guests' own ping and iperf3),
not from vnetd's word alone."""

import itertools
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from vnetlab import netlab
from test_vhost import image  # noqa: F401  (the QEMU guest image fixture)

MTU = 1450


def ifindex(ns, dev: str) -> int:
    return int(json.loads(ns.exec("ip", "-j", "link", "show", dev).stdout)[0]["ifindex"])


def addresses(ns, dev: str) -> list:
    info = json.loads(ns.exec("ip", "-j", "addr", "show", dev).stdout)[0]
    return sorted(f"{a['local']}/{a['prefixlen']}" for a in info.get("addr_info", []) if a["family"] == "inet")


class Pinger:
    """``ping -D -i INTERVAL`` from ``src`` to ``dst`` until stopped: what was sent, what came
    back, and the longest silence. Its output goes to a file in the lab's work directory (a
    pipe read only at the end would fill and stop ping in a long test)."""

    _logs = itertools.count(1)

    def __init__(self, src, dst: str, interval: float = 0.01):
        self.log = src.lab.workdir / f"ping-{next(Pinger._logs)}-{src.name}.txt"
        with open(self.log, "w") as f:
            self.proc = src.popen("ping", "-D", "-i", interval, "-W", "1", dst,
                                  stdout=f, stderr=subprocess.STDOUT)

    def _end(self) -> tuple[str, list[float]]:
        """Stops ping now: its output and the times of its replies."""
        netlab.stop_pid(self.proc, signal.SIGINT)
        out = self.log.read_text()
        return out, [float(t) for t in re.findall(r"^\[(\d+\.\d+)\] \d+ bytes from", out, re.M)]

    def back_after(self, ready: float, settle: float, detail=lambda: "") -> float:
        """Waits ``settle`` seconds and stops ping: how long after ``ready`` its first reply
        came (there must be one; ``detail()`` says more when there is none)."""
        time.sleep(settle)
        out, times = self._end()
        first = min((t for t in times if t >= ready), default=None)
        assert first is not None, f"no reply after the restart: {out[-800:]}{detail()}"
        return first - ready

    def stop(self) -> dict:
        """Stops ping after 1.5 s more of replies. ``lost``: requests never answered, except
        the last one, which may still be on its way when ping is stopped (it sends until then;
        ping's own summary counts that one as lost, about one stop in 200 here)."""
        time.sleep(1.5)
        out, times = self._end()
        m = re.search(r"(\d+) packets transmitted, (\d+) received", out)
        assert m, out[-800:]
        sent, received = int(m.group(1)), int(m.group(2))
        answered = {int(s) for s in re.findall(r"^\[\d+\.\d+\] \d+ bytes from .* icmp_seq=(\d+) ", out, re.M)}
        unanswered = [s for s in range(1, sent) if s not in answered]
        gap = max((b - a for a, b in zip(times, times[1:])), default=0.0)
        return {"sent": sent, "received": received, "lost": len(unanswered),
                "unanswered": unanswered[:20], "max_gap_s": round(gap, 3), "tail": out[-400:]}


class Stream:
    """An iperf3 TCP stream (one-shot server, JSON result) across the whole test."""

    def __init__(self, lab, server, server_ip: str, client, seconds: int, port: int = 5301):
        self.srv = server.popen("iperf3", "-s", "-1", "-p", port, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        netlab.wait_until(lambda: f":{port} " in server.exec("ss", "-Htln").stdout, 10,
                          what="iperf3 server")
        self.cli = client.popen("iperf3", "-c", server_ip, "-p", port, "-t", seconds, "-i", "0.5", "-J",
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.seconds = seconds

    def result(self) -> dict:
        out, _ = self.cli.communicate(timeout=self.seconds + 30)
        netlab.stop_pid(self.srv, timeout=3)
        j = json.loads(out)
        intervals = [i["sum"]["bits_per_second"] for i in j.get("intervals", [])]
        return {"error": j.get("error"), "gbps": j["end"]["sum_received"]["bits_per_second"] / 1e9
                if "sum_received" in j.get("end", {}) else 0.0,
                "min_interval_gbps": min(intervals, default=0) / 1e9,
                "retransmits": j.get("end", {}).get("sum_sent", {}).get("retransmits")}


def overlay(lab, kind: str):
    """Hosts A and B with a udp link. A: guest a1 from the config file and a2 added at run
    time (as the CNI plugin adds a container); B: guest b1. Returns (A, B, a1, a2, b1)."""
    A, B = lab.host("A"), lab.host("B")
    a1 = lab.guest("a1", ip="192.168.81.11", mac=netlab.mac(8, 1, 1))
    a2 = lab.guest("a2", ip="192.168.81.12", mac=netlab.mac(8, 1, 2))
    b1 = lab.guest("b1", ip="192.168.81.21", mac=netlab.mac(8, 2, 1))
    A.start_vnetd(config=f"""
interface add vm-a1 {kind} mac {a1.mac} netns {a1.name} mtu {MTU}
link add peer udp {B.underlay_ip}
route add any {a1.mac} interface vm-a1
route add any {b1.mac} link peer
""")
    B.start_vnetd(config=f"""
interface add vm-b1 {kind} mac {b1.mac} netns {b1.name} mtu {MTU}
link add peer udp {A.underlay_ip}
route add any {b1.mac} interface vm-b1
route add any {a1.mac} link peer
route add any {a2.mac} link peer
""")
    A.add_vm(a2, "cni-a2", a2.mac, kind=kind, mtu=MTU)
    a1.configure(A.interface("vm-a1")["ifname"], MTU)
    b1.configure(B.interface("vm-b1")["ifname"], MTU)
    for g in (a1, a2):
        lab.wait_ping(g, b1.ip_addr, timeout=10)
    return A, B, a1, a2, b1


def restart(host, sig):
    """Stops the daemon with ``sig`` and starts it again at once with the same arguments (as
    systemd's Restart= does); returns the seconds from the stop to the new daemon's control
    port answering."""
    t0 = time.monotonic()
    host.stop_vnetd(sig=sig)
    host.start_vnetd(args=netlab.own_args(host.vnetd))
    return time.monotonic() - t0


def test_fast_path_guests_lose_nothing_across_restarts(lab, record):
    A, B, a1, a2, b1 = overlay(lab, "veth")
    assert A.interface("vm-a1")["path"] == "kernel" and A.interface("cni-a2")["path"] == "kernel"
    dev_a1, dev_a2 = A.interface("vm-a1")["ifname"], A.interface("cni-a2")["ifname"]
    before = {g.name: (ifindex(g, d), addresses(g, d)) for g, d in ((a1, dev_a1), (a2, dev_a2))}
    for sig, name in ((signal.SIGTERM, "sigterm"), (signal.SIGKILL, "sigkill")):
        pings = [Pinger(a1, b1.ip_addr), Pinger(b1, a2.ip_addr)]
        stream = Stream(lab, b1, b1.ip_addr, a1, seconds=6)
        time.sleep(1.5)
        took = restart(A, sig)
        time.sleep(3)
        results = [p.stop() for p in pings]
        st = stream.result()
        record(f"{name}_restart_s", round(took, 2))
        record(f"{name}_pings", [{k: v for k, v in r.items() if k != "tail"} for r in results])
        record(f"{name}_tcp", st)
        for r in results:
            assert r["sent"] > 300 and r["lost"] == 0, r
        assert st["error"] is None, st
        assert st["min_interval_gbps"] > 0, f"the stream stalled for half a second: {st}"
        # The runtime guest is still the daemon's, with its route, on the same device.
        assert "cni-a2" in {i["name"] for i in A.ctl_json("show", "interfaces", "json")}
        assert any(r["dst"] == a2.mac for r in A.ctl_json("show", "routes", "json"))
        after = {g.name: (ifindex(g, d), addresses(g, d)) for g, d in ((a1, dev_a1), (a2, dev_a2))}
        assert after == before, "a guest's device was replaced"
        log = A.vnetd.log_text()
        assert "adopted" in log, log[-2000:]
        # The new daemon reused the pinned maps and found the table it compiled already there:
        # it wrote nothing, removed nothing.
        m = re.search(r"takeover complete written=(\d+) deleted=(\d+)", log)
        assert "kernel fast path taken over" in log and m, log[-3000:]
        record(f"{name}_takeover_writes", [int(m.group(1)), int(m.group(2))])
        assert (int(m.group(1)), int(m.group(2))) == (0, 0), m.group(0)
        assert "maps=\"reused\"" in log or "maps=reused" in log, log[-3000:]


def test_tap_guests_keep_their_device_and_are_back_within_a_second(lab, record):
    """A TAP guest's device stays (no carrier while no vnetd runs) with its address; a ping
    10 ms apart that runs all along gets its first reply soon after the new vnetd is ready.
    The guest's neighbour entry for its peer is fixed: a neighbour probe the guest's kernel
    happens to send while no vnetd runs is lost (no carrier), and its next try comes 1 s later
    (CI: 1.006 s); that timer is the guest's, not the restart's."""
    A, B, a1, a2, b1 = overlay(lab, "tap")
    dev = A.interface("vm-a1")["ifname"]
    a1.exec("ip", "neigh", "replace", b1.ip_addr, "lladdr", b1.mac, "dev", dev, "nud", "permanent")
    before = (ifindex(a1, dev), addresses(a1, dev))
    for sig, name in ((signal.SIGTERM, "sigterm"), (signal.SIGKILL, "sigkill")):
        p = Pinger(a1, b1.ip_addr)
        time.sleep(1)
        A.stop_vnetd(sig=sig)
        time.sleep(0.3)
        # While no vnetd runs the TAP stays, and keeps its address.
        assert (ifindex(a1, dev), addresses(a1, dev)) == before, "the TAP went with the daemon"
        A.start_vnetd(args=netlab.own_args(A.vnetd))
        back = p.back_after(time.time(), settle=2)
        record(f"{name}_back_after_ready_s", round(back, 3))
        assert back < 1.0, f"{back:.2f} s after vnetd was ready"
        assert (ifindex(a1, dev), addresses(a1, dev)) == before, "the TAP was replaced"
        assert "TAP adopted" in A.vnetd.log_text()


def test_a_second_vnetd_refuses_and_touches_nothing(lab, record):
    A, B, a1, a2, b1 = overlay(lab, "veth")
    links_before = set(A.links())
    r = A.exec(netlab.VNETD, "--control", "127.0.0.1:7611", "--udp-port", "4790",
               "--state-dir", A.state_dir, "--config", A.config_path, check=False, timeout=15)
    assert r.returncode != 0 and "another vnetd" in r.stderr, r.stderr
    record("second_vnetd_error", r.stderr.strip().splitlines()[-1])
    assert set(A.links()) == links_before
    assert A.vnetd.alive()
    assert lab.ping(a1, b1.ip_addr, count=3, interval=0.1).received == 3
    assert lab.ping(a2, b1.ip_addr, count=3, interval=0.1).received == 3
    # The daemon's own log has no error since.
    assert "bad state" not in A.vnetd.log_text()


def bpf_dirs() -> set:
    try:
        return {d for d in os.listdir("/sys/fs/bpf") if d.startswith("vnet")}
    except OSError:
        return set()


@pytest.mark.parametrize("how", ["vnetctl", "flag"])
def test_teardown_leaves_nothing(lab, record, how):
    A, B, a1, a2, b1 = overlay(lab, "veth")
    # Each daemon's own pin directory (other labs' daemons may come and go meanwhile).
    pins = {h: Path(json.loads((h.state_dir / "host.json").read_text())["bpf_dir"]) for h in (A, B)}
    assert pins[A] != pins[B] and all(p.name in bpf_dirs() for p in pins.values()), (pins, bpf_dirs())
    made = {n for n in A.links() if n.startswith(("vh-", "vp-"))}
    assert len(made) == 4, made
    if how == "vnetctl":
        out = A.ctl("teardown")
        assert "tearing down" in out
        netlab.wait_until(lambda: not A.vnetd.alive(), 15, what="vnetd to exit after teardown")
        assert A.vnetd.proc.returncode == 0, A.vnetd.log_text()[-2000:]
    else:
        assert A.stop_vnetd() == 0
        assert made <= set(A.links()), "a plain stop removed devices"
        r = A.teardown_vnetd()
        assert r.returncode == 0, r.stderr
    assert not {n for n in A.links() if n.startswith(("vh-", "vp-"))}
    for g in (a1, a2):
        assert not [n for n in g.links() if n.startswith("vn-")], g.links()
    assert not pins[A].exists() and pins[B].is_dir(), (pins, bpf_dirs())
    leftover = sorted(p.name for p in A.state_dir.iterdir() if p.name != "lock")
    assert leftover == [], leftover
    # The next start is a first start from the config file again.
    A.start_vnetd()
    a1.configure(A.interface("vm-a1")["ifname"], MTU)
    lab.wait_ping(a1, b1.ip_addr, timeout=10)
    assert "cni-a2" not in {i["name"] for i in A.ctl_json("show", "interfaces", "json")}


def test_an_edited_config_file_is_applied_on_top_of_runtime_changes(lab, record):
    A, B, a1, a2, b1 = overlay(lab, "tap")
    a3 = lab.guest("a3", ip="192.168.81.13", mac=netlab.mac(8, 1, 3))
    dev_a1 = A.interface("vm-a1")["ifname"]
    assert A.stop_vnetd() == 0
    # The operator drops a1 from the file and adds a3.
    A.config_path.write_text(f"""
interface add vm-a3 tap mac {a3.mac} netns {a3.name} mtu {MTU}
link add peer udp {B.underlay_ip}
route add any {a3.mac} interface vm-a3
route add any {b1.mac} link peer
""")
    A.start_vnetd()
    names = {i["name"] for i in A.ctl_json("show", "interfaces", "json")}
    assert names == {"vm-a3", "cni-a2"}, names
    assert dev_a1 not in a1.links(), "the TAP of the interface the file dropped stayed"
    assert "the config file changed" in A.vnetd.log_text()
    lab.wait_ping(a2, b1.ip_addr, timeout=10)


@pytest.mark.parametrize("vnetd_side", ["server", "client"])
def test_a_vhost_user_vm_is_served_again_after_a_restart(lab, image, record, vnetd_side):
    """A real VM (QEMU, vhost-user) across SIGKILL + start of its vnetd: the VM keeps running
    and its device is served again. vnetd as the server: QEMU reconnects (`reconnect=1`, its
    granularity is a second); vnetd as the client (`interface add ... client`, QEMU listens):
    the new vnetd connects at once. The gap is from the new vnetd being ready to the first
    reply of a ping (10 ms apart) that ran all along."""
    from test_vhost import SUBNET, boot, failed, two_hosts
    sock = lab.workdir / "vm1.sock"
    vms = []
    if vnetd_side == "client":
        # QEMU listens first; vnetd connects to it.
        A, B, b1 = two_hosts(lab, sock, vm_options=" client",
                             before_vnetd=lambda A: vms.append(qemu_guest(lab, image, A, sock, server=True)))
        g = vms[0]
    else:
        A, B, b1 = two_hosts(lab, sock)
        g = boot(lab, image, A, sock, 1, reconnect=1)
    with g:
        g.wait_ready(timeout=120)
        lab.wait_ping(b1, f"{SUBNET}.1", timeout=30)
        p = Pinger(b1, f"{SUBNET}.1")
        time.sleep(1)
        restart(A, signal.SIGKILL)
        back = p.back_after(time.time(), settle=4, detail=lambda: f"\n{failed(g, A)}")
        record(f"{vnetd_side}_back_after_ready_s", round(back, 3))
        assert g.alive(), failed(g, A)
        bound = 1.0 if vnetd_side == "client" else 2.5
        assert back < bound, f"{back:.2f} s after vnetd was ready"


def qemu_guest(lab, image, host, sock, server: bool):
    """A VM whose vhost-user NIC listens on ``sock`` (QEMU as the server)."""
    from guest import qemu
    from test_vhost import SUBNET, vm_mac
    g = qemu.Guest(image, qemu.VhostUser(str(sock), mac=vm_mac(1), server=server),
                   ip=f"{SUBNET}.1/24", mtu=MTU, cmd="true", then="wait", netns=host.name,
                   name=f"{lab.prefix}-vm1")
    g.start()
    netlab.wait_until(lambda: sock.exists(), 30, what="QEMU's vhost-user socket")
    return g
