"""Where the time goes: a system-wide `perf record` during one iperf3 TCP stream guest to guest,
per configuration (kernel VXLAN, fast-path variants, native), on the fastpath_variants testbed.
Prints and saves the top kernel symbols (self time, all CPUs) of each.

    sudo python3 -m bench.fastpath_profile [--mtu 1500] [--seconds 6] [--configs kernel-vxlan fp-cache]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from vnetlab import netlab

from . import REPO
from .fastpath_bed import CONFIGS, FastpathBed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--configs", nargs="+", default=["kernel-vxlan", "fp-cache"], choices=CONFIGS)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if shutil.which("perf") is None:
        print("perf missing (Debian: linux-perf)", file=sys.stderr)
        return 2
    out = a.out or REPO / "results" / time.strftime("fastpath-profile-%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    netlab.install_signal_cleanup()
    report = {}
    with FastpathBed(a.mtu, tag="fpprof") as bed:
        for config in a.configs:
            bed.prepare(config)
            cl, sv, cip, sip = bed.endpoint(config)
            srv = sv.popen("iperf3", "-s", "-1", "-B", sip, "-p", 5201, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            netlab.wait_until(lambda: ":5201 " in sv.exec("ss", "-Htln").stdout, 10, 0.05, what="iperf3")
            cli = cl.popen("iperf3", "-c", sip, "-B", cip, "-p", 5201, "-t", a.seconds + 2, "-J",
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            time.sleep(1)
            data = out / f"perf-{config}.data"
            subprocess.run(["perf", "record", "-a", "-g", "-o", str(data), "--", "sleep", str(a.seconds)],
                           capture_output=True, check=True)
            res = json.loads(cli.communicate(timeout=60)[0])
            netlab.stop_pid(srv, timeout=3)
            gbps = res["end"]["sum_received"]["bits_per_second"] / 1e9
            # Only the test's own processes (the network work runs in their softirq context or in
            # ksoftirqd): the machine is shared, other work would blur the picture.
            rep = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort",
                                  "symbol", "--percent-limit", "0.7", "-g", "none", "--percentage", "relative",
                                  "--comms", "iperf3,ksoftirqd/0,ksoftirqd/1"],
                                 capture_output=True, text=True).stdout
            lines = [l for l in rep.splitlines() if l.strip() and not l.startswith("#")][: a.top]
            report[config] = {"gbps": round(gbps, 2), "top": lines}
            (out / f"perf-{config}.txt").write_text(rep)
            print(f"== {config}: {gbps:.2f} Gbit/s during the profile\n" + "\n".join(lines) + "\n", flush=True)
    (out / "profile.json").write_text(json.dumps(report, indent=1))
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
