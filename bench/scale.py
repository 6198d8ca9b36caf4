"""The scale of vnet's etcd control plane (issue #13): runs ``vnet-scale`` (N real vnet agents,
the code of ``vnetd --etcd``, with recording data planes) against a real etcd started here, for
each N asked, and writes ``scale.json``, ``summary.md`` and plots under
``results/scale-<UTC time>/``.

Each N gets a fresh etcd (Debian's ``/usr/bin/etcd``, free loopback ports, its data directory
in ``/dev/shm`` so that the disk's fsync latency is not what is measured), stopped by PID at
the end. ``--proxies P`` runs each N again with the agents spread over P of etcd's gRPC
proxies (``etcd grpc-proxy start`` on loopback, agent i on proxy i % P; the harness's own
client and the figures of etcd stay on etcd), for etcd's cost per event with and without
them. ``--baseline FILE`` puts an earlier run's figures (``scale.json``) beside these in the
summary and the plots, for a before/after comparison.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from . import REPO
from vnetlab.etcdlab import etcd_argv, grpc_proxy_argv
from vnetlab.procs import stop_pid

from .etcd import free_port, shm_dir
from .machine import commit
from .report import ensure_matplotlib, pyplot, save, sig

STEPS = ("join", "move", "storm", "death")
GOALS = {"move": 1.0, "join": 2.0}


class Etcd:
    """One etcd member on loopback, stopped (SIGTERM, then SIGKILL) by PID."""

    def __init__(self, logdir: Path):
        self.client_port, self.peer_port = free_port(), free_port()
        self.dir = shm_dir("vnet-scale-etcd-")
        self.endpoint = f"127.0.0.1:{self.client_port}"
        self.log = open(logdir / f"etcd-{self.client_port}.log", "w")
        self.proc = subprocess.Popen(etcd_argv("s", self.dir, f"http://{self.endpoint}",
                                               f"http://127.0.0.1:{self.peer_port}", quota=4 << 30),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.client_port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            self.stop()
            raise RuntimeError("etcd did not start")
        time.sleep(0.5)

    def stop(self) -> None:
        stop_child(self.proc, self.log, self.dir)


def stop_child(proc: subprocess.Popen, log, workdir) -> None:
    """Ends a server this harness started (etcd or a proxy): SIGTERM, SIGKILL after 10 s; then
    its log is closed and its directory removed."""
    stop_pid(proc, timeout=10)
    log.close()
    shutil.rmtree(workdir, ignore_errors=True)


def wait_port(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.time() + 20
    while time.time() < deadline and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not start")


class EtcdTimeline:
    """etcd's own counters sampled twice a second while a run goes on, to
    ``raw/etcd-timeline-<name>.csv`` (seconds since the harness started, then the columns of
    ``TIMELINE``): when etcd's revision moved (every write), its watchers and watch streams,
    its slow watchers and applies, its leases granted, renewed, revoked and expired, its CPU.
    The harness reports per step; a failure inside a step (a lease cascade in the storm) needs
    the seconds."""

    TIMELINE = (
        ("revision", "etcd_debugging_mvcc_current_revision"),
        ("watchers", "etcd_debugging_mvcc_watcher_total"),
        ("watch_streams", "etcd_debugging_mvcc_watch_stream_total"),
        ("slow_watchers", "etcd_debugging_mvcc_slow_watcher_total"),
        ("pending_events", "etcd_debugging_mvcc_pending_events_total"),
        ("txns", "etcd_mvcc_txn_total"),
        ("ranges", "etcd_mvcc_range_total"),
        ("leases_granted", "etcd_debugging_lease_granted_total"),
        ("leases_renewed", "etcd_debugging_lease_renewed_total"),
        ("leases_revoked", "etcd_debugging_lease_revoked_total"),
        ("leases_expired", "etcd_debugging_server_lease_expired_total"),
        ("proposals_pending", "etcd_server_proposals_pending"),
        ("slow_applies", "etcd_server_slow_apply_total"),
        ("slow_read_indexes", "etcd_server_slow_read_indexes_total"),
        ("cpu_s", "process_cpu_seconds_total"),
        ("sent_bytes", "etcd_network_client_grpc_sent_bytes_total"),
    )

    def __init__(self, etcd: "Etcd", path: Path):
        import threading
        self.url = f"http://{etcd.endpoint}/metrics"
        self.path = path
        self.t0 = time.monotonic()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        import urllib.request
        with open(self.path, "w") as f:
            f.write(",".join(["t"] + [c for c, _ in self.TIMELINE]) + "\n")
            while not self.done.wait(0.5):
                try:
                    with urllib.request.urlopen(self.url, timeout=2) as r:
                        page = r.read().decode()
                except OSError:
                    continue
                sums: dict[str, float] = {}
                for line in page.splitlines():
                    if line.startswith("#"):
                        continue
                    name, _, value = line.rpartition(" ")
                    name = name.split("{", 1)[0]
                    try:
                        sums[name] = sums.get(name, 0.0) + float(value)
                    except ValueError:
                        pass
                row = [f"{time.monotonic() - self.t0:.2f}"] + [f"{sums.get(m, 0):g}" for _, m in self.TIMELINE]
                f.write(",".join(row) + "\n")
                f.flush()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=5)


class Proxy:
    """One of etcd's gRPC proxies on loopback in front of ``etcd``, stopped by PID."""

    def __init__(self, etcd: Etcd, logdir: Path):
        self.port = free_port()
        self.dir = shm_dir("vnet-scale-proxy-")
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log = open(logdir / f"grpc-proxy-{self.port}.log", "w")
        self.proc = subprocess.Popen(grpc_proxy_argv(etcd.endpoint, self.endpoint, self.dir),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait_port(self.port, self.proc, "etcd's gRPC proxy")
        except RuntimeError:
            self.stop()
            raise

    def stop(self) -> None:
        stop_child(self.proc, self.log, self.dir)


def label(r: dict) -> str:
    """A run's name in the tables: N, and its proxies if any."""
    p = r.get("proxies", 0)
    return f"{r['hosts']}" + (f", {p} proxies" if p else "")


def run_one(binary: Path, n: int, n_proxies: int, args, out: Path, k: int, total: int) -> dict:
    etcd = Etcd(out / "raw")
    proxies = []
    try:
        proxies = [Proxy(etcd, out / "raw") for _ in range(n_proxies)]
        cmd = [str(binary), "--etcd", etcd.endpoint, "--etcd-pid", str(etcd.proc.pid),
               "--hosts", str(n), "--guests", str(args.guests), "--vnis", str(args.vnis),
               "--lease-ttl", str(args.lease_ttl), "--storm", str(args.storm),
               "--timeout", str(args.timeout), "--ramp", str(args.ramp),
               "--read-page", str(args.read_page)]
        if args.cold_start:
            cmd += ["--cold-start"]
        if args.bringup_timeout:
            cmd += ["--bringup-timeout", str(args.bringup_timeout)]
        if args.agents_nice:
            # etcd has machines of its own in practice; here the harness's thousands of agent
            # threads would otherwise take the CPU from etcd's few by their number alone.
            cmd = ["nice", "-n", str(args.agents_nice)] + cmd
        if proxies:
            cmd += ["--proxies", ",".join(x.endpoint for x in proxies),
                    "--proxy-pids", ",".join(str(x.proc.pid) for x in proxies)]
        name = f"{n}" + (f"-p{n_proxies}" if n_proxies else "")
        print(f"[{k}/{total}] N={n} P={n_proxies}: {' '.join(cmd)}", file=sys.stderr, flush=True)
        timeline = EtcdTimeline(etcd, out / "raw" / f"etcd-timeline-{name}.csv")
        with open(out / "raw" / f"scale-{name}.log", "w") as log, AgentsGroup(args.agents_cpu_shares) as group:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            group.take(p.pid)
            assert p.stderr is not None and p.stdout is not None
            for line in p.stderr:  # the harness's progress, shown and kept
                log.write(line)
                print(f"[{k}/{total}] {line.rstrip()}", file=sys.stderr, flush=True)
            stdout = p.stdout.read()
            rc = p.wait()
        timeline.stop()
        if rc != 0:
            failed = {"hosts": n, "proxies": n_proxies}
            try:  # the steps measured before the failure, if the harness got to write them
                partial = json.loads(stdout)
                failed["steps"] = partial.get("steps", [])
                why = f": {partial['error']}" if partial.get("error") else ""
            except (json.JSONDecodeError, AttributeError):
                why = ""
            failed["error"] = f"vnet-scale exited {rc}{why} (see raw/scale-{name}.log)"
            return failed
        return json.loads(stdout)
    finally:
        for x in proxies:
            x.stop()
        etcd.stop()


class AgentsGroup:
    """A cgroup (v1 `cpu` controller) with `shares` for the harness's process, so that etcd and
    the proxies outweigh the agents however many threads they run. Nice alone does not do it:
    within one scheduling group each of 1,000 busy agent threads at nice 10 still weighs a
    tenth of one of etcd's threads, so together they outweigh etcd a hundred times over. A real
    etcd has machines of its own. None: nothing done. Removed when the harness has exited."""

    ROOT = Path("/sys/fs/cgroup/cpu")

    def __init__(self, shares: int | None):
        self.shares = shares
        self.dir: Path | None = None

    def __enter__(self) -> "AgentsGroup":
        if self.shares:
            if not (self.ROOT / "cpu.shares").exists():
                raise SystemExit(f"--agents-cpu-shares needs the cgroup v1 cpu controller at {self.ROOT}")
            self.dir = self.ROOT / f"vnet-scale-{os.getpid()}-{time.monotonic_ns()}"
            self.dir.mkdir()
            (self.dir / "cpu.shares").write_text(str(self.shares))
        return self

    def take(self, pid: int) -> None:
        """Moves process `pid` (all its threads, and those it makes later) into the group."""
        if self.dir is not None:
            (self.dir / "cgroup.procs").write_text(str(pid))

    def __exit__(self, *exc) -> None:
        if self.dir is not None:
            for _ in range(50):  # the exited process leaves the group a moment later
                try:
                    self.dir.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def step(run: dict, name: str) -> dict:
    return next((s for s in run.get("steps", []) if s["step"] == name), {})


def summary(runs: list[dict], baseline: list[dict] | None, meta: dict) -> str:
    lines = [f"# vnet etcd control plane at scale ({meta['time']})", "",
             f"Harness: `vnet-scale`, {meta['guests']} guests per host, {meta['vnis']} VNI(s), lease TTL "
             f"{meta['lease_ttl']} s, storm of {meta['storm']} moves; one etcd 3.4 on loopback (data in /dev/shm); "
             f"commit {meta['commit']}. The machine has {os.cpu_count()} cores shared by etcd and every agent"
             + (f" (the agents at nice {meta['agents_nice']})" if meta.get("agents_nice") else "")
             + (f" (the agents in a cgroup of cpu.shares {meta['agents_cpu_shares']}, etcd and the proxies "
                "at the default 1024)" if meta.get("agents_cpu_shares") else "")
             + ": figures are preliminary.", "",
             "Convergence: time from the change in etcd until the agent's recorder has applied it, over every "
             "agent the change concerns (p50 / p99 / max, seconds). A death is the host's agent stopping "
             "silently and its lease revoked at t0 (what expiry does TTL seconds later). The storm is timed "
             "two ways: from the first move sent until every agent applied every move (this includes the time "
             "to issue them all from 8 threads, `issue_s` in scale.json), and each move from its own "
             "transaction being sent until each agent applied it (\"each move\").", ""]
    lines += ["| N | bring-up s | join p50/p99/max | move p50/p99/max | storm p50/p99/max | storm, each move p50/p99/max | death p50/p99/max | not converged | agents wrong |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        if "error" in r and not r.get("steps"):
            lines.append(f"| {label(r)} | {r['error']} | | | | | | | |")
            continue
        cells = []
        nc = wrong = 0
        for s in STEPS:
            st = step(r, s)
            cells.append(" / ".join(sig(st.get(k)) for k in ("p50_s", "p99_s", "max_s")))
            if s == "storm":
                cells.append(" / ".join(sig(st.get(k)) for k in ("per_move_p50_s", "per_move_p99_s", "per_move_max_s")))
            nc += st.get("not_converged", 0)
            wrong += st.get("agents_wrong_after", 0)
        wrong += step(r, "bring-up").get("agents_wrong_after", 0)
        b = step(r, "bring-up")
        up = sig(b.get("wall_s"))
        if b.get("agents_complete", r["hosts"]) < r["hosts"]:
            up += f" (only {b['agents_complete']} of {r['hosts']} agents complete)"
        if b.get("cold_start"):
            up += ", all at once"
        if "leases_lost" in b:
            up += f", {b['leases_lost']} leases lost"
        lines.append(f"| {label(r)} | {up} | " + " | ".join(cells) + f" | {nc} | {wrong} |")
    for r in runs:
        if "error" in r and r.get("steps"):
            done = [st["step"] for st in r["steps"]]
            lost = max((st.get("leases_lost", 0) for st in r["steps"]), default=0)
            lines.append(f"\nN={label(r)} stopped after {', '.join(done)} ({lost} leases lost by then): {r['error']}")
    lines += ["", "Load per step: agent CPU per event (µs of this process's CPU above its idle rate, per agent "
              "receiving, per store event), etcd's CPU (cores = CPU-seconds / wall-seconds of the step; ms per "
              "store event) and bytes its gRPC server sent per event, each also above etcd's idle rate (what it spends "
              "renewing every host's lease while nothing changes: a cost per host, not per event; for a join, also "
              "without the joiner's own first read of the overlay, which etcd serves even through a proxy because the "
              "joiner's registration through it clears its cache), and the proxies' CPU (all of them).", "",
              "| N | step | agent µs/event | agents CPU s | etcd CPU s | etcd cores | etcd ms/event | above idle | etcd bytes/event | above idle | proxies CPU s | etcd RSS MB | etcd watchers |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        for s in STEPS:
            st = step(r, s)
            if st:
                per_event = st["etcd_cpu_s"] * 1e3 / max(st.get("events", 1), 1) if "etcd_cpu_s" in st else None
                lines.append(f"| {label(r)} | {s} | {sig(st.get('agent_cpu_us_per_event'))} | {sig(st.get('agents_cpu_s'))} | "
                             f"{sig(st.get('etcd_cpu_s'))} | {sig(st.get('etcd_cores'))} | {sig(per_event)} | "
                             f"{sig(st.get('etcd_cpu_ms_per_event_above_idle'))} | "
                             f"{sig(st.get('etcd_sent_bytes_per_event'))} | "
                             f"{sig(st.get('etcd_sent_bytes_per_event_above_idle'))}{less_joiner(st)} | {sig(st.get('proxies_cpu_s'))} | "
                             f"{sig(st.get('etcd_rss_bytes', 0) / 1e6)} | {sig(st.get('etcd_watchers'))} |")
    lines += ["", "What a host read to start (issue #19): per host, its first whole read of the overlay (keys; bytes "
              "as sent, the polls of the host count included), the polls, how long it waited before reading and, "
              "of that, its part of the spread of the reads of the hosts starting with it (median / max); every read of the bring-up together (more than N: some read again); what etcd "
              "sent in the bring-up, per host, its CPU, the ranges its store served (through proxies: those their "
              "cache did not answer) and the watchers it held after the bring-up.", "",
              "| N | keys per host | KB per host | polls | waited s | spread s | reads | etcd KB sent per host | etcd CPU s | etcd ranges served | etcd watchers |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        b = step(r, "bring-up")
        sr = b.get("start_reads")
        if not sr:
            continue

        def pair(k: str, scale: float = 1.0) -> str:
            return " / ".join(sig(v * scale if v is not None else None) for v in (sr[k]["p50"], sr[k]["max"]))
        lines.append(f"| {label(r)} | {pair('keys_per_host')} | {pair('bytes_per_host', 1e-3)} | {pair('polls_per_host')} | "
                     f"{pair('settle_s')} | {pair('read_spread_s') if 'read_spread_s' in sr else ''} | {sr['reads']} | {sig(b.get('etcd_sent_bytes', 0) / 1e3 / max(r['hosts'], 1))} | "
                     f"{sig(b.get('etcd_cpu_s'))} | {sig(b.get('etcd_ranges'))} | {sig(b.get('etcd_watchers'))} |")
    lines += ["", "| N | agents' threads | agents' RSS MB (after bring-up) | per agent MB | idle agents cores | idle etcd cores |",
              "| --- | --- | --- | --- | --- | --- |"]
    for r in runs:
        if "error" not in r:
            lines.append(f"| {label(r)} | {r['threads']} | {sig(r['agents_rss_bytes'] / 1e6)} | {sig(r['rss_bytes_per_agent'] / 1e6)} | "
                         f"{sig(r['idle_agents_cores'])} | {sig(r['idle_etcd_cores'])} |")
    lines += ["", "## Goals (p99)", ""]
    for r in runs:
        if "error" in r:
            continue
        for s, g in GOALS.items():
            st = step(r, s)
            p99 = st.get("p99_s")
            ok = p99 is not None and p99 <= g and st.get("not_converged", 1) == 0
            lines.append(f"- N={label(r)}: {s} p99 {sig(p99)} s (goal <= {g} s): {'met' if ok else 'NOT met'}")
        st = step(r, "storm")
        p99 = st.get("per_move_p99_s")
        ok = p99 is not None and p99 <= GOALS["move"] and st.get("per_move_not_applied", 1) == 0
        lines.append(f"- N={label(r)}: storm, each move p99 {sig(p99)} s (goal <= {GOALS['move']} s): {'met' if ok else 'NOT met'}")
        cores = st.get("etcd_cores")
        lines.append(f"- N={label(r)}: etcd during the storm {sig(cores)} cores (goal <= 1): "
                     f"{'met' if cores is not None and cores <= 1.0 else 'NOT met'}")
    if baseline:
        lines += ["", "## Against the baseline", "", "p99 convergence, seconds (baseline -> this run; '-' did not converge "
                  "within the harness's timeout):", "",
                  "| N | join | move | storm | death | bring-up |", "| --- | --- | --- | --- | --- | --- |"]
        base = {(b["hosts"], b.get("proxies", 0)): b for b in baseline}
        for r in runs:
            b = base.get((r["hosts"], r.get("proxies", 0)))
            if not b or "error" in r:
                continue
            cells = [f"{sig(step(b, s).get('p99_s') if not step(b, s).get('not_converged') else None)} -> {sig(step(r, s).get('p99_s'))}" for s in STEPS]
            cells.append(f"{sig(step(b, 'bring-up').get('wall_s'))} -> {sig(step(r, 'bring-up').get('wall_s'))}")
            lines.append(f"| {label(r)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def less_joiner(st: dict) -> str:
    """A join's etcd bytes per event without the joiner's own first read (O(N) by nature)."""
    v = st.get("etcd_sent_bytes_per_event_above_idle_less_joiner_read")
    return "" if v is None else f" ({sig(v)} less the joiner's read)"


def plots(runs: list[dict], baseline: list[dict] | None, out: Path) -> list[str]:
    try:
        plt = pyplot()
    except ImportError:
        return ["plots skipped: matplotlib is not importable"]
    ok = [r for r in runs if "error" not in r]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    series = [(f"{p} proxies, " if p else "", [r for r in ok if r.get("proxies", 0) == p], "-o")
              for p in sorted({r.get("proxies", 0) for r in ok})]
    series.append(("baseline ", [b for b in (baseline or []) if "error" not in b], "--x"))
    for name, runs_, style in series:
        for s in STEPS:
            xs = [r["hosts"] for r in runs_ if step(r, s).get("p99_s") is not None and not step(r, s).get("not_converged")]
            ys = [step(r, s)["p99_s"] for r in runs_ if step(r, s).get("p99_s") is not None and not step(r, s).get("not_converged")]
            if xs:
                axes[0].plot(xs, ys, style, label=f"{name}{s}")
    axes[0].axhline(1.0, color="grey", lw=0.8, ls=":")
    axes[0].axhline(2.0, color="grey", lw=0.8, ls=":")
    axes[0].set(xscale="log", yscale="log", xlabel="hosts (N)", ylabel="p99 convergence (s)",
                title="time until every agent applied the change")
    axes[0].legend(fontsize=7)
    for name, runs_, style in series:
        for s in ("join", "storm"):
            xs = [r["hosts"] for r in runs_ if step(r, s)]
            if xs:
                axes[1].plot(xs, [step(r, s).get("etcd_cores", 0) for r in runs_ if step(r, s)], style, label=f"{name}etcd cores, {s}")
                axes[1].plot(xs, [step(r, s).get("agent_cpu_us_per_event", 0) / 1000 for r in runs_ if step(r, s)], style,
                             alpha=0.5, label=f"{name}agent ms/event, {s}")
    axes[1].set(xscale="log", yscale="log", xlabel="hosts (N)", title="etcd cores; agent CPU per event (ms)")
    axes[1].legend(fontsize=7)
    # Issue #19's flatness goal: etcd's cost per event above its idle rate against N.
    for name, runs_, style in series:
        for s, key, scale, unit in (("storm", "etcd_cpu_ms_per_event_above_idle", 1, "ms"),
                                    ("storm", "etcd_sent_bytes_per_event_above_idle", 1e-3, "KB")):
            pts = [(r["hosts"], step(r, s).get(key)) for r in runs_ if step(r, s).get(key) is not None]
            if pts:
                axes[2].plot([x for x, _ in pts], [max(y * scale, 1e-3) for _, y in pts], style,
                             label=f"{name}etcd {unit}/event, {s}")
    axes[2].set(xscale="log", yscale="log", xlabel="hosts (N)",
                title="etcd per event above idle (flat = independent of N)")
    axes[2].legend(fontsize=7)
    save(fig, out / "scale.png")
    return []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default=None, help="comma-separated N (default 10,100,300,1000; none with --daemons)")
    ap.add_argument("--daemons", type=int, default=0,
                    help="also run bench.daemons: this many real vnetd --etcd daemons in namespaces (e.g. 200)")
    ap.add_argument("--guests", type=int, default=8)
    ap.add_argument("--vnis", type=int, default=1)
    ap.add_argument("--lease-ttl", type=int, default=10)
    ap.add_argument("--storm", type=int, default=100)
    ap.add_argument("--timeout", type=int, default=60, help="longest wait for one step, seconds")
    ap.add_argument("--read-page", type=int, default=10000, help="keys per page of the agents' first read")
    ap.add_argument("--ramp", type=float, default=0.0, help="spread the agents' starts over this many seconds (default: all within about 2 s)")
    ap.add_argument("--proxies", default="0",
                    help="comma-separated P: run each N with the agents spread over P of etcd's gRPC proxies "
                         "(0: straight to etcd; e.g. 0,4 for both)")
    ap.add_argument("--cold-start", action="store_true",
                    help="start every agent at once (a simultaneous cold start); the bring-up reports its time "
                         "and the leases lost")
    ap.add_argument("--agents-nice", type=int, default=0,
                    help="run the harness's agents at this nice level (e.g. 10), so that etcd and the proxies, "
                         "which have machines of their own in practice, are not starved by their thread count")
    ap.add_argument("--agents-cpu-shares", type=int, default=None,
                    help="run the harness's agents in a cgroup with these cpu.shares (e.g. 102, a tenth of "
                         "etcd's 1024), so that etcd and the proxies are served first whatever the agents' "
                         "thread count (see AgentsGroup)")
    ap.add_argument("--bringup-timeout", type=int, default=0,
                    help="longest wait for bring-up, seconds (default: 1.5 s per host, at least 180)")
    ap.add_argument("--quick", action="store_true", help="N=10 and 50, for CI (a minute or two)")
    ap.add_argument("--baseline", type=Path, help="an earlier scale.json to compare with")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--binary", type=Path, default=REPO / "target" / "release" / "vnet-scale")
    args = ap.parse_args()
    ensure_matplotlib()
    if args.quick:
        # Small pages, so that reads of many pages (at one revision) are exercised too.
        args.hosts, args.timeout, args.storm, args.read_page = "10,50", 30, 50, 64
    if args.hosts is None:
        args.hosts = "" if args.daemons else "10,100,300,1000"
    ns = [int(x) for x in args.hosts.split(",") if x]
    if ns and not args.binary.exists():
        print(f"{args.binary} not found: cargo build --release -p vnet-scale", file=sys.stderr)
        return 2
    if not Path("/usr/bin/etcd").exists():
        print("/usr/bin/etcd not found: bash scripts/setup.sh installs it", file=sys.stderr)
        return 2
    # Each agent holds a watch stream and a unary connection: lift the soft descriptor limit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or REPO / "results" / f"scale-{stamp}"
    (out / "raw").mkdir(parents=True, exist_ok=True)
    meta = {"time": stamp, "proxies": args.proxies, "cold_start": args.cold_start, "agents_nice": args.agents_nice, "agents_cpu_shares": args.agents_cpu_shares, "guests": args.guests, "vnis": args.vnis, "lease_ttl": args.lease_ttl,
            "storm": args.storm, "commit": commit() or "?", "cores": os.cpu_count()}
    ps = [int(x) for x in args.proxies.split(",") if x] or [0]
    todo = [(n, p) for n in ns for p in ps]
    runs = [run_one(args.binary, n, p, args, out, k + 1, len(todo)) for k, (n, p) in enumerate(todo)]
    text = ""
    if ns:
        baseline = json.loads(args.baseline.read_text())["runs"] if args.baseline else None
        (out / "scale.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
        notes = plots(runs, baseline, out)
        text = summary(runs, baseline, meta) + "".join(f"\n{n}\n" for n in notes)
    daemons_ok = True
    if args.daemons:
        from . import daemons  # namespaces, root only: imported only when asked for
        print(f"daemons: {args.daemons} real vnetd --etcd daemons (bench.daemons)", file=sys.stderr, flush=True)
        doc = daemons.run(args.daemons, out, ttl=args.lease_ttl)
        text += "\n" + daemons.report(doc, out)
        daemons_ok = all(s["not_converged"] == 0 for s in doc["steps"])
    (out / "summary.md").write_text(text)
    print(text)
    print(f"results: {out}", file=sys.stderr)
    return 1 if any("error" in r for r in runs) or not daemons_ok else 0


if __name__ == "__main__":
    sys.exit(main())
