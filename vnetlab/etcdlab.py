"""A real etcd for the lab (Debian's ``etcd``): one member in a namespace of its own on the
lab's underlay (client port 2379 of that namespace's address, peer port on its loopback),
started and stopped by PID, and ``vnetctl --etcd`` spoken to it from that namespace (the root
namespace has no route to the underlay). The etcd system tests and the benchmarks with many
daemons build on it; ``etcd_argv`` is also the command line of an etcd started elsewhere.
``GrpcProxy`` puts etcd's own gRPC proxy (``etcd grpc-proxy start``, which coalesces the
watches and lease keep-alives of its clients into a few on etcd) in front of it, and
``grpc_proxy_argv`` is its command line."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Optional

from . import netlab

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
OVERLAY = "lab"  # the overlay the tests' daemons join
TTL = 3  # the tests' lease TTL (seconds)


def etcd_argv(name: str, data, client_url: str, peer_url: str, cluster: Optional[str] = None,
              quota: Optional[int] = None) -> list:
    """etcd as member ``name`` serving ``client_url``; alone unless ``cluster`` names its
    members (``name=peer_url,...``)."""
    argv = [ETCD, "--name", name, "--data-dir", str(data),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", cluster or f"{name}={peer_url}"]
    if cluster:
        argv += ["--initial-cluster-state", "new"]
    if quota:
        argv += ["--quota-backend-bytes", str(quota)]
    return argv


def grpc_proxy_argv(endpoints: str, listen: str, data, metrics: Optional[str] = None) -> list:
    """etcd's gRPC proxy on ``listen`` (``host:port``) in front of etcd at ``endpoints``; its
    data (a few bytes of state) in ``data``. Answers up to 64 MiB may go through (the proxy's
    default of 1.5 MiB is smaller than a read of a large overlay in one piece)."""
    argv = [ETCD, "grpc-proxy", "start", "--endpoints", endpoints, "--listen-addr", listen,
            "--advertise-client-url", listen, "--data-dir", str(data),
            "--max-send-bytes", str(64 << 20)]
    if metrics:
        argv += ["--metrics-addr", f"http://{metrics}"]
    return argv


def etcd_ctl(ns: netlab.Netns, endpoints: str, overlay: str, *words, check: bool = True, timeout: int = 5):
    """``vnetctl --etcd ENDPOINTS --overlay OVERLAY WORDS...`` in ``ns``: its output (CtlError
    when it fails), or with ``check=False`` the CompletedProcess."""
    r = ns.exec(netlab.VNETCTL, "--etcd", endpoints, "--overlay", overlay, "--timeout", str(timeout),
                *map(str, words), check=False, timeout=6 * timeout)
    if check and r.returncode != 0:
        raise netlab.CtlError(words, r.returncode, r.stdout, r.stderr)
    return r if not check else r.stdout


class EtcdServer:
    """One etcd member in its own namespace of the lab, started and stopped by PID."""

    def __init__(self, lab: netlab.Lab, name: str = "vnet-test", overlay: str = OVERLAY,
                 data: Optional[Path] = None, quota: Optional[int] = None, timeout: int = 5):
        self.lab, self.name, self.overlay, self.quota, self.timeout = lab, name, overlay, quota, timeout
        self.ns = lab.host("etcd")
        self.endpoint = f"{self.ns.underlay_ip}:2379"
        self.data = data or lab.workdir / "etcd-data"  # its data, with the test's files
        self.proc = None

    def start(self, wait: float = 20):
        log = open(self.lab.workdir / "etcd.log", "ab")
        self.proc = self.ns.popen(*etcd_argv(self.name, self.data, f"http://{self.endpoint}",
                                             "http://127.0.0.1:2380", quota=self.quota),
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        netlab.wait_until(lambda: self.ctl("hosts", check=False).returncode == 0, wait, what="etcd to answer")

    def stop(self):
        if self.proc is not None:
            netlab.stop_pid(self.proc)
            self.proc = None

    def ctl(self, *words, check=True):
        """vnetctl --etcd ... (in the etcd namespace)."""
        return etcd_ctl(self.ns, self.endpoint, self.overlay, *words, check=check, timeout=self.timeout)


class GrpcProxy:
    """etcd's gRPC proxy in the etcd namespace of the lab (``--listen-addr`` on its underlay
    address, port ``port``) in front of ``etcd``, started and stopped by PID. Daemons and
    vnetctl reach it at ``endpoint`` as they would reach etcd."""

    def __init__(self, etcd: EtcdServer, port: int = 23790):
        self.etcd, self.lab, self.ns, self.overlay = etcd, etcd.lab, etcd.ns, etcd.overlay
        self.endpoint = f"{self.ns.underlay_ip}:{port}"
        self.data = self.lab.workdir / f"grpc-proxy-{port}"
        self.proc = None

    def start(self, wait: float = 20):
        log = open(self.lab.workdir / f"grpc-proxy-{self.endpoint.rsplit(':', 1)[1]}.log", "ab")
        self.proc = self.ns.popen(*grpc_proxy_argv(self.etcd.endpoint, self.endpoint, self.data),
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        netlab.wait_until(lambda: self.ctl("hosts", check=False).returncode == 0, wait,
                          what="etcd's gRPC proxy to answer")

    def stop(self):
        if self.proc is not None:
            netlab.stop_pid(self.proc)
            self.proc = None

    def ctl(self, *words, check=True):
        """vnetctl --etcd through the proxy (in the etcd namespace)."""
        return etcd_ctl(self.ns, self.endpoint, self.overlay, *words, check=check, timeout=self.etcd.timeout)
