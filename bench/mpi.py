"""The application level: MPI ping-pong (NetPIPE) and the HPC Challenge latency/bandwidth
test (hpcc), two ranks, one in each endpoint of a configuration (guest A and guest B, or the
two hosts for ``native``).

Debian's ``hpcc`` is built against Open MPI, so Open MPI runs both. How it is made to span
namespaces and to measure the network honestly:

* ``mpirun`` runs in endpoint A; ``--host A_IP,B_IP``: Open MPI sees A_IP as local and starts
  rank 0 there, and starts the daemon for B_IP through ``plm_rsh_agent``, a script that maps
  the "host" (an IP address) to its namespace and runs ``ip netns exec NS sh -c "CMD"``.
* ranks in different namespaces of one machine could still reach each other through shared
  memory: ``--mca btl tcp,self --mca pml ob1`` leaves them only TCP, on the configuration's
  subnet (``btl_tcp_if_include``), and every sample checks the path's byte counters
  (vnet's own ``show stats json`` for vnet) grew by at least the bytes the test moved.
* ``--mca mpi_yield_when_idle 1 --bind-to none``: on this 2-core machine two busy-polling
  ranks starve the kernel's softirq work and vnetd; without it every message waits for a
  scheduler tick (4 ms one-way latency, native included).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

from measure import MeasureError, _evidence
from testbed import Testbed

HPCC_INPUT = """HPLinpack benchmark input file
Innovative Computing Laboratory, University of Tennessee
HPL.out      output file name (if any)
8            device out (6=stdout,7=stderr,file)
1            # of problems sizes (N)
{n}          Ns
1            # of NBs
{nb:<13}NBs
0            PMAP process mapping (0=Row-,1=Column-major)
1            # of process grids (P x Q)
{ps:<13}Ps
{qs:<13}Qs
16.0         threshold
1            # of panel fact
2            PFACTs (0=left, 1=Crout, 2=Right)
1            # of recursive stopping criterium
4            NBMINs (>= 1)
1            # of panels in recursion
2            NDIVs
1            # of recursive panel fact.
1            RFACTs (0=left, 1=Crout, 2=Right)
1            # of broadcast
1            BCASTs (0=1rg,1=1rM,2=2rg,3=2rM,4=Lng,5=LnM)
1            # of lookahead depth
1            DEPTHs (>=0)
2            SWAP (0=bin-exch,1=long,2=mix)
64           swapping threshold
0            L1 in (0=transposed,1=no-transposed) form
0            U  in (0=transposed,1=no-transposed) form
1            Equilibration (0=no,1=yes)
8            memory alignment in double (> 0)
##### This line (no. 32) is ignored (it serves as a separator). ######
0                               Number of additional problem sizes for PTRANS
1200 10000 30000                values of N
0                               number of additional blocking sizes for PTRANS
40 9 8 13 13 20 16 32 64        values of NB
"""


def hpcc_input(n: int, nb: int = 32, ps: int = 1, qs: int = 2) -> str:
    """HPCC's ``hpccinf.txt``: HPL with problem size ``n``, block ``nb`` on a ``ps`` x ``qs``
    grid of ranks (every other HPCC kernel sizes its problem from ``n``), then PTRANS's input."""
    return HPCC_INPUT.format(n=n, nb=nb, ps=ps, qs=qs)

AGENT = """#!/bin/sh
# plm_rsh_agent for Open MPI: [options] HOST COMMAND... -> run COMMAND in HOST's namespace
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
ns=$(awk -v h="$host" '$1==h {print $2}' "$(dirname "$0")/hosts.map")
[ -n "$ns" ] || { echo "mpi-agent: unknown host $host" >&2; exit 1; }
exec ip netns exec "$ns" sh -c "$*"
"""

HPCC_KEYS = {
    "hpcc_pingpong_lat_us": ("AvgPingPongLatency_usec", 1.0, "µs"),
    "hpcc_pingpong_bw_gbps": ("AvgPingPongBandwidth_GBytes", 8.0, "Gbit/s"),
    "hpcc_ring_lat_us": ("RandomlyOrderedRingLatency_usec", 1.0, "µs"),
    "hpcc_ring_bw_gbps": ("NaturallyOrderedRingBandwidth_GBytes", 8.0, "Gbit/s"),
}


def missing_tools() -> list:
    return [t for t in ("mpirun", "NPopenmpi", "hpcc") if shutil.which(t) is None]


def _mpirun(tb: Testbed, config: str, workdir: Path) -> tuple:
    ep = tb.endpoint(config)
    workdir.mkdir(parents=True, exist_ok=True)
    agent = workdir / "mpi-agent.sh"
    agent.write_text(AGENT)
    agent.chmod(0o755)
    (workdir / "hosts.map").write_text(f"{ep.client_ip} {ep.client.name}\n{ep.server_ip} {ep.server.name}\n")
    argv = ["mpirun", "--allow-run-as-root", "--host", f"{ep.client_ip},{ep.server_ip}", "-np", "2",
            "--bind-to", "none", "--mca", "plm_rsh_agent", str(agent),
            "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
            "--mca", "btl_tcp_if_include", ep.subnet, "--mca", "oob_tcp_if_include", ep.subnet,
            "--mca", "mpi_yield_when_idle", "1", "--mca", "btl_base_warn_component_unused", "0"]
    return ep, argv


def _exec_in(ns, argv, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    cmd = " ".join(_q(a) for a in argv)
    return ns.exec("sh", "-c", f"cd {_q(str(cwd))} && exec {cmd}", check=False, timeout=timeout)


def _q(s) -> str:
    s = str(s)
    return "'" + s.replace("'", "'\\''") + "'" if re.search(r"[^\w@%+=:,./-]", s) else s


def netpipe(tb: Testbed, config: str, workdir: Path, upper: int, repeats: int, raw_dir: Path, tag: str) -> list:
    """MPI ping-pong across sizes 1 B .. ``upper`` (NetPIPE's MPI module, ``repeats`` round
    trips per size): latency of 8-byte messages (one way, as NetPIPE reports) and the best
    bandwidth."""
    ep, argv = _mpirun(tb, config, workdir)
    out = workdir / "np.out"
    out.unlink(missing_ok=True)
    argv += ["NPopenmpi", "-l", "1", "-u", str(upper), "-p", "0", "-n", str(repeats), "-o", str(out)]
    before = tb.counters(config)
    t0 = time.monotonic()
    r = _exec_in(ep.client, argv, workdir, 240)
    wall = time.monotonic() - t0
    after = tb.counters(config)
    if r.returncode != 0 or not out.exists():
        raise MeasureError(f"NetPIPE (mpirun) rc={r.returncode}: {(r.stdout + r.stderr)[-1200:]}")
    rows = []
    for line in out.read_text().splitlines():
        p = line.split()
        if len(p) >= 3:
            rows.append((int(p[0]), float(p[1]), float(p[2])))
    if not rows:
        raise MeasureError("NetPIPE wrote no results")
    shutil.copy(out, raw_dir / f"netpipe-{tag}.out")
    lat_row = next((r_ for r_ in rows if r_[0] >= 8), rows[0])
    best = max(rows, key=lambda r_: r_[1])
    # each size was sent `repeats` times each way (NetPIPE's calibration adds more)
    payload = sum(s for s, _, _ in rows) * repeats
    ev = _evidence(tb, config, before, after, payload, payload)
    curve = [{"bytes": s, "mbps": m, "usec": round(t * 1e6, 2)} for s, m, t in rows]
    extra = {"size": lat_row[0], "wall_s": round(wall, 2), "curve": curve}
    return [dict(metric="mpi_pingpong_lat_us", value=lat_row[2] * 1e6, unit="µs", extra=extra, **ev),
            dict(metric="mpi_pingpong_bw_gbps", value=best[1] / 1e3, unit="Gbit/s",
                 extra={"size": best[0], "from": "mpi_pingpong_lat_us"}, check=ev["check"])]


def hpcc(tb: Testbed, config: str, workdir: Path, n: int, raw_dir: Path, tag: str) -> list:
    """HPC Challenge with a small problem (N=``n``), two ranks; its latency/bandwidth part
    (ping-pong between the two ranks, and ring latency/bandwidth)."""
    ep, argv = _mpirun(tb, config, workdir)
    (workdir / "hpccinf.txt").write_text(hpcc_input(n))
    outf = workdir / "hpccoutf.txt"
    outf.unlink(missing_ok=True)
    argv += ["hpcc"]
    before = tb.counters(config)
    t0 = time.monotonic()
    r = _exec_in(ep.client, argv, workdir, 300)
    wall = time.monotonic() - t0
    after = tb.counters(config)
    if r.returncode != 0 or not outf.exists():
        raise MeasureError(f"hpcc (mpirun) rc={r.returncode}: {(r.stdout + r.stderr)[-1200:]}")
    text = outf.read_text(errors="replace")
    shutil.copy(outf, raw_dir / f"hpcc-{tag}.txt")
    vals = dict(re.findall(r"^(\w+)=(\S+)$", text, re.M))
    # the ping-pong bandwidth test alone moves several 2 MB messages each way
    ev = _evidence(tb, config, before, after, 2_000_000, 2_000_000)
    out = []
    for metric, (key, mult, unit) in HPCC_KEYS.items():
        if key not in vals:
            continue
        try:
            v = float(vals[key]) * mult
        except ValueError:
            continue
        extra = {"hpcc_key": key, "wall_s": round(wall, 2), "N": n}
        if metric == "hpcc_pingpong_lat_us":
            extra.update({k: vals.get(k) for k in ("MinPingPongLatency_usec", "MaxPingPongLatency_usec",
                                                    "HPL_Tflops", "PTRANS_GBs", "MPIRandomAccess_GUPs",
                                                    "MPIFFT_Gflops")})
            out.append(dict(metric=metric, value=v, unit=unit, extra=extra, **ev))
        else:
            out.append(dict(metric=metric, value=v, unit=unit, extra=extra, check=ev["check"]))
    if not out:
        raise MeasureError("hpcc output has no latency/bandwidth results")
    return out
