"""The benchmark suite still runs: ``python3 -m bench.run --quick`` builds its testbed, measures every
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

from bench import hpc, hpc_bed, hpc_report
from vnetlab import netlab

CONFIGS = {"native", "kernel-vxlan", "vnet-guest-driven", "vnet-polling", "vnet-adaptive", "vnet-encrypted",
           "vnet-encrypted-veth", "vnet-kernel"}
PNG = b"\x89PNG\r\n\x1a\n"


def _matplotlib_python():
    for py in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(py) and subprocess.run([py, "-c", "import matplotlib"],
                                                 capture_output=True).returncode == 0:
            return py
    return None


def require(*binaries):
    for b in binaries:
        if not os.path.exists(b):
            pytest.fail(f"{b} not found: run `cargo build --release` first")


def run_quick(module: str, out, timeout: float, py: str = sys.executable):
    """``python3 -m bench.<module> --quick --out OUT`` from the repository root: it must succeed."""
    r = subprocess.run([py, "-m", f"bench.{module}", "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=timeout, cwd=netlab.REPO)
    assert r.returncode == 0, f"bench.{module} --quick failed (rc={r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-4000:]}"


def test_bench_quick(tmp_path, tools):
    require(netlab.VNETD, netlab.VNETCTL)
    missing = [t for t in ("sockperf", "mpirun", "hpcc", "NPopenmpi") if shutil.which(t) is None]
    if _matplotlib_python() is None:
        missing.append("matplotlib")
    if missing:
        pytest.skip(f"benchmark tools missing ({', '.join(missing)}): bash scripts/bench.sh --install-only")

    out = tmp_path / "bench"
    run_quick("run", out, 900)

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
    user = [s for s in vnet if s["config"] != "vnet-kernel"]
    assert user and all(s["check"]["path"].startswith("vnet link") and s.get("dispatch") for s in user)
    # the kernel fast path's samples are proven by the kernel's share of the link's counters
    kern = [s for s in vnet if s["config"] == "vnet-kernel"]
    assert kern and all(s["check"]["path"].startswith("kernel fast path") for s in kern)
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
    """``python3 -m bench.vhost --quick``: every (size, link, data path, notification policy) produced
    a sample whose path vnetd's own counters confirm, and the report and plot were written."""
    require(netlab.VNETD, netlab.VNETCTL,
            os.environ.get("VHOST_FRONTEND", str(netlab.REPO / "target" / "release" / "vhost-frontend")))
    out = tmp_path / "vhost"
    run_quick("vhost", out, 600, _matplotlib_python() or sys.executable)
    doc = json.loads((out / "vhost.json").read_text())
    samples = doc["samples"]
    assert len(samples) == 2 * 7, samples  # 4 plaintext configurations, 3 on the encrypted link
    assert sum(1 for s in samples if s.get("link") == "encrypted") == 2 * 3, samples
    errors = [s for s in samples if "error" in s]
    assert not errors, errors
    assert all(s["path_ok"] for s in samples), [s["vnet"] for s in samples if not s["path_ok"]]
    assert all(s["rx_pps"] > 0 and s["calls"] > 0 for s in samples)
    assert "goal" in doc and (out / "vhost.md").read_text().count("|") > 20
    if _matplotlib_python():
        assert (out / "vhost.png").read_bytes()[:8] == PNG


def test_hpc_bench_quick(tmp_path, tools):
    """``python3 -m bench.hpc --quick``: HPCC with 4 ranks on 4 guests over 4 hosts and NetPIPE between
    the most distant pair, on every configuration. Every configuration produced every HPCC
    kernel's figure and NetPIPE's, every run's counters show its bytes on the configuration's
    path (for vnet: vnet's own link counters, on every link between hosts), and the report
    says the machine is oversubscribed."""
    require(netlab.VNETD, netlab.VNETCTL)
    missing = [t for t in hpc.TOOLS if shutil.which(t) is None]
    if missing:
        pytest.skip(f"MPI tools missing ({', '.join(missing)}): bash scripts/bench.sh --install-only")
    out = tmp_path / "hpc"
    run_quick("hpc", out, 2400, _matplotlib_python() or sys.executable)
    doc = json.loads((out / "hpc.json").read_text())
    runs = doc["runs"]
    errors = [f"{x['config']} {x['job']}: {x['error']}" for x in runs if x.get("error")]
    assert not errors, "failed runs:\n" + "\n".join(errors)
    configs = list(hpc_bed.CONFIGS)
    assert doc["meta"]["configs"] == configs
    for c in configs:
        for job, figures in (("hpcc", hpc_report.KERNELS), ("netpipe", hpc_report.NETPIPE)):
            done = [x for x in runs if x["config"] == c and x["job"] == job]
            assert len(done) == 1, f"{c} {job}: {len(done)} runs"
            x = done[0]
            assert set(figures) <= set(x["figures"]), f"{c} {job} lacks {set(figures) - set(x['figures'])}"
            assert all(v > 0 for v in x["figures"].values()), (c, job, x["figures"])
            assert x["check"]["ok"], f"{c} {job}: counters do not show the bytes: {x['check']}"
            if c.startswith("vnet"):
                ch = x["check"]
                # HPCC: all 12 ordered pairs of the 4 hosts; NetPIPE: first <-> last host
                assert len(ch["links"]) == (12 if job == "hpcc" else 2), ch["links"]
                assert all(v["tx_bytes"] >= v["need"] > 0 and v["rx_bytes"] >= v["need"]
                           for v in ch["links"].values()), ch["links"]
                if c == "vnet-kernel":  # the kernel's eBPF programs carried it, not vnetd
                    assert ch["path"].startswith("kernel fast path")
                    assert all(v["kernel_tx_bytes"] >= v["need"] and v["kernel_rx_bytes"] >= v["need"]
                               for v in ch["links"].values()), ch["links"]
                else:
                    assert ch["path"].startswith("vnet udp links")
                    assert x["info"]["dispatch"]["frames"] > 0
            else:
                assert ch_dev(x["check"]) in ("eth0", "vx1")
        hp = [x for x in runs if x["config"] == c and x["job"] == "hpcc"][0]
        assert hp["verification"] == {"randomaccess_errors": 0, "hpl_failed": 0}
    md = (out / "hpc.md").read_text()
    assert "| kernel | unit | native | kernel-vxlan |" in md
    assert "**Oversubscribed:**" in md and "mpi_yield_when_idle 1" in md
    for c in configs[1:]:
        assert f"{c} / native" in md
    png = out / "hpc.png"
    if _matplotlib_python():
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 5000
        assert "(hpc.png)" in md


def ch_dev(check: dict) -> str:
    return check["path"].split()[2]


def test_hpc_counters_check_can_fail(tools):
    """The counters check of bench.hpc is not vacuous: with no job run between its two
    snapshots it fails (vnet's link counters, their kernel share, a kernel device); after a real
    NetPIPE job between rank 0 and rank 3 (two hosts) it passes; and for vnet-kernel the same
    job with the fast path off (`set fastpath off`: vnetd forwards it) fails, because the
    kernel's share of the links did not carry it."""
    require(netlab.VNETD, netlab.VNETCTL)
    if shutil.which("mpirun") is None or shutil.which("NPopenmpi") is None:
        pytest.skip("MPI tools missing: bash scripts/bench.sh --install-only")
    with hpc_bed.Bed(hosts=2) as bed:
        for c in ("native", "vnet-adaptive", "vnet-kernel"):
            p = bed.build(c)
            p.prepare()
            need = {"per_pair": 1_000_000, "ranks": [0, 3]}
            idle = p.counters()
            ch = p.check(idle, p.counters(), need)
            assert not ch["ok"], f"{c}: check passed with no traffic: {ch}"
            res = hpc.run_netpipe(bed, p, 1 << 16, 20, bed.workdir, c, timeout=120)
            assert res["check"]["ok"], res["check"]
            assert res["check"]["total_tx_bytes"] >= 2 * res["extra"]["payload_each_way"]
        p = bed.placements["vnet-kernel"]
        for h in bed.hosts:
            h.ctl("set", "fastpath", "off")
        try:
            res = hpc.run_netpipe(bed, p, 1 << 16, 20, bed.workdir, "vnet-kernel-off", timeout=120)
        finally:
            for h in bed.hosts:
                h.ctl("set", "fastpath", "kernel")
        links = res["check"]["links"].values()
        assert all(v["tx_bytes"] >= v["need"] for v in links), res["check"]  # vnetd carried it
        assert not res["check"]["ok"], f"the kernel check passed with the fast path off: {res['check']}"
