"""Facts about the machine a benchmark runs on, read from /proc and git: CPU time of the machine
and of processes, memory, load, what the machine is and which commit is measured. Every report
records them, because on a shared machine they decide how far a figure can be trusted."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from . import REPO

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def machine_cpu() -> tuple:
    """(busy CPU seconds, wall time) of the whole machine from /proc/stat: user + nice +
    system + irq + softirq + steal over all CPUs. Softirq is where the kernel does the
    network work of veth, bridges and the kernel VXLAN, so this charges every configuration
    for all of the work it causes."""
    with open("/proc/stat") as f:
        parts = f.readline().split()
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in parts[1:9])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK, time.monotonic()


def _proc_stat(pid: int) -> list:
    """The fields of /proc/PID/stat after the command name (field 3 onwards)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def proc_cpu(pid: int) -> float:
    """utime + stime (all threads) of one process, seconds; 0 if it is gone."""
    try:
        fields = _proc_stat(pid)
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def proc_rss(pid: int) -> int:
    """Resident memory of one process, bytes; 0 if it is gone."""
    try:
        return int(_proc_stat(pid)[21]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


class CpuMeter:
    """CPU seconds of the machine and of some processes over a ``with`` block."""

    def __init__(self, pids=()):
        self.pids = list(pids)

    def __enter__(self):
        self.m0, self.t0 = machine_cpu()
        self.p0 = {p: proc_cpu(p) for p in self.pids}
        return self

    def __exit__(self, *exc):
        self.m1, self.t1 = machine_cpu()
        self.p1 = {p: proc_cpu(p) for p in self.pids}
        return False

    @property
    def machine_s(self) -> float:
        return self.m1 - self.m0

    @property
    def wall_s(self) -> float:
        return self.t1 - self.t0

    @property
    def procs_s(self) -> float:
        return sum(self.p1[p] - self.p0[p] for p in self.pids)


def background_cpu(seconds: float = 1.0) -> float:
    """Busy CPUs (0..ncpu) of the machine while the suite does nothing: other people's
    builds and tests skew CPU-per-GB and everything else; the summary reports it."""
    m0, t0 = machine_cpu()
    time.sleep(seconds)
    m1, t1 = machine_cpu()
    return (m1 - m0) / (t1 - t0)


def loadavg() -> float:
    """The 1-minute load average (-1 if /proc does not say)."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return -1.0


def machine_info() -> str:
    kern = os.uname().release
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs ({cpu}), Linux {kern}"


def commit() -> str:
    """The short hash of the checkout's HEAD ("" outside a git checkout)."""
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    except OSError:
        return ""


def vnet_version() -> str:
    """The commit measured, and whether crates/ had uncommitted changes."""
    try:
        rev = commit()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "crates"], capture_output=True,
                               text=True).stdout.strip()
        return f"commit {rev}" + (" + uncommitted changes in crates/" if dirty else "")
    except OSError:
        return "unknown"


def command_line() -> str:
    """How this run was started, as it could be typed again (``python3 -m bench.run --quick``)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    head = f"python3 -m {spec.name}" if spec is not None else sys.argv[0]
    return " ".join([head, *sys.argv[1:]])
