"""The unit-test log of scripts/test.sh (scripts/cargo_test_summary.py): from cargo test's
output it prints per crate the tests passed, failed and ignored, the first failures in full and
a test binary that died, keeps all of the output in its log file, and fails when anything
failed; in test.sh's pipeline (pipefail) cargo's own failure is kept even when every parsed
result passed. No root, no network: canned cargo output."""

import json
import subprocess
import sys

import pytest

from vnetlab import netlab

pytestmark = pytest.mark.no_vnetd

SCRIPT = netlab.REPO / "scripts" / "cargo_test_summary.py"

PASSING = """\
   Compiling vnet-wire v0.1.0 (/x/crates/vnet-wire)
    Finished `release` profile [optimized] target(s) in 1.20s
     Running unittests src/lib.rs (target/release/deps/vnet_wire-0123456789abcdef)

running 3 tests
test frame::tests::parses ... ok
test frame::tests::rejects_short ... ok
test frame::tests::slow ... ignored

test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.00s

     Running unittests src/main.rs (target/release/deps/vnetd-1111222233334444)

running 1 test
test config::tests::loads ... ok

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s

   Doc-tests vnet_wire

running 1 test
test crates/vnet-wire/src/lib.rs - frame (line 10) ... ok

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.20s

"""

FAILING = PASSING + """\
     Running tests/stream.rs (target/release/deps/stream-fedcba9876543210)

running 3 tests
test roundtrip ... ok
test garbage ... FAILED
test silent ... FAILED

failures:

---- garbage stdout ----
thread 'garbage' panicked at crates/vnet-wire/tests/stream.rs:40:5:
assertion `left == right` failed
  left: 3
 right: 4
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace


failures:
    garbage
    silent

test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s

error: test failed, to rerun pass `-p vnet-wire --test stream`
     Running unittests src/lib.rs (target/release/deps/vnet_core-5555666677778888)

running 4 tests
test a ... ok
error: test failed, to rerun pass `-p vnet-core --lib`

Caused by:
  process didn't exit successfully: `/x/target/release/deps/vnet_core-5555666677778888` (signal: 11, SIGSEGV)
error: 2 targets failed:
    `-p vnet-wire --test stream`
    `-p vnet-core --lib`
"""


def _metadata(tmp_path):
    def pkg(name, targets):
        root = f"/x/crates/{name}"
        return {"name": name, "manifest_path": f"{root}/Cargo.toml",
                "targets": [{"name": n, "kind": [k], "src_path": f"{root}/{src}"} for n, k, src in targets]}
    meta = {"packages": [pkg("vnet-wire", [("vnet_wire", "lib", "src/lib.rs"), ("stream", "test", "tests/stream.rs")]),
                         pkg("vnetd", [("vnetd", "bin", "src/main.rs")]),
                         pkg("vnet-core", [("vnet_core", "lib", "src/lib.rs")])]}
    path = tmp_path / "metadata.json"
    path.write_text(json.dumps(meta))
    return path


def summarize(tmp_path, text):
    log = tmp_path / "cargo-test.log"
    r = subprocess.run([sys.executable, SCRIPT, "--metadata", _metadata(tmp_path), "--log", log],
                       input=text, capture_output=True, text=True, timeout=30)
    return r, log


def row(out, crate):
    return next(line.split() for line in out.splitlines() if line.startswith(crate + " "))


def test_passing_run_is_summarized_per_crate(tmp_path):
    r, log = summarize(tmp_path, PASSING)
    assert r.returncode == 0, r.stdout + r.stderr
    # crate, passed, failed, ignored, then its test binaries
    assert row(r.stdout, "vnet-wire")[:4] == ["vnet-wire", "3", "0", "1"]
    assert "lib 2, doc 1" in r.stdout
    assert row(r.stdout, "vnetd")[:4] == ["vnetd", "1", "0", "0"]
    assert row(r.stdout, "all")[:5] == ["all", "crates", "4", "0", "1"]
    assert "FAILED" not in r.stdout and "Compiling" not in r.stdout
    assert log.read_text() == PASSING  # all of cargo's output is kept


def test_failures_are_shown_in_full_and_fail(tmp_path):
    r, log = summarize(tmp_path, FAILING)
    assert r.returncode == 1
    assert row(r.stdout, "vnet-wire")[:4] == ["vnet-wire", "4", "2", "1"]
    assert "tests/stream.rs 1" in r.stdout
    # the first failure in full: its header, the panic, the values compared
    assert "==== vnet-wire tests/stream.rs: garbage ====" in r.stdout
    for line in ("thread 'garbage' panicked at crates/vnet-wire/tests/stream.rs:40:5:", "  left: 3", " right: 4"):
        assert line in r.stdout.splitlines()
    # a failure that printed nothing is still named
    assert "==== vnet-wire tests/stream.rs: silent ====" in r.stdout
    # a binary that died without a result, and why
    assert "DIED: vnet-core lib" in r.stdout and "SIGSEGV" in r.stdout
    assert row(r.stdout, "vnet-core")[4:] == ["lib", "DIED"]
    assert "`-p vnet-core --lib`" in r.stdout
    assert log.read_text() == FAILING


def test_no_tests_is_a_failure(tmp_path):
    text = "error[E0425]: cannot find value `x` in this scope\nerror: could not compile `vnet-wire`\n"
    r, _ = summarize(tmp_path, text)
    assert r.returncode == 1
    assert "NO TESTS RAN" in r.stdout and "could not compile" in r.stdout


def test_pipeline_keeps_cargos_status(tmp_path):
    """As in scripts/test.sh: when cargo fails, the pipeline fails, whatever the summary saw."""
    canned = tmp_path / "out.txt"
    canned.write_text(PASSING)
    meta = _metadata(tmp_path)
    cmd = (f"set -o pipefail; (cat {canned}; exit 101) | {sys.executable} {SCRIPT} --metadata {meta} "
           f"--log {tmp_path / 'log'}")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30)
    assert r.returncode == 101
    assert row(r.stdout, "vnet-wire")[:4] == ["vnet-wire", "3", "0", "1"]
