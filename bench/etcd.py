"""Where the control-plane benchmarks put a throw-away etcd (its command line is
``vnetlab.etcdlab``'s): a free loopback port, and a data directory in /dev/shm (so the disk's
fsync latency is not what is measured)."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_dir(prefix: str) -> Path:
    """A new directory in /dev/shm (in the temporary directory where there is none)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
