"""vnet's benchmark suite: native vs the kernel's VXLAN vs vnet (guest-driven, polling,
adaptive, and adaptive over an encrypted link), interleaved and repeated in one run. See bench/README.md.

    sudo python3 -m bench.run                 # full default run (< 10 min on 2 cores)
    sudo python3 -m bench.run --quick         # CI smoke run (~1 min), same output files
    sudo python3 -m bench.run --rate 1gbit    # wire rate-limited with tc tbf

(from the repository root; ``bash scripts/bench.sh`` installs, builds and runs it).
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from vnetlab import netlab

from . import measure, mpi, suite_report
from .machine import background_cpu
from .session import Progress, arguments, begin, finish, guarded, mmss, plots_note, run_meta, usable
from .report import ensure_matplotlib, write_json
from .suite_bed import CONFIGS, EXTRA_CONFIGS, SuiteBed, is_vnet, parse_rate
from .testbed import have_root

ALL_METRICS = ["tcp1", "tcp4", "udp", "rtt64", "sweep"]
MPI_CONFIGS = ["native", "kernel-vxlan", "vnet-kernel", "vnet-adaptive"]
# Message sizes of the latency sweep per wire MTU (64 B comes from the rtt64 test). Every
# sockperf run costs 2.4 s on top of its -t (a fixed 2 s pause after its warm-up), so the
# default run keeps the sweep short: at MTU 9000 only the size where jumbo frames matter most.
SWEEP_SIZES = {1500: [1024, 16384, 65507], 9000: [65507]}
SWEEP_DEFAULT = [1024, 16384, 65507]


def parse_args(argv=None):
    ap = arguments(__doc__, "bench", "CI smoke run: one round, 1 s tests, MTU 1500, reduced metrics (~1 min)",
                   "rounds of every (metric, config) (default 3; quick 1)")
    ap.add_argument("--duration", type=int, help="seconds per iperf3 test (default 2; quick 1)")
    ap.add_argument("--lat-duration", type=int, help="seconds per sockperf test (64 B and the size sweep; default 1)")
    ap.add_argument("--mtus", default=None, help="wire MTUs, comma separated (default 1500,9000; quick 1500)")
    ap.add_argument("--rate", default=None, help="rate-limit the wire with tc tbf, e.g. 1gbit or 10gbit")
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help=f"configurations (default {','.join(CONFIGS)}; also {','.join(EXTRA_CONFIGS)})")
    ap.add_argument("--metrics", default=None, help=f"metrics among {','.join(ALL_METRICS)} (default all)")
    ap.add_argument("--sizes", default=None,
                    help="sweep message sizes in bytes for every MTU (default 1024,16384,65507 at MTU 1500, "
                         "65507 at 9000; quick 65507)")
    ap.add_argument("--udp-rate", default="0", help="iperf3 -u -b (default 0 = unlimited, or the --rate)")
    ap.add_argument("--no-mpi", action="store_true", help="skip MPI ping-pong and HPCC")
    ap.add_argument("--mpi-configs", default=None, help=f"configurations for MPI (default {','.join(MPI_CONFIGS)})")
    ap.add_argument("--mpi-rounds", type=int, help="rounds of the MPI tests (default 2; quick 1)")
    ap.add_argument("--hpcc-n", type=int, default=256, help="HPL problem size of the small HPCC run (default 256)")
    a = ap.parse_args(argv)
    q = a.quick
    a.rounds = a.rounds or (1 if q else 3)
    a.duration = a.duration or (1 if q else 2)
    a.lat_duration = a.lat_duration or 1
    a.mtus = [int(x) for x in (a.mtus or ("1500" if q else "1500,9000")).split(",")]
    a.configs = [c for c in a.configs.split(",") if c]
    for c in a.configs:
        if c not in CONFIGS + EXTRA_CONFIGS:
            ap.error(f"unknown configuration {c!r} (choose from {', '.join(CONFIGS + EXTRA_CONFIGS)})")
    a.metrics = (a.metrics.split(",") if a.metrics else
                 (["tcp1", "udp", "rtt64", "sweep"] if q else list(ALL_METRICS)))
    for m in a.metrics:
        if m not in ALL_METRICS:
            ap.error(f"unknown metric {m!r} (choose from {', '.join(ALL_METRICS)})")
    if a.sizes:
        sizes = [int(x) for x in a.sizes.split(",")]
        a.sizes = {m: sizes for m in a.mtus}
    else:
        a.sizes = {m: ([65507] if q else SWEEP_SIZES.get(m, SWEEP_DEFAULT)) for m in a.mtus}
    for sz in a.sizes.values():
        for s in sz:
            if not 14 <= s <= 65507:
                ap.error("sweep sizes must be 14..65507 bytes (a UDP datagram carries at most 65507)")
    a.mpi_configs = ([c for c in a.mpi_configs.split(",") if c] if a.mpi_configs else
                     (["native", "vnet-adaptive"] if q else list(MPI_CONFIGS)))
    a.mpi_configs = [c for c in a.mpi_configs if c in a.configs]
    a.mpi_rounds = a.mpi_rounds or (1 if q else 2)
    if a.rate:
        parse_rate(a.rate)
        if a.udp_rate == "0":
            a.udp_rate = str(int(parse_rate(a.rate)))
    return a


# --- the plan -------------------------------------------------------------------------------

def task_estimate(kind: str, a) -> float:
    if kind in ("tcp1", "tcp4", "udp"):
        return a.duration + 0.3
    if kind == "rtt64" or kind.startswith("size:"):
        return a.lat_duration + 2.4
    if kind == "netpipe":
        return 4.0 if a.quick else 9.0
    if kind == "hpcc":
        return 8.0
    return 2.0


def plan(a, rng: random.Random) -> list:
    """[(phase_key, mtu, [(round, kind, config), ...])]: for each round, each metric, the
    configurations in a freshly shuffled order; MPI rounds follow in the MTU 1500 phase."""
    phases = []
    mpi_mtu = 1500 if 1500 in a.mtus else a.mtus[0]
    for mtu in a.mtus:
        tasks = []
        kinds = []
        for m in a.metrics:
            if m == "sweep":
                kinds += [f"size:{s}" for s in a.sizes[mtu]]
            else:
                kinds.append(m)
        for r in range(1, a.rounds + 1):
            for k in kinds:
                order = list(a.configs)
                rng.shuffle(order)
                tasks += [(r, k, c) for c in order]
        if not a.no_mpi and mtu == mpi_mtu and a.mpi_configs:
            # quick: NetPIPE everywhere, HPCC once (on vnet-adaptive if it is measured)
            hpcc_cfgs = a.mpi_configs if not a.quick else (
                ["vnet-adaptive"] if "vnet-adaptive" in a.mpi_configs else a.mpi_configs[:1])
            for r in range(1, a.mpi_rounds + 1):
                for k, cfgs in (("netpipe", a.mpi_configs), ("hpcc", hpcc_cfgs)):
                    order = list(cfgs)
                    rng.shuffle(order)
                    tasks += [(r, k, c) for c in order]
        key = f"mtu{mtu}" + (f"-{a.rate}" if a.rate else "")
        phases.append((key, mtu, tasks))
    return phases


# --- running --------------------------------------------------------------------------------

def run_task(tb: SuiteBed, a, kind: str, config: str, rnd: int, phase: str, work: Path, raw: Path,
             rtts: dict) -> list:
    tb.prepare(config)
    tag = f"{phase}-r{rnd}-{config}"
    if kind in ("tcp1", "tcp4"):
        return measure.iperf_tcp(tb, config, a.duration, 1 if kind == "tcp1" else 4)
    if kind == "udp":
        return measure.iperf_udp(tb, config, a.duration, a.udp_rate)
    if kind == "rtt64":
        samples, vals = measure.latency64(tb, config, a.lat_duration, work, tag)
        rtts.setdefault(config, []).extend(vals)
        return samples
    if kind.startswith("size:"):
        return measure.latency_size(tb, config, int(kind.split(":")[1]), a.lat_duration)
    if kind == "netpipe":
        upper, reps = (65536, 50) if a.quick else (1 << 20, 50)
        return measure.netpipe(tb, config, work / "mpi", upper, reps, raw, tag)
    if kind == "hpcc":
        return measure.hpcc(tb, config, work / "mpi", a.hpcc_n, raw, tag)
    raise ValueError(kind)


def box_stats(vals: list) -> dict:
    s = sorted(vals)
    n = len(s)

    def q(p):
        return s[min(n - 1, max(0, int(round(p / 100 * (n - 1)))))]
    return {"n": n, "p1": q(1), "p25": q(25), "p50": q(50), "p75": q(75), "p99": q(99), "p999": q(99.9)}


def preflight(a) -> list:
    """Problems that stop the run, and notes on what will be skipped."""
    fatal, notes = [], []
    r = have_root()
    if r:
        fatal.append(r)
    for t in ("ip", "bridge", "ss", "iperf3", "sockperf", "tc" if a.rate else "ip"):
        if shutil.which(t) is None:
            fatal.append(f"missing tool {t} (bash scripts/bench.sh installs what the suite needs)")
    for b in (netlab.VNETD, netlab.VNETCTL):
        if not b.exists():
            fatal.append(f"{b} not found: cargo build --release")
    if not a.no_mpi:
        miss = mpi.missing_tools()
        if miss:
            notes.append(f"MPI/HPCC skipped: missing {', '.join(miss)} (apt-get install openmpi-bin hpcc netpipe-openmpi)")
            a.no_mpi = True
    return fatal, notes + plots_note()


def main(argv=None) -> int:
    a = parse_args(argv)
    notes = usable(preflight(a), "bench")
    started, out, raw, seed, rng = begin("bench", a.out, "raw", a.seed)
    phases = plan(a, rng)
    est = sum(task_estimate(k, a) for _, _, ts in phases for _, k, _ in ts) + 8 * len(phases)
    ntasks = sum(len(ts) for _, _, ts in phases)
    doc = {"meta": {**run_meta(started),
                    "vnet_settings": a.vnet_set, "rounds": a.rounds, "duration": a.duration,
                    "lat_duration": a.lat_duration, "sizes": {str(k): v for k, v in a.sizes.items()}, "mtus": a.mtus, "rate": a.rate, "configs": a.configs,
                    "seed": seed, "quick": a.quick, "background_cpu": [], "notes": list(notes)},
           "samples": [], "latency_box": {}}
    prog = Progress(est, ntasks)
    prog.say(f"vnet bench: {ntasks} tests in {len(phases)} phase(s), about {mmss(est)}; output {out}")
    for n in notes:
        prog.say(f"note: {n}")
    with guarded(doc["meta"]["notes"], prog) as state:
        for phase, mtu, tasks in phases:
            prog.show(f"{phase}: building the testbed")
            doc["meta"]["background_cpu"].append(round(background_cpu(1.0), 3))
            rtts: dict = {}
            with SuiteBed(mtu=mtu, rate=a.rate, vnet_settings=a.vnet_set) as tb:
                work = tb.workdir
                vnet_dead = False
                for rnd, kind, config in tasks:
                    prog.show(f"{phase} round {rnd}: {kind} {config}")
                    t0 = time.monotonic()
                    base = {"phase": phase, "wire_mtu": mtu, "rate": a.rate, "config": config, "round": rnd,
                            "test": kind, "time": datetime.now(timezone.utc).strftime("%H:%M:%S")}
                    if vnet_dead and is_vnet(config):
                        doc["samples"].append(dict(base, metric=kind, value=None, error="vnetd had died earlier in this phase"))
                        prog.step(task_estimate(kind, a))
                        continue
                    try:
                        res = run_task(tb, a, kind, config, rnd, phase, work, raw, rtts)
                        for s in res:
                            s = dict(base, **s)
                            s["seconds"] = round(time.monotonic() - t0, 2)
                            doc["samples"].append(s)
                            chk = s.get("check")
                            if chk is not None and not chk.get("ok") and "from" not in s.get("extra", {}):
                                prog.say(f"!! counters check failed: {phase} {config} {s['metric']}: {chk}")
                    except (measure.MeasureError, netlab.LabError, netlab.CtlError, subprocess.TimeoutExpired,
                            TimeoutError, OSError, KeyError, ValueError) as e:
                        msg = f"{type(e).__name__}: {e}"
                        doc["samples"].append(dict(base, metric=kind, value=None, error=msg))
                        prog.say(f"!! {phase} round {rnd} {kind} {config} failed: {msg[:400]}")
                    if is_vnet(config) and not tb.daemons_alive():
                        vnet_dead = True
                        msg = f"vnetd died during {phase} {kind} {config}; log tails:\n{tb.logs()[-3000:]}"
                        doc["meta"]["notes"].append(msg)
                        prog.say("!! " + msg)
                    prog.step(task_estimate(kind, a))
                # evidence kept with the results: daemon logs and final counters
                tb.keep_logs(raw, phase)
                for h in (tb.hA, tb.hB):
                    try:
                        (raw / f"vnet-stats-{phase}-{h.role}.json").write_text(json.dumps(h.stats(), indent=1))
                    except Exception:  # noqa: BLE001  (a dead daemon has no stats)
                        pass
            doc["latency_box"][phase] = {c: box_stats(v) for c, v in rtts.items() if v}
            write_json(out / "samples.json", doc)

    finish(doc, prog, out / "samples.json", lambda: suite_report.plot_all(doc, out), suite_report.write_summary,
           out / "summary.md")
    n_err = len([s for s in doc["samples"] if s.get("error")])
    if state["interrupted"]:
        return 130
    return 1 if n_err and n_err == len(doc["samples"]) else 0


if __name__ == "__main__":
    ensure_matplotlib()
    sys.exit(main())
