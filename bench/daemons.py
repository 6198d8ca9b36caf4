"""Many real ``vnetd --etcd`` daemons on one etcd (issues #13, #19): how long a host joining and a
guest moving take to reach every daemon's forwarding table, straight to etcd or through etcd's
gRPC proxies.

Each daemon runs in a host namespace of its own (``vnetlab.netlab``: a veth to a shared
underlay bridge) with one guest NIC (a TAP that vnetd moves into a guest namespace); etcd runs
in a namespace of its own on the same underlay, its data in /dev/shm. The daemons' local
configurations hold only their guest's interface: every link and route comes from etcd. With
``--proxies P``, P of etcd's gRPC proxies (``etcd grpc-proxy start``, ``vnetlab.etcdlab.GrpcProxy``)
run in etcd's namespace and daemon i's ``--etcd`` is proxy i % P (``vnetctl move`` still speaks to
etcd itself); etcd's CPU and the proxies' are recorded for every step.

Steps:

- bring-up: every daemon started (in waves, with a progress line) until each routes every
  guest of the overlay; with ``--at-once`` every namespace is made first, then every daemon's
  process is spawned without waiting for any, and the time runs from the first spawn until
  polling sees every daemon route every guest (goal <= 15 s);
- join: one more daemon starts (its namespaces exist already); for every other daemon, the
  time from starting that daemon's process until it routes the new guest over the derived link
  to the new host (goal <= 1 s): this includes the new daemon's own start-up and registration;
- move: host 1's guest moves to host 2 (as ``test_etcd.py`` does it: host 2 gets a second NIC
  with the guest's MAC, ``vnetctl --etcd move`` rewrites the placement in one transaction, host
  1 drops its NIC); for every daemon but host 1, the time from starting the ``vnetctl`` process
  until it routes the MAC the new way (goal <= 0.5 s): this includes vnetctl's own run
  (``vnetctl_move_s``), so it overstates the propagation by up to that much.

The times are taken twice: from each daemon's ``show routes json`` over its control port
(persistent connections, 8 threads polling: "seen by polling", from outside, good to one
polling round, ``poll_round_s``; the goals are judged on these, p100: the slowest daemon), and
from each daemon's own log, where its agent logs every route it applies with a UTC timestamp
("applied", exact to the clock, kept beside them: it says how much of a figure is the polling).
Output: ``daemons.json``, ``daemons.md`` and ``daemons.png``
(the distribution over daemons) in the output directory. Run as root; it is a benchmark,
not a test (200 daemons take several minutes on 2 cores). Everything it made is removed at
the end, whatever happens (netlab's cleanup).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path

from vnetlab import netlab
from vnetlab.etcdlab import EtcdServer, GrpcProxy

from . import REPO
from .etcd import shm_dir
from .machine import commit, proc_cpu, proc_rss
from .report import pyplot, save, sig

OVERLAY = "bench"
# A line of vnetd's log (tracing's format without colours): UTC time, level, target, message.
LOG_LINE = re.compile(r"^(\S+Z)\s+INFO\s+\S+: etcd: (.*)$")
# Issue #19's goals, judged on the slowest daemon as seen by polling (from outside); bring-up
# only with --at-once (every daemon started at once).
GOALS = {"bring-up": 15.0, "join": 1.0, "move": 0.5}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Etcd(EtcdServer):
    """The benchmark's etcd, in its own namespace on the lab's underlay (``vnetlab.etcdlab``):
    its data in /dev/shm (removed at the end), a larger quota, longer timeouts for 200 daemons."""

    def __init__(self, lab: netlab.Lab):
        super().__init__(lab, name="bench", overlay=OVERLAY, data=shm_dir("vnet-daemons-etcd-"), quota=4 << 30,
                         timeout=10)
        self.start(wait=30)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.data, ignore_errors=True)


class Control:
    """A persistent connection to one daemon's control port (``netlab.ControlClient``, opened
    inside its namespace), opened again once when it fails."""

    def __init__(self, host: netlab.Host):
        self.host = host
        self.client = None

    def command(self, line: str) -> str:
        for attempt in (1, 2):
            try:
                if self.client is None:
                    self.client = netlab.ControlClient(self.host, timeout=10)
                head, lines = self.client.command(line)
                if head is None or None in lines:
                    raise ConnectionError("control port closed")
                if head.startswith("error"):
                    raise RuntimeError(f"{self.host.role}: {line}: {head}")
                return "\n".join(lines)
            except (OSError, ConnectionError, ValueError, IndexError):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def routes(self) -> dict:
        return {r["dst"].lower(): (r["to"], r["name"]) for r in json.loads(self.command("show routes json"))}

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


class Bench:
    def __init__(self, lab: netlab.Lab, etcd: Etcd, n: int, ttl: int, threads: int,
                 proxies: list[GrpcProxy] | None = None):
        self.lab, self.etcd, self.n, self.ttl = lab, etcd, n, ttl
        self.proxies = proxies or []
        self.hosts: list[netlab.Host] = []
        self.guests: list[netlab.Guest] = []
        self.controls: list[Control] = []
        self.pool = concurrent.futures.ThreadPoolExecutor(threads)
        self.rounds: list[float] = []

    def add_host(self, i: int, wait: bool) -> netlab.Host:
        h, g = self.prepare_host(i)
        return self.start_host(h, g, wait)

    def prepare_host(self, i: int):
        """The host's and the guest's namespaces (not timed: a real host exists before its daemon)."""
        return self.lab.host(f"h{i}"), self.lab.guest(f"g{i}", mac=netlab.mac(1, i, 1))

    def endpoint(self, k: int) -> str:
        """Daemon k's (0-based) --etcd: proxy k % P, or etcd itself without proxies."""
        return self.proxies[k % len(self.proxies)].endpoint if self.proxies else self.etcd.endpoint

    def cpu(self) -> dict:
        """etcd's CPU and the proxies' (all of them), seconds so far."""
        return {"etcd_cpu_s": proc_cpu(self.etcd.proc.pid),
                "proxies_cpu_s": sum(proc_cpu(p.proc.pid) for p in self.proxies)}

    def start_host(self, h: netlab.Host, g: netlab.Guest, wait: bool) -> netlab.Host:
        h.start_vnetd(config=f"interface add vm tap mac {g.mac} netns {g.name} vni 1\n",
                      args=["--etcd", self.endpoint(len(self.hosts)), "--overlay", OVERLAY, "--host-id", h.role,
                            "--advertise-addr", h.underlay_ip, "--etcd-lease-ttl", self.ttl],
                      wait=wait)
        self.hosts.append(h)
        self.guests.append(g)
        self.controls.append(Control(h))
        return h

    def poll(self, which: list[int], pred, timeout: float, t0: float, what: str) -> dict:
        """Polls the daemons `which` until pred(routes) holds on each; returns index -> seconds
        since t0 at the first round that saw it (None: not within the timeout)."""
        seen: dict[int, float | None] = {i: None for i in which}
        lock = threading.Lock()
        deadline = t0 + timeout
        last_report = time.monotonic()

        def check(i: int) -> None:
            try:
                ok = pred(i, self.controls[i].routes())
            except Exception:
                ok = False
            if ok:
                with lock:
                    if seen[i] is None:
                        seen[i] = time.monotonic() - t0

        while True:
            left = [i for i, v in seen.items() if v is None]
            if not left or time.monotonic() > deadline:
                break
            r0 = time.monotonic()
            list(self.pool.map(check, left))
            self.rounds.append(time.monotonic() - r0)
            if time.monotonic() - last_report > 2:
                done = sum(v is not None for v in seen.values())
                log(f"{what}: {done} of {len(seen)} daemons")
                last_report = time.monotonic()
        return seen

    def bring_up(self, wave: int, at_once: bool = False) -> dict:
        if at_once:
            # The namespaces first (a real host exists before its daemon), then every process
            # spawned back to back; nothing waits for a control port: polling sees them come.
            prepared = [self.prepare_host(i) for i in range(1, self.n + 1)]
            log(f"bring-up: {self.n} hosts' namespaces made; starting every daemon at once")
            t0 = time.monotonic()
            for h, g in prepared:
                self.start_host(h, g, wait=False)
            log(f"bring-up: {self.n} daemons spawned ({time.monotonic() - t0:.1f} s)")
        else:
            t0 = time.monotonic()
            for i in range(1, self.n + 1):
                self.add_host(i, wait=False)
                if i % wave == 0 or i == self.n:
                    for h in self.hosts[(i - 1) // wave * wave:i]:
                        h.wait_ready(timeout=60)
                    log(f"bring-up: {i} of {self.n} daemons started ({time.monotonic() - t0:.0f} s)")
        macs = {g.mac for g in self.guests}
        started = time.monotonic() - t0
        self.rounds.clear()
        seen = self.poll(list(range(self.n)), lambda i, r: macs <= r.keys(),
                         timeout=max(300, self.n * 3), t0=t0, what="bring-up: routing every guest")
        for i, h in enumerate(self.hosts):
            if seen[i] is None and not h.vnetd.alive():
                log(f"bring-up: {h.role}'s vnetd exited (rc={h.vnetd.proc.returncode}): "
                    f"{h.vnetd.log_text()[-500:]}")
        out = summarize("bring-up", seen, self.rounds)
        done = out["times_s"]
        out.update({"at_once": at_once, "start_s": started,
                    "all_routed_s": max(done) if len(done) == self.n else None})
        return out

    def applied_at(self, which: list[int], mac: str, target, t0_wall: float, grace: float = 2.0) -> dict:
        """Per daemon, when its agent applied the route for `mac` to `target` ((kind, name)),
        from the daemon's own log ("etcd: route add ..." with the log's UTC timestamp), in
        seconds since t0_wall; None when the log does not show it. Exact to the log's clock,
        unlike the polling, which is good to one round. The agent logs a batch after applying
        it, so polling may see a route before its line is written: missing lines are looked for
        again for up to `grace` seconds."""
        want = f"{mac} {target[0]} {target[1]}"
        out = self._applied_at(which, want, t0_wall)
        deadline = time.monotonic() + grace
        while None in out.values() and time.monotonic() < deadline:
            time.sleep(0.1)
            out.update(self._applied_at([i for i, v in out.items() if v is None], want, t0_wall))
        return out

    def _applied_at(self, which: list[int], want: str, t0_wall: float) -> dict:
        out = {}
        for i in which:
            out[i] = None
            v = self.hosts[i].vnetd
            try:
                text = v.log.read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                m = LOG_LINE.match(line)
                if not m or "route" not in m.group(2) or not m.group(2).endswith(want):
                    continue
                at = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp() - t0_wall
                if at >= -0.5:  # this change, not an earlier one
                    out[i] = max(at, 0.0)
                    break
        return out

    def join(self) -> dict:
        j = self.n + 1
        mac = netlab.mac(1, j, 1)
        want = ("link", f"c-h{j}-v1")
        others = list(range(self.n))
        h, g = self.prepare_host(j)
        self.rounds.clear()
        t0, t0_wall = time.monotonic(), time.time()
        self.start_host(h, g, wait=False)
        seen = self.poll(others, lambda i, r: r.get(mac) == want, timeout=60, t0=t0, what="join")
        out = summarize("join", seen, self.rounds)
        out["applied"] = summarize("join", self.applied_at(others, mac, want, t0_wall), [])
        return out

    def move(self) -> dict:
        src, dst = self.hosts[0], self.hosts[1]
        g = self.guests[0]
        dst.ctl("interface", "add", "vmig", "tap", "mac", g.mac, "netns", g.name, "vni", 1)
        # h2 routes the MAC to h1 until the move (its local NIC is not the placement yet).
        netlab.wait_until(lambda: self.controls[1].routes().get(g.mac) == ("link", "c-h1-v1"), 20, 0.1,
                          what="h2 to keep routing the guest to h1 before the move")
        want_dst = ("interface", "vmig")
        want = ("link", f"c-{dst.role}-v1")
        others = list(range(1, len(self.hosts)))  # every daemon but the source (host 1)
        self.rounds.clear()
        t0, t0_wall = time.monotonic(), time.time()
        moved = self.etcd.ctl("move", 1, g.mac, dst.role, "vmig")
        issued = time.monotonic() - t0
        seen = self.poll(others, lambda i, r: r.get(g.mac) == (want_dst if i == 1 else want),
                         timeout=60, t0=t0, what="move")
        src.ctl("interface", "del", "vm")  # the VM is gone from the source host
        out = summarize("move", seen, self.rounds)
        applied = self.applied_at([i for i in others if i != 1], g.mac, want, t0_wall)
        applied.update(self.applied_at([1], g.mac, want_dst, t0_wall))
        out["applied"] = summarize("move", applied, [])
        out["vnetctl_move_s"] = issued
        out["vnetctl_output"] = moved.strip()
        return out

    def close(self) -> None:
        for c in self.controls:
            c.close()
        self.pool.shutdown()


def percentile(sorted_v: list[float], p: float):
    if not sorted_v:
        return None
    k = max(1, min(len(sorted_v), int(-(-p / 100 * len(sorted_v) // 1))))
    return sorted_v[k - 1]


def summarize(step: str, seen: dict, rounds: list[float]) -> dict:
    done = sorted(v for v in seen.values() if v is not None)
    return {"step": step, "daemons": len(seen), "not_converged": len(seen) - len(done),
            "p50_s": percentile(done, 50), "p99_s": percentile(done, 99), "max_s": done[-1] if done else None,
            "poll_round_s": (sum(rounds) / len(rounds)) if rounds else None, "times_s": done}


def resources(bench: Bench, etcd: Etcd) -> dict:
    def usage(pid: int):
        return proc_cpu(pid), proc_rss(pid)
    daemons = [usage(h.vnetd.pid) for h in bench.hosts if h.vnetd and h.vnetd.alive()]
    e = usage(etcd.proc.pid)
    proxies = [usage(p.proc.pid) for p in bench.proxies]
    return {"daemons_cpu_s": sum(c for c, _ in daemons), "daemons_rss_bytes": sum(r for _, r in daemons),
            "etcd_cpu_s": e[0], "etcd_rss_bytes": e[1],
            "proxies_cpu_s": sum(c for c, _ in proxies), "proxies_rss_bytes": sum(r for _, r in proxies)}


def report(doc: dict, out: Path) -> str:
    via = f"through {doc['proxies']} of etcd's gRPC proxies" if doc.get("proxies") else "on one etcd"
    lines = [f"## {doc['daemons']} real vnetd --etcd daemons {via} ({doc['time']})", "",
             f"Each daemon in its own host namespace with one guest TAP, lease TTL {doc['lease_ttl']} s, "
             f"etcd 3.4 in a namespace of its own (data in /dev/shm)"
             + (f", {doc['proxies']} gRPC proxies beside it (daemon i on proxy i % {doc['proxies']})" if doc.get("proxies") else "")
             + f"; commit {doc['commit']}; "
             f"{os.cpu_count()} cores shared by etcd and every daemon. \"Applied\": when each daemon's agent "
             "applied the route, from the daemon's log; \"seen by polling\": when `show routes json` first showed it "
             "(good to one polling round, which confirms that the route is in place).", "",
             "| step | daemons | p50 s | p99 s | max s | not converged | polling round s | goal |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in doc["steps"]:
        g = GOALS[s["step"]]
        judged = s["step"] != "bring-up" or s.get("at_once")
        ok = s["not_converged"] == 0 and s.get("max_s") is not None and s["max_s"] <= g
        verdict = f"slowest daemon <= {g} s: {'met' if ok else 'NOT met'}" if judged else f"(<= {g} s with --at-once only)"
        name = s["step"] + (" (at once)" if s.get("at_once") else " (in waves)" if s["step"] == "bring-up" else "")
        lines.append(f"| {name}, seen by polling | {s['daemons']} | {sig(s['p50_s'])} | {sig(s['p99_s'])} | {sig(s['max_s'])} | "
                     f"{s['not_converged']} | {sig(s['poll_round_s'])} | {verdict} |")
        if s["step"] == "bring-up":
            started = "every process spawned" if s.get("at_once") else "every control port answering"
            lines.append(f"| bring-up, {started} | {s['daemons']} | | | {sig(s['start_s'])} | | | |")
            continue
        a = s.get("applied") or {}
        lines.append(f"| {s['step']}, applied (daemons' logs) | {a.get('daemons', '-')} | {sig(a.get('p50_s'))} | {sig(a.get('p99_s'))} | "
                     f"{sig(a.get('max_s'))} | {a.get('not_converged', '-')} | | |")
    lines += ["", "The goals are judged on the polling rows' max (p100: the slowest daemon, seen from outside; "
              "bring-up from the first spawn). etcd's CPU in each step"
              + (" and its proxies'" if doc.get("proxies") else "") + ":", ""]
    for s in doc["steps"]:
        if "etcd_cpu_s" in s:
            lines.append(f"- {s['step']}: etcd {s['etcd_cpu_s']:.2f} CPU-s"
                         + (f", proxies {s['proxies_cpu_s']:.2f} CPU-s" if doc.get("proxies") else ""))
    r = doc["resources"]
    lines += ["", f"After the steps: the daemons used {r['daemons_cpu_s']:.1f} CPU-s in all and hold "
              f"{r['daemons_rss_bytes'] / 1e6:.0f} MB resident; etcd {r['etcd_cpu_s']:.1f} CPU-s, "
              f"{r['etcd_rss_bytes'] / 1e6:.0f} MB"
              + (f"; the {doc['proxies']} proxies {r['proxies_cpu_s']:.1f} CPU-s, {r['proxies_rss_bytes'] / 1e6:.0f} MB"
                 if doc.get("proxies") else "") + ".", ""]
    return "\n".join(lines)


def plot(doc: dict, out: Path) -> None:
    try:
        plt = pyplot()
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for s in doc["steps"]:
        t = s.get("times_s") if s["step"] != "bring-up" else None  # polling, as the goals
        if t:
            ax.step(t, [(k + 1) / s["daemons"] for k in range(len(t))], where="post",
                    label=f"{s['step']} (goal {GOALS[s['step']]} s)")
            ax.axvline(GOALS[s["step"]], color="grey", lw=0.8, ls=":")
    via = f"through {doc['proxies']} gRPC proxies" if doc.get("proxies") else "on one etcd"
    ax.set(xlabel="seconds until polling sees the daemon route the change", ylabel="fraction of daemons",
           title=f"{doc['daemons']} vnetd --etcd daemons {via}")
    ax.legend()
    save(fig, out / "daemons.png")


def run(n: int, out: Path, ttl: int = 10, wave: int = 20, threads: int = 8, proxies: int = 0,
        at_once: bool = False) -> dict:
    if n < 3 or n > 250:
        raise SystemExit("--daemons must be 3 to 250 (one /24 underlay)")
    if proxies < 0 or proxies > 32:
        raise SystemExit("--proxies must be 0 to 32")
    out.mkdir(parents=True, exist_ok=True)
    netlab.install_signal_cleanup()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    doc = {"daemons": n, "lease_ttl": ttl, "commit": commit() or "?", "time": stamp, "proxies": proxies,
           "at_once": at_once, "goals_s": GOALS, "steps": []}
    with netlab.Lab(tag="daemons") as lab:
        etcd = Etcd(lab)
        grpc_proxies: list[GrpcProxy] = []
        bench = None
        try:
            for k in range(proxies):
                grpc_proxies.append(GrpcProxy(etcd, port=23790 + k))
                grpc_proxies[-1].start(wait=30)
            bench = Bench(lab, etcd, n, ttl, threads, grpc_proxies)

            def measured(step):
                """The step, with etcd's CPU and the proxies' during it."""
                c0 = bench.cpu()
                s = step()
                s.update({k: v - c0[k] for k, v in bench.cpu().items()})
                return s

            s = measured(lambda: bench.bring_up(wave, at_once))
            doc["steps"].append(s)
            log(f"bring-up: all routed after {sig(s['all_routed_s'])} s (every process spawned in "
                f"{sig(s['start_s'])} s), {s['not_converged']} not converged (polling round {sig(s['poll_round_s'])} s)")
            for step in (bench.join, bench.move):
                s = measured(step)
                doc["steps"].append(s)
                log(f"{s['step']}: p50 {sig(s['p50_s'])} p99 {sig(s['p99_s'])} max {sig(s['max_s'])} s, "
                    f"{s['not_converged']} not converged (polling round {sig(s['poll_round_s'])} s)")
            doc["resources"] = resources(bench, etcd)
        finally:
            if bench is not None:
                bench.close()
            for p in grpc_proxies:
                p.stop()
            etcd.close()
    (out / "daemons.json").write_text(json.dumps(doc, indent=1))
    (out / "daemons.md").write_text(report(doc, out))
    plot(doc, out)
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--daemons", type=int, default=200)
    ap.add_argument("--lease-ttl", type=int, default=10)
    ap.add_argument("--wave", type=int, default=20, help="daemons started before waiting for their control ports")
    ap.add_argument("--proxies", type=int, default=0,
                    help="etcd gRPC proxies in front of etcd, daemon i on proxy i %% P (default 0: straight to etcd)")
    ap.add_argument("--at-once", action="store_true",
                    help="start every daemon's process at once (no waves); bring-up timed from the first spawn")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or REPO / "results" / f"daemons-{stamp}"
    doc = run(args.daemons, out, args.lease_ttl, args.wave, proxies=args.proxies, at_once=args.at_once)
    print(report(doc, out))
    print(f"results: {out}", file=sys.stderr)
    ok = all(s["not_converged"] == 0 for s in doc["steps"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
