"""MPI jobs across network namespaces (Open MPI; Debian's ``hpcc`` is built against it), shared
by the suite's two-rank jobs (``measure``) and the four-rank jobs of ``hpc``: the rsh agent, the
mpirun words, HPCC's input, and NetPIPE's and HPCC's output. How they span namespaces and
measure the network honestly:

* ``mpirun`` runs in rank 0's namespace; Open MPI sees that address as local and starts the
  daemons for the others through ``plm_rsh_agent``, a script that maps each "host" (an IP
  address) to its namespace and runs ``ip netns exec NS sh -c "CMD"``.
* ranks in different namespaces of one machine could still reach each other through shared
  memory: ``--mca btl tcp,self --mca pml ob1`` leaves them only TCP, on the configuration's
  subnet (``btl_tcp_if_include``), and every run checks the path's byte counters (vnet's own
  ``show stats json`` for vnet) grew by at least the bytes the job moved.
* ``--mca mpi_yield_when_idle 1 --bind-to none``: on this 2-core machine busy-polling ranks
  starve the kernel's softirq work and vnetd; without it every message waits for a scheduler
  tick (4 ms one-way latency, native included).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

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

TOOLS = ("mpirun", "hpcc", "NPopenmpi")


def missing_tools() -> list:
    return [t for t in TOOLS if shutil.which(t) is None]


def write_agent(workdir: Path, hosts: dict) -> Path:
    """The rsh agent in ``workdir`` and its host map (``hosts``: address -> namespace name)."""
    workdir.mkdir(parents=True, exist_ok=True)
    agent = workdir / "mpi-agent.sh"
    agent.write_text(AGENT)
    agent.chmod(0o755)
    (workdir / "hosts.map").write_text("".join(f"{ip} {ns}\n" for ip, ns in hosts.items()))
    return agent


def mpirun_argv(agent: Path, hosts: str, np: int, subnet: str, oversubscribe: bool = False) -> list:
    """The mpirun words that start ``np`` ranks on ``hosts`` (``ip[:slots],...``) through
    ``agent``, on TCP over ``subnet`` only, yielding the CPU when idle."""
    return ["mpirun", "--allow-run-as-root", *(["--oversubscribe"] if oversubscribe else []),
            "--host", hosts, "-np", str(np), "--bind-to", "none", "--mca", "plm_rsh_agent", str(agent),
            "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
            "--mca", "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet,
            "--mca", "mpi_yield_when_idle", "1", "--mca", "btl_base_warn_component_unused", "0"]


def quote(s) -> str:
    """``s`` as one word of a shell command."""
    s = str(s)
    return "'" + s.replace("'", "'\\''") + "'" if re.search(r"[^\w@%+=:,./-]", s) else s


def in_dir(cwd: Path, argv: list) -> str:
    """A shell command that runs ``argv`` in ``cwd``."""
    return f"cd {quote(str(cwd))} && exec " + " ".join(quote(a) for a in argv)


def netpipe_argv(upper: int, repeats: int, out: Path) -> list:
    """NetPIPE's MPI module: sizes 1 B .. ``upper``, ``repeats`` round trips each, to ``out``."""
    return ["NPopenmpi", "-l", "1", "-u", str(upper), "-p", "0", "-n", str(repeats), "-o", str(out)]


def job_output(r, path: Path, what: str, raw: Path, error=RuntimeError) -> str:
    """The output file an mpirun job ``r`` wrote to ``path``, copied to ``raw``; ``error`` (with
    the end of what mpirun said) when the job failed or wrote none."""
    if r.returncode != 0 or not path.exists():
        raise error(f"{what} (mpirun) rc={r.returncode}: {(r.stdout + r.stderr)[-1500:]}")
    shutil.copy(path, raw)
    return path.read_text(errors="replace")


def netpipe_result(text: str, repeats: int):
    """NetPIPE's output file (size, Mbit/s, seconds per line): the 8-byte latency row (one way,
    as NetPIPE reports it), the best bandwidth row, the payload each way (every size
    ``repeats`` times; NetPIPE's calibration adds more) and the curve; None if it has no row."""
    rows = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 3:
            try:
                rows.append((int(f[0]), float(f[1]), float(f[2])))
            except ValueError:
                continue
    if not rows:
        return None
    return {"lat": next((row for row in rows if row[0] >= 8), rows[0]),
            "best": max(rows, key=lambda row: row[1]),
            "payload": sum(s for s, _, _ in rows) * repeats,
            "curve": [{"bytes": s, "mbps": m, "usec": round(t * 1e6, 2)} for s, m, t in rows]}


def hpcc_summary(text: str) -> dict:
    """The summary section of hpccoutf.txt: its ``key=value`` lines."""
    return dict(re.findall(r"^(\w+)=(\S+)$", text, re.M))
