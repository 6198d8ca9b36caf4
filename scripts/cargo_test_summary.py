#!/usr/bin/env python3
"""A test log a person can read: reads ``cargo test`` output on stdin, keeps all of it in a log
file, and prints per crate how many tests passed, failed and were ignored (and in which targets),
then the first failures in full, a test binary that died without a result, or the compiler's
errors when nothing ran. scripts/test.sh pipes the workspace's tests through it:

    cargo test --release --workspace --no-fail-fast 2>&1 | python3 scripts/cargo_test_summary.py

Exits 1 when a test failed, a test binary died, or no test ran at all (0 otherwise); the caller
keeps cargo's own status with ``set -o pipefail``. Lines about a test running for a long time
are passed through as they come, so a hang shows in the log while it happens.

Crates are named from ``cargo metadata`` (the package that owns each test binary's source
file); ``--metadata FILE`` reads that JSON from a file instead.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

RUNNING = re.compile(r"^\s*Running (?:unittests )?(\S+) \((?:.*/)?([^/]+?)(?:-[0-9a-f]{8,})?(?:\.exe)?\)\s*$")
DOCTESTS = re.compile(r"^\s*Doc-tests (\S+)\s*$")
RESULT = re.compile(r"^test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored;")
BLOCK = re.compile(r"^---- (.+) (stdout|stderr) ----$")
SHOW_LIVE = re.compile(r"has been running for over|^error(\[E\d+\])?: ")
FULL_LINES = 200  # of one failure's output printed at most (the log has the rest)


@dataclass
class Target:
    crate: str
    name: str  # lib, bin NAME, tests/x.rs, doc
    result: tuple = ()  # (passed, failed, ignored) once libtest printed its result line
    failures: list = field(default_factory=list)  # [(test name, [lines])]
    lines: list = field(default_factory=list)  # its output, for a binary that died


def load_packages(metadata: str | None) -> dict:
    """(target name with '_', source path relative to its package) and ("doc", lib name) ->
    (package name, target name), from cargo metadata."""
    try:
        text = (Path(metadata).read_text() if metadata else
                subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
                               capture_output=True, text=True, timeout=60).stdout)
        meta = json.loads(text)
    except (OSError, ValueError, subprocess.SubprocessError):
        return {}
    out = {}
    for pkg in meta.get("packages", []):
        root = Path(pkg["manifest_path"]).parent
        for t in pkg.get("targets", []):
            name = t["name"].replace("-", "_")
            try:
                src = str(Path(t["src_path"]).relative_to(root))
            except ValueError:
                src = t["src_path"]
            out[(name, src)] = (pkg["name"], t["name"])
            if "lib" in t["kind"] or "proc-macro" in t["kind"]:
                out[("doc", name)] = (pkg["name"], t["name"])
    return out


def target_label(src: str, name: str) -> str:
    if src == "src/lib.rs":
        return "lib"
    if src.startswith("src/"):
        return f"bin {name}"
    return src


class Summary:
    def __init__(self, packages: dict):
        self.packages = packages
        self.targets: list[Target] = []
        self.cargo_errors: list[str] = []  # cargo's own error lines (rerun hints, compile errors)
        self.compile_lines: list[str] = []  # what came before the first test binary ran
        self._section = None  # within a binary's failures: "output", then "names"
        self._block = None  # the failure whose output is being read

    @property
    def current(self):
        return self.targets[-1] if self.targets else None

    def feed(self, line: str) -> None:
        if line.startswith("error") or (line.startswith("    `") and self.cargo_errors):
            self.cargo_errors.append(line)  # with the targets cargo lists after "N targets failed:"
        m = RUNNING.match(line)
        d = DOCTESTS.match(line)
        if m:
            src, stem = m.group(1), m.group(2)
            crate, name = self.packages.get((stem, src), (stem.replace("_", "-"), stem))
            self._start(Target(crate, target_label(src, name)))
            return
        if d:
            lib = d.group(1)
            self._start(Target(self.packages.get(("doc", lib), (lib.replace("_", "-"), lib))[0], "doc"))
            return
        t = self.current
        if t is None:
            self.compile_lines.append(line)
            return
        if t.result:
            return  # cargo's own lines after a binary's result
        t.lines.append(line)
        r = RESULT.match(line)
        if r:
            t.result = (int(r.group(2)), int(r.group(3)), int(r.group(4)))
            self._section = None
            return
        if line == "failures:":
            # libtest prints "failures:" before the failing tests' captured output, and again
            # before their names
            self._section = "names" if self._section == "output" else "output"
            self._block = None
            return
        if self._section == "output":
            b = BLOCK.match(line)
            if b:
                self._block = (b.group(1), [line])
                t.failures.append(self._block)
            elif self._block is not None:
                self._block[1].append(line)
        elif self._section == "names" and line.startswith("    "):
            name = line.strip()
            if name not in (n for n, _ in t.failures):  # a failure that printed nothing
                t.failures.append((name, []))

    def _start(self, target: Target) -> None:
        self.targets.append(target)
        self._section, self._block = None, None

    # -- the report --
    def crashed(self) -> list:
        return [t for t in self.targets if not t.result]

    def failed_tests(self) -> list:
        return [(t, name, lines) for t in self.targets for name, lines in t.failures]

    def report(self, log: str, show: int) -> str:
        out = []
        crates: dict = {}
        for t in self.targets:
            crates.setdefault(t.crate, []).append(t)
        total = [0, 0, 0]
        rows = []
        for crate in sorted(crates):
            ts = crates[crate]
            p = sum(t.result[0] for t in ts if t.result)
            f = sum(t.result[1] for t in ts if t.result)
            i = sum(t.result[2] for t in ts if t.result)
            total = [total[0] + p, total[1] + f, total[2] + i]
            parts = [f"{t.name} {t.result[0]}" if t.result else f"{t.name} DIED" for t in ts]
            rows.append((crate, p, f, i, ", ".join(parts)))
        width = max([len(r[0]) for r in rows] + [len("all crates")])
        out.append(f"unit and property tests, per crate (all of cargo's output: {log})")
        out.append(f"{'crate':<{width}}  {'passed':>6}  {'failed':>6}  {'ignored':>7}  targets (tests passed)")
        for crate, p, f, i, parts in rows:
            out.append(f"{crate:<{width}}  {p:>6}  {f:>6}  {i:>7}  {parts}")
        out.append(f"{'all crates':<{width}}  {total[0]:>6}  {total[1]:>6}  {total[2]:>7}  "
                   f"{len(self.targets)} test binaries in {len(crates)} crates")
        failed = self.failed_tests()
        if failed:
            out += ["", f"FAILED: {len(failed)} test(s); the first {min(show, len(failed))} in full:"]
            for t, name, lines in failed[:show]:
                out.append(f"==== {t.crate} {t.name}: {name} ====")
                lines = _trimmed(lines)
                out += lines[:FULL_LINES]
                if len(lines) > FULL_LINES:
                    out.append(f"[... {len(lines) - FULL_LINES} more lines in {log}]")
            if len(failed) > show:
                out.append("the others: " + ", ".join(f"{t.crate} {name}" for t, name, _ in failed[show:]))
        for t in self.crashed():
            out += ["", f"DIED: {t.crate} {t.name} ended without a test result; its last lines:"]
            out += _trimmed(t.lines)[-40:]
        if not self.targets:
            out += ["", "NO TESTS RAN; the end of cargo's output:"] + self.compile_lines[-60:]
        elif self.cargo_errors and (failed or self.crashed()):
            out += ["", "cargo:"] + self.cargo_errors[-20:]
        return "\n".join(out)

    def ok(self) -> bool:
        return bool(self.targets) and not self.failed_tests() and not self.crashed() and all(
            t.result[1] == 0 for t in self.targets)


def _trimmed(lines: list) -> list:
    """Without the blank lines at either end."""
    lines = list(lines)
    while lines and not lines[-1].strip():
        lines.pop()
    while lines and not lines[0].strip():
        lines.pop(0)
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", type=Path, default=Path("target/cargo-test.log"),
                    help="where all of cargo's output is kept (default target/cargo-test.log)")
    ap.add_argument("--failures", type=int, default=5, help="failures printed in full (default 5)")
    ap.add_argument("--metadata", help="cargo metadata JSON in a file (default: ask cargo)")
    a = ap.parse_args(argv)
    summary = Summary(load_packages(a.metadata))
    a.log.parent.mkdir(parents=True, exist_ok=True)
    with open(a.log, "w") as log:
        for raw in sys.stdin:
            log.write(raw)
            line = raw.rstrip("\n")
            if SHOW_LIVE.search(line):
                print(line, flush=True)
            summary.feed(line)
    print(summary.report(str(a.log), a.failures), flush=True)
    return 0 if summary.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
