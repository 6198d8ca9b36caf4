"""vnet's lab: throw-away hosts and guests built from real Linux objects (network namespaces,
veth pairs, TAP devices, bridges, the kernel's VXLAN) with one guaranteed cleanup.

- ``netlab``: namespaces, hosts running vnetd, guests, the underlay, cleanup, ready-made
  topologies (see its header); the names of the modules below it are part of its interface;
- ``procs`` (commands, waiting, stopping by PID, entering a namespace), ``results`` (ping's and
  iperf3's figures), ``stats`` (vnet's counters), ``frames`` (hand-built frames and datagrams):
  what netlab builds on, each module one job;
- ``control``: the control port spoken line by line (the grammar's Python side);
- ``etcdlab``: a real etcd in a namespace of the lab, and ``vnetctl --etcd`` spoken to it;
- ``httplab``: real clients of vnetd's HTTP listener (HTTP, Prometheus, headless Chromium);
- ``wanlab``: the wide-area lab on netlab: a public segment, sites behind NAT routers of each
  kind, firewalls, a small-MTU path, paths with delay, jitter, loss and a rate (``vnet-pathem``);
  ``stun``: a tiny STUN server and client for it.

The system tests (tests/system), the benchmark suite (bench/) and the demo import it as a
package from the repository root: ``from vnetlab import netlab``. pytest puts the root on the
import path (``pythonpath`` in pytest.ini), the benchmarks run as modules from the root
(``python3 -m bench.run``), so neither needs to edit ``sys.path``.
"""
