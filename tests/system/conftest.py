"""pytest glue for vnet's system tests: skip rules, the ``lab`` fixture (always cleaned up),
vnetd logs attached to failure reports, and the results file."""

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from vnetlab import netlab
from vnetlab.etcdlab import EtcdServer

RESULTS = Path(os.environ.get("VNET_RESULTS", netlab.REPO / "results" / "system-tests.json"))
_results: dict = {}


def _skip_reason():
    if os.geteuid() != 0:
        return "system tests need root (network namespaces, TAP devices)"
    if not os.path.exists("/dev/net/tun"):
        return "system tests need /dev/net/tun"
    return None


def pytest_configure(config):
    config.addinivalue_line("markers", "no_vnetd: the test does not need the vnetd binaries")


def pytest_collection_modifyitems(config, items):
    reason = _skip_reason()
    if reason:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_sessionstart(session):
    if _skip_reason() is None:
        netlab.install_signal_cleanup()
        netlab.sweep_stale()


@pytest.fixture(scope="session")
def tools():
    """Fail loudly (not skip) when something the suite needs is missing."""
    missing = [t for t in ("ip", "bridge", "ping", "iperf3", "ss", "sysctl") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"missing tools: {', '.join(missing)} (apt-get install iproute2 iputils-ping iperf3 procps)")


@pytest.fixture
def lab(request, tools):
    """A fresh Lab per test; closed (processes stopped, namespaces deleted) whatever happens."""
    if request.node.get_closest_marker("no_vnetd") is None:
        for b in (netlab.VNETD, netlab.VNETCTL):
            if not b.exists():
                pytest.fail(f"{b} not found: run `cargo build --release` first (or set VNETD / VNETCTL)")
    lab = netlab.Lab(tag=request.node.name)
    request.node._lab = lab
    yield lab
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        lab.failed = True  # keep the work directory (logs, config files)
    lab.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call = rep
        lab = getattr(item, "_lab", None)
        if rep.failed and lab is not None:
            rep.sections.append(("vnetd logs", f"work dir: {lab.workdir}\n{lab.logs()}"))


@pytest.fixture
def etcd(lab):
    """A real etcd member in its own namespace of the lab (``vnetlab.etcdlab``), stopped at the
    end of the test."""
    e = EtcdServer(lab)
    e.start()
    yield e
    e.stop()


@pytest.fixture(params=["tap", "veth"])
def guest_kind(request):
    """The interface kind the guests of an overlay test get: ``tap`` (served by vnetd in user
    space) and ``veth`` (forwarded by the kernel fast path where it can). A test that takes
    this fixture runs once for each."""
    return request.param


@pytest.fixture
def record(request):
    """record(key, value): store a measured figure in the results file."""
    def rec(key, value):
        _results.setdefault(request.node.name, {})[key] = value
    return rec


def pytest_sessionfinish(session, exitstatus):
    if _results:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        doc = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "results": _results}
        RESULTS.write_text(json.dumps(doc, indent=2) + "\n")


def pytest_terminal_summary(terminalreporter):
    if _results:
        terminalreporter.write_sep("-", f"measurements (written to {RESULTS})")
        for test, figs in _results.items():
            for k, v in figs.items():
                terminalreporter.write_line(f"{test}: {k} = {v}")
