"""Reach (issue #31): how vnet does across NATs and over a wide-area path, on the wide-area lab
(``vnetlab/wanlab.py``). See bench/README.md, "Reach across NATs and a wide-area path".

    sudo python3 -m bench.reach               # the NAT matrix and the wide-area path (~3 min)
    sudo python3 -m bench.reach --quick       # shorter tests: does it run?

1. The NAT matrix: one site per NAT kind (none, full-cone, port-restricted, symmetric,
   one-to-one), a host behind each with one veth guest, etcd on a public host. Every vnetd is
   started as a new user would: ``--etcd`` (with the overlay and host id it requires), a config
   holding only its guest's interface. For every pair of guests: whether they reach (ping),
   the first reply after both daemons were up, and TCP throughput (iperf3) where they reach.
2. The wide-area path: two public hosts, one behind vnet-pathem (10 ms each way, 0.5 % loss each
   way: 20 ms RTT), both with vnetd on etcd and a veth guest (MTU 1450: nothing fragments):
   native TCP between the hosts against the guests' TCP over vnet, interleaved rounds, and ping
   RTT both ways; vnet's link counters show the guests' bytes crossed the overlay.

Output (``--out``, default results/reach-<UTC time>): reach.json, summary.md, reach.png.
"""

from __future__ import annotations

import socket
import struct
import sys
import threading
import time
from pathlib import Path

from vnetlab import netlab, wanlab
from vnetlab.etcdlab import EtcdServer

from .report import ensure_matplotlib, fmt, md_row, med, pyplot, save, spread
from .session import Progress, arguments, begin, finish, guarded, plots_note, run_meta

KINDS = wanlab.NAT_KINDS
OVERLAY_MATRIX, OVERLAY_WAN = "reach", "wan"
OVERLAY_TRIES, OVERLAY_TPUT = "tries", "tput"
WAN_PATH = dict(delay="10ms", loss="0.5%")
# TCP congestion control: this machine's default is BBR, which does not take random loss for
# congestion; CUBIC (Linux's usual default) does. Both, so the figures mean something either way.
CCS = ("bbr", "cubic")


def parse_args(argv=None):
    ap = arguments(__doc__, "reach", "short tests (1 round of 3 s TCP, 10 s reach deadline)",
                   "rounds of the wide-area TCP comparison (default 5; quick 1)")
    ap.add_argument("--deadline", type=float, help="seconds a pair may take to reach (default 20; quick 10)")
    ap.add_argument("--tcp-seconds", type=int, help="seconds per iperf3 run (default 8; quick 3)")
    ap.add_argument("--tries", type=int, help="first-reply tries per pair of NAT kinds (default 20; quick 3)")
    a = ap.parse_args(argv)
    a.rounds = a.rounds or (1 if a.quick else 5)
    a.deadline = a.deadline or (10.0 if a.quick else 20.0)
    a.tcp_seconds = a.tcp_seconds or (3 if a.quick else 8)
    a.tries = a.tries or (3 if a.quick else 20)
    return a


def start_host(h: netlab.Host, g: netlab.Guest, etcd: EtcdServer, overlay: str, a, mtu=None) -> float:
    """vnetd with only --etcd (and what it requires) and one veth guest; when it answered."""
    line = f"interface add vm veth mac {g.mac} netns {g.name} vni 1" + (f" mtu {mtu}" if mtu else "")
    h.start_vnetd(config=line + "\n", args=["--etcd", etcd.endpoint, "--overlay", overlay, "--host-id", h.role])
    up = time.time()
    for words in a.vnet_set:
        h.ctl("set", *words.split())
    g.configure(h.interface("vm")["ifname"], mtu)
    return up


def _checksum(b: bytes) -> int:
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack(f"!{len(b) // 2}H", b))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def first_reply(src: netlab.Netns, dst: str, ident: int, deadline: float, interval: float = 0.1) -> dict:
    """An ICMP echo from ``src`` to ``dst`` every ``interval`` until the first reply or
    ``deadline`` (wall time): when it came and how many were sent. A raw socket, not ping(8):
    ping gives up at its first error (the guest's ARP failing while nothing reaches), and the
    point here is to keep asking."""
    sock = src.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    sent = 0
    try:
        while time.time() < deadline:
            body = struct.pack("!d", time.time())
            head = struct.pack("!BBHHH", 8, 0, 0, ident, sent)
            pkt = struct.pack("!BBHHH", 8, 0, _checksum(head + body), ident, sent) + body
            try:
                sock.sendto(pkt, (dst, 0))
            except OSError:
                pass  # unreachable for now: ask again
            sent += 1
            until = min(deadline, time.time() + interval)
            while (left := until - time.time()) > 0:
                sock.settimeout(left)
                try:
                    data, addr = sock.recvfrom(2048)
                except OSError:
                    break
                ihl = (data[0] & 0x0F) * 4
                if addr[0] == dst and len(data) >= ihl + 8 and data[ihl] == 0 and \
                        struct.unpack("!H", data[ihl + 4:ihl + 6])[0] == ident:
                    return {"first_reply": time.time(), "sent": sent}
        return {"first_reply": None, "sent": sent}
    finally:
        sock.close()


def first_replies(pairs: list, deadline: float) -> dict:
    """``first_reply`` for every (src guest, dst ip) at once, each until ``deadline`` s from now."""
    end = time.time() + deadline
    out = {}

    def run(i, src, dst):
        out[(src.name, dst)] = first_reply(src, dst, 0x7100 + i, end)
    threads = [threading.Thread(target=run, args=(i, s, d)) for i, (s, d) in enumerate(pairs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline + 10)
    return out


def link_bytes(h: netlab.Host) -> dict:
    """tx/rx bytes summed over the host's links (its derived links to other hosts)."""
    st = h.stats()
    links = {l["name"] for l in h.ctl_json("show", "links", "json")}
    tx = sum(p.get("tx_bytes", 0) for p in st["ports"] if p["name"] in links)
    rx = sum(p.get("rx_bytes", 0) for p in st["ports"] if p["name"] in links)
    return {"tx_bytes": tx, "rx_bytes": rx}


def host_view(h: netlab.Host) -> dict:
    """What a host's vnetd says of its links and of the overlay (for the results)."""
    view = {}
    for words in (("show", "links", "json"), ("show", "cluster", "json")):
        r = h.ctl(*words, check=False)
        view[words[1]] = r.stdout.strip()[:4000] if r.returncode == 0 else f"error: {r.stderr.strip()[:300]}"
    st = h.stats()
    view["drops"] = {k: v for k, v in st.get("daemon", {}).get("drops", {}).items() if v}
    return view


def start_relay(r: netlab.Host, etcd: EtcdServer, overlay: str) -> None:
    """A public host relaying for the others (``--relay``), as the README has it."""
    r.start_vnetd(config="", args=["--etcd", etcd.endpoint, "--overlay", overlay, "--host-id", r.role, "--relay"])


def path_of(h: netlab.Host, peer: str) -> str | None:
    """The path (direct, punched, relayed, unknown) host ``h``'s links to ``peer`` take."""
    r = h.ctl("show", "reach", "json", check=False)
    if r.returncode != 0:
        return None
    import json
    return next((p["path"] for p in json.loads(r.stdout).get("peers", []) if p["host"] == peer), None)


def run_matrix(lab: netlab.Lab, wan: wanlab.WanLab, etcd: EtcdServer, a, prog: Progress, doc: dict) -> None:
    prog.show("NAT matrix: building the sites")
    relay = wan.public_host("R1")
    start_relay(relay, etcd, OVERLAY_MATRIX)
    hosts, guests = {}, {}
    for i, k in enumerate(KINDS, 1):
        s = wan.site(f"S{i}", nat=k)
        hosts[k] = s.host(f"{k}")
        guests[k] = lab.guest(f"g{i}", ip=f"192.168.80.{i}", mac=netlab.mac(1, i, 1))
    prog.show("NAT matrix: starting vnetd on every host (only --etcd)")
    up = {k: start_host(hosts[k], guests[k], etcd, OVERLAY_MATRIX, a) for k in KINDS}
    pairs = [(x, y) for i, x in enumerate(KINDS) for y in KINDS[i + 1:]]
    prog.show(f"NAT matrix: pinging all {len(pairs)} pairs for up to {a.deadline:.0f} s")
    res = first_replies([(guests[x], guests[y].ip_addr) for x, y in pairs], a.deadline)
    prog.step(a.deadline)
    rows = []
    for x, y in pairs:
        r = res[(guests[x].name, guests[y].ip_addr)]
        t_up = max(up[x], up[y])
        row = {"a": x, "b": y, "reaches": r["first_reply"] is not None, "echoes_sent": r["sent"],
               "first_reply_s": round(r["first_reply"] - t_up, 3) if r["first_reply"] else None,
               "tcp_mbps": None, "path": path_of(hosts[x], y), "path_back": path_of(hosts[y], x)}
        rows.append(row)
    for row in rows:
        if not row["reaches"]:
            continue
        x, y = row["a"], row["b"]
        prog.show(f"NAT matrix: iperf3 {x} -> {y}")
        before = link_bytes(hosts[x])
        try:
            r = lab.iperf(guests[y], guests[y].ip_addr, guests[x], seconds=a.tcp_seconds)
            row["tcp_mbps"] = round(r.gbps * 1000, 1)
            row["tcp_bytes"] = r.bytes
            row["link_tx_bytes"] = link_bytes(hosts[x])["tx_bytes"] - before["tx_bytes"]
        except netlab.LabError as e:
            row["tcp_error"] = str(e)[:500]
        prog.step(a.tcp_seconds)
    doc["matrix"] = rows
    doc["matrix_hosts"] = {k: {"underlay_ip": hosts[k].underlay_ip, "site_public_ip": hosts[k].site.public_ip,
                               "view": host_view(hosts[k])} for k in KINDS}
    for h in list(hosts.values()) + [relay]:
        h.stop_vnetd()


# Pairs of sites for the repeated first-reply tries and the throughput comparison: two cone
# NATs (punched), two port-restricted ones (punched), two symmetric ones (relayed); no NAT
# for the reference.
TRY_PAIRS = (("full-cone", "full-cone"), ("port-restricted", "port-restricted"), ("symmetric", "symmetric"))


def fresh_pair(lab, wan, etcd, overlay: str, kinds: tuple, tag: str, a, mtu=1450) -> dict:
    """Two sites of ``kinds`` with a host and a veth guest each, nothing started."""
    hs, gs = [], []
    for j, k in enumerate(kinds, 1):
        s = wan.site(f"{tag}{j}", nat=k)
        hs.append(s.host(f"{tag}h{j}"))
        gs.append(lab.guest(f"{tag}g{j}", ip=f"192.168.82.{len(wan.sites)}", mac=netlab.mac(3, len(wan.sites), 1)))
    return {"kinds": kinds, "hosts": hs, "guests": gs, "mtu": mtu}


def start_pair(p: dict, etcd: EtcdServer, overlay: str, a) -> dict:
    """Both hosts of a pair at once: when each answered and when each agent had read the
    overlay (the agent waits for a burst of hosts to settle first, issue #19)."""
    import json
    up, joined = {}, {}

    def one(h, g):
        up[h.role] = start_host(h, g, etcd, overlay, a, mtu=p["mtu"])
        def synced():
            r = h.ctl("show", "cluster", "json", check=False)
            return r.returncode == 0 and (json.loads(r.stdout).get("agent") or {}).get("syncs", 0) > 0
        netlab.wait_until(synced, 30, 0.02, what=f"{h.role}'s agent")
        joined[h.role] = time.time()
    ts = [threading.Thread(target=one, args=(h, g)) for h, g in zip(p["hosts"], p["guests"])]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return {"up": max(up.values()), "joined": max(joined.values())}


def run_tries(lab, wan, etcd, a, prog: Progress, doc: dict) -> None:
    """For each pair of NAT kinds, ``tries`` times: both daemons started afresh together (a
    teardown between tries, so each is a first start) into an overlay that already runs (a
    relay), pinging from the first guest until a reply: seconds from both daemons up, and from
    both agents having read the overlay; the path then."""
    relay = wan.public_host("R2")
    start_relay(relay, etcd, OVERLAY_TRIES)
    rows = []
    for n, kinds in enumerate(TRY_PAIRS):
        p = fresh_pair(lab, wan, etcd, OVERLAY_TRIES, kinds, f"T{n}", a)
        for t in range(a.tries):
            prog.show(f"first replies: {kinds[0]} / {kinds[1]} try {t + 1}/{a.tries}")
            when = start_pair(p, etcd, OVERLAY_TRIES, a)
            g1, g2 = p["guests"]
            r = first_reply(g1, g2.ip_addr, 0x7200 + t, time.time() + a.deadline, interval=0.05)
            first = r["first_reply"]
            rows.append({"a": kinds[0], "b": kinds[1], "try": t,
                         "from_up_s": round(first - when["up"], 3) if first else None,
                         "from_joined_s": round(first - when["joined"], 3) if first else None,
                         "path": path_of(p["hosts"][0], p["hosts"][1].role)})
            for h in p["hosts"]:
                # `vnetctl teardown`: the daemon revokes its lease and removes what it made, so
                # the next try is a first start that no earlier lease holds up.
                h.ctl("teardown", check=False)
                h.vnetd.proc.wait(timeout=20)
            prog.step(1)
    relay.stop_vnetd()
    doc["tries"] = rows


def run_throughput(lab, wan, etcd, a, prog: Progress, doc: dict, rng) -> None:
    """TCP between the guests of three pairs on the same lab, interleaved rounds: no NAT,
    punched through two port-restricted NATs (the kernel fast path), relayed between two
    symmetric ones (vnetd at both ends and the relay). Guests' MTU 1450: a relayed path's 12
    bytes more are told to the guest (path MTU)."""
    relay = wan.public_host("R3")
    start_relay(relay, etcd, OVERLAY_TPUT)
    pairs = {"no NAT": ("none", "none"), "punched": ("port-restricted", "port-restricted"),
             "relayed": ("symmetric", "symmetric")}
    built = {}
    for n, (name, kinds) in enumerate(pairs.items()):
        p = fresh_pair(lab, wan, etcd, OVERLAY_TPUT, kinds, f"P{n}", a)
        start_pair(p, etcd, OVERLAY_TPUT, a)
        built[name] = p
    for p in built.values():
        lab.wait_ping(p["guests"][0], p["guests"][1].ip_addr, timeout=30)
    samples = []
    for rnd in range(a.rounds):
        order = list(built)
        rng.shuffle(order)
        for name in order:
            p = built[name]
            g1, g2 = p["guests"]
            prog.show(f"throughput: round {rnd + 1}/{a.rounds} {name}")
            try:
                r = lab.iperf(g2, g2.ip_addr, g1, seconds=a.tcp_seconds)
                samples.append({"round": rnd, "pair": name, "mbps": round(r.gbps * 1000, 1),
                                "path": path_of(p["hosts"][0], p["hosts"][1].role)})
            except netlab.LabError as e:
                samples.append({"round": rnd, "pair": name, "mbps": None, "error": str(e)[:300]})
            prog.step(a.tcp_seconds)
    for p in built.values():
        for h in p["hosts"]:
            h.stop_vnetd()
    relay.stop_vnetd()
    doc["throughput"] = samples


def run_wan(lab: netlab.Lab, wan: wanlab.WanLab, etcd: EtcdServer, a, prog: Progress, doc: dict, rng) -> None:
    prog.show("wide-area path: building")
    w1 = wan.public_host("W1")
    w2 = wan.public_host("W2", path=wanlab.Path(**WAN_PATH))
    g1 = lab.guest("wg1", ip="192.168.81.1", mac=netlab.mac(2, 1, 1))
    g2 = lab.guest("wg2", ip="192.168.81.2", mac=netlab.mac(2, 2, 1))
    start_host(w1, g1, etcd, OVERLAY_WAN, a, mtu=1450)
    start_host(w2, g2, etcd, OVERLAY_WAN, a, mtu=1450)
    lab.wait_ping(g1, g2.ip_addr, timeout=30)
    lab.ping(w1, w2.underlay_ip, count=2)
    samples = []
    for rnd in range(a.rounds):
        order = [(cfg, cc) for cfg in ("native", "vnet") for cc in CCS]
        rng.shuffle(order)
        for cfg, cc in order:
            prog.show(f"wide-area path: round {rnd + 1}/{a.rounds} TCP {cfg} {cc}")
            before = link_bytes(w1)
            pe0 = w2.pathem.counters()
            extra = ["-C", cc]
            try:
                if cfg == "native":
                    r = lab.iperf(w2, w2.underlay_ip, w1, seconds=a.tcp_seconds, extra=extra)
                else:
                    r = lab.iperf(g2, g2.ip_addr, g1, seconds=a.tcp_seconds, extra=extra)
                s = {"round": rnd, "config": cfg, "cc": cc, "metric": "tcp", "mbps": round(r.gbps * 1000, 2),
                     "bytes": r.bytes, "retransmits": r.retransmits}
            except netlab.LabError as e:
                s = {"round": rnd, "config": cfg, "cc": cc, "metric": "tcp", "mbps": None, "error": str(e)[:500]}
            pe1 = w2.pathem.counters()
            s["link_tx_bytes"] = link_bytes(w1)["tx_bytes"] - before["tx_bytes"]
            s["path_loss_down"] = _loss(pe0, pe1, "b_to_a")
            s["path_loss_up"] = _loss(pe0, pe1, "a_to_b")
            samples.append(s)
            prog.step(a.tcp_seconds)
        for cfg, (src, dst) in (("native", (w1, w2.underlay_ip)), ("vnet", (g1, g2.ip_addr))):
            prog.show(f"wide-area path: round {rnd + 1}/{a.rounds} ping {cfg}")
            r = lab.ping(src, dst, count=20, interval=0.05, wait=1)
            samples.append({"round": rnd, "config": cfg, "metric": "rtt", "rtt_ms": r.avg_ms,
                            "sent": r.sent, "received": r.received})
            prog.step(2)
    doc["wan"] = {"path": WAN_PATH, "guest_mtu": 1450, "samples": samples,
                  "pathem": w2.pathem.counters(),
                  "hosts": {h.role: host_view(h) for h in (w1, w2)}}


def ping_rtts(src: netlab.Netns, dst: str, count: int, interval: float) -> list:
    r = src.exec("ping", "-n", "-c", count, "-i", interval, "-W", 1, dst, check=False, timeout=count * interval + 20)
    return [float(line.split("time=")[1].split()[0]) for line in r.stdout.splitlines() if "time=" in line]


def run_forwarder(lab: netlab.Lab, wan: wanlab.WanLab, a, prog: Progress, doc: dict) -> None:
    """vnet-pathem's own cost: TCP and ping from one public host to three others: directly on
    the segment, behind a path of 0 delay, behind a path of 10 ms each way (no loss)."""
    prog.show("forwarder: building")
    src = wan.public_host("F0")
    dsts = {"direct": wan.public_host("F1"),
            "pathem 0 ms": wan.public_host("F2", path=wanlab.Path()),
            "pathem 10 ms each way": wan.public_host("F3", path=wanlab.Path(delay="10ms"))}
    for d in dsts.values():
        ping_rtts(src, d.underlay_ip, 2, 0.1)
    samples = []
    for rnd in range(a.rounds):
        for name, d in dsts.items():
            prog.show(f"forwarder: round {rnd + 1}/{a.rounds} {name}")
            r = lab.iperf(d, d.underlay_ip, src, seconds=a.tcp_seconds)
            rtts = ping_rtts(src, d.underlay_ip, 100, 0.01)
            samples.append({"round": rnd, "config": name, "mbps": round(r.gbps * 1000, 1),
                            "rtts_ms": rtts})
            prog.step(a.tcp_seconds + 1)
    doc["forwarder"] = {"samples": samples,
                        "counters": {n: d.pathem.counters() for n, d in dsts.items() if d.pathem}}


def _loss(c0: dict, c1: dict, d: str) -> float | None:
    a, b = c0[d]["counters"], c1[d]["counters"]
    rx = b["rx_packets"] - a["rx_packets"]
    return round((b["drop_loss"] - a["drop_loss"]) / rx, 5) if rx else None


# --- the report -------------------------------------------------------------------------------

def summary(doc: dict) -> str:
    m = doc["meta"]
    lines = ["# Reach across NATs and a wide-area path (issue #31)", "",
             f"Run {m['started']} on {m.get('vnet_version', '?')}, {m['ncpu']} CPUs; `{m['command']}`.", ""]
    if doc.get("matrix"):
        n = len(doc["matrix"])
        ok = sum(r["reaches"] for r in doc["matrix"])
        lines += ["## The NAT matrix", "",
                  f"{ok} of {n} guest pairs reach each other. vnetd started with `--etcd` only (plus the "
                  "overlay and host id it requires); one veth guest per host; from guest A an ICMP echo "
                  f"every 0.1 s to guest B until the first reply or {doc['meta']['deadline_s']:.0f} s.", "",
                  md_row(["guest A behind", "guest B behind", "reaches", "path A->B / B->A", "echoes sent",
                          "first reply (s)", "TCP Mbit/s"]),
                  md_row(["---"] * 7)]
        for r in doc["matrix"]:
            lines.append(md_row([r["a"], r["b"], "yes" if r["reaches"] else "**no**",
                                 f"{r.get('path') or '-'} / {r.get('path_back') or '-'}",
                                 r["echoes_sent"], fmt(r["first_reply_s"]), fmt(r["tcp_mbps"])]))
        lines += ["", "What each host published and derived is in `reach.json` (`matrix_hosts`: "
                  "`show links`, `show cluster`, drop counters).", ""]
    if doc.get("tries"):
        lines += ["## First replies, pair by pair", "",
                  "Both daemons of a pair started afresh together (a teardown between tries) into an overlay "
                  "that runs (a public relay); an ICMP echo every 50 ms from guest A. Seconds from both "
                  "daemons answering, and from both etcd agents having read the overlay (the agent first waits "
                  "for a burst of starting hosts to settle, issue #19). p50 / p95 [min-max] over the tries.", "",
                  md_row(["pair", "tries", "replied", "from up p50 / p95", "from joined p50 / p95", "paths"]),
                  md_row(["---"] * 6)]
        for kinds in TRY_PAIRS:
            rs = [r for r in doc["tries"] if (r["a"], r["b"]) == kinds]
            ups = sorted(r["from_up_s"] for r in rs if r["from_up_s"] is not None)
            js = sorted(r["from_joined_s"] for r in rs if r["from_joined_s"] is not None)
            p95 = lambda v: v[min(len(v) - 1, int(0.95 * len(v)))] if v else None  # noqa: E731
            paths = sorted({r["path"] or "-" for r in rs})
            lines.append(md_row([f"{kinds[0]} / {kinds[1]}", len(rs), len(ups),
                                 f"{fmt(med(ups))} / {fmt(p95(ups))} [{spread(ups)}]" if ups else "-",
                                 f"{fmt(med(js))} / {fmt(p95(js))} [{spread(js)}]" if js else "-",
                                 ", ".join(paths)]))
        lines.append("")
    if doc.get("throughput"):
        t = doc["throughput"]
        base = med(s["mbps"] for s in t if s["pair"] == "no NAT" and s["mbps"])
        punched = med(s["mbps"] for s in t if s["pair"] == "punched" and s["mbps"])
        lines += ["## Throughput: direct, punched, relayed", "",
                  "TCP guest to guest (iperf3), interleaved rounds on the same lab; guests' MTU 1450.", "",
                  md_row(["pair", "path", "TCP Mbit/s median [min-max]", "x no NAT", "x punched"]),
                  md_row(["---"] * 5)]
        for name in ("no NAT", "punched", "relayed"):
            ss = [s for s in t if s["pair"] == name and s["mbps"]]
            v = med(s["mbps"] for s in ss)
            lines.append(md_row([name, ", ".join(sorted({s.get("path") or "-" for s in ss})) or "-",
                                 f"{fmt(v)} [{spread([s['mbps'] for s in ss])}]" if ss else "-",
                                 f"{v / base:.2f}" if v and base else "-",
                                 f"{v / punched:.2f}" if v and punched else "-"]))
        lines.append("")
    if doc.get("wan"):
        w = doc["wan"]
        lines += ["## The wide-area path", "",
                  f"Two public hosts, one behind vnet-pathem ({w['path']['delay']} each way, {w['path']['loss']} "
                  f"loss each way); guests' MTU {w['guest_mtu']}. Medians over rounds, [min-max].", "",
                  md_row(["path", "TCP cc", "TCP Mbit/s", "x native", "retransmits (median)",
                          "link bytes / TCP bytes"]),
                  md_row(["---"] * 6)]
        for cc in CCS:
            nat = med(s["mbps"] for s in w["samples"] if s["config"] == "native" and s["metric"] == "tcp"
                      and s.get("cc") == cc)
            for cfg in ("native", "vnet"):
                tcp = [s for s in w["samples"] if s["config"] == cfg and s["metric"] == "tcp" and s.get("mbps")
                       and s.get("cc") == cc]
                v = med(s["mbps"] for s in tcp)
                ev = (fmt(med(s["link_tx_bytes"] / s["bytes"] for s in tcp if s["bytes"])) if cfg == "vnet" else "–")
                lines.append(md_row([cfg, cc, f"{fmt(v)} [{spread([s['mbps'] for s in tcp])}]" if tcp else "–",
                                     f"{v / nat:.2f}" if v and nat else "–",
                                     fmt(med(s["retransmits"] for s in tcp)), ev]))
        lines += ["", md_row(["path", "ping RTT ms (median of round averages) [min-max]"]), md_row(["---"] * 2)]
        for cfg in ("native", "vnet"):
            rtt = [s["rtt_ms"] for s in w["samples"] if s["config"] == cfg and s["metric"] == "rtt" and s["rtt_ms"]]
            lines.append(md_row([cfg, f"{fmt(med(rtt))} [{spread(rtt)}]" if rtt else "–"]))
        losses = [s["path_loss_down"] for s in w["samples"] if s["metric"] == "tcp" and s.get("path_loss_down") is not None]
        if losses:
            lines += ["", f"Loss the forwarder applied to the TCP data direction per run: {spread(losses, lambda x: f'{x * 100:.2f} %')}."]
        lines.append("")
    if doc.get("forwarder"):
        f = doc["forwarder"]
        names = list(dict.fromkeys(s["config"] for s in f["samples"]))
        lines += ["## The forwarder's own cost (vnet-pathem)", "",
                  "One public host to three others: directly on the segment, behind vnet-pathem with no "
                  "impairment, behind vnet-pathem with 10 ms each way (no loss). TCP (default cc) and "
                  "100 pings at 10 ms intervals per round; RTT median and p5-p95 over all rounds.", "",
                  md_row(["destination", "TCP Mbit/s [min-max]", "RTT median ms", "RTT p5-p95 ms",
                          "added over direct (median)"]), md_row(["---"] * 5)]
        base = None
        for n in names:
            ss = [s for s in f["samples"] if s["config"] == n]
            rtts = sorted(x for s in ss for x in s["rtts_ms"])
            if not rtts:
                continue
            m = med(rtts)
            p5, p95 = rtts[int(0.05 * (len(rtts) - 1))], rtts[int(0.95 * (len(rtts) - 1))]
            base = m if base is None else base
            lines.append(md_row([n, f"{fmt(med(s['mbps'] for s in ss))} [{spread([s['mbps'] for s in ss])}]",
                                 f"{m:.3f}", f"{p5:.3f}-{p95:.3f}", f"{m - base:+.3f} ms"]))
        lines.append("")
    if doc["meta"].get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in doc["meta"]["notes"]] + [""]
    return "\n".join(lines)


def write_summary(doc: dict, path: Path) -> None:
    path.write_text(summary(doc))


def plot(doc: dict, out: Path) -> list:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [1, 1.2]})
    ax = axes[0]
    idx = {k: i for i, k in enumerate(KINDS)}
    grid = [[float("nan")] * len(KINDS) for _ in KINDS]
    for r in doc.get("matrix", []):
        v = r["first_reply_s"] if r["reaches"] else -1
        grid[idx[r["a"]]][idx[r["b"]]] = grid[idx[r["b"]]][idx[r["a"]]] = v
    import numpy as np
    arr = np.ma.masked_invalid(np.array(grid, dtype=float))
    cmap = plt.get_cmap("viridis").copy()
    cmap.set_under("#d62728")
    cmap.set_bad("#eeeeee")
    im = ax.imshow(arr, cmap=cmap, vmin=0, vmax=max(2.0, float(arr.max()) if arr.count() else 2.0))
    for i in range(len(KINDS)):
        for j in range(len(KINDS)):
            v = grid[i][j]
            if v == v:
                ax.text(j, i, "no" if v < 0 else f"{v:.1f}s", ha="center", va="center",
                        color="white" if v < 0 else "black", fontsize=9)
    ax.set_xticks(range(len(KINDS)), KINDS, rotation=30, ha="right")
    ax.set_yticks(range(len(KINDS)), KINDS)
    ax.set_title("guest pairs: first reply after both daemons up\n(red: no reply)")
    fig.colorbar(im, ax=ax, fraction=0.046, label="s")
    ax = axes[1]
    w = doc.get("wan")
    if w:
        cfgs = [(c, cc) for cc in CCS for c in ("native", "vnet")]
        tcp = [[s["mbps"] for s in w["samples"] if s["config"] == c and s.get("cc") == cc and s["metric"] == "tcp"
                and s.get("mbps")] for c, cc in cfgs]
        ax.boxplot([t if t else [float("nan")] for t in tcp], labels=[f"{c}\nTCP {cc}" for c, cc in cfgs])
        ax.set_ylabel("Mbit/s")
        ax.set_title(f"20 ms RTT, {w['path']['loss']} loss each way: TCP over the path")
        ax.set_ylim(bottom=0)
    return [save(fig, out / "reach.png")]


def main(argv=None) -> int:
    a = parse_args(argv)
    ensure_matplotlib()
    started, out, raw, seed, rng = begin("reach", a.out, "raw", a.seed)
    for b in (netlab.VNETD, netlab.VNETCTL, wanlab.PATHEM):
        if not b.exists():
            print(f"bench.reach: {b} missing (cargo build --release)", file=sys.stderr)
            return 2
    doc = {"meta": {**run_meta(started), "deadline_s": a.deadline, "tcp_seconds": a.tcp_seconds,
                    "rounds": a.rounds, "notes": plots_note()}}
    npairs = len(KINDS) * (len(KINDS) - 1) // 2
    prog = Progress(a.deadline + 30 + npairs * a.tcp_seconds + a.rounds * (4 * a.tcp_seconds + 4)
                    + a.rounds * 3 * (a.tcp_seconds + 1) + 40 + len(TRY_PAIRS) * a.tries * 4
                    + a.rounds * 3 * a.tcp_seconds,
                    1 + npairs + 9 * a.rounds + len(TRY_PAIRS) * a.tries + 3 * a.rounds)
    with guarded(doc["meta"]["notes"], prog):
        lab = wanlab.new_lab("reach")
        wan = wanlab.WanLab(lab)
        etcd = EtcdServer(lab, overlay=OVERLAY_MATRIX)
        wan.adopt(etcd.ns)
        etcd.start()
        run_matrix(lab, wan, etcd, a, prog, doc)
        run_tries(lab, wan, etcd, a, prog, doc)
        run_throughput(lab, wan, etcd, a, prog, doc, rng)
        run_wan(lab, wan, etcd, a, prog, doc, rng)
        run_forwarder(lab, wan, a, prog, doc)
        doc["topology"] = wan.describe()
        etcd.stop()
    finish(doc, prog, out / "reach.json", lambda: plot(doc, out), write_summary, out / "summary.md")
    print(summary(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
