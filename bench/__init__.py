"""vnet's benchmark suite, a package run from the repository root: ``python3 -m bench.run``
(``bash scripts/bench.sh`` does that). See bench/README.md for what each part measures.

Shared by every benchmark (each module imports only those listed before it):

- ``machine``: facts about the machine and its processes (CPU time, load, the commit);
- ``report``: the formatting and plotting helpers of every report (numbers, ratios, tables,
  matplotlib);
- ``session``: a run's frame: its options, output directory, status line with the time left,
  and its end whatever happens;
- ``etcd``: where a throw-away etcd keeps its data, and a free port for it;
- ``testbed``: the base every testbed extends (the lab and its cleanup, the wire, the kernel
  VXLAN, vnet daemons, measurement servers, counters), on ``vnetlab.netlab``;
- ``mpi``: MPI jobs across namespaces (the rsh agent, mpirun's words, NetPIPE's and HPCC's
  input and output).

The benchmarks, each a testbed, its measurements and its report:

- the suite (``run``): ``suite_bed``, ``measure``, ``suite_report``;
- vhost-user (``vhost``), MPI over many guests (``hpc``: ``hpc_bed``, ``hpc_report``),
  the kernel fast path's variants (``fastpath_variants``, ``fastpath_profile``:
  ``fastpath_bed``), the etcd control plane at scale (``scale``, ``daemons``,
  ``etcd_gateway_cost``).
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
