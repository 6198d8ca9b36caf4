"""vnetd's CPU per route event against the overlay's size, and `show` latency during a route
storm (issue #19: "vnetd's CPU per event flat in the overlay's size ... and show/metrics latency
unaffected by a route storm").

For each size H (hosts' worth of routes): one vnetd in a network namespace of its own, started
with a config file of H plain udp links (one per remote host, 10.77.x.y) and 8 routes per link
(`route add any MAC link hN`, as the etcd agent derives for a host with 8 guests), its state
directory in /dev/shm. Then a storm of E route events over the control port, one command per
line and answer (`route replace any MAC link hK`: a guest moving to another host), and:

- CPU per event: the daemon's utime+stime (/proc/PID/stat) over the storm, divided by E (the
  whole process: control thread, the apply, the state directory's journal, the dispatchers'
  idle wake-ups, which the `idle` figure, measured for as long as the storm lasted with no
  events, subtracts out). utime+stime come in ticks (10 ms: +-5 us per event over 2,000
  events), so `run_per_event_us` gives the same from the run time the scheduler counts in ns
  (the sum of /proc/PID/task/*/schedstat), `run_per_event_minus_idle_us` less the idle run
  time;
- show and /metrics latency: a second storm of E events with a second connection sending
  `show links` in a loop beside it and a third client fetching `/metrics` (vnetd's `--http`
  listener) in a loop (back to back, or one every `--scrape-every-ms`: a back-to-back
  scraper is one more CPU hog on the host, a Prometheus scrapes every 15 s by default), each
  loop a process of its own (as threads of one Python process they would wait on each
  other's interpreter lock, up to 5 ms), and for comparison the same
  requests with no storm first; p50/p99/max in ms. (`show links` renders every link,
  `/metrics` every port's counters: their own cost grows with H.)

The state directory is in /dev/shm (no disk in the figure) unless `--state-parent DIR` puts it
on a file system of one's choice, where each change's sync then costs what that disk costs
(`events_per_s` shows it).

Run as root on a quiet machine: `python3 -m bench.route_event_cpu --vnetd PATH --out FILE`.
It removes the namespace and state directory it made at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import ctypes
import http.client
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from vnetlab.procs import stop_pid

ROUTES_PER_HOST = 8
CLK = os.sysconf("SC_CLK_TCK")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def setns(fd: int) -> None:
    """Moves this process (its threads to come) into the network namespace `fd`."""
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")


def mac(h: int, g: int) -> str:
    return f"52:54:{(h >> 8) & 0xff:02x}:{h & 0xff:02x}:00:{g:02x}"


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def run_s(pid: int) -> float:
    """The run time of the process's live threads, in seconds (ns resolution)."""
    total = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / 1e9


class Conn:
    def __init__(self, port: int):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=600)
        self.f = self.s.makefile("rb")

    def cmd(self, line: str, keep: bool = True) -> list[str]:
        """The answer's lines (`keep=False`: an empty list; the lines are only counted, so
        that a loop of `show links` makes no garbage for Python's collector to pause on)."""
        self.s.sendall(line.encode() + b"\n")
        head = self.f.readline().decode().strip()
        if head.startswith("error"):
            raise RuntimeError(f"{line}: {head}")
        n = int(head.split()[1])
        # The answer's n lines, read in bulk and split once: reading them one `readline` at a
        # time costs Python about a microsecond a line, at 1,000 links more than the daemon's
        # whole answer, and the latency measured would be this client's.
        chunks, seen = [], 0
        while seen < n:
            chunk = self.f.read1(1 << 16)
            if not chunk:
                raise RuntimeError(f"{line}: connection closed after {seen} of {n} lines")
            chunks.append(chunk)
            seen += chunk.count(b"\n")
        return b"".join(chunks).decode().split("\n")[:n] if keep else []


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else 0.0


def metrics(port: int) -> int:
    """One GET /metrics (the listener answers one request per connection); its size."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("GET", "/metrics")
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"/metrics: {r.status}")
        return len(body)
    finally:
        c.close()


def show_loop(port: int, stop, out) -> None:
    """`show links` on a connection of its own until `stop` is set; the latencies to `out`."""
    s, lat = Conn(port), []
    while not stop.is_set():
        t = time.perf_counter()
        s.cmd("show links", keep=False)
        lat.append(time.perf_counter() - t)
    out.put(("show", lat))


def scrape_loop(port: int, stop, out, every_s: float = 0.0) -> None:
    """`GET /metrics` until `stop` is set, back to back, or one every `every_s` as a Prometheus
    does (a scrape that takes longer is followed at once); the latencies to `out`."""
    lat = []
    start = time.perf_counter()
    k = 0
    while not stop.is_set():
        if every_s > 0:
            k += 1
            wait = start + k * every_s - time.perf_counter()
            if wait > 0 and stop.wait(wait):
                break
        t = time.perf_counter()
        metrics(port)
        lat.append(time.perf_counter() - t)
    out.put(("metrics", lat))


def latency(xs: list[float]) -> dict:
    return {"n": len(xs), "p50": round(1e3 * pct(xs, 0.5), 3), "p99": round(1e3 * pct(xs, 0.99), 3),
            "max": round(1e3 * max(xs), 3) if xs else None}


def run_size(vnetd: str, hosts: int, events: int, shows: int, state_parent: str = "/dev/shm",
             scrape_every_s: float = 0.0) -> dict:
    ns = f"vnbench{os.getpid()}"
    state = tempfile.mkdtemp(prefix="vnet-bench-", dir=state_parent)
    cfg = os.path.join(state, "config.vnet.in")
    lines = []
    for h in range(hosts):
        lines.append(f"link add h{h} udp 10.77.{(h + 1) >> 8}.{(h + 1) & 0xff}\n")
        for g in range(ROUTES_PER_HOST):
            lines.append(f"route add any {mac(h, g)} link h{h}\n")
    with open(cfg, "w") as f:
        f.writelines(lines)
    port, http_port = 7600, 7680
    subprocess.run(["ip", "netns", "add", ns], check=True)
    proc = None
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        log = open(os.path.join(state, "vnetd.log"), "w")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, vnetd, "--config", cfg, "--state-dir",
             os.path.join(state, "s"), "--control", f"127.0.0.1:{port}", "--http",
             f"127.0.0.1:{http_port}"],
            stdout=log, stderr=subprocess.STDOUT)
        # `ip netns exec` execs vnetd: same pid.
        deadline = time.time() + 120
        while True:
            try:
                out = subprocess.run(["ip", "netns", "exec", ns, "python3", "-c",
                                      "import socket;socket.create_connection(('127.0.0.1',%d),1)" % port],
                                     capture_output=True)
                if out.returncode == 0:
                    break
            except Exception:
                pass
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError(f"vnetd did not come up; see {state}/vnetd.log")
            time.sleep(0.2)
        # Run the clients inside the namespace too: this process enters it.
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        host_ns = os.open("/proc/self/ns/net", os.O_RDONLY)
        setns(fd)
        try:
            c, s = Conn(port), Conn(port)
            assert len(c.cmd("show routes")) >= hosts * ROUTES_PER_HOST
            # Idle: show latency with no storm, and the daemon's CPU while idle.
            idle_lat, idle_metrics = [], []
            for _ in range(shows):
                t = time.perf_counter()
                s.cmd("show links", keep=False)
                idle_lat.append(time.perf_counter() - t)
            for _ in range(shows):
                t = time.perf_counter()
                metrics(http_port)
                idle_metrics.append(time.perf_counter() - t)
            # The storm: guest g of host h moves to host h+1 (then the next event moves the
            # next guest), E events in all; first alone (the CPU per event), then again with
            # `show links` in a loop beside it (the latency).
            def storm(base: int) -> None:
                for e in range(base, base + events):
                    h, g = e % hosts, (e // hosts) % ROUTES_PER_HOST
                    to = (h + 1 + e // (hosts * ROUTES_PER_HOST)) % hosts
                    c.cmd(f"route replace any {mac(h, g)} link h{to}")

            c0, r0, t0 = cpu_s(proc.pid), run_s(proc.pid), time.perf_counter()
            storm(0)
            c1, r1, t1 = cpu_s(proc.pid), run_s(proc.pid), time.perf_counter()
            wall = t1 - t0
            # Idle CPU over as long as the storm took (at least a second).
            idle_wall = min(max(wall, 1.0), 30)
            time.sleep(idle_wall)
            c2, r2 = cpu_s(proc.pid), run_s(proc.pid)
            idle_rate = (c2 - c1) / idle_wall
            idle_run_rate = (r2 - r1) / idle_wall
            # The `show links` loop and the scraper run in processes of their own (forked here,
            # in the namespace): as threads of this one they would share its interpreter lock
            # with the storm and each other, and a thread waits up to Python's switch interval
            # (5 ms) for it, which is what the tail would then measure.
            mp = multiprocessing.get_context("fork")
            stop, got = mp.Event(), mp.Queue()
            loops = [mp.Process(target=show_loop, args=(port, stop, got)),
                     mp.Process(target=scrape_loop, args=(http_port, stop, got, scrape_every_s))]
            t2 = time.perf_counter()
            for p in loops:
                p.start()
            storm(events)
            stop.set()
            results = dict(got.get(timeout=120) for _ in loops)
            for p in loops:
                p.join(timeout=30)
            wall_with_shows = time.perf_counter() - t2
            storm_lat, storm_metrics = results["show"], results["metrics"]
        finally:
            setns(host_ns)
        storm_cpu = c1 - c0
        return {
            "hosts": hosts,
            "routes": hosts * ROUTES_PER_HOST,
            "links": hosts,
            "events": events,
            "storm_wall_s": round(wall, 3),
            "storm_with_shows_wall_s": round(wall_with_shows, 3),
            "events_per_s": round(events / wall, 1),
            "cpu_per_event_us": round(1e6 * storm_cpu / events, 1),
            "cpu_per_event_minus_idle_us": round(1e6 * (storm_cpu - idle_rate * wall) / events, 1),
            "idle_cpu_per_s": round(idle_rate, 4),
            "run_per_event_us": round(1e6 * (r1 - r0) / events, 2),
            "run_per_event_minus_idle_us": round(1e6 * (r1 - r0 - idle_run_rate * wall) / events, 2),
            "idle_run_per_s": round(idle_run_rate, 5),
            "show_idle_ms": latency(idle_lat),
            "show_storm_ms": latency(storm_lat),
            "metrics_idle_ms": latency(idle_metrics),
            "metrics_storm_ms": latency(storm_metrics),
        }
    finally:
        if proc is not None:
            stop_pid(proc, timeout=20)
        subprocess.run(["ip", "netns", "del", ns])
        shutil.rmtree(state, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vnetd", required=True)
    ap.add_argument("--out", required=True, help="a JSON file")
    ap.add_argument("--sizes", default="1,100,1000")
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--shows", type=int, default=200)
    ap.add_argument("--label", default="")
    ap.add_argument("--state-parent", default="/dev/shm",
                    help="where the state directory is made (default /dev/shm: no disk in the figures)")
    ap.add_argument("--scrape-every-ms", type=float, default=0.0,
                    help="the storm's scraper fetches /metrics this often (default 0: back to "
                         "back, a scraper that is a CPU hog of its own; a Prometheus scrapes "
                         "every 15 s by default)")
    a = ap.parse_args()
    rows = []
    for h in [int(x) for x in a.sizes.split(",")]:
        r = run_size(a.vnetd, h, a.events, a.shows, a.state_parent, a.scrape_every_ms / 1e3)
        r["label"] = a.label
        r["scrape_every_ms"] = a.scrape_every_ms
        print(json.dumps(r), flush=True)
        rows.append(r)
    with open(a.out, "w") as f:
        json.dump({"vnetd": a.vnetd, "label": a.label, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
