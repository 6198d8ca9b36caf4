"""MPI jobs over many guests (issue #13): HPC Challenge with 4 ranks on 4 guests spread over
2-4 hosts, and NetPIPE between the most distant pair, for native, the kernel's VXLAN and vnet's
paths, reported like the dissertation's tables (value per configuration and its ratio to
native). See bench/README.md, "MPI jobs over many guests".

    sudo python3 -m bench.hpc                 # full run: 5 rounds, HPCC N=256, NetPIPE to 1 MB
    sudo python3 -m bench.hpc --quick         # one round, small sizes (the CI check)
    sudo python3 -m bench.hpc --mtus 1500,9000 --hosts 2 --configs native,vnet-adaptive

Output (``results/hpc-<UTC time>/`` or ``--out``): hpc.md (the tables), hpc.json (every run,
its HPCC/NetPIPE figures and the counters that show which path its bytes took), hpc.png, and
raw/hpc/ (hpccoutf.txt and NetPIPE's output of every run, the vnetd logs).

How the jobs span namespaces and stay honest (``mpi``, as for the suite's two ranks): ``mpirun`` runs
in rank 0's namespace and starts the other ranks' daemons through an ``plm_rsh_agent`` script
that maps each "host" (an address) to its namespace; ``--mca btl tcp,self --mca pml ob1``
keeps the ranks off shared memory (namespaces of one machine share /dev/shm), on the
configuration's subnet; and every run's counters (vnet's own ``show stats json`` for vnet, the
VXLAN device or the underlay NIC otherwise) must show at least the bytes the job must have moved
between every pair of hosts. Four ranks (plus the daemons) share two cores: ranks yield when
idle (``mpi_yield_when_idle 1``, ``--oversubscribe``, no binding), and only ratios within one
run mean anything.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from vnetlab import netlab

from . import hpc_report
from .hpc_bed import CONFIGS, RANKS, Bed, Placement
from .machine import background_cpu, loadavg
from .mpi import (TOOLS, hpcc_input, hpcc_summary, in_dir, job_output, mpirun_argv, netpipe_argv,
                  netpipe_result, write_agent)
from .session import Progress, arguments, begin, finish, guarded, mmss, plots_note, run_meta, usable
from .report import ensure_matplotlib, write_json
from .testbed import have_root

# HPCC sends 2,000,000-byte messages between every ordered pair of ranks in its ping-pong
# bandwidth test (and many more in the ring tests): the floor a run's counters must show.
HPCC_PAIR_BYTES = 2_000_000


# The figures of one HPCC run kept per kernel: name -> (hpccoutf.txt summary key, multiplier)
HPCC_FIGURES = {k: (key, mult) for k, (key, mult, *_rest) in hpc_report.KERNELS.items()}


def parse_args(argv=None):
    ap = arguments(__doc__, "hpc", "one round, HPCC N=64, NetPIPE to 64 KB: checks that everything runs",
                   "rounds of every (job, configuration) (default 5; quick 1)")
    ap.add_argument("--hosts", type=int, default=4, help="host namespaces the 4 guests spread over, 2-4 (default 4)")
    ap.add_argument("--mtus", default="1500", help="underlay MTUs, comma separated (default 1500; e.g. 1500,9000)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"configurations (default all: {','.join(CONFIGS)})")
    ap.add_argument("--hpcc-n", type=int, help="HPL problem size N, which sizes every HPCC kernel (default 256; quick 64)")
    ap.add_argument("--np-upper", type=int, help="NetPIPE's largest message, bytes (default 1048576; quick 65536)")
    ap.add_argument("--np-repeats", type=int, default=50, help="NetPIPE round trips per message size (default 50)")
    ap.add_argument("--no-netpipe", action="store_true", help="HPCC only")
    a = ap.parse_args(argv)
    a.rounds = a.rounds or (1 if a.quick else 5)
    a.hpcc_n = a.hpcc_n or (64 if a.quick else 256)
    a.np_upper = a.np_upper or (65536 if a.quick else 1 << 20)
    a.mtus = [int(x) for x in a.mtus.split(",") if x]
    a.configs = [c for c in a.configs.split(",") if c]
    for c in a.configs:
        if c not in CONFIGS:
            ap.error(f"unknown configuration {c!r} (choose from {', '.join(CONFIGS)})")
    if not 2 <= a.hosts <= RANKS:
        ap.error(f"--hosts must be 2..{RANKS}")
    for m in a.mtus:
        if not 1280 <= m <= 9000:
            ap.error("MTUs must be 1280..9000")
    if a.hpcc_n < 32:
        ap.error("--hpcc-n must be at least 32")
    if not 8 <= a.np_upper <= 1 << 26:
        ap.error("--np-upper must be 8 B .. 64 MB")
    return a


# --- running one MPI job ------------------------------------------------------------------

class JobError(RuntimeError):
    pass


def _job_dir(bed: Bed, p: Placement, ranks: list) -> tuple:
    """A work directory with the rsh agent and its host map; the mpirun words that start
    ``ranks`` (rank indexes, in order) on ``p``."""
    wd = bed.workdir / f"job-{p.config}"
    agent = write_agent(wd, {p.ranks[i].ip: p.ranks[i].ns.name for i in ranks})  # ranks may share a host
    slots: dict = {}
    for i in ranks:  # ranks are placed in the order of --host, by slot
        slots[p.ranks[i].ip] = slots.get(p.ranks[i].ip, 0) + 1
    hosts = ",".join(f"{ip}:{n}" for ip, n in slots.items())
    return wd, mpirun_argv(agent, hosts, len(ranks), p.subnet, oversubscribe=True)


def _exec(p: Placement, wd: Path, argv: list, timeout: float) -> subprocess.CompletedProcess:
    """Run ``argv`` (an mpirun) in rank 0's namespace. On timeout the whole job goes: mpirun,
    the agents and daemons it started and their ranks share its session (SIGTERM so mpirun can
    stop its daemons, then SIGKILL), and nothing of the job is left to compete with the next."""
    proc = subprocess.Popen(["ip", "netns", "exec", p.ranks[0].ns.name, "sh", "-c", in_dir(wd, argv)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.communicate(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
        job = next((x for x in argv if x in ("hpcc", "NPopenmpi")), "mpirun")
        raise JobError(f"{job} did not finish within {timeout:.0f} s (killed)")
    except BaseException:  # Ctrl-C, SIGTERM: the job must not outlive the run
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _kill_leftovers(bed: Bed, p: Placement) -> int:
    """After a failed job: kill any process still in the ranks' namespaces except the vnet
    daemons (all of them were started by the job there). Returns how many."""
    daemons = {h.vnetd.pid for h in bed.hosts if h.vnetd is not None}
    n = 0
    for ns in {r.ns.name: r.ns for r in p.ranks}.values():
        for pid in netlab._netns_pids(ns.name):
            if pid not in daemons and pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGKILL)
                    n += 1
                except OSError:
                    pass
    return n


def _measured(p: Placement, run) -> tuple:
    """Run ``run()`` between two counter snapshots: (its result, before, after, wall seconds)."""
    before = p.counters()
    t0 = time.monotonic()
    res = run()
    wall = time.monotonic() - t0
    return res, before, p.counters(), wall


def parse_hpcc(text: str) -> dict:
    """The summary section of hpccoutf.txt (``key=value`` lines) and its verification lines."""
    vals = hpcc_summary(text)
    figures = {}
    for name, (key, mult) in HPCC_FIGURES.items():
        try:
            figures[name] = float(vals[key]) * mult
        except (KeyError, ValueError):
            continue
    ra_errors = sum(int(n) for n in re.findall(r"Found (\d+) errors in", text))
    hpl_failed = sum(int(n) for n in re.findall(r"(\d+) tests completed and failed residual checks", text))
    return {"figures": figures, "verification": {"randomaccess_errors": ra_errors, "hpl_failed": hpl_failed},
            "sizes": {k: vals.get(k) for k in ("HPL_N", "PTRANS_n", "MPIFFT_N", "MPIRandomAccess_N")}}


def run_hpcc(bed: Bed, p: Placement, n: int, raw: Path, tag: str, timeout: float) -> dict:
    ranks = list(range(RANKS))
    wd, argv = _job_dir(bed, p, ranks)
    # 4 ranks on a 2 x 2 grid; every other HPCC kernel sizes its problem from N (memory ~ 8 N^2
    # bytes): RandomAccess's table, FFT's vector, DGEMM, STREAM.
    (wd / "hpccinf.txt").write_text(hpcc_input(n, nb=32 if n >= 128 else 16, ps=2, qs=2))
    outf = wd / "hpccoutf.txt"
    outf.unlink(missing_ok=True)
    r, before, after, wall = _measured(p, lambda: _exec(p, wd, argv + ["hpcc"], timeout))
    res = parse_hpcc(job_output(r, outf, "hpcc", raw / f"hpcc-{tag}.txt", JobError))
    missing = [k for k in HPCC_FIGURES if k not in res["figures"]]
    if missing:
        raise JobError(f"hpccoutf.txt lacks {', '.join(missing)}")
    v = res["verification"]
    if v["randomaccess_errors"] or v["hpl_failed"]:
        raise JobError(f"HPCC's own verification failed: {v}")
    check = p.check(before, after, {"per_pair": HPCC_PAIR_BYTES, "ranks": ranks})
    return dict(res, check=check, info=p.info(before, after), wall_s=round(wall, 2))


def run_netpipe(bed: Bed, p: Placement, upper: int, repeats: int, raw: Path, tag: str, timeout: float) -> dict:
    """NetPIPE (MPI) between rank 0 and rank 3: on the first and the last host."""
    ranks = [0, RANKS - 1]
    wd, argv = _job_dir(bed, p, ranks)
    out = wd / "np.out"
    out.unlink(missing_ok=True)
    argv += netpipe_argv(upper, repeats, out)
    r, before, after, wall = _measured(p, lambda: _exec(p, wd, argv, timeout))
    res = netpipe_result(job_output(r, out, "NetPIPE", raw / f"netpipe-{tag}.out", JobError), repeats)
    if res is None:
        raise JobError("NetPIPE wrote no results")
    check = p.check(before, after, {"per_pair": res["payload"], "ranks": ranks})
    lat, best = res["lat"], res["best"]
    return {"figures": {"np_lat_us": lat[2] * 1e6, "np_bw_mbps": best[1]},
            "extra": {"lat_size": lat[0], "bw_size": best[0], "payload_each_way": res["payload"]},
            "curve": res["curve"], "check": check, "info": p.info(before, after), "wall_s": round(wall, 2)}


# --- the plan ------------------------------------------------------------------------------

def plan(a, rng: random.Random) -> list:
    """[(round, job, config)]: every round runs every job on every configuration, in a new
    random order per round and job, so slow drifts of the shared machine hit all alike."""
    jobs = ["hpcc"] + ([] if a.no_netpipe else ["netpipe"])
    tasks = []
    for r in range(1, a.rounds + 1):
        for job in jobs:
            order = list(a.configs)
            rng.shuffle(order)
            tasks += [(r, job, c) for c in order]
    return tasks


def estimate(job: str, a) -> float:
    """Seconds one job takes on this 2-core machine (medians seen under others' load; the
    progress line rescales by how fast the finished jobs went)."""
    if job == "hpcc":
        return 8.0 if a.quick else 14.0
    if job == "netpipe":
        return 2.5 if a.quick else 4.0
    return 1.0  # building a configuration (a second or two; vnet's first waits for its daemons)


def preflight(a) -> tuple:
    fatal = []
    r = have_root()
    if r:
        fatal.append(r)
    for t in ("ip", "bridge", "ping", *TOOLS):
        if shutil.which(t) is None:
            fatal.append(f"missing tool {t} (bash scripts/bench.sh --install-only installs them)")
    if any(c.startswith("vnet") for c in a.configs):
        for b in (netlab.VNETD, netlab.VNETCTL):
            if not b.exists():
                fatal.append(f"{b} not found: cargo build --release")
    return fatal, plots_note()


def main(argv=None) -> int:
    a = parse_args(argv)
    notes = usable(preflight(a), "hpc")
    # raw/hpc: beside the suite's raw/ when both share --out
    started, out, raw, seed, rng = begin("hpc", a.out, "raw/hpc", a.seed)
    tasks = plan(a, rng)
    est = len(a.mtus) * (sum(estimate(j, a) for _, j, _ in tasks) + estimate("build", a) * len(a.configs))
    ntasks = len(a.mtus) * (len(tasks) + len(a.configs))
    placement = [f"rank {i}: host h{i * a.hosts // RANKS + 1}" for i in range(RANKS)]
    doc = {"meta": {**run_meta(started),
                    "ranks": RANKS, "hosts": a.hosts, "placement": placement, "mtus": a.mtus,
                    "configs": a.configs, "rounds": a.rounds, "hpcc_n": a.hpcc_n, "np_upper": a.np_upper,
                    "np_repeats": a.np_repeats, "vnet_settings": a.vnet_set, "quick": a.quick, "seed": seed,
                    "oversubscribed": f"{RANKS} ranks (+ {a.hosts} vnetd for vnet) on {os.cpu_count()} CPUs",
                    "mpi": "Open MPI, --mca btl tcp,self --mca pml ob1 --mca mpi_yield_when_idle 1 "
                           "--oversubscribe --bind-to none",
                    "background_cpu": [], "notes": list(notes)},
           "runs": []}
    prog = Progress(est, ntasks)
    prog.say(f"hpc bench: {ntasks} steps ({len(a.configs)} configurations x {a.rounds} round(s), "
             f"MTU {','.join(map(str, a.mtus))}), about {mmss(est)}; output {out}")
    for n in notes:
        prog.say(f"note: {n}")
    with guarded(doc["meta"]["notes"], prog) as state:
        for mtu in a.mtus:
            phase = f"mtu{mtu}"
            prog.show(f"{phase}: building the underlay ({a.hosts} hosts)")
            doc["meta"]["background_cpu"].append(round(background_cpu(1.0), 3))
            with Bed(hosts=a.hosts, mtu=mtu, vnet_settings=a.vnet_set) as bed:
                run_phase(bed, a, phase, tasks, doc, prog, raw)
                bed.keep_logs(raw, phase)
            write_json(out / "hpc.json", doc)
    finish(doc, prog, out / "hpc.json", lambda: hpc_report.plot(doc, out), hpc_report.write_markdown, out / "hpc.md")
    if state["interrupted"]:
        return 130
    errors = [r for r in doc["runs"] if r.get("error")]
    bad = [r for r in doc["runs"] if r.get("check") and not r["check"]["ok"]]
    return 1 if errors or bad else 0


def run_phase(bed: Bed, a, phase: str, tasks: list, doc: dict, prog: Progress, raw: Path) -> None:
    unbuilt = {}
    for c in a.configs:
        prog.show(f"{phase}: building {c}")
        try:
            bed.build(c)
        except (netlab.LabError, netlab.CtlError, subprocess.TimeoutExpired, TimeoutError, OSError,
                KeyError, ValueError) as e:
            # one configuration that cannot be built (say no BPF here) must not stop the others
            unbuilt[c] = f"{type(e).__name__}: {e}"
            prog.say(f"!! {phase}: {c} could not be built, its jobs are skipped: {unbuilt[c][:500]}")
        prog.step(estimate("build", a))
    for rnd, job, config in tasks:
        prog.show(f"{phase} round {rnd}/{a.rounds}: {job} on {config}")
        tag = f"{phase}-r{rnd}-{config}"
        rec = {"phase": phase, "mtu": bed.wire_mtu, "config": config, "round": rnd, "job": job,
               "time": datetime.now(timezone.utc).strftime("%H:%M:%S"), "loadavg": loadavg()}
        if config in unbuilt:
            doc["runs"].append(dict(rec, error=f"not built: {unbuilt[config]}"))
            prog.step(estimate(job, a))
            continue
        p = bed.placements[config]
        try:
            p.prepare()
            for attempt in (1, 2, 3):
                try:
                    if job == "hpcc":
                        rec.update(run_hpcc(bed, p, a.hpcc_n, raw, tag, timeout=600 if a.quick else 900))
                    else:
                        rec.update(run_netpipe(bed, p, a.np_upper, a.np_repeats, raw, tag, timeout=300))
                    break
                except JobError as e:
                    # Open MPI's launcher now and then fails to start its daemons across the
                    # namespaces ("ORTE does not know how to route a message", mpirun crashing):
                    # no rank ran, nothing was measured, so the job is started again (up to
                    # three times) and the failed launches recorded.
                    if attempt == 3 or not _launch_failed(str(e)):
                        raise
                    _kill_leftovers(bed, p)
                    rec.setdefault("launches_failed", []).append(str(e)[-300:])
                    prog.say(f"!! {tag} {job}: MPI launch failed, starting it again")
                    time.sleep(2)
            if not rec["check"]["ok"]:
                prog.say(f"!! {tag} {job}: the counters do not show the job's bytes on {p.path}: "
                         f"{json.dumps(rec['check'])[:600]}")
        except (JobError, netlab.LabError, netlab.CtlError, subprocess.TimeoutExpired, TimeoutError,
                OSError, KeyError, ValueError) as e:
            rec["error"] = f"{type(e).__name__}: {e}"
            left = _kill_leftovers(bed, p)
            if left:
                rec["error"] += f" ({left} leftover processes of the job killed)"
            prog.say(f"!! {tag} {job} failed: {rec['error'][:500]}")
        if config.startswith("vnet") and not bed.daemons_alive():
            msg = f"a vnetd died during {tag} {job}; log tails:\n{bed.logs()[-3000:]}"
            doc["meta"]["notes"].append(msg)
            rec.setdefault("error", "vnetd died")
            prog.say("!! " + msg)
        doc["runs"].append(rec)
        prog.step(estimate(job, a))


def _launch_failed(err: str) -> bool:
    """Whether an mpirun failure is Open MPI failing to start its daemons (no rank ran)."""
    return any(m in err for m in ("ORTE does not know how to route", "ORTE was unable to reliably start",
                                  "an inability to create a connection back to mpirun"))


if __name__ == "__main__":
    ensure_matplotlib()
    sys.exit(main())
