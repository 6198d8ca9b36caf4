"""The suite's measurements: iperf3 (TCP, UDP), sockperf ping-pong, CPU per GB moved, and
MPI between the two endpoints (NetPIPE, HPCC; see ``mpi``).

Every function runs one test of one configuration on a SuiteBed and returns a list of
samples (dicts with metric, value, unit, extra) plus the evidence that the traffic took the
configuration's path (counters before/after). It never decides whether a number is good."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Optional

from .machine import CpuMeter
from .mpi import (hpcc_input, hpcc_summary, in_dir, job_output, mpirun_argv, netpipe_argv, netpipe_result,
                  write_agent)
from .suite_bed import SuiteBed, check_path, dispatch_delta, is_vnet


class MeasureError(RuntimeError):
    pass


# --- helpers --------------------------------------------------------------------------------

def _run(ns, argv, timeout):
    return ns.exec(*argv, check=False, timeout=timeout)


def _json(out: str, what: str) -> dict:
    try:
        j = json.loads(out)
    except ValueError:
        raise MeasureError(f"{what}: no JSON output: {out[-800:]!r}")
    if "error" in j:
        raise MeasureError(f"{what}: {j['error']}")
    return j


def evidence(tb: SuiteBed, config: str, before: dict, after: dict, ab: int, ba: int = 0) -> dict:
    ev = {"check": check_path(config, before, after, ab, ba)}
    if is_vnet(config):
        ev["dispatch"] = dispatch_delta(before, after)
    return ev


# --- iperf3 ---------------------------------------------------------------------------------

def _iperf(tb: SuiteBed, config: str, extra: list, seconds: float, what: str, pids=()) -> tuple:
    """One iperf3 client run A -> B (``extra`` its options) between two counter snapshots, the
    CPU of the machine and of ``pids`` metered over it: (its JSON report, the counters before,
    after, the CpuMeter). A failed run restarts the server."""
    ep = tb.endpoint(config)
    tb.server("iperf3", ep.server, ep.server_ip)
    argv = ["iperf3", "-c", ep.server_ip, "-B", ep.client_ip, "-p", 5201, *extra, "-t", seconds, "-J"]
    before = tb.counters(config)
    with CpuMeter(pids) as cpu:
        r = _run(ep.client, argv, seconds + 30)
    after = tb.counters(config)
    try:
        if r.returncode != 0 and not r.stdout.strip().startswith("{"):
            raise MeasureError(f"iperf3 rc={r.returncode}: {r.stderr[-500:]}")
        return _json(r.stdout, what), before, after, cpu
    except MeasureError:
        tb.restart_server("iperf3", ep.server, ep.server_ip)
        raise


def iperf_tcp(tb: SuiteBed, config: str, seconds: float, streams: int = 1) -> list:
    """TCP throughput A -> B (iperf3, receiver's goodput), with CPU seconds per GB moved:
    the whole machine's (from /proc/stat) and, for vnet, the two daemons' own."""
    pids = tb.vnetd_pids() if is_vnet(config) else []
    j, before, after, cpu = _iperf(tb, config, ["-P", streams] if streams > 1 else [], seconds, "iperf3", pids)
    recv = j["end"]["sum_received"]
    sent = j["end"].get("sum_sent", {})
    gbps = recv["bits_per_second"] / 1e9
    nbytes = int(recv["bytes"])
    gb = nbytes / 1e9
    ev = evidence(tb, config, before, after, nbytes)
    extra = {"bytes": nbytes, "retransmits": sent.get("retransmits"), "seconds": recv.get("seconds"),
             "streams": streams}
    tag = f"tcp{streams}"
    out = [dict(metric=f"{tag}_gbps", value=gbps, unit="Gbit/s", extra=extra, **ev)]
    if gb > 0:
        cpu_extra = {"machine_cpu_s": round(cpu.machine_s, 3), "wall_s": round(cpu.wall_s, 3),
                     "gb": round(gb, 4), "from": f"{tag}_gbps"}
        out.append(dict(metric=f"cpu_s_per_gb_{tag}", value=cpu.machine_s / gb, unit="CPU-s/GB",
                        extra=cpu_extra, check=ev["check"]))
        if pids:
            out.append(dict(metric=f"vnetd_cpu_s_per_gb_{tag}", value=cpu.procs_s / gb, unit="CPU-s/GB",
                            extra={"vnetd_cpu_s": round(cpu.procs_s, 3), "gb": round(gb, 4),
                                   "pids": pids}, check=ev["check"]))
    return out


def iperf_udp(tb: SuiteBed, config: str, seconds: float, rate: str = "0") -> list:
    """UDP goodput A -> B (iperf3 -u, datagrams that fill the path's MTU without
    fragmentation, sender unlimited unless ``rate``): the receiver's goodput and loss."""
    length = tb.endpoint(config).mtu - 28
    j, before, after, _ = _iperf(tb, config, ["-u", "-b", rate, "-l", length], seconds, "iperf3 -u")
    recv = j["end"]["sum_received"]
    nbytes = int(recv["bytes"])
    ev = evidence(tb, config, before, after, nbytes)
    extra = {"bytes": nbytes, "datagram": length, "lost_percent": recv.get("lost_percent"),
             "packets": recv.get("packets"), "lost_packets": recv.get("lost_packets"),
             "sender_gbps": j["end"].get("sum_sent", {}).get("bits_per_second", 0) / 1e9}
    return [dict(metric="udp_gbps", value=recv["bits_per_second"] / 1e9, unit="Gbit/s", extra=extra, **ev),
            dict(metric="udp_loss_pct", value=float(recv.get("lost_percent") or 0.0), unit="%",
                 extra={"from": "udp_gbps"}, check=ev["check"])]


# --- sockperf -------------------------------------------------------------------------------

_PCT = re.compile(r"percentile\s+([\d.]+)\s*=\s*([\d.]+)")
_AVG = re.compile(r"avg-rtt=([\d.]+)")
_TOTAL = re.compile(r"\[Total Run\].*SentMessages=(\d+); ReceivedMessages=(\d+)")
_VALID = re.compile(r"\[Valid Duration\].*SentMessages=(\d+); ReceivedMessages=(\d+)")
_DROPPED = re.compile(r"# dropped messages = (\d+)")


def parse_sockperf(out: str) -> dict:
    pct = {float(a): float(b) for a, b in _PCT.findall(out)}
    m = _TOTAL.search(out)
    v = _VALID.search(out)
    if "No valid observations" in out:
        raise MeasureError("sockperf: no valid observations (probably a message or its reply was lost and the "
                           "client waited for it until the end of the test)")
    if 50.0 not in pct:
        raise MeasureError("sockperf: no percentiles in its output")
    d = _DROPPED.search(out)
    a = _AVG.search(out)
    return {"p50": pct[50.0], "p99": pct.get(99.0), "p999": pct.get(99.9), "p25": pct.get(25.0),
            "p75": pct.get(75.0), "avg": float(a.group(1)) if a else None,
            "total_sent": int(m.group(1)) if m else 0, "total_received": int(m.group(2)) if m else 0,
            "observations": int(v.group(2)) if v else 0, "dropped": int(d.group(1)) if d else None}


def read_full_log(path: Path, keep: int = 20000) -> list:
    """RTTs (µs) from ``sockperf --full-log``, evenly thinned to at most ``keep``."""
    vals = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split(",")
                if len(parts) == 4 and parts[0].strip().isdigit():
                    try:
                        vals.append(float(parts[3]))
                    except ValueError:
                        pass
    except OSError:
        return []
    if len(vals) > keep:
        step = len(vals) / keep
        vals = [vals[int(i * step)] for i in range(keep)]
    return vals


def sockperf_pp(tb: SuiteBed, config: str, size: int, seconds: float, full_log: Optional[Path] = None) -> dict:
    """One UDP ping-pong run of ``size``-byte messages A <-> B, round-trip times in µs."""
    ep = tb.endpoint(config)
    tb.server("sockperf", ep.server, ep.server_ip)
    argv = ["sockperf", "ping-pong", "-i", ep.server_ip, "-p", 11111, "--client_ip", ep.client_ip,
            "-m", size, "-t", seconds, "--full-rtt"]
    if full_log:
        argv += ["--full-log", full_log]
    before = tb.counters(config)
    r = _run(ep.client, argv, seconds + 20)
    after = tb.counters(config)
    out = r.stdout + r.stderr
    try:
        if r.returncode != 0:
            raise MeasureError(f"sockperf rc={r.returncode}")
        res = parse_sockperf(out)
    except MeasureError as e:
        # keep the evidence: what sockperf saw, and what the path's counters saw
        tb.restart_server("sockperf", ep.server, ep.server_ip)
        total = _TOTAL.search(out)
        seen = "; ".join(l.split("sockperf: ", 1)[-1] for l in out.splitlines()
                         if "Total Run" in l or "No valid" in l or "ERROR" in l)
        ev = evidence(tb, config, before, after, 0, 0)
        chk = {k: v for k, v in ev["check"].items() if k not in ("path", "ok", "payload_ab", "payload_ba")}
        raise MeasureError(f"{e}: {seen or out[-400:]!r}; path counters during the test: {chk}"
                           + (f" (sent {total.group(1)}, received {total.group(2)})" if total else ""))
    # every received reply crossed twice; count only the replies both ways (a request whose
    # reply was lost may not have arrived)
    payload = res["total_received"] * size
    res.update(evidence(tb, config, before, after, payload, payload))
    return res


def latency64(tb: SuiteBed, config: str, seconds: float, log_dir: Path, tag: str) -> tuple:
    """64-byte round trip: p50, p99, p99.9 samples, plus the RTTs for the box plot."""
    fl = log_dir / f"sockperf-{tag}.csv"
    res = sockperf_pp(tb, config, 64, seconds, full_log=fl)
    rtts = read_full_log(fl)
    try:
        fl.unlink()
    except OSError:
        pass
    extra = {k: res[k] for k in ("p25", "p75", "avg", "observations", "dropped", "total_received")}
    ev = {k: res[k] for k in ("check", "dispatch") if k in res}
    samples = [dict(metric="rtt64_p50_us", value=res["p50"], unit="µs", extra=extra, **ev),
               dict(metric="rtt64_p99_us", value=res["p99"], unit="µs", extra={"from": "rtt64_p50_us"},
                    check=ev["check"]),
               dict(metric="rtt64_p999_us", value=res["p999"], unit="µs", extra={"from": "rtt64_p50_us"},
                    check=ev["check"])]
    return samples, rtts


def latency_size(tb: SuiteBed, config: str, size: int, seconds: float) -> list:
    res = sockperf_pp(tb, config, size, seconds)
    extra = {k: res[k] for k in ("p99", "p999", "avg", "observations", "dropped")}
    extra["size"] = size
    ev = {k: res[k] for k in ("check", "dispatch") if k in res}
    return [dict(metric=f"rtt_size_{size}_p50_us", value=res["p50"], unit="µs", extra=extra, **ev)]


# --- MPI: two ranks, one in each endpoint (guest A and guest B, or the two hosts) -------------

HPCC_KEYS = {
    "hpcc_pingpong_lat_us": ("AvgPingPongLatency_usec", 1.0, "µs"),
    "hpcc_pingpong_bw_gbps": ("AvgPingPongBandwidth_GBytes", 8.0, "Gbit/s"),
    "hpcc_ring_lat_us": ("RandomlyOrderedRingLatency_usec", 1.0, "µs"),
    "hpcc_ring_bw_gbps": ("NaturallyOrderedRingBandwidth_GBytes", 8.0, "Gbit/s"),
}


def _mpi_job(tb: SuiteBed, config: str, workdir: Path, job: list, timeout: float) -> tuple:
    """Run ``job`` (its words after mpirun's) on two ranks, rank 0 in the client endpoint,
    between two counter snapshots: (result, before, after, wall seconds)."""
    ep = tb.endpoint(config)
    agent = write_agent(workdir, {ep.client_ip: ep.client.name, ep.server_ip: ep.server.name})
    argv = mpirun_argv(agent, f"{ep.client_ip},{ep.server_ip}", 2, ep.subnet) + job
    before = tb.counters(config)
    t0 = time.monotonic()
    r = ep.client.exec("sh", "-c", in_dir(workdir, argv), check=False, timeout=timeout)
    wall = time.monotonic() - t0
    return r, before, tb.counters(config), wall


def netpipe(tb: SuiteBed, config: str, workdir: Path, upper: int, repeats: int, raw_dir: Path, tag: str) -> list:
    """MPI ping-pong across sizes 1 B .. ``upper`` (NetPIPE's MPI module, ``repeats`` round
    trips per size): latency of 8-byte messages (one way, as NetPIPE reports) and the best
    bandwidth."""
    out = workdir / "np.out"
    workdir.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    r, before, after, wall = _mpi_job(tb, config, workdir, netpipe_argv(upper, repeats, out), 240)
    res = netpipe_result(job_output(r, out, "NetPIPE", raw_dir / f"netpipe-{tag}.out", MeasureError), repeats)
    if res is None:
        raise MeasureError("NetPIPE wrote no results")
    lat, best = res["lat"], res["best"]
    ev = evidence(tb, config, before, after, res["payload"], res["payload"])
    extra = {"size": lat[0], "wall_s": round(wall, 2), "curve": res["curve"]}
    return [dict(metric="mpi_pingpong_lat_us", value=lat[2] * 1e6, unit="µs", extra=extra, **ev),
            dict(metric="mpi_pingpong_bw_gbps", value=best[1] / 1e3, unit="Gbit/s",
                 extra={"size": best[0], "from": "mpi_pingpong_lat_us"}, check=ev["check"])]


def hpcc(tb: SuiteBed, config: str, workdir: Path, n: int, raw_dir: Path, tag: str) -> list:
    """HPC Challenge with a small problem (N=``n``), two ranks; its latency/bandwidth part
    (ping-pong between the two ranks, and ring latency/bandwidth)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "hpccinf.txt").write_text(hpcc_input(n))
    outf = workdir / "hpccoutf.txt"
    outf.unlink(missing_ok=True)
    r, before, after, wall = _mpi_job(tb, config, workdir, ["hpcc"], 300)
    vals = hpcc_summary(job_output(r, outf, "hpcc", raw_dir / f"hpcc-{tag}.txt", MeasureError))
    # the ping-pong bandwidth test alone moves several 2 MB messages each way
    ev = evidence(tb, config, before, after, 2_000_000, 2_000_000)
    out = []
    for metric, (key, mult, unit) in HPCC_KEYS.items():
        if key not in vals:
            continue
        try:
            v = float(vals[key]) * mult
        except ValueError:
            continue
        extra = {"hpcc_key": key, "wall_s": round(wall, 2), "N": n}
        if metric == "hpcc_pingpong_lat_us":
            extra.update({k: vals.get(k) for k in ("MinPingPongLatency_usec", "MaxPingPongLatency_usec",
                                                    "HPL_Tflops", "PTRANS_GBs", "MPIRandomAccess_GUPs",
                                                    "MPIFFT_Gflops")})
            out.append(dict(metric=metric, value=v, unit=unit, extra=extra, **ev))
        else:
            out.append(dict(metric=metric, value=v, unit=unit, extra=extra, check=ev["check"]))
    if not out:
        raise MeasureError("hpcc output has no latency/bandwidth results")
    return out
