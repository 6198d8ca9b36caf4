"""hpc.md and hpc.png from hpc.json alone, so they can be redrawn later:
``python3 -m bench.hpc_report results/hpc-.../hpc.json``.

The tables follow the dissertation's (seed 000, chapter 6, Tables 6.1-6.2): one row per HPCC
kernel, the median value per configuration, then each configuration as a percentage of native
*performance*: value / native for rates, native / value for latencies, so 100 % is native and
lower is always worse."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

from .report import COLORS, ensure_matplotlib, fmt, md_row, med, pct, phases, pyplot, save, spread

# name -> (hpccoutf.txt summary key, multiplier, unit, better, label)
KERNELS = {
    "pingpong_lat_us": ("AvgPingPongLatency_usec", 1.0, "µs", "lower", "Ping-pong latency (avg of pairs)"),
    "pingpong_minlat_us": ("MinPingPongLatency_usec", 1.0, "µs", "lower", "Ping-pong latency (best pair)"),
    "pingpong_bw_MBs": ("AvgPingPongBandwidth_GBytes", 1e3, "MB/s", "higher", "Ping-pong bandwidth (avg of pairs)"),
    "ring_nat_lat_us": ("NaturallyOrderedRingLatency_usec", 1.0, "µs", "lower", "Ring latency, natural order"),
    "ring_rand_lat_us": ("RandomlyOrderedRingLatency_usec", 1.0, "µs", "lower", "Ring latency, random order"),
    "ring_nat_bw_MBs": ("NaturallyOrderedRingBandwidth_GBytes", 1e3, "MB/s", "higher", "Ring bandwidth, natural order"),
    "ring_rand_bw_MBs": ("RandomlyOrderedRingBandwidth_GBytes", 1e3, "MB/s", "higher", "Ring bandwidth, random order"),
    "ptrans_MBs": ("PTRANS_GBs", 1e3, "MB/s", "higher", "PTRANS"),
    "mpifft_Mflops": ("MPIFFT_Gflops", 1e3, "Mflop/s", "higher", "MPI FFT"),
    "mpira_MUPs": ("MPIRandomAccess_GUPs", 1e3, "MUP/s", "higher", "MPI RandomAccess"),
    "mpira_lcg_MUPs": ("MPIRandomAccess_LCG_GUPs", 1e3, "MUP/s", "higher", "MPI RandomAccess (LCG)"),
    "hpl_Gflops": ("HPL_Tflops", 1e3, "Gflop/s", "higher", "HPL (compute-bound, for reference)"),
}
NETPIPE = {
    "np_lat_us": ("µs", "lower", "NetPIPE latency, 8 B one way"),
    "np_bw_mbps": ("Mbit/s", "higher", "NetPIPE peak bandwidth"),
}
def configs(doc: dict) -> list:
    return [c for c in doc["meta"]["configs"] if any(r["config"] == c for r in doc["runs"])]


def values(doc: dict, phase: str, job: str, config: str, figure: str) -> list:
    """Every good run's value of one figure (runs with an error or a failed counters check
    are left out: their bytes did not provably take the path)."""
    return [r["figures"][figure] for r in doc["runs"]
            if r["phase"] == phase and r["job"] == job and r["config"] == config and not r.get("error")
            and r.get("check", {}).get("ok") and figure in r.get("figures", {})]


def hfmt(v: Optional[float]) -> str:
    """A figure of these tables: HPCC's rates can be tiny at small N (scientific below 0.01)."""
    return fmt(v, sci_below=0.01)


def pct_of_native(v: Optional[float], native: Optional[float], better: str) -> Optional[float]:
    """Performance as a percentage of native's: 100 % is native, lower is worse either way."""
    if v is None or native is None or v <= 0 or native <= 0:
        return None
    return 100.0 * (v / native if better == "higher" else native / v)


def _table(doc, phase, job, figures: dict, cfgs: list) -> list:
    others = [c for c in cfgs if c != "native"]
    head = ["kernel", "unit"] + cfgs + [f"{c} / native" for c in others if "native" in cfgs]
    L = [md_row(head), "|" + "---|" * len(head)]
    for fig, spec in figures.items():
        unit, better, label = spec[-3], spec[-2], spec[-1]
        meds = {c: med(values(doc, phase, job, c, fig)) for c in cfgs}
        row = [label, unit] + [hfmt(meds[c]) for c in cfgs]
        if "native" in cfgs:
            row += [pct(pct_of_native(meds[c], meds["native"], better)) for c in others]
        L.append(md_row(row))
    return L


def _spread_table(doc, phase, job, figures: dict, cfgs: list) -> list:
    head = ["kernel"] + cfgs
    L = [md_row(head), "|" + "---|" * len(head)]
    for fig, spec in figures.items():
        row = [spec[-1]]
        for c in cfgs:
            v = values(doc, phase, job, c, fig)
            row.append(f"{spread(v, hfmt)} (n={len(v)})" if v else "–")
        L.append(md_row(row))
    return L


def _evidence_table(doc, phase, cfgs) -> list:
    L = ["| configuration | job | runs ok / runs | counters checked | MB the path carried (median) | "
         "vnet: MB the guests handed to vnet (median) | drops seen | vnetd CPU-s per run (median) | "
         "load average (median) |", "|---|---|---|---|---|---|---|---|---|"]
    for c in cfgs:
        for job in ("hpcc", "netpipe"):
            runs = [r for r in doc["runs"] if r["phase"] == phase and r["config"] == c and r["job"] == job]
            if not runs:
                continue
            good = [r for r in runs if not r.get("error") and r.get("check", {}).get("ok")]
            checks = [r["check"] for r in runs if r.get("check")]
            path = checks[0]["path"] if checks else "–"
            carried = med([ch.get("total_tx_bytes", 0) / 1e6 for ch in checks])
            guest = med([ch["guest_tx_bytes"] / 1e6 for ch in checks if "guest_tx_bytes" in ch])
            drops: dict = {}
            for ch in checks:
                for k, n in ch.get("drops", {}).items():
                    drops[k] = drops.get(k, 0) + n
            dtxt = ", ".join(f"{k} {n}" for k, n in sorted(drops.items())) or "none"
            load = med([r["loadavg"] for r in runs if r.get("loadavg", -1) >= 0])
            cpu = med([r["info"]["vnetd_cpu_s"] for r in runs if "vnetd_cpu_s" in r.get("info", {})])
            L.append(f"| {c} | {job} | {len(good)} / {len(runs)} | {path} | {hfmt(carried)} | "
                     f"{hfmt(guest) if guest is not None else '–'} | {dtxt if c.startswith('vnet') else '–'} | "
                     f"{hfmt(cpu)} | {hfmt(load)} |")
    return L


def write_markdown(doc: dict, path: Path) -> None:
    m = doc["meta"]
    cfgs = configs(doc)
    L = ["# MPI jobs over many guests: HPCC and NetPIPE", "",
         f"Started {m['started']}, {m.get('elapsed_s', '?')} s; {m['machine']}; vnet {m['vnet_version']}.",
         f"Command: `{m['command']}`", "",
         f"**{m['ranks']} MPI ranks on {m['ranks']} guests over {m['hosts']} host namespaces** "
         f"({'; '.join(m['placement'])}); the guests of a configuration are namespaces on its overlay "
         "(`native`: the ranks run on the hosts themselves). Underlay: a bridge in a wire namespace, "
         f"MTU {', '.join(map(str, m['mtus']))}; overlay MTU = underlay - 50.",
         f"HPCC with N = {m['hpcc_n']} (HPL on a 2 x 2 grid; every other kernel sizes its problem from "
         f"N); NetPIPE between rank 0 and rank {m['ranks'] - 1} (first and last host), up to "
         f"{m['np_upper']} B, {m['np_repeats']} round trips per size. {m['rounds']} round(s), "
         "configurations in a new random order per round and job; tables show medians.", "",
         f"**Oversubscribed:** {m['oversubscribed']}. MPI: {m['mpi']}: ranks yield the CPU when "
         "idle instead of spinning, and stay off shared memory. Absolute figures are those of a "
         "shared 2-core machine; compare the ratios within this run, not across runs. Machine "
         f"busy CPUs before each phase (others' load): {m.get('background_cpu')}.", "",
         "Every run's bytes are checked against counters: vnet's own `vnetctl show stats json` "
         "(each udp link between two hosts with ranks must have sent and received at least what "
         "the job must move between them: 2 MB per ordered pair of ranks for HPCC, NetPIPE's "
         "payload for NetPIPE), the `vx1` devices for kernel-vxlan, the hosts' `eth0` for native. "
         "Runs failing the check are left out of the tables.", ""]
    for phase in phases(doc["runs"]):
        L += [f"## {phase}", "", "### HPCC, 4 ranks", "",
              "Percentages: performance relative to native (rates: value / native; latencies: "
              "native / value). HPCC's ring bandwidths are per process, as HPCC prints them.", ""]
        L += _table(doc, phase, "hpcc", KERNELS, cfgs)
        L += ["", "### NetPIPE, rank 0 <-> rank 3", ""]
        L += _table(doc, phase, "netpipe", NETPIPE, cfgs)
        L += ["", "### Spread (min–max over rounds)", ""]
        L += _spread_table(doc, phase, "hpcc", KERNELS, cfgs)
        L += [""] + _spread_table(doc, phase, "netpipe", NETPIPE, cfgs)
        L += ["", "### Did the bytes take the path?", ""]
        L += _evidence_table(doc, phase, cfgs)
        L.append("")
    errs = [r for r in doc["runs"] if r.get("error")]
    if errs:
        L += ["## Failed runs", ""]
        L += [f"- {r['phase']} round {r['round']} {r['job']} on {r['config']}: {r['error'][:400]}" for r in errs]
        L.append("")
    if m.get("notes"):
        L += ["## Notes", ""] + [f"- {n}" for n in m["notes"]] + [""]
    for p in m.get("plots", []):
        L.append(f"![{p}]({p})")
    path.write_text("\n".join(L) + "\n")


def plot(doc: dict, out: Path) -> list:
    """hpc.png: per phase, % of native per HPCC kernel and NetPIPE figure (grouped bars), and
    NetPIPE's bandwidth against message size (median curve per configuration)."""
    plt = pyplot()
    ph = phases(doc["runs"])
    cfgs = configs(doc)
    if not ph or not cfgs:
        return []
    figs = {**{k: (v[3], v[4]) for k, v in KERNELS.items()}, **{k: (v[1], v[2]) for k, v in NETPIPE.items()}}
    others = [c for c in cfgs if c != "native"]
    fig, axes = plt.subplots(len(ph), 2, figsize=(15, 7.5 * len(ph)), squeeze=False,
                             gridspec_kw={"width_ratios": [1.4, 1]})
    for row, phase in zip(axes, ph):
        # horizontal grouped bars: one group per kernel (top to bottom), one bar per configuration
        ax = row[0]
        height = 0.8 / max(1, len(others))
        for i, c in enumerate(others):
            xs = []
            for f, (better, _) in figs.items():
                job = "netpipe" if f in NETPIPE else "hpcc"
                xs.append(pct_of_native(med(values(doc, phase, job, c, f)),
                                        med(values(doc, phase, job, "native", f)), better) or 0)
            ys = [j + (i - (len(others) - 1) / 2) * height for j in range(len(figs))]
            ax.barh(ys, xs, height, label=c, color=COLORS.get(c))
        ax.axvline(100, color="k", lw=0.8, ls="--")
        ax.set_yticks(range(len(figs)))
        ax.set_yticklabels([lbl for _, lbl in figs.values()], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("% of native performance (rates: value / native; latencies: native / value)")
        ax.set_title(f"{phase}: HPCC (4 ranks) and NetPIPE, medians")
        ax.legend(fontsize=8, loc="best")
        ax.grid(axis="x", alpha=0.3)
        ax = row[1]
        for c in cfgs:
            curves = [r["curve"] for r in doc["runs"] if r["phase"] == phase and r["config"] == c
                      and r["job"] == "netpipe" and not r.get("error") and r.get("check", {}).get("ok")]
            if not curves:
                continue
            by_size: dict = {}
            for cv in curves:
                for pt in cv:
                    by_size.setdefault(pt["bytes"], []).append(pt["mbps"])
            xs = sorted(by_size)
            ax.plot(xs, [med(by_size[x]) for x in xs], label=c, color=COLORS.get(c), lw=1.3)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("Mbit/s")
        ax.set_title(f"{phase}: NetPIPE rank 0 <-> rank 3")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return [save(fig, out / "hpc.png")]


if __name__ == "__main__":
    ensure_matplotlib()
    if len(sys.argv) != 2:
        sys.exit("usage: python3 -m bench.hpc_report results/hpc-.../hpc.json")
    src = Path(sys.argv[1])
    d = json.loads(src.read_text())
    d["meta"]["plots"] = plot(d, src.parent)
    write_markdown(d, src.parent / "hpc.md")
    print(src.parent / "hpc.md")
