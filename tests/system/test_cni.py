"""The CNI plugin (issue #12) under a real CNI runtime: ``cnitool`` (built from the Go module
proxy by scripts/setup.sh into target/tools) runs ``vnet-cni`` with Debian's ``host-local``
IPAM (/usr/lib/cni) on two hosts of an etcd overlay. Two "containers" (network namespaces the
test made) get their NICs from the local vnetd, ping and run iperf3 across the overlay; CHECK
passes and then fails when the container's address is taken away; STATUS answers; DEL (twice)
leaves nothing behind in vnetd, the host, the container, host-local's store or etcd; GC
removes an attachment the runtime no longer knows; STATUS fails with code 50 once vnetd is
stopped."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from vnetlab import netlab
from test_etcd import EtcdServer, OVERLAY, TTL

CNITOOL = netlab.REPO / "target" / "tools" / "cnitool"
VNET_CNI = netlab.VNETD.parent / "vnet-cni"
CNI_DIR = Path("/usr/lib/cni")
NET = "vnet-test"


@pytest.fixture
def etcd(lab):
    for p, what in ((CNITOOL, "cnitool (scripts/setup.sh builds it)"),
                    (CNI_DIR / "host-local", "host-local (Debian's containernetworking-plugins)"),
                    (VNET_CNI, "vnet-cni (cargo build --release)")):
        if not p.exists():
            pytest.fail(f"{p} is missing: {what}")
    e = EtcdServer(lab)
    e.start()
    yield e
    e.stop()


class CniHost:
    """A host running vnetd --etcd, and the CNI configuration its runtime uses."""

    def __init__(self, lab, etcd, role, first, last, mtu=1400, extra=()):
        self.lab = lab
        self.h = lab.host(role)
        self.h.start_vnetd(config="", args=[
            "--etcd", etcd.endpoint, "--overlay", OVERLAY, "--host-id", role,
            "--advertise-addr", self.h.underlay_ip, "--etcd-lease-ttl", TTL, *extra])
        self.dir = lab.workdir / f"cni-{role}"
        (self.dir / "net.d").mkdir(parents=True)
        # The plugins: vnet-cni (as built) and Debian's host-local.
        (self.dir / "bin").mkdir()
        os.symlink(VNET_CNI, self.dir / "bin" / "vnet-cni")
        self.ipam_dir = self.dir / "ipam"
        conf = {
            "cniVersion": "1.1.0", "name": NET,
            "plugins": [{
                "type": "vnet-cni", "vni": 5, "mtu": mtu, "control": netlab.CONTROL,
                "stateDir": str(self.h.state_dir),
                "ipam": {"type": "host-local", "dataDir": str(self.ipam_dir),
                         "ranges": [[{"subnet": "10.77.0.0/24", "rangeStart": first, "rangeEnd": last}]],
                         "routes": [{"dst": "10.78.0.0/16"}]},
            }],
        }
        (self.dir / "net.d" / f"{NET}.conflist").write_text(json.dumps(conf, indent=1))

    def cnitool(self, verb, container, args="", check=True):
        env = [f"NETCONFPATH={self.dir / 'net.d'}", f"CNI_PATH={self.dir / 'bin'}:{CNI_DIR}",
               "CNI_IFNAME=eth0", f"CNI_ARGS={args}"]
        path = getattr(container, "cni_path", f"/var/run/netns/{container.name}")
        r = self.h.exec("env", *env, CNITOOL, verb, NET, path, check=False, timeout=60)
        if check and r.returncode != 0:
            raise netlab.LabError(f"cnitool {verb} on {self.h.role}: rc={r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def cni_interfaces(self):
        return [i for i in self.h.ctl_json("show", "interfaces", "json") if i["name"].startswith("cni-")]

    def allocations(self):
        d = self.ipam_dir / NET
        return sorted(p.name for p in d.iterdir() if p.name[0].isdigit()) if d.exists() else []


def container_ip(c):
    for a in json.loads(c.ip("-j", "addr", "show", "dev", "eth0").stdout)[0]["addr_info"]:
        if a["family"] == "inet":
            return a["local"]
    return None


def test_cni_plugin_with_cnitool(lab, etcd, record):
    a = CniHost(lab, etcd, "h1", "10.77.0.10", "10.77.0.59")
    # h2 without the kernel fast path: its veth interfaces are TAPs served by vnetd.
    b = CniHost(lab, etcd, "h2", "10.77.0.60", "10.77.0.109", extra=["--no-kernel-fastpath"])
    c1, c2 = lab.netns("c1"), lab.netns("c2")
    # c1 is a named namespace (vnetd puts the device there); c2 is given to the runtime as a
    # process's namespace, /proc/PID/ns/net, as some runtimes do (the plugin moves the device).
    holder = c2.popen("sleep", "600")
    c2.cni_path = f"/proc/{holder.pid}/ns/net"
    host_devices = {x.h.role: set(x.h.links()) for x in (a, b)}

    r1 = json.loads(a.cnitool("add", c1).stdout)
    r2 = json.loads(b.cnitool("add", c2, args="IgnoreUnknown=1;MAC=52:54:00:77:00:02").stdout)
    record("add_result", r1)
    assert r1["cniVersion"] == "1.1.0"
    assert r1["interfaces"][0]["name"] == "eth0"
    assert r1["interfaces"][0]["sandbox"] == f"/var/run/netns/{c1.name}"
    assert r1["ips"][0]["address"] == "10.77.0.10/24" and r1["ips"][0]["interface"] == 0
    assert r2["ips"][0]["address"] == "10.77.0.60/24"
    assert r2["interfaces"][0]["mac"] == "52:54:00:77:00:02"
    # The container's NIC: renamed, up, the MTU and addresses and routes of the config.
    link = c1.links()["eth0"]
    assert link["address"] == r1["interfaces"][0]["mac"] and link["mtu"] == 1400
    assert "UP" in link["flags"]
    assert container_ip(c1) == "10.77.0.10"
    assert "10.78.0.0/16" in c1.ip("route").stdout
    assert r2["interfaces"][0]["sandbox"] == c2.cni_path
    assert c2.links()["eth0"]["address"] == "52:54:00:77:00:02"
    # vnetd's side: one interface each, in VNI 5, of the kernel fast path's veth kind (on h2,
    # without the fast path, vnetd serves a TAP of the same name instead).
    (ia,), (ib,) = a.cni_interfaces(), b.cni_interfaces()
    assert ia["vni"] == 5 and ia["mac"] == r1["interfaces"][0]["mac"] and ia["kind"] == "veth"
    assert ib["mac"] == "52:54:00:77:00:02" and ib["kind"] == "veth"
    assert ia["netns"] == c1.name and ib["netns"] is None
    assert c2.links()["eth0"].get("link_type") == "ether"
    record("c1_device_kind", json.loads(c1.ip("-d", "-j", "link", "show", "eth0").stdout)[0].get("linkinfo", {}).get("info_kind"))
    record("c2_device_kind", json.loads(c2.ip("-d", "-j", "link", "show", "eth0").stdout)[0].get("linkinfo", {}).get("info_kind"))
    assert not [d for d in a.h.links() if d.startswith("vc")], "the device stayed on the host"

    # Across the overlay: routes from etcd placements, ping and iperf3.
    t = lab.wait_ping(c1, "10.77.0.60", timeout=20)
    record("first_ping_after_add_s", round(t, 2))
    before = a.h.stats()
    res = lab.iperf(c2, "10.77.0.60", c1, seconds=3)
    after = a.h.stats()
    record("iperf3_container_to_container_gbps", round(res.gbps, 3))
    assert res.gbps > 0.05
    # Across the link to h2: in vnetd's counters, or in the kernel fast path's merged into them.
    sent = netlab.delta(before, after, "c-h2-v5", "tx_bytes")
    assert sent > 0.9 * res.bytes, (sent, res.bytes)

    # CHECK: as ADD left it; then not, once the address is gone.
    a.cnitool("check", c1)
    b.cnitool("check", c2)
    c1.ip("addr", "del", "10.77.0.10/24", "dev", "eth0")
    r = a.cnitool("check", c1, check=False)
    assert r.returncode != 0
    err = json.loads(r.stdout) if r.stdout.strip().startswith("{") else {}
    assert "lacks address 10.77.0.10/24" in r.stdout + r.stderr, r.stdout + r.stderr
    record("check_error", (err or {"raw": r.stdout + r.stderr}))
    c1.ip("addr", "add", "10.77.0.10/24", "dev", "eth0")
    a.cnitool("check", c1)
    a.cnitool("status", c1)

    # DEL: nothing left anywhere; DEL again is fine.
    assert a.allocations() == ["10.77.0.10"]
    for host, c in ((a, c1), (b, c2)):
        host.cnitool("del", c)
        host.cnitool("del", c)
        assert host.cni_interfaces() == []
        assert "eth0" not in c.links()
        assert set(host.h.links()) == host_devices[host.h.role], "devices left on the host"
        assert host.allocations() == []
    netlab.wait_until(lambda: json.loads(etcd.ctl("interfaces", "json")) == [], 10,
                      what="the placements to leave etcd")
    netlab.wait_until(lambda: not any(r["dst"].startswith("52:54:00:77")
                                      for r in a.h.ctl_json("show", "routes", "json")), 10,
                      what="the routes to the containers to go")

    # GC: the runtime knows no attachment any more (cnitool gc passes none): ours go.
    a.cnitool("add", c1)
    assert len(a.cni_interfaces()) == 1
    a.cnitool("gc", c1)
    assert a.cni_interfaces() == []
    a.cnitool("del", c1)

    # STATUS without a vnetd: the spec's "plugin not available" (50), in the CNI error
    # format (the plugin run directly, as a runtime does: cnitool prints only the message).
    b.h.stop_vnetd()
    r = b.cnitool("status", c2, check=False)
    assert r.returncode != 0 and "vnetd is not available" in r.stderr, r.stderr
    conf = json.loads((b.dir / "net.d" / f"{NET}.conflist").read_text())
    plugin_conf = dict(conf["plugins"][0], cniVersion="1.1.0", name=NET)
    r = b.h.exec("env", "CNI_COMMAND=STATUS", f"CNI_PATH={b.dir / 'bin'}:{CNI_DIR}", VNET_CNI,
                 check=False, input=json.dumps(plugin_conf))
    err = json.loads(r.stdout)
    assert r.returncode == 1 and err["code"] == 50 and err["cniVersion"] == "1.1.0", r.stdout
    record("status_error", err)
    # ADD without a vnetd fails cleanly (try again later, 11) and leaves no address taken.
    r = b.cnitool("add", c2, check=False)
    assert r.returncode != 0 and b.allocations() == []


def cnitool_container_id(container) -> str:
    """The container id cnitool gives an attachment: a hash of the namespace path."""
    import hashlib
    path = getattr(container, "cni_path", f"/var/run/netns/{container.name}")
    return "cnitool-" + hashlib.sha512(path.encode()).hexdigest()[:20]


def gc_keeping(host, keep) -> None:
    """CNI GC as a runtime that still knows the attachments ``keep`` runs it (the plugin called
    directly: cnitool's gc passes no valid attachments)."""
    conf = json.loads((host.dir / "net.d" / f"{NET}.conflist").read_text())
    plugin_conf = dict(conf["plugins"][0], cniVersion="1.1.0", name=NET)
    plugin_conf["cni.dev/valid-attachments"] = [
        {"containerID": cnitool_container_id(c), "ifname": "eth0"} for c in keep]
    r = host.h.exec("env", "CNI_COMMAND=GC", f"CNI_PATH={host.dir / 'bin'}:{CNI_DIR}", VNET_CNI,
                    check=False, input=json.dumps(plugin_conf))
    assert r.returncode == 0, r.stdout + r.stderr


def test_cni_attachments_outlive_vnetd(lab, etcd, record):
    """Issue #17: a container's NIC outlives its host's vnetd. After a SIGKILL and after a
    SIGTERM, each followed by a new vnetd, CHECK passes and the container keeps its device and
    its traffic; GC after a restart removes only the attachment the runtime no longer knows;
    DEL while no vnetd runs is queued in the state directory and the next vnetd takes the
    interface out, with everything made for it."""
    a = CniHost(lab, etcd, "h1", "10.77.0.10", "10.77.0.59")
    b = CniHost(lab, etcd, "h2", "10.77.0.60", "10.77.0.109")
    c1, c3, c2 = lab.netns("c1"), lab.netns("c3"), lab.netns("c2")
    host_devices = set(a.h.links())
    a.cnitool("add", c1)
    b.cnitool("add", c2)
    lab.wait_ping(c1, "10.77.0.60", timeout=20)
    ifindex = json.loads(c1.ip("-j", "link", "show", "eth0").stdout)[0]["ifindex"]
    for sig in (signal.SIGKILL, signal.SIGTERM):
        a.h.stop_vnetd(sig=sig)
        t0 = time.monotonic()
        a.h.start_vnetd(args=netlab.own_args(a.h.vnetd))
        a.cnitool("check", c1)
        lab.wait_ping(c1, "10.77.0.60", timeout=5)
        record(f"after_{sig.name}_ping_s", round(time.monotonic() - t0, 2))
        assert json.loads(c1.ip("-j", "link", "show", "eth0").stdout)[0]["ifindex"] == ifindex
        assert container_ip(c1) == "10.77.0.10"
    # GC after a restart: c3 is stale (the runtime lost it), c1 is not.
    a.cnitool("add", c3)
    a.h.restart_vnetd()
    name_c1 = [i["name"] for i in a.cni_interfaces()]
    assert len(name_c1) == 2
    gc_keeping(a, [c1])
    (left,) = a.cni_interfaces()
    assert left["netns"] == c1.name, left
    a.cnitool("check", c1)
    a.cnitool("del", c3)
    # DEL with no vnetd running: queued; the next vnetd removes the interface and its devices.
    assert a.h.stop_vnetd() == 0
    a.cnitool("del", c1)
    assert a.allocations() == []
    queued = sorted(p.name for p in (a.h.state_dir / "cni-deleted").iterdir())
    assert queued == [left["name"]], queued
    a.h.start_vnetd(args=netlab.own_args(a.h.vnetd))
    assert a.cni_interfaces() == []
    assert set(a.h.links()) == host_devices, "devices made for the deleted container stayed"
    assert not (a.h.state_dir / "cni-deleted" / left["name"]).exists()
    netlab.wait_until(lambda: not any(i["mac"] == left["mac"] for i in json.loads(etcd.ctl("interfaces", "json"))),
                      10, what="the container's placement to leave etcd")
