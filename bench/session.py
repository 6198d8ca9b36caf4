"""One benchmark run's frame: its output directory, its status line (what it does now, how long
it has run, the time left, rescaled by how fast the finished steps went against their
estimates), and its end whatever happens: an interruption or an error is noted in the results,
every lab is removed, and a plot that fails never loses the tables."""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

from vnetlab import netlab

from . import REPO
from .machine import command_line, machine_info, vnet_version
from .report import write_json


def results_dir(out: Optional[Path], kind: str, started: datetime) -> Path:
    """``out``, or results/<kind>-<UTC time> in the repository."""
    return (out or REPO / "results" / f"{kind}-{started.strftime('%Y%m%dT%H%M%SZ')}").resolve()


def arguments(doc: str, kind: str, quick: str, rounds: str) -> argparse.ArgumentParser:
    """A benchmark's command line with the options every run has: --out (default
    results/<kind>-<UTC time>), --quick and --rounds (``quick``, ``rounds``: what they mean
    there), --vnet-set, --seed."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help=f"output directory (default results/{kind}-<UTC time>)")
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--rounds", type=int, help=rounds)
    ap.add_argument("--vnet-set", action="append", default=[], metavar="'KEY VALUE'",
                    help="extra `set` for every vnetd, e.g. --vnet-set 'yield timed' (repeatable)")
    ap.add_argument("--seed", type=int, default=None, help="seed of the order shuffle")
    return ap


def usable(found: tuple, who: str) -> list:
    """The notes of a preflight check (``found``: problems that stop the run, notes); when there
    are such problems, says them and exits with status 2."""
    fatal, notes = found
    if fatal:
        for f in fatal:
            print(f"{who}: {f}", file=sys.stderr)
        sys.exit(2)
    return notes


def begin(kind: str, out: Optional[Path], raw: str, seed: Optional[int]) -> tuple:
    """A run starts: (its start time, its output directory, the directory for the tools' raw
    output ``raw`` below it (both made), the seed of its shuffles, a generator on that seed).
    Labs a killed run left behind are removed, and SIGTERM/SIGHUP end the run like Ctrl-C."""
    started = datetime.now(timezone.utc)
    out = results_dir(out, kind, started)
    (out / raw).mkdir(parents=True, exist_ok=True)
    seed = seed if seed is not None else int(time.time())
    netlab.install_signal_cleanup()
    netlab.sweep_stale()
    return started, out, out / raw, seed, random.Random(seed)


def run_meta(started: datetime) -> dict:
    """What every results document says first: when, how it was started, on what, which vnet."""
    return {"started": started.strftime("%Y-%m-%d %H:%M:%S UTC"), "command": command_line(),
            "machine": machine_info(), "ncpu": os.cpu_count(), "vnet_version": vnet_version()}


def plots_note() -> list:
    """What a run notes when it cannot draw (matplotlib missing)."""
    try:
        import matplotlib  # noqa: F401  (only whether it is there)
    except ImportError:
        return ["plots skipped: matplotlib is not importable (apt-get install python3-matplotlib)"]
    return []


@contextlib.contextmanager
def guarded(notes: list, prog: "Progress"):
    """Runs the body; Ctrl-C (or SIGTERM, with netlab's signal handling) or an error ends it
    with a note in ``notes`` instead of losing what was measured (``state["interrupted"]``), and
    every lab is removed in any case."""
    state = {"interrupted": False}
    try:
        yield state
    except KeyboardInterrupt:
        state["interrupted"] = True
        notes.append("interrupted: the results are partial")
        prog.say("interrupted: writing what was measured")
    except Exception:  # noqa: BLE001  (report what was measured, then fail)
        state["interrupted"] = True
        notes.append("the run stopped on an error:\n" + traceback.format_exc()[-2000:])
        prog.say(traceback.format_exc())
    finally:
        netlab.close_all()


def finish(doc: dict, prog: "Progress", data: Path, plot: Callable[[], list], write, report: Path) -> None:
    """The end of a run, whatever happened: its time, the plots (``plot()``), the results
    document ``doc`` in ``data`` and its report (``write(doc, report)``)."""
    doc["meta"]["elapsed_s"] = round(prog.elapsed(), 1)
    draw(doc["meta"], plot)
    write_json(data, doc)
    write(doc, report)
    prog.say(f"done in {mmss(prog.elapsed())}: {report}")


def draw(meta: dict, plot: Callable[[], list]) -> None:
    """``meta["plots"]``: the files ``plot()`` drew; none (and a note) when it fails."""
    try:
        meta["plots"] = plot()
    except ImportError:
        meta["plots"] = []
    except Exception:  # noqa: BLE001  (a plot failing must not lose the tables)
        meta["plots"] = []
        meta["notes"].append("plotting failed:\n" + traceback.format_exc()[-1500:])


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
