"""vhost-user data-path benchmark (issue #4): frames from a frontend that plays the VMM go
vhost-user -> vnetd A -> VXLAN/UDP -> vnetd B -> vhost-user into a second frontend, with no
emulated CPU anywhere (QEMU under TCG would measure the emulator, not vnet).

    python3 -m bench.vhost [--quick] [--out DIR] [--rounds N] [--duration S] [--sizes 64,1500,65536]

Two hosts (network namespaces) joined by one veth pair (the wire, MTU 9000 by default so a
1500-byte frame is one datagram), one vnetd each serving one vhost-user interface. The frontend
(`vhost-frontend`, crate vnet-frontend) gives the transmitting "guest" memfd-shared memory, rings,
kick and call eventfds, and keeps its transmit ring full with frames of the given size (64 KB
frames as TSO frames with a virtio-net header); the receiving one keeps its receive ring
stocked and counts frames, bytes and the notifications (call eventfd signals) it got.

Beside the plaintext link the daemons have an encrypted one (`encrypt PEER_KEY`, VNI 2, between
second wire addresses) with a second vhost-user interface on each side. Cut-through receive never serves an encrypted link,
and a guest's memory is never sealed in place: with cut-through on, the sending daemon reads a
guest's frame straight from its memory into the send buffer where it is sealed (one copy), and
the receiving one writes the opened frames into the guest's buffers from its receive buffers
(`rx_direct`); without it, frames are copied out of and into the rings by the device threads.
It is measured with copy + batch, copy + optimistic and cut-through + optimistic.

Every (size, link, data path, notification policy) runs `--rounds` times in shuffled order, with
both daemons switched at run time (`set cut-through`, `set notify`). Each sample is checked
against vnetd's own counters (the path the frames took: cut-through or copied, on both sides).
Reported: packets per second and Gbit/s delivered to the receiving guest, notifications per MB
and frames per notification (as the receiving guest saw them), and the ratio of each
configuration to copy + batch. Output: vhost.json, vhost.md and vhost.png in the output dir.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from vnetlab import netlab

from . import REPO
from .report import ensure_matplotlib, med, pyplot, save
from .testbed import Testbed

FRONTEND = Path(os.environ.get("VHOST_FRONTEND", REPO / "target" / "release" / "vhost-frontend"))
WIRE_NET = "10.97.0"
ENC_WIRE_NET = "10.97.1"
MAC_A, MAC_B = "52:54:00:97:00:01", "52:54:00:97:00:02"
# The encrypted link's guests (VNI 2).
ENC_MAC_A, ENC_MAC_B = "52:54:00:98:00:01", "52:54:00:98:00:02"
GUEST_MTU = 1500
# (cut-through, notification policy, link)
CONFIGS = [("off", "batch", "plain"), ("off", "optimistic", "plain"), ("on", "batch", "plain"),
           ("on", "optimistic", "plain"), ("off", "batch", "encrypted"), ("off", "optimistic", "encrypted"),
           ("on", "optimistic", "encrypted")]
BASELINE = ("off", "batch", "plain")


def label(cfg) -> str:
    return f"{'cut-through' if cfg[0] == 'on' else 'copy'} + {cfg[1]}{' (encrypted)' if cfg[2] == 'encrypted' else ''}"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="output directory (default results/vhost-<UTC time>)")
    ap.add_argument("--quick", action="store_true", help="1 round, 1 s, sizes 64 and 1500 (checks the bench runs)")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--duration", type=float)
    ap.add_argument("--sizes", help="Ethernet frame sizes, comma separated (default 64,1500,65536)")
    ap.add_argument("--wire-mtu", type=int, default=9000)
    a = ap.parse_args(argv)
    a.rounds = a.rounds or (1 if a.quick else 3)
    a.duration = a.duration or (1.0 if a.quick else 3.0)
    a.sizes = [int(s) for s in (a.sizes or ("64,1500" if a.quick else "64,1500,65536")).split(",")]
    return a


class Bed(Testbed):
    """Two hosts on a veth wire, a vnetd on each with one vhost-user interface on a plain link
    and one on an encrypted link."""

    def __init__(self, wire_mtu: int):
        super().__init__("vhostbench", wire_mtu)

    def setup(self):
        lab = self.lab
        self.wire_pair(WIRE_NET, pin_neighbours=False)
        # The encrypted link runs between second addresses in a subnet of their own (the kernel
        # sends from the address of the destination's subnet): cut-through receive never serves
        # a plaintext link to the same peer address as an encrypted one.
        enc_ip = {self.hA: f"{ENC_WIRE_NET}.1", self.hB: f"{ENC_WIRE_NET}.2"}
        for h in (self.hA, self.hB):
            h.ip("addr", "add", f"{enc_ip[h]}/24", "dev", "eth0")
        self.sock = {"A": lab.workdir / "a.sock", "B": lab.workdir / "b.sock",
                     "A-enc": lab.workdir / "a-enc.sock", "B-enc": lab.workdir / "b-enc.sock"}
        keys = {}
        for h in (self.hA, self.hB):
            path = lab.workdir / f"{h.role}.key"
            r = subprocess.run([str(netlab.VNETD), "--gen-key", str(path)], capture_output=True, text=True,
                               timeout=10, check=True)
            keys[h] = (path, r.stdout.strip())
        for h, o, me, peer, eme, epeer, s, es in (
                (self.hA, self.hB, MAC_A, MAC_B, ENC_MAC_A, ENC_MAC_B, self.sock["A"], self.sock["A-enc"]),
                (self.hB, self.hA, MAC_B, MAC_A, ENC_MAC_B, ENC_MAC_A, self.sock["B"], self.sock["B-enc"])):
            h.start_vnetd(config=f"""
interface add vm vhost-user {s} mac {me} mtu {GUEST_MTU}
link add peer udp {o.underlay_ip}
route add any {me} interface vm
route add any {peer} link peer
interface add vm-enc vhost-user {es} mac {eme} mtu {GUEST_MTU} vni 2
link add peer-enc udp {enc_ip[o]} vni 2 encrypt {keys[o][1]}
route add any {eme} interface vm-enc
route add any {epeer} link peer-enc
""", args=["--key-file", str(keys[h][0])])
        def link_up(h) -> bool:
            return any(x["name"] == "peer-enc" and x["state"] == "up" for x in h.ctl_json("show", "links", "json"))
        netlab.wait_until(lambda: link_up(self.hA) and link_up(self.hB), 10, 0.1,
                          what="the encrypted link's session on both hosts")

    def configure(self, cfg):
        for h in (self.hA, self.hB):
            h.ctl("set", "cut-through", cfg[0])
            h.ctl("set", "notify", cfg[1])

    def nic(self, h, link: str = "plain") -> dict:
        return h.port("vm-enc" if link == "encrypted" else "vm")["nic"]


def frontend(sock: Path, role: str, size: int, duration: float, extra=(), link: str = "plain") -> subprocess.Popen:
    args = [str(FRONTEND), "-s", str(sock), "--mem-mb", "128"]
    if size > GUEST_MTU + 14:
        args.append("--offload")
    macs, net = ((ENC_MAC_A, ENC_MAC_B), "192.168.98") if link == "encrypted" else ((MAC_A, MAC_B), "192.168.97")
    args += ["bench", "--role", role, "--size", str(size), "--mtu", str(GUEST_MTU), "--json",
             "--src-mac", macs[0], "--dst-mac", macs[1], "--src-ip", f"{net}.1", "--dst-ip", f"{net}.2",
             "--duration", str(duration), *extra]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def one_run(bed: Bed, cfg, size: int, duration: float) -> dict:
    bed.configure(cfg)
    link = cfg[2]
    sfx = "-enc" if link == "encrypted" else ""
    a0, b0 = bed.nic(bed.hA, link), bed.nic(bed.hB, link)
    rx = frontend(bed.sock["B" + sfx], "rx", size, duration, ["--idle", "1.5"], link)
    time.sleep(0.4)  # rx rings stocked before the first frame
    tx = frontend(bed.sock["A" + sfx], "tx", size, duration, link=link)
    tout, terr = tx.communicate(timeout=duration + 60)
    rout, rerr = rx.communicate(timeout=duration + 60)
    if tx.returncode != 0 or rx.returncode != 0 or not tout.strip() or not rout.strip():
        raise RuntimeError(f"frontend failed: tx rc={tx.returncode} {terr[-400:]} / rx rc={rx.returncode} {rerr[-400:]}")
    t, r = json.loads(tout), json.loads(rout)
    a1, b1 = bed.nic(bed.hA, link), bed.nic(bed.hB, link)
    d = lambda x0, x1, k: x1.get(k, 0) - x0.get(k, 0)  # noqa: E731
    # Which path the frames took, from vnetd's own counters.
    if link == "encrypted":
        # No cut-through receive: with cut-through on, sent frames come from guest memory and
        # received ones are written into the guest's buffers by the receiving thread (rx_direct).
        on = cfg[0] == "on"
        tx_path = d(a0, a1, "tx_cut_through" if on else "tx_copied")
        rx_path = d(b0, b1, "rx_direct" if on else "rx_copied")
    elif cfg[0] == "on":
        tx_path, rx_path = d(a0, a1, "tx_cut_through"), d(b0, b1, "rx_cut_through")
    else:
        tx_path, rx_path = d(a0, a1, "tx_copied"), d(b0, b1, "rx_copied")
    tx_frames = d(a0, a1, "tx_cut_through") + d(a0, a1, "tx_copied")
    rx_frames = sum(d(b0, b1, k) for k in ("rx_cut_through", "rx_direct", "rx_copied"))
    # The configured path must carry most frames. With cut-through on, a frame may still be
    # copied legitimately (the guest's receive ring was empty, the socket was full), more often
    # on a loaded machine, so "most" is a majority; with it off no frame may be cut through.
    if link == "encrypted":
        share = 0.5 if cfg[0] == "on" else 0.9
        ok = d(b0, b1, "rx_cut_through") == 0 and rx_path >= share * rx_frames and tx_path >= share * tx_frames
    elif cfg[0] == "on":
        ok = tx_path >= 0.5 * tx_frames and rx_path >= 0.5 * rx_frames
    else:
        ok = d(a0, a1, "tx_cut_through") == 0 and d(b0, b1, "rx_cut_through") == 0 \
            and tx_path >= 0.9 * tx_frames and rx_path >= 0.9 * rx_frames
    ok = ok and tx_frames > 0 and rx_frames > 0
    return {
        "size": size, "cut_through": cfg[0], "notify": cfg[1], "link": link,
        "rx_pps": r["pps"], "rx_gbps": r["gbit_per_s"], "rx_frames": r["frames"],
        "tx_pps": t["pps"], "tx_frames": t["frames"],
        "calls": r["calls"], "call_wakeups": r.get("call_wakeups"), "calls_per_MB": r["calls_per_MB"],
        "frames_per_call": r["frames_per_call"], "empty_wakeups": r.get("empty_wakeups"),
        "vnet": {"A_tx_path": tx_path, "A_tx_frames": tx_frames, "B_rx_path": rx_path, "B_rx_frames": rx_frames,
                 "B_early": d(b0, b1, "rx_early"), "B_early_masked": d(b0, b1, "rx_early_masked"),
                 "B_early_found_nothing": d(b0, b1, "rx_early_found_nothing"),
                 "B_notifications": d(b0, b1, "rx_notifications"),
                 "B_skipped_cold": d(b0, b1, "rx_skipped_cold"), "B_skipped_hot": d(b0, b1, "rx_skipped_hot")},
        "path_ok": ok,
    }


def summarize(samples: list, sizes: list) -> dict:
    out = {}
    for size in sizes:
        row = {}
        for cfg in CONFIGS:
            s = [x for x in samples if x["size"] == size and (x["cut_through"], x["notify"], x.get("link", "plain")) == cfg
                 and "error" not in x]
            if not s:
                continue
            row[label(cfg)] = {k: med([x[k] for x in s]) for k in ("rx_pps", "rx_gbps", "calls_per_MB", "frames_per_call")}
            row[label(cfg)]["n"] = len(s)
            row[label(cfg)]["pps_range"] = [min(x["rx_pps"] for x in s), max(x["rx_pps"] for x in s)]
        base = row.get(label(BASELINE))
        for k, v in row.items():
            if base and base["rx_pps"]:
                v["pps_vs_copy_batch"] = v["rx_pps"] / base["rx_pps"]
        out[str(size)] = row
    return out


def write_md(doc: dict, path: Path) -> None:
    m = doc["meta"]
    lines = [f"# vhost-user data path ({m['started']})", "",
             f"{m['rounds']} round(s) of {m['duration']} s per configuration, wire MTU {m['wire_mtu']}, guest MTU {GUEST_MTU}; "
             f"medians; frontend `vhost-frontend` (no emulated CPU). Machine: {m['machine']}.", "",
             "| frame | data path + notification | pps (median) | range | Gbit/s | × copy+batch | notifications/MB | frames/notification |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for size, row in doc["summary"].items():
        for name, v in row.items():
            ratio = v.get("pps_vs_copy_batch")
            lines.append(f"| {size} B | {name} | {v['rx_pps']:,.0f} | {v['pps_range'][0]:,.0f}-{v['pps_range'][1]:,.0f} | "
                         f"{v['rx_gbps']:.2f} | {ratio:.2f}× | {v['calls_per_MB']:.1f} | {v['frames_per_call']:.1f} |"
                         if ratio is not None else f"| {size} B | {name} | {v['rx_pps']:,.0f} | | {v['rx_gbps']:.2f} | | {v['calls_per_MB']:.1f} | {v['frames_per_call']:.1f} |")
    g = doc.get("goal")
    if g:
        lines += ["", f"Goal (1500-byte frames): cut-through + optimistic ≥ 1.5× the pps of copy + batch, and fewer "
                      f"notifications per MB: {g['pps_ratio']:.2f}×, {g['cut_opt_calls_per_MB']:.1f} vs "
                      f"{g['copy_batch_calls_per_MB']:.1f} notifications/MB: **{'met' if g['met'] else 'not met'}**."]
    bad = [s for s in doc["samples"] if not s.get("path_ok", False)]
    lines += ["", f"Samples: {len(doc['samples'])}; path confirmed by vnetd's counters in "
                  f"{len(doc['samples']) - len(bad)}; errors: {len([s for s in doc['samples'] if 'error' in s])}."]
    for n in m.get("notes", []):
        lines.append(f"- {n}")
    path.write_text("\n".join(lines) + "\n")


def plot(doc: dict, path: Path) -> bool:
    try:
        plt = pyplot()
    except ImportError:
        return False
    sizes = list(doc["summary"].keys())
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    w = 0.8 / len(CONFIGS)
    for i, cfg in enumerate(CONFIGS):
        name = label(cfg)
        pps = [doc["summary"][s].get(name, {}).get("rx_pps") or 0 for s in sizes]
        cpm = [doc["summary"][s].get(name, {}).get("calls_per_MB") or 0 for s in sizes]
        xs = [k + (i - (len(CONFIGS) - 1) / 2) * w for k in range(len(sizes))]
        axes[0].bar(xs, [p / 1e3 for p in pps], w, label=name)
        axes[1].bar(xs, cpm, w, label=name)
    for ax, t in ((axes[0], "received kpps (higher is better)"), (axes[1], "notifications per MB (lower is better)")):
        ax.set_xticks(range(len(sizes)))
        ax.set_xticklabels([f"{s} B" for s in sizes])
        ax.set_title(t)
    axes[0].legend(fontsize=8)
    fig.suptitle("vnet vhost-user: vhost-user -> UDP -> vhost-user")
    save(fig, path)
    return True


def main(argv=None) -> int:
    a = parse_args(argv)
    if os.geteuid() != 0:
        print("bench.vhost: needs root (network namespaces)", file=sys.stderr)
        return 2
    for b in (FRONTEND, netlab.VNETD, netlab.VNETCTL):
        if not Path(b).exists():
            print(f"bench.vhost: {b} not found (cargo build --release)", file=sys.stderr)
            return 2
    started = datetime.now(timezone.utc)
    out = (a.out or REPO / "results" / f"vhost-{started.strftime('%Y%m%dT%H%M%SZ')}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    tasks = [(size, cfg) for _ in range(a.rounds) for size in a.sizes for cfg in CONFIGS]
    rng = random.Random(int(time.time()))
    rng.shuffle(tasks)
    doc = {"meta": {"started": started.strftime("%Y-%m-%d %H:%M:%S UTC"), "rounds": a.rounds, "duration": a.duration,
                    "wire_mtu": a.wire_mtu, "sizes": a.sizes, "machine": f"{os.cpu_count()} CPUs, {os.uname().release}",
                    "notes": []}, "samples": []}
    netlab.install_signal_cleanup()
    netlab.sweep_stale()
    t0 = time.monotonic()
    per = a.duration + 2.5
    try:
        with Bed(a.wire_mtu) as bed:
            for k, (size, cfg) in enumerate(tasks, 1):
                left = (len(tasks) - k + 1) * per
                print(f"\r[vhost bench] {k}/{len(tasks)} {size} B {label(cfg):<26} ~{left:4.0f} s left ", end="", flush=True)
                try:
                    s = one_run(bed, cfg, size, a.duration)
                except (RuntimeError, subprocess.TimeoutExpired, netlab.CtlError, json.JSONDecodeError, KeyError) as e:
                    s = {"size": size, "cut_through": cfg[0], "notify": cfg[1], "link": cfg[2], "error": str(e)[:800]}
                    print(f"\n!! {size} B {label(cfg)}: {s['error']}")
                doc["samples"].append(s)
    finally:
        netlab.close_all()
    print(f"\r[vhost bench] done in {time.monotonic() - t0:.0f} s{' ' * 40}")
    doc["summary"] = summarize(doc["samples"], a.sizes)
    row = doc["summary"].get("1500", {})
    cb, co = row.get(label(BASELINE)), row.get(label(("on", "optimistic", "plain")))
    if cb and co and cb["rx_pps"]:
        doc["goal"] = {"pps_ratio": co["rx_pps"] / cb["rx_pps"], "cut_opt_calls_per_MB": co["calls_per_MB"],
                       "copy_batch_calls_per_MB": cb["calls_per_MB"],
                       "met": co["rx_pps"] >= 1.5 * cb["rx_pps"] and co["calls_per_MB"] < cb["calls_per_MB"]}
    (out / "vhost.json").write_text(json.dumps(doc, indent=1))
    write_md(doc, out / "vhost.md")
    if plot(doc, out / "vhost.png"):
        doc["meta"]["plot"] = str(out / "vhost.png")
    print((out / "vhost.md").read_text())
    errors = [s for s in doc["samples"] if "error" in s]
    return 1 if errors and len(errors) == len(doc["samples"]) else 0


if __name__ == "__main__":
    ensure_matplotlib()
    sys.exit(main())
