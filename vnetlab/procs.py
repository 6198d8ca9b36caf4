"""Processes and namespaces for the lab: running a command (an error that says what failed),
waiting for a condition, stopping a process we started by its PID, and entering a network
namespace from Python (for sockets that live there). ``netlab`` builds on these."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from typing import Callable, Optional

CLONE_NEWNET = 0x40000000


class LabError(RuntimeError):
    pass


def sh(*args, check=True, timeout=30, input=None) -> subprocess.CompletedProcess:
    """Run a command (list of words), capture text output, raise on failure."""
    args = [str(a) for a in args]
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=input)
    if check and r.returncode != 0:
        raise LabError(f"command failed (rc={r.returncode}): {' '.join(args)}\n{r.stderr.strip()}")
    return r


def wait_until(pred: Callable[[], object], timeout: float, interval: float = 0.1, what: str = "condition"):
    """Poll ``pred`` until it returns a true value (returned) or raise after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child is not alive
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_pid(proc: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 5.0) -> Optional[int]:
    """Stop one process we started: ``sig``, wait, then SIGKILL. Returns its exit code."""
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        except ProcessLookupError:
            pass
    return proc.returncode


# --- entering a namespace from Python (for raw/UDP/TCP sockets in tests) -----------------

_libc = ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def in_netns(name: str):
    """Run the body with the *calling thread* inside network namespace ``name``.

    Sockets created in the body stay in that namespace after the block ends."""
    orig = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns({name}): {os.strerror(e)}")
        try:
            yield
        finally:
            if _libc.setns(orig, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the original namespace failed")
    finally:
        os.close(orig)
        os.close(target)
