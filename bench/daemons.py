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
  1 drops its NIC); for every daemon but host 1, the time until it routes the MAC the new way
  (goal <= 0.5 s). The transaction is issued inside the ``vnetctl`` process, after its start-up
  and its read of the overlay, and committed before it exits: the times are given from the
  process's start (the judged figure: it bounds the propagation from above) and from its exit
  (``after vnetctl``: from below), and vnetctl's run apart (``vnetctl_move_s``).

The times are taken twice: from each daemon's control port ("seen by polling", from outside:
``show routes json`` for the bring-up, ``show routes to MAC json`` for the join and the move, the
same table cut to the routes that can carry the guest's frames, so that an answer costs a
daemon little however many routes it has; the goals are judged on these, p100: the slowest daemon), and
from each daemon's own log, where its agent logs every route it applies with a UTC timestamp
("applied", exact to the clock, kept beside them: it says how much of a figure is the polling).
Polling is one thread over persistent connections: each round sends the query to every daemon
not yet seen and reads the answers as they come (``selectors``), so a round lasts about what the
daemons take to answer; rounds start at least ``--poll-interval`` apart (default 0.05 s) so that
the polling itself does not take the cores from what it measures. A daemon's time is when the
first answer that shows the change arrived (good to one round, ``poll_round_s``, the mean round).

Where the bring-up's time goes (``anatomy``): for every daemon, from its log, when its process
ran (its first line), loaded the kernel fast path, answered on its control port ("vnetd
ready") and was watching the overlay after its first read ("etcd: watching"), from the first
spawn; and the CPU each party used in the bring-up: the daemons (all of it, from their start),
the harness itself (spawning, polling), etcd and its proxies.
Output: ``daemons.json``, ``daemons.md`` and ``daemons.png``
(the distribution over daemons) in the output directory. Run as root; it is a benchmark,
not a test (200 daemons take several minutes on 2 cores). Everything it made is removed at
the end, whatever happens (netlab's cleanup).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import selectors
import shutil
import socket
import statistics
import sys
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
# The phases of a daemon's start (its log's messages), in order, for the bring-up's anatomy.
PHASES = [("process ran", re.compile(r"^(\S+Z)\s")),
          ("fast path loaded", re.compile(r"^(\S+Z)\s.*(kernel fast path loaded|kernel fast path is not available)")),
          ("control port ready", re.compile(r"^(\S+Z)\s.*vnetd ready")),
          ("watching etcd", re.compile(r"^(\S+Z)\s.*etcd: watching the overlay"))]
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


class Poller:
    """Polls many daemons' control ports from one thread: a round sends the query on every
    connection at once, then reads the answers as they come, so it lasts about what the
    daemons take to answer rather than the sum of the round trips; a connection that fails
    (a daemon not yet listening) is opened again at the next round."""

    QUERY = b"show routes json\n"

    @staticmethod
    def query_to(mac: str) -> bytes:
        """The query for the routes to one MAC only (what a join or a move changes)."""
        return f"show routes to {mac} json\n".encode()

    def __init__(self, hosts: list):
        self.hosts = hosts
        self.socks: dict[int, socket.socket] = {}

    def _sock(self, i: int):
        s = self.socks.get(i)
        if s is None:
            h = self.hosts[i]
            addr, port = h.control.rsplit(":", 1)
            s = h.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(1.0)
            try:
                s.connect((addr, int(port)))
            except OSError:
                s.close()
                return None
            s.setblocking(False)
            self.socks[i] = s
        return s

    def _drop(self, i: int) -> None:
        s = self.socks.pop(i, None)
        if s is not None:
            s.close()

    def round(self, which: list[int], timeout: float = 5.0, query: bytes = QUERY) -> dict:
        """Index -> (monotonic time the answer was complete, the answer's JSON line as bytes),
        for the daemons that answered ``query`` within ``timeout``."""
        sel = selectors.DefaultSelector()
        bufs: dict[int, bytearray] = {}
        for i in which:
            s = self._sock(i)
            if s is None:
                continue
            try:
                s.send(query)
            except OSError:
                self._drop(i)
                continue
            bufs[i] = bytearray()
            sel.register(s, selectors.EVENT_READ, i)
        out = {}
        deadline = time.monotonic() + timeout
        while bufs.keys() - out.keys() and time.monotonic() < deadline:
            for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
                i = key.data
                try:
                    chunk = key.fileobj.recv(1 << 20)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    sel.unregister(key.fileobj)
                    self._drop(i)
                    bufs.pop(i)
                    continue
                b = bufs[i]
                b += chunk
                # `ok 1` and the JSON line: complete at the second newline.
                if b.count(b"\n") >= 2:
                    sel.unregister(key.fileobj)
                    head, line = bytes(b).split(b"\n", 2)[:2]
                    out[i] = (time.monotonic(), line if head.startswith(b"ok") else b"")
        for key in list(sel.get_map().values()):
            sel.unregister(key.fileobj)
            self._drop(key.data)  # no answer in time: its late answer must not be read as the next
        sel.close()
        return out

    def close(self) -> None:
        for i in list(self.socks):
            self._drop(i)


def routes_of(line: bytes) -> dict:
    """MAC -> (kind, name) from a ``show routes json`` answer."""
    try:
        return {r["dst"].lower(): (r["to"], r["name"]) for r in json.loads(line)}
    except ValueError:
        return {}


def route_to(line: bytes, mac: str):
    """(kind, name) of the route to ``mac`` in a ``show routes json`` answer, without parsing
    the whole answer (a round reads hundreds of them); None when there is none."""
    m = re.search(rb'"dst":"' + mac.lower().encode() + rb'","to":"(\w+)","name":"([^"]*)"', line)
    return (m.group(1).decode(), m.group(2).decode()) if m else None


class Bench:
    def __init__(self, lab: netlab.Lab, etcd: Etcd, n: int, ttl: int, interval: float,
                 proxies: list[GrpcProxy] | None = None, extra_config: list[str] | None = None,
                 extra_args: list[str] | None = None):
        self.lab, self.etcd, self.n, self.ttl = lab, etcd, n, ttl
        self.extra_config, self.extra_args = extra_config or [], extra_args or []
        self.proxies = proxies or []
        self.hosts: list[netlab.Host] = []
        self.guests: list[netlab.Guest] = []
        self.controls: list[Control] = []
        self.poller = Poller(self.hosts)
        self.interval = interval
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
        """etcd's CPU, the proxies' (all of them) and the daemons' (all of them, to the
        nanosecond: each thread's run time from schedstat), seconds so far."""
        return {"etcd_cpu_s": proc_cpu(self.etcd.proc.pid),
                "proxies_cpu_s": sum(proc_cpu(p.proc.pid) for p in self.proxies),
                "daemons_cpu_s": sum(run_time(h.vnetd.pid) for h in self.hosts if h.vnetd)}

    def idle(self, seconds: float = 2.0) -> dict:
        """The daemons' CPU while nothing happens (cores): what every step pays beside its
        own work on this machine (each daemon's dispatchers, agent loop, keep-alives)."""
        c0, t0 = self.cpu(), time.monotonic()
        time.sleep(seconds)
        c1, t1 = self.cpu(), time.monotonic()
        return {"step": "idle", "seconds": t1 - t0, "daemons": len(self.hosts),
                "daemons_cores": (c1["daemons_cpu_s"] - c0["daemons_cpu_s"]) / (t1 - t0),
                "etcd_cores": (c1["etcd_cpu_s"] - c0["etcd_cpu_s"]) / (t1 - t0),
                "proxies_cores": (c1["proxies_cpu_s"] - c0["proxies_cpu_s"]) / (t1 - t0)}

    def start_host(self, h: netlab.Host, g: netlab.Guest, wait: bool) -> netlab.Host:
        config = "".join(f"{line}\n" for line in
                         [f"interface add vm tap mac {g.mac} netns {g.name} vni 1", *self.extra_config])
        h.start_vnetd(config=config,
                      args=["--etcd", self.endpoint(len(self.hosts)), "--overlay", OVERLAY, "--host-id", h.role,
                            "--advertise-addr", h.underlay_ip, "--etcd-lease-ttl", self.ttl, *self.extra_args],
                      wait=wait)
        self.hosts.append(h)
        self.guests.append(g)
        self.controls.append(Control(h))
        return h

    def poll(self, which: list[int], pred, timeout: float, t0: float, what: str,
             query: bytes = Poller.QUERY) -> dict:
        """Polls the daemons `which` until pred(i, answer) holds on each (answer: the bytes of
        its answer to ``query``, ``show routes json`` unless told); returns index -> seconds
        since t0 when the first answer that showed it arrived (None: not within the timeout)."""
        seen: dict[int, float | None] = {i: None for i in which}
        deadline = t0 + timeout
        last_report = time.monotonic()
        while True:
            left = [i for i, v in seen.items() if v is None]
            if not left or time.monotonic() > deadline:
                break
            r0 = time.monotonic()
            for i, (at, line) in self.poller.round(left, query=query).items():
                if pred(i, line):
                    seen[i] = at - t0
            r1 = time.monotonic()
            self.rounds.append(r1 - r0)
            if r1 - last_report > 2:
                done = sum(v is not None for v in seen.values())
                log(f"{what}: {done} of {len(seen)} daemons")
                last_report = r1
            time.sleep(max(0.0, self.interval - (r1 - r0)))
        return seen

    def bring_up(self, wave: int, at_once: bool = False) -> dict:
        c0, h0 = self.cpu(), os.times()
        t0_wall = time.time()
        spawned: list[float] = []
        if at_once:
            # The namespaces first (a real host exists before its daemon), then every process
            # spawned back to back; nothing waits for a control port: polling sees them come.
            prepared = [self.prepare_host(i) for i in range(1, self.n + 1)]
            log(f"bring-up: {self.n} hosts' namespaces made; starting every daemon at once")
            c0, h0 = self.cpu(), os.times()
            t0, t0_wall = time.monotonic(), time.time()
            for h, g in prepared:
                self.start_host(h, g, wait=False)
                spawned.append(time.monotonic() - t0)
            log(f"bring-up: {self.n} daemons spawned ({time.monotonic() - t0:.1f} s)")
        else:
            t0 = time.monotonic()
            for i in range(1, self.n + 1):
                self.add_host(i, wait=False)
                spawned.append(time.monotonic() - t0)
                if i % wave == 0 or i == self.n:
                    for h in self.hosts[(i - 1) // wave * wave:i]:
                        h.wait_ready(timeout=60)
                    log(f"bring-up: {i} of {self.n} daemons started ({time.monotonic() - t0:.0f} s)")
        macs = {g.mac.lower() for g in self.guests}
        n = len(macs)
        started = time.monotonic() - t0
        self.rounds.clear()

        def routes_all(i: int, line: bytes) -> bool:
            # Counting first: the whole answer is parsed only once it can hold every guest.
            return line.count(b'"dst":"') >= n and macs <= routes_of(line).keys()

        seen = self.poll(list(range(self.n)), routes_all,
                         timeout=max(300, self.n * 3), t0=t0, what="bring-up: routing every guest")
        c1, h1 = self.cpu(), os.times()
        for i, h in enumerate(self.hosts):
            if seen[i] is None and not h.vnetd.alive():
                log(f"bring-up: {h.role}'s vnetd exited (rc={h.vnetd.proc.returncode}): "
                    f"{h.vnetd.log_text()[-500:]}")
        out = summarize("bring-up", seen, self.rounds)
        done = out["times_s"]
        out.update({"at_once": at_once, "start_s": started,
                    "all_routed_s": max(done) if len(done) == self.n else None,
                    "anatomy": anatomy([h.vnetd for h in self.hosts], spawned, seen, t0_wall),
                    "cpu_s": {"daemons": sum(proc_cpu(h.vnetd.pid) for h in self.hosts if h.vnetd.alive()),
                              "harness": (h1.user - h0.user) + (h1.system - h0.system)
                              + (h1.children_user - h0.children_user) + (h1.children_system - h0.children_system),
                              "etcd": c1["etcd_cpu_s"] - c0["etcd_cpu_s"],
                              "proxies": c1["proxies_cpu_s"] - c0["proxies_cpu_s"]}})
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
        seen = self.poll(others, lambda i, line: route_to(line, mac) == want, timeout=60, t0=t0, what="join",
                         query=Poller.query_to(mac))
        out = summarize("join", seen, self.rounds)
        out["applied"] = summarize("join", self.applied_at(others, mac, want, t0_wall), [])
        # Where the joining daemon's own start-up went (from the same origin).
        out["joiner"] = anatomy([h.vnetd], [0.0], {0: None}, t0_wall)
        return out

    def move(self) -> dict:
        src, dst = self.hosts[0], self.hosts[1]
        g = self.guests[0]
        dst.ctl("interface", "add", "vmig", "tap", "mac", g.mac, "netns", g.name, "vni", 1)
        # h2 routes the MAC to h1 until the move (its local NIC is not the placement yet).
        netlab.wait_until(lambda: self.controls[1].routes().get(g.mac.lower()) == ("link", "c-h1-v1"), 20, 0.1,
                          what="h2 to keep routing the guest to h1 before the move")
        want_dst = ("interface", "vmig")
        want = ("link", f"c-{dst.role}-v1")
        others = list(range(1, len(self.hosts)))  # every daemon but the source (host 1)
        self.rounds.clear()
        t0, t0_wall = time.monotonic(), time.time()
        # vnetctl joins etcd's namespace with nsenter (what `ip netns exec` adds, a mount
        # namespace and /sys mounted again, would be counted as the move's).
        moved = netlab.sh("nsenter", f"--net=/run/netns/{self.etcd.ns.name}", netlab.VNETCTL, "--etcd",
                          self.etcd.endpoint, "--overlay", OVERLAY, "--timeout", self.etcd.timeout,
                          "move", 1, g.mac, dst.role, "vmig", timeout=60).stdout
        issued = time.monotonic() - t0
        seen = self.poll(others, lambda i, line: route_to(line, g.mac) == (want_dst if i == 1 else want),
                         timeout=60, t0=t0, what="move", query=Poller.query_to(g.mac))
        src.ctl("interface", "del", "vm")  # the VM is gone from the source host
        out = summarize("move", seen, self.rounds)
        applied = self.applied_at([i for i in others if i != 1], g.mac, want, t0_wall)
        applied.update(self.applied_at([1], g.mac, want_dst, t0_wall))
        out["applied"] = summarize("move", applied, [])
        # From vnetctl's exit (the transaction committed before it): a bound from below.
        after = {i: None if v is None else v - issued for i, v in seen.items()}
        out["after_vnetctl"] = summarize("move", after, self.rounds)
        out["applied_after_vnetctl"] = summarize(
            "move", {i: None if v is None else v - issued for i, v in applied.items()}, [])
        out["vnetctl_move_s"] = issued
        out["vnetctl_output"] = moved.strip()
        return out

    def close(self) -> None:
        for c in self.controls:
            c.close()
        self.poller.close()


def percentile(sorted_v: list[float], p: float):
    if not sorted_v:
        return None
    k = max(1, min(len(sorted_v), int(-(-p / 100 * len(sorted_v) // 1))))
    return sorted_v[k - 1]


def run_time(pid: int) -> float:
    """A process's CPU time in seconds, every thread's, to the nanosecond (schedstat)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def summarize(step: str, seen: dict, rounds: list[float]) -> dict:
    done = sorted(v for v in seen.values() if v is not None)
    return {"step": step, "daemons": len(seen), "not_converged": len(seen) - len(done),
            "p50_s": percentile(done, 50), "p99_s": percentile(done, 99), "max_s": done[-1] if done else None,
            "poll_round_s": (sum(rounds) / len(rounds)) if rounds else None, "times_s": done}


def anatomy(daemons: list, spawned: list[float], seen: dict, t0_wall: float) -> dict:
    """Where a start's time went: per phase (spawned by the harness, the phases of the
    daemon's log, routing every guest as polling saw it), the median and the slowest daemon,
    in seconds from the first spawn; and how many daemons' logs showed each phase."""
    rows: dict[str, list[float]] = {"spawned": list(spawned)}
    for d in daemons:
        text = d.log_text()
        for name, pat in PHASES:
            for line in text.splitlines():
                m = pat.match(line)
                if m:
                    at = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
                    rows.setdefault(name, []).append(at - t0_wall)
                    break
    rows["routing every guest (polling)"] = [v for v in seen.values() if v is not None]
    return {k: {"daemons": len(v), "p50_s": statistics.median(v) if v else None, "max_s": max(v, default=None)}
            for k, v in rows.items()}


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
             + (f"; NOT the defaults: every daemon's config also has {doc['extra_config']}" if doc.get("extra_config") else "")
             + (f"; NOT the defaults: every vnetd also runs with {doc['extra_args']}" if doc.get("extra_args") else "")
             + f"; commit {doc['commit']}; "
             f"{os.cpu_count()} cores shared by etcd and every daemon. \"Applied\": when each daemon's agent "
             "applied the route, from the daemon's log; \"seen by polling\": when the daemon's control port first showed it "
             "(`show routes json` in the bring-up, `show routes to MAC json` for the join and the move; good to one "
             "polling round, which confirms that the route is in place).", "",
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
        for key, what in (("after_vnetctl", "seen by polling, from vnetctl's exit"),
                          ("applied_after_vnetctl", "applied, from vnetctl's exit")):
            b = s.get(key)
            if b:
                lines.append(f"| {s['step']}, {what} | {b['daemons']} | {sig(b['p50_s'])} | {sig(b['p99_s'])} | "
                             f"{sig(b['max_s'])} | {b['not_converged']} | | |")
    for s in doc["steps"]:
        if s["step"] == "move":
            lines += ["", f"The move: vnetctl ran {sig(s['vnetctl_move_s'])} s (its start-up, its read of the overlay, "
                      "the transaction); the judged row counts from its start, the \"from vnetctl's exit\" rows from "
                      "after the transaction had committed."]
    for s in doc["steps"]:
        if s.get("anatomy"):
            c = s["cpu_s"]
            lines += ["", f"Where the {s['step']}'s time went (seconds from the first spawn; CPU: daemons "
                      f"{c['daemons']:.1f} s, harness {c['harness']:.1f} s, etcd {c['etcd']:.1f} s, proxies {c['proxies']:.1f} s):", "",
                      "| phase | daemons | median s | slowest s |", "| --- | --- | --- | --- |"]
            for k, v in s["anatomy"].items():
                lines.append(f"| {k} | {v['daemons']} | {sig(v['p50_s'])} | {sig(v['max_s'])} |")
        if s.get("joiner"):
            j = ", ".join(f"{k} {sig(v['p50_s'])} s" for k, v in s["joiner"].items() if v["daemons"] and k != "spawned")
            lines += ["", f"The joining daemon's own start (from its spawn): {j}."]
    lines += ["", "The goals are judged on the polling rows' max (p100: the slowest daemon, seen from outside; "
              "bring-up from the first spawn). etcd's CPU in each step"
              + (" and its proxies'" if doc.get("proxies") else "") + ":", ""]
    for s in doc["steps"]:
        if "etcd_cpu_s" in s:
            lines.append(f"- {s['step']}: etcd {s['etcd_cpu_s']:.2f} CPU-s"
                         + (f", proxies {s['proxies_cpu_s']:.2f} CPU-s" if doc.get("proxies") else "")
                         + (f", the daemons {s['daemons_cpu_s']:.2f} CPU-s" if "daemons_cpu_s" in s else ""))
    if doc.get("idle"):
        i = doc["idle"]
        lines += ["", f"Idle (nothing happening, {i['seconds']:.1f} s after the bring-up): the {i['daemons']} daemons "
                  f"used {i['daemons_cores']:.2f} cores, etcd {i['etcd_cores']:.2f}, the proxies {i['proxies_cores']:.2f}: "
                  "every step above paid that beside its own work."]
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


def run(n: int, out: Path, ttl: int = 10, wave: int = 20, interval: float = 0.05, proxies: int = 0,
        at_once: bool = False, extra_config: list[str] | None = None, extra_args: list[str] | None = None) -> dict:
    if n < 3 or n > 250:
        raise SystemExit("--daemons must be 3 to 250 (one /24 underlay)")
    if proxies < 0 or proxies > 32:
        raise SystemExit("--proxies must be 0 to 32")
    out.mkdir(parents=True, exist_ok=True)
    netlab.install_signal_cleanup()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    doc = {"daemons": n, "lease_ttl": ttl, "commit": commit() or "?", "time": stamp, "proxies": proxies,
           "at_once": at_once, "poll_interval_s": interval, "goals_s": GOALS, "steps": [],
           "extra_config": extra_config or [], "extra_args": extra_args or []}
    with netlab.Lab(tag="daemons") as lab:
        etcd = Etcd(lab)
        grpc_proxies: list[GrpcProxy] = []
        bench = None
        try:
            for k in range(proxies):
                grpc_proxies.append(GrpcProxy(etcd, port=23790 + k))
                grpc_proxies[-1].start(wait=30)
            bench = Bench(lab, etcd, n, ttl, interval, grpc_proxies, extra_config, extra_args)

            def measured(step):
                """The step, with the CPU of etcd, the proxies and the daemons during it."""
                c0 = bench.cpu()
                s = step()
                s.update({k: v - c0[k] for k, v in bench.cpu().items()})
                return s

            s = measured(lambda: bench.bring_up(wave, at_once))
            doc["steps"].append(s)
            log(f"bring-up: all routed after {sig(s['all_routed_s'])} s (every process spawned in "
                f"{sig(s['start_s'])} s), {s['not_converged']} not converged (polling round {sig(s['poll_round_s'])} s)")
            doc["idle"] = bench.idle()
            log(f"idle: the daemons use {doc['idle']['daemons_cores']:.2f} cores doing nothing")
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
    ap.add_argument("--poll-interval", type=float, default=0.05,
                    help="seconds from the start of one polling round to the next at least (default 0.05)")
    ap.add_argument("--extra-config", action="append", default=[], metavar="LINE",
                    help="a line added to every daemon's config file (an experiment, said in the report)")
    ap.add_argument("--vnetd-arg", action="append", default=[], metavar="ARG",
                    help="an argument added to every daemon's command line (an experiment, said in the report)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or REPO / "results" / f"daemons-{stamp}"
    doc = run(args.daemons, out, args.lease_ttl, args.wave, args.poll_interval, proxies=args.proxies,
              at_once=args.at_once, extra_config=args.extra_config, extra_args=args.vnetd_arg)
    print(report(doc, out))
    print(f"results: {out}", file=sys.stderr)
    ok = all(s["not_converged"] == 0 for s in doc["steps"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
