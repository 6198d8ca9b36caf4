"""The suite's summary.md and plots, from the list of samples alone (so they can be redrawn
later: ``python3 -m bench.suite_report results/bench-.../samples.json``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .report import COLORS, ensure_matplotlib, fmt, md_row, med, phases, pyplot, ratio, save, spread

CONFIG_ORDER = ["native", "kernel-vxlan", "vnet-kernel", "vnet-guest-driven", "vnet-polling", "vnet-adaptive",
                "vnet-encrypted", "vnet-encrypted-veth", "vnet-encrypted-guest-driven",
                "vnet-encrypted-veth-guest-driven"]
VNET_CONFIGS = ["vnet-guest-driven", "vnet-polling", "vnet-adaptive"]


# metric -> (label, better, group)
METRICS = {
    "tcp1_gbps": ("TCP throughput, 1 stream (Gbit/s)", "higher", "throughput"),
    "tcp4_gbps": ("TCP throughput, 4 streams (Gbit/s)", "higher", "throughput"),
    "udp_gbps": ("UDP goodput at the receiver (Gbit/s)", "higher", "throughput"),
    "udp_loss_pct": ("UDP loss (%)", "lower", "throughput"),
    "rtt64_p50_us": ("64 B RTT p50 (µs)", "lower", "latency"),
    "rtt64_p99_us": ("64 B RTT p99 (µs)", "lower", "latency"),
    "rtt64_p999_us": ("64 B RTT p99.9 (µs)", "lower", "latency"),
    "cpu_s_per_gb_tcp1": ("machine CPU-s per GB, TCP 1 stream", "lower", "cpu"),
    "cpu_s_per_gb_tcp4": ("machine CPU-s per GB, TCP 4 streams", "lower", "cpu"),
    "vnetd_cpu_s_per_gb_tcp1": ("vnetd's own CPU-s per GB, TCP 1 stream", "lower", "cpu"),
    "vnetd_cpu_s_per_gb_tcp4": ("vnetd's own CPU-s per GB, TCP 4 streams", "lower", "cpu"),
    "mpi_pingpong_lat_us": ("MPI ping-pong latency, 8 B one way (µs, NetPIPE)", "lower", "mpi"),
    "mpi_pingpong_bw_gbps": ("MPI ping-pong best bandwidth (Gbit/s, NetPIPE)", "higher", "mpi"),
    "hpcc_pingpong_lat_us": ("HPCC ping-pong latency (µs)", "lower", "mpi"),
    "hpcc_pingpong_bw_gbps": ("HPCC ping-pong bandwidth (Gbit/s)", "higher", "mpi"),
    "hpcc_ring_lat_us": ("HPCC randomly-ordered ring latency (µs)", "lower", "mpi"),
    "hpcc_ring_bw_gbps": ("HPCC naturally-ordered ring bandwidth (Gbit/s)", "higher", "mpi"),
}


def metric_info(m: str) -> tuple:
    if m in METRICS:
        return METRICS[m]
    if m.startswith("rtt_size_"):
        size = int(m.split("_")[2])
        return (f"{size} B UDP RTT p50 (µs)", "lower", "size")
    return (m, "lower", "other")


def metric_sort_key(m: str):
    keys = list(METRICS)
    if m in keys:
        grp = METRICS[m][2]
        return (["throughput", "latency", "size", "cpu", "mpi"].index(grp), keys.index(m), 0)
    if m.startswith("rtt_size_"):
        return (2, 0, int(m.split("_")[2]))
    return (9, 0, 0)


# --- aggregation ----------------------------------------------------------------------------

def valid(samples):
    return [s for s in samples if s.get("value") is not None and not s.get("error")]


def group(samples, phase) -> dict:
    """(metric, config) -> [values] for one phase."""
    g: dict = {}
    for s in valid(samples):
        if s["phase"] == phase:
            g.setdefault((s["metric"], s["config"]), []).append(float(s["value"]))
    return g


def medians(samples, phase):
    """m(metric, config): the median of one phase's values (None where not measured)."""
    g = group(samples, phase)
    return lambda metric, config: med(g.get((metric, config), []))


# --- summary.md -----------------------------------------------------------------------------

def goal_checks(samples, phase) -> list:
    """The goals of issue #3 for one phase: (goal, detail, met or None if not measured)."""
    m = medians(samples, phase)
    out = []
    for metric, streams in (("tcp1_gbps", "1 stream"), ("tcp4_gbps", "4 streams")):
        kx, nat = m(metric, "kernel-vxlan"), m(metric, "native")
        for cfg in VNET_CONFIGS:
            v = m(metric, cfg)
            if v is None or kx is None:
                continue
            pct = f", {100 * v / nat:.0f} % of native (aim 90 %)" if nat else ""
            out.append((f"TCP throughput ({streams}) ≥ kernel VXLAN: {cfg}",
                        f"{fmt(v)} vs {fmt(kx)} Gbit/s = {v / kx:.2f}×{pct}", v >= kx))
    pol, nat, ad, kx = (m("rtt64_p50_us", c) for c in ("vnet-polling", "native", "vnet-adaptive", "kernel-vxlan"))
    if pol is not None and nat:
        out.append(("64 B RTT p50, polling ≤ 1.3× native", f"{fmt(pol)} vs {fmt(nat)} µs = {pol / nat:.2f}×",
                    pol <= 1.3 * nat))
    if ad is not None and kx:
        out.append(("64 B RTT p50, adaptive ≤ kernel VXLAN", f"{fmt(ad)} vs {fmt(kx)} µs = {ad / kx:.2f}×",
                    ad <= kx))
    for metric in ("cpu_s_per_gb_tcp1", "cpu_s_per_gb_tcp4"):
        kxc = m(metric, "kernel-vxlan")
        for cfg in VNET_CONFIGS:
            v = m(metric, cfg)
            if v is None or not kxc:
                continue
            out.append((f"CPU per GB ≤ 2× kernel VXLAN ({metric.rsplit('_', 1)[1]}): {cfg}",
                        f"{fmt(v)} vs {fmt(kxc)} CPU-s/GB = {v / kxc:.2f}×", v <= 2 * kxc))
    return out


def kernel_goal_checks(samples, phase) -> list:
    """The goals of issue #10 for one phase (the kernel fast path, `vnet-kernel`)."""
    m = medians(samples, phase)
    out = []
    v, kx, nat = m("tcp1_gbps", "vnet-kernel"), m("tcp1_gbps", "kernel-vxlan"), m("tcp1_gbps", "native")
    if v is not None and kx:
        out.append(("TCP 1 stream ≥ 1.1× kernel VXLAN", f"{fmt(v)} vs {fmt(kx)} Gbit/s = {v / kx:.2f}×",
                    v >= 1.1 * kx))
    if v is not None and nat and phase.startswith("mtu9000"):
        out.append(("TCP 1 stream ≥ 0.75× native (wire MTU 9000)", f"{fmt(v)} vs {fmt(nat)} Gbit/s = {v / nat:.2f}×",
                    v >= 0.75 * nat))
    r, rkx, rnat = (m("rtt64_p50_us", c) for c in ("vnet-kernel", "kernel-vxlan", "native"))
    if r is not None and rkx:
        out.append(("64 B RTT p50 ≤ kernel VXLAN", f"{fmt(r)} vs {fmt(rkx)} µs = {r / rkx:.2f}×", r <= rkx))
    if r is not None and rnat:
        out.append(("64 B RTT p50 ≤ 1.3× native", f"{fmt(r)} vs {fmt(rnat)} µs = {r / rnat:.2f}×", r <= 1.3 * rnat))
    c, ckx = m("cpu_s_per_gb_tcp1", "vnet-kernel"), m("cpu_s_per_gb_tcp1", "kernel-vxlan")
    if c is not None and ckx:
        out.append(("machine CPU-s per GB ≤ kernel VXLAN", f"{fmt(c)} vs {fmt(ckx)} = {c / ckx:.2f}×", c <= ckx))
    for metric, label, higher in (("mpi_pingpong_lat_us", "MPI (NetPIPE) latency", False),
                                  ("mpi_pingpong_bw_gbps", "MPI (NetPIPE) bandwidth", True),
                                  ("hpcc_pingpong_lat_us", "HPCC ping-pong latency", False),
                                  ("hpcc_pingpong_bw_gbps", "HPCC ping-pong bandwidth", True)):
        a, b, n = m(metric, "vnet-kernel"), m(metric, "kernel-vxlan"), m(metric, "native")
        if a is None or not b:
            continue
        within = a >= 0.9 * b if higher else a <= 1.1 * b
        nat_txt = f"; {a / n:.2f}× native" if n else ""
        out.append((f"{label} within 10 % of kernel VXLAN", f"{fmt(a)} vs {fmt(b)} = {a / b:.2f}×{nat_txt}", within))
    return out


def encryption_table(samples, phase) -> list:
    """vnet plaintext (adaptive) against vnet encrypted (adaptive, Noise link): same daemons."""
    g = group(samples, phase)
    rows = []
    for metric in ("tcp1_gbps", "tcp4_gbps", "udp_gbps", "rtt64_p50_us", "rtt64_p99_us", "cpu_s_per_gb_tcp1"):
        p, e = med(g.get((metric, "vnet-adaptive"), [])), med(g.get((metric, "vnet-encrypted"), []))
        if p is None or e is None:
            continue
        label, better, _ = metric_info(metric)
        rows.append(f"| {label} {'↑' if better == 'higher' else '↓'} | {fmt(p)} | {fmt(e)} | {ratio(e, p)} |")
    return rows


def dispatch_table(samples, phase) -> list:
    """Per vnet config and test kind: median frames per wake-up and mode switches."""
    rows = []
    kinds = [("tcp1_gbps", "TCP 1 stream"), ("tcp4_gbps", "TCP 4 streams"), ("udp_gbps", "UDP"),
             ("rtt64_p50_us", "64 B ping-pong"), ("mpi_pingpong_lat_us", "MPI NetPIPE"),
             ("hpcc_pingpong_lat_us", "HPCC")]
    for cfg in VNET_CONFIGS:
        for metric, label in kinds:
            ds = [s["dispatch"] for s in valid(samples)
                  if s["phase"] == phase and s["config"] == cfg and s["metric"] == metric and s.get("dispatch")]
            if not ds:
                continue
            fpw = [d["frames_per_wakeup"] for d in ds if d.get("frames_per_wakeup") is not None]
            sw = [d["switches"] for d in ds]
            gso = [d.get("offload", {}).get("udp_gso_sends", 0) for d in ds]
            ends = sorted({m.split(":", 1)[1] for d in ds for m in d.get("end_modes", [])})
            rows.append(f"| {cfg} | {label} | {fmt(med(fpw))} | {fmt(med(sw))} | {fmt(med(gso))} | {', '.join(ends)} |")
    return rows


def section(title: str, lines: list) -> list:
    """A section of summary.md after a blank line (none when it has no lines)."""
    return ["", title, "", *lines] if lines else []


def table(head: list, rows: list) -> list:
    """A Markdown table (no lines without rows)."""
    return [md_row(head), md_row(["---"] * len(head)), *rows] if rows else []


def goals_table(title: str, goals: list) -> list:
    """The lines of a goals section (none when no goal could be judged)."""
    if not goals:
        return []
    return [f"### {title}", "", "| goal | measured (medians) | |", "| --- | --- | --- |",
            *(md_row([goal, detail, f"**{'met' if met else 'not met'}**"]) for goal, detail, met in goals), ""]


def write_summary(doc: dict, path: Path) -> None:
    samples = doc["samples"]
    meta = doc.get("meta", {})
    L = []
    L.append(f"# vnet benchmark: {meta.get('started', '')}")
    L.append("")
    L.append(f"- command: `{meta.get('command', '')}`")
    L.append(f"- duration: {meta.get('elapsed_s', 0):.0f} s; machine: {meta.get('machine', '')}")
    L.append(f"- vnet: {meta.get('vnet_version', '')}; vnet settings: {meta.get('vnet_settings') or 'defaults'}"
             f" (the three vnet configurations are the same daemons switched with `vnetctl set mode`)")
    L.append(f"- rounds: {meta.get('rounds')} (configuration order shuffled per round and metric), "
             f"iperf3 tests {meta.get('duration')} s, sockperf tests {meta.get('lat_duration')} s "
             f"(sockperf measures its last {meta.get('lat_duration', 1) - 0.45:.2f} s after a warm-up)")
    bg = meta.get("background_cpu", [])
    if bg:
        L.append(f"- other load on the machine while idle (busy CPUs out of {meta.get('ncpu')}): "
                 + ", ".join(f"{b:.2f}" for b in bg)
                 + " (measured between phases; CPU-per-GB counts the whole machine)")
    n_all = len(samples)
    n_err = len([s for s in samples if s.get("error")])
    checks = [s for s in valid(samples) if s.get("check") is not None and "from" not in s.get("extra", {})]
    n_ok = len([s for s in checks if s["check"].get("ok")])
    L.append(f"- samples: {n_all} ({n_err} failed); counters check (the path's byte counters grew by at "
             f"least the payload; vnet: its own `show stats json` link counters): {n_ok}/{len(checks)} passed")
    L.append("")
    L.append("Ratios are the median divided by the native or kernel VXLAN median of the same metric "
             "and phase (above 1 is better for throughput, worse for latency and CPU). "
             "Spread is min–max over the rounds.")
    for phase in phases(samples):
        g = group(samples, phase)
        L.append("")
        L.append(f"## {phase}")
        L.append("")
        L += goals_table("Goals of issue #3", goal_checks(samples, phase))
        L += goals_table("Goals of issue #10 (the kernel fast path, `vnet-kernel`)", kernel_goal_checks(samples, phase))
        L.append("### All metrics")
        L.append("")
        L.append("| metric | config | median | spread | n | vs native | vs kernel VXLAN |")
        L.append("| --- | --- | --- | --- | --- | --- | --- |")
        metrics = sorted({m for m, _ in g}, key=metric_sort_key)
        for metric in metrics:
            label, better, _ = metric_info(metric)
            nat = med(g.get((metric, "native"), []))
            kx = med(g.get((metric, "kernel-vxlan"), []))
            arrow = "↑" if better == "higher" else "↓"
            for cfg in CONFIG_ORDER:
                vals = g.get((metric, cfg))
                if not vals:
                    continue
                v = med(vals)
                L.append(f"| {label} {arrow} | {cfg} | {fmt(v)} | {spread(vals) if len(vals) > 1 else '–'} | {len(vals)} | "
                         f"{ratio(v, nat) if cfg != 'native' else '1'} | "
                         f"{ratio(v, kx) if cfg != 'kernel-vxlan' else '1'} |")
        L += section("### Encrypted vs plaintext vnet link (both adaptive; medians)",
                     table(["metric", "vnet plaintext", "vnet encrypted", "encrypted / plaintext"],
                           encryption_table(samples, phase)))
        L += section("### vnet dispatchers (both daemons, per test; medians)",
                     table(["config", "test", "frames per wake-up", "mode switches", "UDP GSO sends",
                            "dispatcher modes at the end"], dispatch_table(samples, phase)))
    errs = [s for s in samples if s.get("error")]
    bad = [s for s in checks if not s["check"].get("ok")]
    drops = [s for s in valid(samples) if s.get("check", {}) and s["check"].get("drops")]
    if errs or bad or drops:
        L.append("")
        L.append("## Problems")
        L.append("")
        for s in errs:
            L.append(f"- failed: {s['phase']} round {s['round']} {s['config']} {s['metric']}: {s['error'][:300]}")
        for s in bad:
            L.append(f"- counters check failed: {s['phase']} round {s['round']} {s['config']} {s['metric']}: "
                     f"{json.dumps({k: v for k, v in s['check'].items() if k != 'drops'})}")
        for s in drops:
            if "from" in s.get("extra", {}):
                continue
            L.append(f"- vnet drops during {s['phase']} round {s['round']} {s['config']} {s['metric']}: "
                     f"{s['check']['drops']}")
    L += section("## Notes", [f"- {n}" for n in meta.get("notes", [])])
    L += section("## Plots", [f"![{p}]({p})" for p in meta.get("plots", [])])
    path.write_text("\n".join(L) + "\n")


# --- plots ----------------------------------------------------------------------------------

def plot_all(doc: dict, out: Path) -> list:
    """Draw every plot the data allows; returns the file names written."""
    samples = doc["samples"]
    plt = pyplot()
    written = []
    ph = phases(samples)
    configs = [c for c in CONFIG_ORDER if any(s["config"] == c for s in samples)]

    # 1. throughput bars
    tmetrics = [m for m in ("tcp1_gbps", "tcp4_gbps", "udp_gbps") if any(s["metric"] == m for s in valid(samples))]
    tph = [p for p in ph if any(s["phase"] == p and s["metric"] in tmetrics for s in valid(samples))]
    if tmetrics and tph:
        fig, axes = plt.subplots(1, len(tph), figsize=(6.5 * len(tph), 4.5), squeeze=False)
        for ax, p in zip(axes[0], tph):
            g = group(samples, p)
            width = 0.8 / len(configs)
            for i, c in enumerate(configs):
                meds, lo, hi = [], [], []
                for m in tmetrics:
                    vals = g.get((m, c), [])
                    v = med(vals) or 0
                    meds.append(v)
                    lo.append(v - min(vals) if vals else 0)
                    hi.append(max(vals) - v if vals else 0)
                xs = [j + (i - (len(configs) - 1) / 2) * width for j in range(len(tmetrics))]
                ax.bar(xs, meds, width, yerr=[lo, hi], capsize=3, label=c, color=COLORS.get(c))
            ax.set_xticks(range(len(tmetrics)))
            names = {"tcp1_gbps": "TCP, 1 stream", "tcp4_gbps": "TCP, 4 streams", "udp_gbps": "UDP goodput"}
            ax.set_xticklabels([names[m] for m in tmetrics])
            ax.set_ylabel("Gbit/s (median, min–max)")
            ax.set_title(p)
            ax.grid(axis="y", alpha=0.3)
        axes[0][0].legend(fontsize=8)
        fig.suptitle("Throughput guest to guest (native: host to host)")
        written.append(save(fig, out / "throughput.png"))

    # 2. 64-byte latency box plots (pooled RTTs of all rounds)
    boxes = doc.get("latency_box", {})
    bph = [p for p in ph if p in boxes and boxes[p]]
    if bph:
        fig, axes = plt.subplots(1, len(bph), figsize=(6.5 * len(bph), 4.5), squeeze=False)
        for ax, p in zip(axes[0], bph):
            stats, labels, colors = [], [], []
            for c in configs:
                b = boxes[p].get(c)
                if not b:
                    continue
                stats.append({"med": b["p50"], "q1": b["p25"], "q3": b["p75"], "whislo": b["p1"],
                              "whishi": b["p99"], "fliers": [], "label": c})
                labels.append(c)
                colors.append(COLORS.get(c))
            bp = ax.bxp(stats, showfliers=False, patch_artist=True)
            for patch, col in zip(bp["boxes"], colors):
                patch.set_facecolor(col)
                patch.set_alpha(0.6)
            for i, c in enumerate(labels, 1):
                ax.plot([i], [boxes[p][c]["p999"]], marker="v", color="k", markersize=5)
            ax.set_ylabel("round-trip time, µs")
            ax.set_yscale("log")
            ax.set_title(p)
            ax.tick_params(axis="x", rotation=20, labelsize=8)
            ax.grid(axis="y", alpha=0.3, which="both")
        fig.suptitle("64-byte UDP round trip, sockperf ping-pong\n"
                     "box: quartiles; whiskers: p1–p99; ▼: p99.9; all rounds pooled", fontsize=10)
        written.append(save(fig, out / "latency_box.png"))

    # 3. latency against message size
    sph = [p for p in ph if any(s["phase"] == p and s["metric"].startswith("rtt_size_") for s in valid(samples))]
    if sph:
        fig, axes = plt.subplots(1, len(sph), figsize=(6.5 * len(sph), 4.5), squeeze=False)
        for ax, p in zip(axes[0], sph):
            g = group(samples, p)
            for c in configs:
                pts = []
                if g.get(("rtt64_p50_us", c)):
                    pts.append((64, g[("rtt64_p50_us", c)]))
                for (m, cc), vals in g.items():
                    if cc == c and m.startswith("rtt_size_"):
                        pts.append((int(m.split("_")[2]), vals))
                pts.sort()
                if not pts:
                    continue
                xs = [x for x, _ in pts]
                ys = [med(v) for _, v in pts]
                lo = [med(v) - min(v) for _, v in pts]
                hi = [max(v) - med(v) for _, v in pts]
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=2, label=c, color=COLORS.get(c))
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("UDP message size, bytes")
            ax.set_ylabel("RTT p50, µs (median of rounds, min–max)")
            ax.set_title(p)
            ax.grid(alpha=0.3, which="both")
        axes[0][0].legend(fontsize=8)
        fig.suptitle("Round-trip latency against message size (sockperf ping-pong)")
        written.append(save(fig, out / "latency_vs_size.png"))

    # 4. CPU per GB
    cph = [p for p in ph if any(s["phase"] == p and s["metric"] == "cpu_s_per_gb_tcp1" for s in valid(samples))]
    if cph:
        fig, axes = plt.subplots(1, len(cph), figsize=(6.5 * len(cph), 4.2), squeeze=False)
        for ax, p in zip(axes[0], cph):
            g = group(samples, p)
            xs = list(range(len(configs)))
            tot = [med(g.get(("cpu_s_per_gb_tcp1", c), [])) or 0 for c in configs]
            own = [med(g.get(("vnetd_cpu_s_per_gb_tcp1", c), [])) or 0 for c in configs]
            ax.bar(xs, tot, 0.6, color=[COLORS.get(c) for c in configs], alpha=0.8, label="whole machine")
            ax.bar(xs, own, 0.3, color="k", alpha=0.5, label="of which vnetd")
            ax.set_xticks(xs)
            ax.set_xticklabels(configs, rotation=20, fontsize=8)
            ax.set_ylabel("CPU seconds per GB (TCP, 1 stream)")
            ax.set_title(p)
            ax.grid(axis="y", alpha=0.3)
            ax.legend(fontsize=8)
        written.append(save(fig, out / "cpu_per_gb.png"))

    # 5. MPI
    mmetrics = [m for m in ("mpi_pingpong_lat_us", "hpcc_pingpong_lat_us", "hpcc_ring_lat_us",
                            "mpi_pingpong_bw_gbps", "hpcc_pingpong_bw_gbps", "hpcc_ring_bw_gbps")
                if any(s["metric"] == m for s in valid(samples))]
    if mmetrics:
        p = next(p for p in ph if any(s["phase"] == p and s["metric"] in mmetrics for s in valid(samples)))
        g = group(samples, p)
        mcfg = [c for c in configs if any((m, c) in g for m in mmetrics)]
        ncol = 3
        nrow = (len(mmetrics) + ncol - 1) // ncol
        fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.6 * nrow), squeeze=False)
        flat = [ax for row in axes for ax in row]
        for ax in flat[len(mmetrics):]:
            ax.axis("off")
        for ax, m in zip(flat, mmetrics):
            cs = [c for c in mcfg if g.get((m, c))]
            vals = [g[(m, c)] for c in cs]
            ax.bar(range(len(cs)), [med(v) for v in vals],
                   yerr=[[med(v) - min(v) for v in vals], [max(v) - med(v) for v in vals]],
                   capsize=3, color=[COLORS.get(c) for c in cs])
            ax.set_xticks(range(len(cs)))
            ax.set_xticklabels(cs, rotation=20, fontsize=7)
            ax.set_title(metric_info(m)[0], fontsize=8)
            ax.grid(axis="y", alpha=0.3)
        fig.suptitle(f"MPI between the two endpoints ({p}; Open MPI over TCP, NetPIPE and HPCC)")
        written.append(save(fig, out / "mpi.png"))
    return written


if __name__ == "__main__":
    ensure_matplotlib()
    src = Path(sys.argv[1])
    d = json.loads(src.read_text())
    d.setdefault("meta", {})["plots"] = plot_all(d, src.parent)
    write_summary(d, src.parent / "summary.md")
    print(src.parent / "summary.md")
