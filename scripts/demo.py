#!/usr/bin/env python3
"""vnet demo: three hosts with two VMs each on one virtual LAN, all on this machine.

Hosts and VMs are network namespaces; the "physical" network is a bridge with a veth per
host. Each host runs vnetd with UDP (VXLAN) links to the two others, as in the worked example
of docs/control-language.md. The demo pings across the overlay, runs iperf3 between VMs on
different hosts, measures the same on the bare veth underlay and on the Linux kernel's own
VXLAN for comparison, prints a table and removes everything (also on Ctrl-C or failure).

    sudo python3 scripts/demo.py [--seconds 3] [--kind veth|tap] [--no-kernel] [--hold]

The VMs' NICs are `veth` interfaces by default, which the kernel fast path forwards (eBPF,
programmed by vnetd); `--kind tap` gives them TAPs served by vnetd in user space.

Needs root, /dev/net/tun, iproute2, ping and iperf3, and the release build
(`cargo build --release`; or set VNETD / VNETCTL).
"""

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

# Run as a file (scripts/ is no package): the lab package lives at the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vnetlab import netlab  # noqa: E402


def step(msg):
    print(f"\n== {msg}", flush=True)


def info(msg):
    print(f"   {msg}", flush=True)


def preflight():
    problems = []
    if os.geteuid() != 0:
        problems.append("run as root (namespaces and TAP devices need it)")
    if not os.path.exists("/dev/net/tun"):
        problems.append("/dev/net/tun is missing")
    for t in ("ip", "bridge", "ping", "iperf3", "ss"):
        if shutil.which(t) is None:
            problems.append(f"'{t}' not found (apt-get install iproute2 iputils-ping iperf3)")
    for b in (netlab.VNETD, netlab.VNETCTL):
        if not b.exists():
            problems.append(f"{b} not found: build with `cargo build --release` (or set VNETD / VNETCTL)")
    if problems:
        sys.exit("demo cannot run:\n  " + "\n  ".join(problems))


def rtt(lab, src, dst, count):
    r = lab.ping(src, dst, count=count, interval=0.05, wait=1)
    if not r.ok:
        raise RuntimeError(f"ping {dst} from {src.name} failed:\n{r.output}")
    return r.avg_ms


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3, help="length of each iperf3 run (default 3)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved ping rounds (default 3)")
    ap.add_argument("--mtu", type=int, default=1450,
                    help="VM MTU (default 1450: the encapsulated frame fits the 1500-byte underlay, as the "
                         "kernel VXLAN's default; 1500 makes vnet fragment)")
    ap.add_argument("--kind", choices=("veth", "tap"), default="veth",
                    help="the VMs' interface kind: veth (the kernel fast path, default) or tap (vnetd in user space)")
    ap.add_argument("--no-kernel", action="store_true", help="skip the kernel VXLAN comparison")
    ap.add_argument("--hold", action="store_true", help="keep the topology until Enter is pressed")
    args = ap.parse_args()
    preflight()
    netlab.install_signal_cleanup()

    lab = netlab.Lab(tag="demo")
    try:
        run(lab, args)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        lab.failed = True
        return 130
    except Exception as e:
        lab.failed = True
        print(f"\ndemo failed: {e}\nlogs kept in {lab.workdir}\n{lab.logs(1500)}", file=sys.stderr)
        return 1
    finally:
        step("tearing down")
        lab.close()
        info("all namespaces, devices and processes removed")
    return 0


def run(lab, args):
    step("building 3 hosts x 2 VMs (network namespaces) joined by a veth + bridge underlay")
    m = netlab.udp_mesh(lab, ("A", "B", "C"), guests_per_host=2, mtu=args.mtu, kind=args.kind)
    A, B, C = m.hosts
    for h in m.hosts:
        vms = ", ".join(f"{g.role} {g.ip_addr} ({g.mac})" for g in m.guests[h.role])
        info(f"host {h.role}: netns {h.name}, underlay {h.underlay_ip}, vnetd pid {h.vnetd.pid}; VMs: {vms}")
    info(f"host A's vnetd config ({A.config_path}):")
    for line in A.config_path.read_text().splitlines():
        info(f"    {line}")
    paths = {i["name"]: i.get("path", "user") for i in A.ctl_json("show", "interfaces", "json")}
    path = "kernel" if all(p == "kernel" for p in paths.values()) else "user"
    info(f"data path of host A's VMs: {', '.join(f'{n} {p}' for n, p in paths.items())}"
         + ("" if path == "kernel" or args.kind == "tap" else
            " (the kernel fast path is not available here: see vnetd's log)"))

    step("ping between every pair of VMs on different hosts")
    guests = m.all_guests()
    pairs = [(g, d.ip_addr) for g in guests for d in guests if m.host_of(g) is not m.host_of(d)]
    res = lab.ping_many(pairs, count=2)
    ok = sum(1 for r in res.values() if r.ok)
    info(f"{ok}/{len(pairs)} pairs answered")
    if ok != len(pairs):
        bad = [f"{s.role}->{d}" for (s, d), r in res.items() if not r.ok]
        raise RuntimeError(f"no answer for {bad}")

    a1, b1 = m.guests["A"][0], m.guests["B"][0]
    rows = []  # (path, rtt ms, gbps)
    label = "kernel fast path" if path == "kernel" else "vnetd"
    configs = [(f"vnet, {label} (VM a1 -> VM b1, MTU {args.mtu})", a1, b1, b1.ip_addr)]
    configs.insert(0, ("native veth underlay (host A -> host B)", A, B, B.underlay_ip))
    if not args.no_kernel:
        step("building two kernel-VXLAN hosts on the same underlay (the in-kernel baseline)")
        ka = lab.kernel_vxlan_host("KA", vni=1)
        kb = lab.kernel_vxlan_host("KB", vni=1, peers=[ka.underlay_ip])
        ka.add_peer(kb.underlay_ip)
        k1 = lab.guest("k1", ip="192.168.60.1", mac="52:54:00:99:01:01")
        k2 = lab.guest("k2", ip="192.168.60.2", mac="52:54:00:99:02:01")
        ka.add_vm(k1, mac=k1.mac)
        kb.add_vm(k2, mac=k2.mac)
        configs.append(("kernel VXLAN (VM k1 -> VM k2, MTU 1450)", k1, k2, k2.ip_addr))

    step(f"ping RTT, {args.rounds} interleaved rounds of 20 pings per path")
    samples = {c[0]: [] for c in configs}
    for _ in range(args.rounds):
        for name, src, dst, ip in configs:
            samples[name].append(rtt(lab, src, ip, 20))
    step(f"iperf3 TCP, {args.seconds:g} s per path")
    st0 = A.stats()
    for name, src, dst, ip in configs:
        r = lab.iperf(dst, ip, src, seconds=args.seconds)
        info(f"{name}: {r.gbps:.2f} Gbit/s")
        rows.append((name, statistics.median(samples[name]), r.gbps, r))
    st1 = A.stats()

    # confirm with vnet's own counters that the VM traffic crossed the overlay
    vnet_row = next(r for r in rows if r[0].startswith("vnet"))
    sent = netlab.delta(st0, st1, "to-b", "tx_bytes")
    info(f"vnetd on A sent {sent / 1e6:.1f} MB over link to-b during the runs "
         f"(iperf3 payload received: {vnet_row[3].bytes / 1e6:.1f} MB)")
    if sent < vnet_row[3].bytes:
        raise RuntimeError("vnet counters do not account for the iperf3 traffic")

    step("results")
    native = rows[0]
    w = max(len(r[0]) for r in rows)
    print(f"   {'path':<{w}}  {'RTT (ms)':>9}  {'x native':>8}  {'TCP Gbit/s':>10}  {'% native':>8}")
    for name, ms, gbps, _ in rows:
        print(f"   {name:<{w}}  {ms:9.3f}  {ms / native[1]:8.2f}  {gbps:10.2f}  {100 * gbps / native[2]:7.0f}%")
    info("(RTT: median of the per-round averages; one machine, so the 'wire' is memory copies)")
    st = A.stats()
    info("vnetd on host A, per port (frames rx/tx): " + ", ".join(
        f"{p['name']} {p['rx_frames']}/{p['tx_frames']}" for p in st["ports"]))

    if args.hold:
        step("the topology is up; try for example:")
        info(f"ip netns exec {A.name} {netlab.VNETCTL} show routes")
        info(f"ip netns exec {a1.name} ping {b1.ip_addr}")
        input("   press Enter to tear down ")


if __name__ == "__main__":
    sys.exit(main())
