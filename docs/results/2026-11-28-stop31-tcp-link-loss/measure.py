"""A TCP link under 30% random loss each way: how long do a guest's pings wait?

Two hosts (namespaces), one guest each, one `tcp` link; iptables drops 30% of what arrives
in each host from the other (as test_security's loss phase does). A guest pings its peer
every 50 ms for SECONDS seconds; the figures are the share of pings answered, the longest
silence between two replies, the round trip's median and p99, and how many times the link
reconnected (TCP_USER_TIMEOUT ended a connection). Rounds alternate two vnetd builds, so a
difference is the builds', not the machine's hour.

    python3 docs/results/2026-11-28-stop31-tcp-link-loss/measure.py \
        --build old=/path/old/release --build new=target/release --rounds 5
"""
import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
from vnetlab import netlab  # noqa: E402

PING = re.compile(r"^\[(\d+\.\d+)\] \d+ bytes from .* icmp_seq=(\d+) .* time=([\d.]+) ms", re.M)


def one_run(release: Path, seconds: int) -> dict:
    netlab.VNETD, netlab.VNETCTL = release / "vnetd", release / "vnetctl"
    lab = netlab.Lab(tag="tcp-link-loss")
    try:
        A, B = lab.host("A"), lab.host("B")
        ga = lab.guest("at", ip="192.168.60.11", mac=netlab.mac(2, 1, 1))
        gb = lab.guest("bt", ip="192.168.60.21", mac=netlab.mac(2, 2, 1))
        A.start_vnetd(config=f"""
listen tcp {A.underlay_ip}:7700
interface add vm-at tap mac {ga.mac} netns {ga.name} vni 2
link add to-b-tcp tcp accept {B.underlay_ip} vni 2
route add any {ga.mac} interface vm-at
route add any {gb.mac} link to-b-tcp
""")
        B.start_vnetd(config=f"""
interface add vm-bt tap mac {gb.mac} netns {gb.name} vni 2
link add to-a-tcp tcp {A.underlay_ip}:7700 vni 2
route add any {gb.mac} interface vm-bt
route add any {ga.mac} link to-a-tcp
""")
        ga.configure(A.interface("vm-at")["ifname"])
        gb.configure(B.interface("vm-bt")["ifname"])
        netlab.wait_until(lambda: A.link_state("to-b-tcp") == "up" and B.link_state("to-a-tcp") == "up",
                          15, what="tcp link up")
        lab.wait_ping(ga, gb.ip_addr, timeout=10)
        for h, o in ((A, B), (B, A)):
            h.exec("iptables", "-A", "INPUT", "-s", o.underlay_ip, "-m", "statistic", "--mode",
                   "random", "--probability", "0.3", "-j", "DROP")
        t0 = time.time()
        out = ga.exec("ping", "-D", "-i", "0.05", "-W", "10", "-w", seconds, gb.ip_addr,
                      check=False, timeout=seconds + 30).stdout
        sent = netlab.parse_ping(out).sent
        replies = [(float(t), float(rtt)) for t, _, rtt in PING.findall(out)]
        arrivals = sorted([t0] + [t for t, _ in replies])
        accepted = (lab.workdir / "vnetd-A.log").read_text().count("tcp link accepted")
        return {
            "sent": sent,
            "answered_pct": round(100 * len(replies) / max(sent, 1), 1),
            "longest_silence_s": round(max(b - a for a, b in zip(arrivals, arrivals[1:])), 2),
            "rtt_p50_ms": round(statistics.median(r for _, r in replies), 1) if replies else None,
            "rtt_p99_ms": round(sorted(r for _, r in replies)[int(0.99 * (len(replies) - 1))], 1)
            if replies else None,
            "reconnects": accepted - 1,
        }
    finally:
        lab.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="append", required=True, metavar="NAME=DIR",
                    help="a vnetd/vnetctl build directory (e.g. target/release); give two")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("runs.json"))
    a = ap.parse_args()
    builds = [(n, Path(d).resolve()) for n, d in (b.split("=", 1) for b in a.build)]
    runs = []
    total = a.rounds * len(builds)
    for r in range(a.rounds):
        for i, (name, d) in enumerate(builds if r % 2 == 0 else builds[::-1]):
            n = r * len(builds) + i + 1
            print(f"[{n}/{total}] round {r + 1} {name} ...", end=" ", flush=True)
            res = one_run(d, a.seconds)
            print(json.dumps(res), flush=True)
            runs.append({"round": r + 1, "build": name, **res})
    a.out.write_text(json.dumps(runs, indent=1) + "\n")
    print()
    keys = ("answered_pct", "longest_silence_s", "rtt_p50_ms", "rtt_p99_ms", "reconnects")
    print("| build | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, _ in builds:
        cells = []
        for k in keys:
            v = [x[k] for x in runs if x["build"] == name and x[k] is not None]
            cells.append(f"{statistics.median(v):g} ({min(v):g}-{max(v):g})" if v else "-")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
