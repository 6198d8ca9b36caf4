"""Which kernel fast path (issue #10)? Measures the fast-path variants (fastpath_bed.py) against
native and the kernel VXLAN + bridge, interleaved: every round runs every configuration in a new
random order, per wire MTU. Metrics: TCP 1 stream (iperf3, receiver), 64-byte UDP round trip
p50 (sockperf ping-pong), machine CPU seconds per GB (/proc/stat over the TCP run).

Each fast-path sample is checked against the fast path's own counters (the link's encapsulated
bytes on A, decapsulated on B, delivered to guest B) and records the bytes per skb seen there
(GSO kept whole: ~64 KB), the punts, and the receiving guest's checksum errors (nstat).

    sudo python3 -m bench.fastpath_variants [--mtus 1500 9000] [--rounds 3] [--quick]

Needs the release build of the fplab example: cargo build --release -p vnet-fastpath --examples.
Writes results/fastpath-<time>/{summary.md,samples.json}, and plots if matplotlib is there.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from vnetlab import netlab

from . import REPO
from .fastpath_bed import CONFIGS, FP_VARIANTS, FPLAB, FastpathBed, coexistence
from .machine import loadavg, machine_cpu
from .measure import MeasureError, parse_sockperf
from .report import med, pyplot, save

GOALS = """Goals of issue #10 (fast path = the chosen variant): TCP >= 1.1x kernel VXLAN at MTU 1500
and 9000, and >= 0.75x native at 9000; 64 B RTT p50 <= kernel VXLAN and <= 1.3x native;
CPU/GB <= kernel VXLAN."""


def nstat(ns) -> dict:
    out = ns.exec("nstat", "-az", "--json", check=False).stdout
    try:
        kernel = json.loads(out).get("kernel", {})
    except ValueError:
        return {}
    return {k: v for k, v in kernel.items() if "CsumErrors" in k}


def fp_evidence(before: dict, after: dict) -> dict:
    """The fast path's counters over one test: A's link (encapsulated), B's link (decapsulated),
    B's port (delivered), with bytes per skb."""
    def d(side, port, key):
        return after[side]["ports"][port][key] - before[side]["ports"][port][key]
    ev = {}
    for side, port, what in (("hA", "link2", "tx"), ("hB", "link2", "rx"), ("hB", "port1", "tx"),
                             ("hA", "port1", "rx")):
        fr, by = d(side, port, f"{what}_frames"), d(side, port, f"{what}_bytes")
        ev[f"{side}_{port}_{what}_frames"] = fr
        ev[f"{side}_{port}_{what}_bytes"] = by
        ev[f"{side}_{port}_{what}_bytes_per_skb"] = round(by / fr) if fr else None
    ev["punted"] = sum(d(s, "port1", "punted_frames") for s in ("hA", "hB"))
    ev["encap_fail"] = sum(d(s, "port1", "encap_fail") for s in ("hA", "hB"))
    ev["neigh_miss"] = sum(d(s, "port1", "neigh_miss") for s in ("hA", "hB"))
    return ev


def path_ok(config: str, before: dict, after: dict, payload: int) -> dict:
    if config in FP_VARIANTS:
        ev = fp_evidence(before, after)
        ev["ok"] = ev["hA_link2_tx_bytes"] >= payload and ev["hB_port1_tx_bytes"] >= payload
        ev["path"] = "fast path counters: link encapsulated on A, delivered to the guest on B"
        return ev
    ab = after["A"]["tx_bytes"] - before["A"]["tx_bytes"]
    rb = after["B"]["rx_bytes"] - before["B"]["rx_bytes"]
    return {"ok": ab >= payload and rb >= payload, "A_tx_bytes": ab, "B_rx_bytes": rb,
            "path": f"kernel device {before['dev']} in the host namespaces"}


def tcp(bed, config, seconds) -> dict:
    a, b, cip, sip = bed.endpoint(config)
    bed.server("iperf3", b, sip)
    before = bed.counters(config)
    csum0 = nstat(b)
    cpu0, t0 = machine_cpu()
    r = a.exec("iperf3", "-c", sip, "-B", cip, "-p", 5201, "-t", seconds, "-J", check=False, timeout=seconds + 30)
    cpu1, t1 = machine_cpu()
    after = bed.counters(config)
    csum1 = nstat(b)
    j = json.loads(r.stdout)
    if "error" in j:
        raise MeasureError(j["error"])
    recv = j["end"]["sum_received"]
    nbytes = int(recv["bytes"])
    ev = path_ok(config, before, after, nbytes)
    ev["csum_errors"] = {k: csum1.get(k, 0) - csum0.get(k, 0) for k in csum1 if csum1.get(k, 0) != csum0.get(k, 0)}
    return {"gbps": recv["bits_per_second"] / 1e9, "bytes": nbytes,
            "retransmits": j["end"].get("sum_sent", {}).get("retransmits"),
            "cpu_s_per_gb": (cpu1 - cpu0) / (nbytes / 1e9) if nbytes else None,
            "machine_cpu_s": round(cpu1 - cpu0, 3), "wall_s": round(t1 - t0, 3), "check": ev}


def rtt(bed, config, seconds) -> dict:
    a, b, cip, sip = bed.endpoint(config)
    bed.server("sockperf", b, sip)
    before = bed.counters(config)
    r = a.exec("sockperf", "ping-pong", "-i", sip, "-p", 11111, "--client_ip", cip, "-m", 64, "-t", seconds,
               check=False, timeout=seconds + 20)
    after = bed.counters(config)
    res = parse_sockperf(r.stdout + r.stderr)
    res["check"] = path_ok(config, before, after, res["total_received"] * 64)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mtus", type=int, nargs="+", default=[1500, 9000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tcp-seconds", type=int, default=5)
    ap.add_argument("--lat-seconds", type=int, default=3)
    ap.add_argument("--configs", nargs="+", default=CONFIGS, choices=CONFIGS)
    ap.add_argument("--quick", action="store_true", help="one round, 2 s tests (does the harness work?)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args(argv)
    if a.quick:
        a.rounds, a.tcp_seconds, a.lat_seconds = 1, 2, 2
    if os.geteuid() != 0:
        print("fastpath_variants.py: run as root", file=sys.stderr)
        return 2
    if not FPLAB.exists():
        print(f"{FPLAB} missing: cargo build --release -p vnet-fastpath --examples", file=sys.stderr)
        return 2
    out = a.out or REPO / "results" / time.strftime("fastpath-%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(a.seed)
    netlab.install_signal_cleanup()
    samples, notes = [], {"load_start": loadavg(), "cpus": os.cpu_count()}
    ntask = len(a.mtus) * a.rounds * len(a.configs) * 2
    done, t_start = 0, time.monotonic()
    for mtu in a.mtus:
        with FastpathBed(mtu, tag="fpvar") as bed:
            if "coexistence" not in notes:
                notes["coexistence"] = coexistence(bed.hA)
            for rnd in range(a.rounds):
                for metric in ("tcp", "rtt"):
                    order = list(a.configs)
                    rng.shuffle(order)
                    for config in order:
                        bed.prepare(config)
                        la = loadavg()
                        try:
                            res = (tcp(bed, config, a.tcp_seconds) if metric == "tcp"
                                   else rtt(bed, config, a.lat_seconds))
                            err = None
                        except (MeasureError, ValueError, KeyError, netlab.LabError) as e:
                            res, err = {}, str(e)
                        done += 1
                        s = {"mtu": mtu, "round": rnd, "metric": metric, "config": config, "load": la,
                             "error": err, **res}
                        samples.append(s)
                        val = (f"{res['gbps']:.2f} Gbit/s, {res['cpu_s_per_gb']:.2f} CPU-s/GB" if metric == "tcp" and res
                               else f"p50 {res['p50']:.1f} us" if res else f"ERROR {err}")
                        ok = res.get("check", {}).get("ok") if res else False
                        el = time.monotonic() - t_start
                        print(f"[{done}/{ntask} {el:4.0f}s, ~{el / done * (ntask - done):4.0f}s left] mtu {mtu} "
                              f"round {rnd + 1} {metric:3} {config:12} {val}{'' if ok else '  (PATH CHECK FAILED)'}",
                              flush=True)
            bed.stop_fastpath()
    notes["load_end"] = loadavg()
    (out / "samples.json").write_text(json.dumps({"notes": notes, "samples": samples}, indent=1))
    summary = report(samples, notes, a)
    (out / "summary.md").write_text(summary)
    plot(samples, out)
    print(summary)
    print(f"results in {out}")
    return 0


def report(samples, notes, a) -> str:
    lines = ["# Kernel fast path variants (issue #10)", "",
             f"{a.rounds} rounds, interleaved (configuration order shuffled per round and metric), "
             f"TCP {a.tcp_seconds} s, sockperf {a.lat_seconds} s. Machine: {notes['cpus']} CPUs, "
             f"load average {notes['load_start']:.1f} at start, {notes['load_end']:.1f} at end "
             "(shared with other work: preliminary figures). Medians, [min-max].", "", GOALS, ""]
    for mtu in sorted({s["mtu"] for s in samples}):
        lines += [f"## Wire MTU {mtu} (guests {mtu - 50})", "",
                  "| config | TCP Gbit/s | x kernel VXLAN | x native | 64 B RTT p50 us | x kernel VXLAN | x native | CPU-s/GB | x kernel VXLAN | path checks |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        get = {}
        for c in CONFIGS:
            t = [s for s in samples if s["mtu"] == mtu and s["config"] == c and s["metric"] == "tcp" and not s["error"]]
            r = [s for s in samples if s["mtu"] == mtu and s["config"] == c and s["metric"] == "rtt" and not s["error"]]
            if not t and not r:
                continue
            get[c] = (med([s["gbps"] for s in t]), med([s["p50"] for s in r]),
                      med([s["cpu_s_per_gb"] for s in t if s["cpu_s_per_gb"]]), t, r)
        for c, (g, p, cpu, t, r) in get.items():
            kx, nat = get.get("kernel-vxlan"), get.get("native")

            def ratio(v, ref, i):
                return f"{v / ref[i]:.2f}" if v and ref and ref[i] else "-"

            def rng(vals, fmt):
                return f"[{fmt.format(min(vals))}-{fmt.format(max(vals))}]" if vals else ""
            checks = sum(1 for s in t + r if s.get("check", {}).get("ok"))
            lines.append(
                f"| {c} | {g:.2f} {rng([s['gbps'] for s in t], '{:.2f}')} | {ratio(g, kx, 0)} | {ratio(g, nat, 0)} | "
                f"{p:.1f} {rng([s['p50'] for s in r], '{:.1f}')} | {ratio(p, kx, 1)} | {ratio(p, nat, 1)} | "
                f"{cpu:.2f} | {ratio(cpu, kx, 2)} | {checks}/{len(t) + len(r)} |" if g and p and cpu else
                f"| {c} | {g} | | | {p} | | | {cpu} | | {checks}/{len(t) + len(r)} |")
        fp = [s for s in samples if s["mtu"] == mtu and s["config"] in FP_VARIANTS and s["metric"] == "tcp"
              and not s["error"]]
        if fp:
            lines += ["", "Fast-path evidence over the TCP runs (bytes per skb as the programs counted them: "
                      "~64 KB means GSO stayed whole from guest A through the wire into guest B):", "",
                      "| config | round | A link encap B/skb | B link decap B/skb | B guest delivered B/skb | punted | csum errors in guest B |",
                      "| --- | --- | --- | --- | --- | --- | --- |"]
            for s in fp:
                c = s["check"]
                lines.append(f"| {s['config']} | {s['round'] + 1} | {c.get('hA_link2_tx_bytes_per_skb')} | "
                             f"{c.get('hB_link2_rx_bytes_per_skb')} | {c.get('hB_port1_tx_bytes_per_skb')} | "
                             f"{c.get('punted')} | {c.get('csum_errors') or 0} |")
        errs = [s for s in samples if s["mtu"] == mtu and s["error"]]
        if errs:
            lines += ["", "Errors: " + "; ".join(f"{s['config']} {s['metric']} r{s['round'] + 1}: {s['error']}" for s in errs)]
        lines.append("")
    lines += ["## Variant (a) and vnetd's UDP port", "",
              "A collect-metadata VXLAN device and a UDP socket on the same port, same namespace:", "",
              "```", json.dumps(notes.get("coexistence"), indent=1), "```", ""]
    return "\n".join(lines)


def plot(samples, out: Path) -> None:
    try:
        plt = pyplot()
    except ImportError:
        (out / "PLOTS-SKIPPED").write_text("matplotlib not installed (scripts/bench.sh --install-only installs it)\n")
        return
    mtus = sorted({s["mtu"] for s in samples})
    fig, axes = plt.subplots(len(mtus), 2, figsize=(11, 3.6 * len(mtus)), squeeze=False)
    for row, mtu in enumerate(mtus):
        for col, (metric, key, label) in enumerate((("tcp", "gbps", "TCP Gbit/s (1 stream)"),
                                                    ("rtt", "p50", "64 B RTT p50 (us)"))):
            ax = axes[row][col]
            data = [[s[key] for s in samples if s["mtu"] == mtu and s["config"] == c and s["metric"] == metric
                     and not s["error"]] for c in CONFIGS]
            ax.boxplot([d if d else [float("nan")] for d in data], labels=CONFIGS)
            ax.set_title(f"wire MTU {mtu}: {label}")
            ax.tick_params(axis="x", labelrotation=20)
    save(fig, out / "fastpath_variants.png")


if __name__ == "__main__":
    sys.exit(main())
