"""The benchmark suite still runs: ``bench/run.py --quick`` builds its testbed, measures every
configuration once, and writes samples.json, summary.md and the plots.

No speed is asserted: absolute figures are noise on a shared 2-core machine. What is asserted
is that the suite completed, that every configuration produced samples, and that every sample's
counters check passed (the traffic really crossed the path it claims to measure)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

import netlab

CONFIGS = {"native", "kernel-vxlan", "vnet-guest-driven", "vnet-polling", "vnet-adaptive", "vnet-encrypted",
           "vnet-kernel"}
PNG = b"\x89PNG\r\n\x1a\n"


def _matplotlib_python():
    for py in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(py) and subprocess.run([py, "-c", "import matplotlib"],
                                                 capture_output=True).returncode == 0:
            return py
    return None


def test_bench_quick(tmp_path, tools):
    for b in (netlab.VNETD, netlab.VNETCTL):
        if not b.exists():
            pytest.fail(f"{b} not found: run `cargo build --release` first")
    missing = [t for t in ("sockperf", "mpirun", "hpcc", "NPopenmpi") if shutil.which(t) is None]
    if _matplotlib_python() is None:
        missing.append("matplotlib")
    if missing:
        pytest.skip(f"benchmark tools missing ({', '.join(missing)}): bash scripts/bench.sh --install-only")

    out = tmp_path / "bench"
    r = subprocess.run([sys.executable, str(netlab.REPO / "bench" / "run.py"), "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"bench/run.py --quick failed (rc={r.returncode}):\n{r.stderr[-4000:]}"

    doc = json.loads((out / "samples.json").read_text())
    samples = doc["samples"]
    errors = [f"{s['config']} {s['metric']}: {s['error']}" for s in samples if s.get("error")]
    assert not errors, "failed measurements:\n" + "\n".join(errors)
    measured = {s["config"] for s in samples if s.get("value") is not None}
    assert measured == CONFIGS
    metrics = {s["metric"] for s in samples}
    for m in ("tcp1_gbps", "udp_gbps", "rtt64_p50_us", "rtt64_p99_us", "rtt64_p999_us",
              "rtt_size_65507_p50_us", "cpu_s_per_gb_tcp1", "mpi_pingpong_lat_us", "hpcc_pingpong_lat_us"):
        assert m in metrics, f"no {m} samples"
    for s in samples:
        assert {"config", "metric", "round", "value", "phase"} <= set(s)
    checked = [s for s in samples if s.get("check") is not None]
    assert checked, "no sample carries a counters check"
    bad = [f"{s['config']} {s['metric']}: {s['check']}" for s in checked if not s["check"]["ok"]]
    assert not bad, "traffic did not cross the measured path:\n" + "\n".join(bad)
    vnet = [s for s in samples if s["config"].startswith("vnet-") and s["metric"] == "tcp1_gbps"]
    assert vnet and all(s["check"]["path"].startswith("vnet link") and s.get("dispatch") for s in vnet)
    enc = [s for s in vnet if s["config"] == "vnet-encrypted"]
    assert enc and all("'peer-enc'" in s["check"]["path"] for s in enc)

    summary = (out / "summary.md").read_text()
    assert "| metric | config | median | spread | n | vs native | vs kernel VXLAN |" in summary
    assert "Goals of issue #3" in summary
    assert "Encrypted vs plaintext vnet link" in summary
    for name in ("throughput.png", "latency_box.png", "latency_vs_size.png", "cpu_per_gb.png", "mpi.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG and len(data) > 5000, f"{name} is not a real plot"
        assert f"({name})" in summary


def test_vhost_bench_quick(tmp_path, tools):
    """``bench/vhost.py --quick``: every (size, data path, notification policy) produced a
    sample whose path vnetd's own counters confirm, and the report and plot were written."""
    fe = os.environ.get("VHOST_FRONTEND", str(netlab.REPO / "target" / "release" / "vhost-frontend"))
    for b in (netlab.VNETD, netlab.VNETCTL, fe):
        if not os.path.exists(b):
            pytest.fail(f"{b} not found: run `cargo build --release` first")
    py = _matplotlib_python() or sys.executable
    out = tmp_path / "vhost"
    r = subprocess.run([py, str(netlab.REPO / "bench" / "vhost.py"), "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.loads((out / "vhost.json").read_text())
    samples = doc["samples"]
    assert len(samples) == 2 * 4, samples
    errors = [s for s in samples if "error" in s]
    assert not errors, errors
    assert all(s["path_ok"] for s in samples), [s["vnet"] for s in samples if not s["path_ok"]]
    assert all(s["rx_pps"] > 0 and s["calls"] > 0 for s in samples)
    assert "goal" in doc and (out / "vhost.md").read_text().count("|") > 20
    if _matplotlib_python():
        assert (out / "vhost.png").read_bytes()[:8] == PNG
