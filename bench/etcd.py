"""A throw-away single-member etcd for the control-plane benchmarks: its command line, a free
loopback port, and a data directory in /dev/shm (so the disk's fsync latency is not what is
measured). Who starts it (a plain process or one in a lab namespace) stops it by PID."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path
from typing import Optional

ETCD = "/usr/bin/etcd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_dir(prefix: str) -> Path:
    """A new directory in /dev/shm (in the temporary directory where there is none)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/dev/shm" if os.path.isdir("/dev/shm") else None))


def etcd_argv(name: str, data: Path, client_url: str, peer_url: str, quota: Optional[int] = None) -> list:
    """Debian's etcd as a one-member cluster serving ``client_url``."""
    argv = [ETCD, "--name", name, "--data-dir", str(data),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"{name}={peer_url}"]
    if quota:
        argv += ["--quota-backend-bytes", str(quota)]
    return argv
