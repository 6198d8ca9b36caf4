"""vnet's lab: throw-away hosts and guests built from real Linux objects (network namespaces,
veth pairs, TAP devices, bridges, the kernel's VXLAN) with one guaranteed cleanup.

- ``netlab``: namespaces, hosts running vnetd, guests, the underlay, cleanup (see its header);
- ``httplab``: real clients of vnetd's HTTP listener (HTTP, Prometheus, headless Chromium).

The system tests (tests/system), the benchmark suite (bench/) and the demo import it as a
package from the repository root: ``from vnetlab import netlab``. pytest puts the root on the
import path (``pythonpath`` in pytest.ini), the benchmarks run as modules from the root
(``python3 -m bench.run``), so neither needs to edit ``sys.path``.
"""
