"""The status line of a long benchmark run: what it does now, how long it has run, and the time
left, rescaled by how fast the finished steps went against their estimates."""

from __future__ import annotations

import sys
import time


def mmss(s: float) -> str:
    s = int(s)
    return f"{s // 60}:{s % 60:02d}"


class Progress:
    """One status line (rewritten in place on a terminal, one line per step otherwise)."""

    def __init__(self, total_s_est: float, ntasks: int):
        self.t0 = time.monotonic()
        self.est_total = total_s_est
        self.ntasks = ntasks
        self.done = 0
        self.spent_est = 0.0
        self.tty = sys.stderr.isatty()
        self.width = 0

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def show(self, what: str) -> None:
        el = self.elapsed()
        # scale the remaining estimate by how fast the finished tasks went versus their estimate
        speed = (el / self.spent_est) if self.spent_est > 5 else 1.0
        eta = max(0.0, (self.est_total - self.spent_est) * speed)
        line = (f"[{self.done:3d}/{self.ntasks}] {mmss(el)} elapsed, ~{mmss(eta)} left | {what}")
        if self.tty:
            pad = max(0, self.width - len(line))
            sys.stderr.write("\r" + line + " " * pad)
            self.width = len(line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def step(self, est: float) -> None:
        self.done += 1
        self.spent_est += est

    def say(self, msg: str) -> None:
        if self.tty and self.width:
            sys.stderr.write("\r" + " " * self.width + "\r")
            self.width = 0
        sys.stderr.write(msg + "\n")
        sys.stderr.flush()
