"""Reach (issue #31): how vnet does across NATs and over a wide-area path, on the wide-area lab
(``vnetlab/wanlab.py``). See bench/README.md, "Reach across NATs and a wide-area path".

    sudo python3 -m bench.reach               # the NAT matrix and the wide-area path (~3 min)
    sudo python3 -m bench.reach --quick       # shorter tests: does it run?

1. The NAT matrix: one site per NAT kind (none, full-cone, port-restricted, symmetric,
   one-to-one), a host behind each with one veth guest, etcd on a public host. Every vnetd is
   started as a new user would: ``--etcd`` (with the overlay and host id it requires), a config
   holding only its guest's interface. For every pair of guests: whether they reach (ping),
   the first reply after both daemons were up, and TCP throughput (iperf3) where they reach.
2. The wide-area path: two pairs of public hosts, in each one behind its own vnet-pathem (10 ms
   each way, 0.5 % loss each way: 20 ms RTT), all with vnetd on etcd and a veth guest (MTU
   1450: nothing fragments), one pair's links plain and the other's encrypted: native TCP
   (BBR and CUBIC), ping and MPI ping-pong (NetPIPE) between the hosts against the same
   between their guests over vnet, interleaved rounds; vnet's link counters show the guests'
   bytes crossed the overlay; meanwhile a guest-to-guest echo every 0.1 s, each host's reach
   path, etcd lease and sessions, and the links' rekeys are watched (no stall, no lease lost).

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
OVERLAY_TRIES, OVERLAY_TPUT, OVERLAY_BUDGET = "tries", "tput", "budget"
# The throughput phase's relay: a budget per pair above what the lab's paths carry, so the
# relayed figure is the relay's data path; a second relay keeps vnetd's default budget.
TPUT_RELAY_MBIT = 20_000
THROUGHPUT_PAIRS = ("no NAT", "punched", "relayed", "relayed, default budget")
WAN_PATH = dict(delay="10ms", loss="0.5%")
# TCP congestion control: this machine's default is BBR, which does not take random loss for
# congestion; CUBIC (Linux's usual default) does. Both, so the figures mean something either way.
CCS = ("bbr", "cubic")
PHASES = ("matrix", "tries", "throughput", "wan", "forwarder")


def parse_args(argv=None):
    ap = arguments(__doc__, "reach", "short tests (1 round of 3 s TCP, 10 s reach deadline)",
                   "rounds of the wide-area TCP comparison (default 5; quick 1)")
    ap.add_argument("--deadline", type=float, help="seconds a pair may take to reach (default 20; quick 10)")
    ap.add_argument("--tcp-seconds", type=int, help="seconds per iperf3 run (default 8; quick 3)")
    ap.add_argument("--tries", type=int, help="first-reply tries per pair of NAT kinds (default 20; quick 3)")
    ap.add_argument("--phases", default=",".join(PHASES),
                    help=f"phases to run, comma separated (default all: {','.join(PHASES)})")
    a = ap.parse_args(argv)
    a.phases = [x.strip() for x in a.phases.split(",") if x.strip()]
    bad = [x for x in a.phases if x not in PHASES]
    if bad:
        ap.error(f"unknown phase(s) {', '.join(bad)}; phases are {', '.join(PHASES)}")
    a.rounds = a.rounds or (1 if a.quick else 5)
    a.deadline = a.deadline or (10.0 if a.quick else 20.0)
    a.tcp_seconds = a.tcp_seconds or (3 if a.quick else 8)
    a.tries = a.tries or (3 if a.quick else 20)
    return a


def start_host(h: netlab.Host, g: netlab.Guest, etcd: EtcdServer, overlay: str, a, mtu=None,
               encrypt: bool = False, lab: netlab.Lab | None = None) -> float:
    """vnetd with only --etcd (and what it requires) and one veth guest; when it answered.
    ``encrypt``: with a host key (``--key-file``), so its links to other keyed hosts encrypt."""
    line = f"interface add vm veth mac {g.mac} netns {g.name} vni 1" + (f" mtu {mtu}" if mtu else "")
    args = ["--etcd", etcd.endpoint, "--overlay", overlay, "--host-id", h.role]
    if encrypt:
        key = lab.workdir / f"{h.role}.key"
        if not key.exists():
            h.exec(str(netlab.VNETD), "--gen-key", str(key))
        args += ["--key-file", str(key)]
    h.start_vnetd(config=line + "\n", args=args)
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


def start_relay(r: netlab.Host, etcd: EtcdServer, overlay: str, rate_mbit: int | None = None) -> None:
    """A public host relaying for the others (``--relay``), as the README has it; each pair's
    budget ``rate_mbit`` (``--relay-rate``) when given."""
    extra = ["--relay-rate", str(rate_mbit)] if rate_mbit else []
    r.start_vnetd(config="", args=["--etcd", etcd.endpoint, "--overlay", overlay, "--host-id", r.role, "--relay"]
                  + extra)


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
    """TCP between the guests of four pairs on the same lab, interleaved rounds: no NAT,
    punched through two port-restricted NATs, relayed between two symmetric ones (the kernel
    fast path at both ends and on the relay, whose budget per pair is above the paths'), and
    relayed the same way in an overlay of its own whose relay has vnetd's default budget (1
    Gbit/s per pair: a policer TCP meets). Guests' MTU 1450: a relayed path's 12 bytes more
    are told to the guest (path MTU)."""
    relay = wan.public_host("R3")
    start_relay(relay, etcd, OVERLAY_TPUT, rate_mbit=TPUT_RELAY_MBIT)
    relay_default = wan.public_host("R4")
    start_relay(relay_default, etcd, OVERLAY_BUDGET)
    pairs = {"no NAT": (("none", "none"), OVERLAY_TPUT),
             "punched": (("port-restricted", "port-restricted"), OVERLAY_TPUT),
             "relayed": (("symmetric", "symmetric"), OVERLAY_TPUT),
             "relayed, default budget": (("symmetric", "symmetric"), OVERLAY_BUDGET)}
    built = {}
    for n, (name, (kinds, overlay)) in enumerate(pairs.items()):
        p = fresh_pair(lab, wan, etcd, overlay, kinds, f"P{n}", a)
        start_pair(p, etcd, overlay, a)
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
    relay_default.stop_vnetd()
    doc["throughput"] = samples
    doc["throughput_relay_mbit"] = {"relayed": TPUT_RELAY_MBIT, "relayed, default budget": 1000}


WAN_PAIRS = (("vnet", False), ("vnet-encrypted", True))
# NetPIPE over the wide-area path: sizes 1..MPI_UPPER bytes, MPI_REPEATS round trips each.
MPI_UPPER, MPI_REPEATS = 16, 30


class Liveness:
    """Watches a wide-area pair for the issue's "no link declared dead, no rekey stall, no etcd
    lease lost" while the rounds run: each host's reach path to the other (sampled every
    second), its etcd lease and sessions, its link's rekeys; and an ICMP echo from guest to
    guest every 0.1 s, whose longest run of lost echoes is the longest stall anything saw."""

    def __init__(self, hosts: list, peer_of: dict, g1: netlab.Guest, g2_ip: str):
        self.hosts, self.peer_of = hosts, peer_of
        self.samples = {h.role: [] for h in hosts}
        self.states = {h.role: [] for h in hosts}
        self.start = {h.role: self._cluster(h) for h in hosts}
        self.links0 = {h.role: self._link(h) for h in hosts}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        # To a file: a pipe nobody reads fills after ~800 lines and stops ping (seen).
        self.ping_log = g1.lab.workdir / f"liveness-{g1.name}.txt"
        self._ping_out = open(self.ping_log, "w")
        self.ping = g1.popen("ping", "-n", "-D", "-i", "0.1", "-W", "1", g2_ip, stdout=self._ping_out,
                             stderr=netlab.subprocess.STDOUT)
        self._t.start()

    @staticmethod
    def _cluster(h) -> dict:
        import json
        a = json.loads(h.ctl("show", "cluster", "json")).get("agent") or {}
        return {"lease": a.get("lease"), "sessions": a.get("sessions")}

    @staticmethod
    def _links(h) -> list:
        import json
        doc = json.loads(h.ctl("show", "links", "json"))
        return doc if isinstance(doc, list) else doc.get("links", [])

    def _link(self, h) -> dict:
        link = next(iter(self._links(h)), {})
        c = link.get("encrypted") or {}
        return {"name": link.get("name"), "state": link.get("state"), "rekeys": c.get("rekeys"),
                "handshakes": c.get("handshakes_completed")}

    def _run(self):
        import json
        while not self._stop.wait(1.0):
            for h in self.hosts:
                try:
                    peers = json.loads(h.ctl("show", "reach", "json"))["peers"]
                    p = next((x["path"] for x in peers if x["host"] == self.peer_of[h.role]), None)
                    st = self._link(h)["state"]
                except Exception as e:  # noqa: BLE001 (a sample lost is reported, not fatal)
                    p = st = f"error: {str(e)[:80]}"
                self.samples[h.role].append(p)
                self.states[h.role].append(st)

    def stop(self) -> dict:
        self._stop.set()
        self._t.join(timeout=10)
        self.ping.send_signal(2)
        self.ping.wait(timeout=10)
        self._ping_out.close()
        text = self.ping_log.read_text(errors="replace")
        seqs = sorted({int(line.split("icmp_seq=")[1].split()[0]) for line in text.splitlines() if "icmp_seq=" in line
                       and "time=" in line})
        gaps = [b - a - 1 for a, b in zip(seqs, seqs[1:])]
        sent = seqs[-1] if seqs else 0
        out = {"echoes_sent": sent, "echoes_answered": len(seqs),
               "longest_unanswered_run": max(gaps, default=0),
               "longest_stall_s": round(0.1 * (max(gaps, default=0) + 1), 1)}
        for h in self.hosts:
            end, link = self._cluster(h), self._link(h)
            ps = self.samples[h.role]
            out[h.role] = {"path_samples": len(ps),
                           "not_direct": sum(1 for p in ps if p not in ("direct", "punched")),
                           "paths_seen": sorted({str(p) for p in ps}),
                           "link_not_up": sum(1 for x in self.states[h.role] if x != "up"),
                           "link_states_seen": sorted({str(x) for x in self.states[h.role]}),
                           "lease_kept": end["lease"] == self.start[h.role]["lease"] and end["lease"] is not None,
                           "etcd_sessions_added": (end["sessions"] or 0) - (self.start[h.role]["sessions"] or 0),
                           "rekeys": None if link["rekeys"] is None else link["rekeys"] - (self.links0[h.role]["rekeys"] or 0),
                           "handshakes": link["handshakes"]}
        return out


def wan_mpi(lab: netlab.Lab, src: netlab.Netns, src_ip: str, dst: netlab.Netns, dst_ip: str, subnet: str,
            raw: Path, tag: str) -> float:
    """NetPIPE (MPI, two ranks, TCP over ``subnet`` only) between ``src`` and ``dst``: the
    8-byte one-way latency in microseconds."""
    from .mpi import in_dir, job_output, mpirun_argv, netpipe_argv, netpipe_result, write_agent
    work = lab.workdir / f"mpi-{tag}"
    agent = write_agent(work, {src_ip: src.name, dst_ip: dst.name})
    out = work / "np.out"
    out.unlink(missing_ok=True)
    argv = mpirun_argv(agent, f"{src_ip},{dst_ip}", 2, subnet) + netpipe_argv(MPI_UPPER, MPI_REPEATS, out)
    r = src.exec("sh", "-c", in_dir(work, argv), check=False, timeout=300)
    res = netpipe_result(job_output(r, out, "NetPIPE", raw / f"netpipe-{tag}.out", netlab.LabError), MPI_REPEATS)
    if res is None:
        raise netlab.LabError("NetPIPE wrote no results")
    return res["lat"][2] * 1e6


def run_wan(lab: netlab.Lab, wan: wanlab.WanLab, etcd: EtcdServer, a, prog: Progress, doc: dict, rng,
            raw: Path) -> None:
    """Two pairs of public hosts, each with one host behind its own vnet-pathem with the same
    impairment (10 ms, 0.5 % each way): one pair's links plain, the other's encrypted. Each
    pair's native TCP, ping and MPI ping-pong between the hosts against the same between its
    guests over vnet, interleaved, while `Liveness` watches the links, leases and rekeys."""
    pairs = {}
    for i, (cfg, encrypt) in enumerate(WAN_PAIRS):
        prog.show(f"wide-area path: building {cfg}")
        w1 = wan.public_host(f"W{2 * i + 1}")
        w2 = wan.public_host(f"W{2 * i + 2}", path=wanlab.Path(**WAN_PATH))
        net = f"192.168.{81 + i}"
        g1 = lab.guest(f"wg{2 * i + 1}", ip=f"{net}.1", mac=netlab.mac(2 + i, 1, 1))
        g2 = lab.guest(f"wg{2 * i + 2}", ip=f"{net}.2", mac=netlab.mac(2 + i, 2, 1))
        overlay = f"{OVERLAY_WAN}-{cfg}"
        start_host(w1, g1, etcd, overlay, a, mtu=1450, encrypt=encrypt, lab=lab)
        start_host(w2, g2, etcd, overlay, a, mtu=1450, encrypt=encrypt, lab=lab)
        pairs[cfg] = dict(w1=w1, w2=w2, g1=g1, g2=g2, net=net)
    for cfg, p in pairs.items():
        lab.wait_ping(p["g1"], p["g2"].ip_addr, timeout=30)
        lab.ping(p["w1"], p["w2"].underlay_ip, count=2)
        p["live"] = Liveness([p["w1"], p["w2"]], {p["w1"].role: p["w2"].role, p["w2"].role: p["w1"].role},
                             p["g1"], p["g2"].ip_addr)
    t0 = time.time()
    samples = []
    for rnd in range(a.rounds):
        order = [(pair, kind, cc) for pair in pairs for kind in ("native", "vnet") for cc in CCS]
        rng.shuffle(order)
        for pair, kind, cc in order:
            p = pairs[pair]
            cfg = "native" if kind == "native" else pair
            prog.show(f"wide-area path: round {rnd + 1}/{a.rounds} TCP {cfg} {cc} ({pair} pair)")
            before = link_bytes(p["w1"])
            pe0 = p["w2"].pathem.counters()
            extra = ["-C", cc]
            try:
                if kind == "native":
                    r = lab.iperf(p["w2"], p["w2"].underlay_ip, p["w1"], seconds=a.tcp_seconds, extra=extra)
                else:
                    r = lab.iperf(p["g2"], p["g2"].ip_addr, p["g1"], seconds=a.tcp_seconds, extra=extra)
                s = {"round": rnd, "pair": pair, "config": cfg, "cc": cc, "metric": "tcp",
                     "mbps": round(r.gbps * 1000, 2), "bytes": r.bytes, "retransmits": r.retransmits}
            except netlab.LabError as e:
                s = {"round": rnd, "pair": pair, "config": cfg, "cc": cc, "metric": "tcp", "mbps": None,
                     "error": str(e)[:500]}
            pe1 = p["w2"].pathem.counters()
            s["link_tx_bytes"] = link_bytes(p["w1"])["tx_bytes"] - before["tx_bytes"]
            s["path_loss_down"] = _loss(pe0, pe1, "b_to_a")
            s["path_loss_up"] = _loss(pe0, pe1, "a_to_b")
            samples.append(s)
            prog.step(a.tcp_seconds)
        order = [(pair, kind) for pair in pairs for kind in ("native", "vnet")]
        rng.shuffle(order)
        for pair, kind in order:
            p = pairs[pair]
            cfg = "native" if kind == "native" else pair
            src, dst_ns, src_ip, dst_ip, subnet = (
                (p["w1"], p["w2"], p["w1"].underlay_ip, p["w2"].underlay_ip, f"{wanlab.PUBLIC}.0/24")
                if kind == "native" else
                (p["g1"], p["g2"], p["g1"].ip_addr, p["g2"].ip_addr, f"{p['net']}.0/24"))
            prog.show(f"wide-area path: round {rnd + 1}/{a.rounds} ping and MPI {cfg} ({pair} pair)")
            r = lab.ping(src, dst_ip, count=20, interval=0.05, wait=1)
            samples.append({"round": rnd, "pair": pair, "config": cfg, "metric": "rtt", "rtt_ms": r.avg_ms,
                            "sent": r.sent, "received": r.received})
            try:
                lat = wan_mpi(lab, src, src_ip, dst_ns, dst_ip, subnet, raw, f"wan-{pair}-{kind}-{rnd}")
                samples.append({"round": rnd, "pair": pair, "config": cfg, "metric": "mpi_lat_us",
                                "value": round(lat, 1)})
            except (netlab.LabError, OSError) as e:
                samples.append({"round": rnd, "pair": pair, "config": cfg, "metric": "mpi_lat_us", "value": None,
                                "error": str(e)[:500]})
            prog.step(2 + MPI_REPEATS * 0.02 * 8)
    doc["wan"] = {"path": WAN_PATH, "guest_mtu": 1450, "samples": samples, "seconds": round(time.time() - t0),
                  "mpi": {"upper_bytes": MPI_UPPER, "repeats": MPI_REPEATS, "size_reported": 8},
                  "liveness": {pair: p["live"].stop() for pair, p in pairs.items()},
                  "pathem": {pair: p["w2"].pathem.counters() for pair, p in pairs.items()},
                  "hosts": {h.role: host_view(h) for p in pairs.values() for h in (p["w1"], p["w2"])}}


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
                  "TCP guest to guest (iperf3), interleaved rounds on the same lab; guests' MTU 1450. "
                  f"The `relayed` pair's relay lets each pair send {TPUT_RELAY_MBIT:,} Mbit/s "
                  "(`--relay-rate`), above what the lab's paths carry; the last pair's relay has vnetd's "
                  "default, 1,000 Mbit/s, which TCP meets as a policer.", "",
                  md_row(["pair", "path", "TCP Mbit/s median [min-max]", "x no NAT", "x punched"]),
                  md_row(["---"] * 5)]
        for name in THROUGHPUT_PAIRS:
            ss = [s for s in t if s["pair"] == name and s["mbps"]]
            v = med(s["mbps"] for s in ss)
            lines.append(md_row([name, ", ".join(sorted({s.get("path") or "-" for s in ss})) or "-",
                                 f"{fmt(v)} [{spread([s['mbps'] for s in ss])}]" if ss else "-",
                                 f"{v / base:.2f}" if v and base else "-",
                                 f"{v / punched:.2f}" if v and punched else "-"]))
        lines.append("")
    if doc.get("wan"):
        w = doc["wan"]
        pairs = list(dict.fromkeys(s["pair"] for s in w["samples"]))
        lines += ["## The wide-area path", "",
                  f"Two pairs of public hosts, in each one host behind its own vnet-pathem ({w['path']['delay']} "
                  f"each way, {w['path']['loss']} loss each way); the `vnet` pair's links plain, the "
                  f"`vnet-encrypted` pair's encrypted; guests' MTU {w['guest_mtu']}. Each pair's native figures "
                  "are between its two hosts over the same pathem. Medians over rounds, [min-max]; "
                  f"{w.get('seconds', '?')} s of rounds.", "",
                  md_row(["pair", "path", "TCP cc", "TCP Mbit/s", "x native (same pair)", "retransmits (median)",
                          "link bytes / TCP bytes"]),
                  md_row(["---"] * 7)]
        ss = w["samples"]
        for pair in pairs:
            for cc in CCS:
                nat = med(s["mbps"] for s in ss if s["pair"] == pair and s["config"] == "native"
                          and s["metric"] == "tcp" and s.get("cc") == cc and s.get("mbps"))
                for cfg in ("native", pair):
                    tcp = [s for s in ss if s["pair"] == pair and s["config"] == cfg and s["metric"] == "tcp"
                           and s.get("mbps") and s.get("cc") == cc]
                    v = med(s["mbps"] for s in tcp)
                    ev = (fmt(med(s["link_tx_bytes"] / s["bytes"] for s in tcp if s["bytes"]))
                          if cfg != "native" else "–")
                    lines.append(md_row([pair, cfg, cc, f"{fmt(v)} [{spread([s['mbps'] for s in tcp])}]" if tcp else "–",
                                         f"{v / nat:.2f}" if v and nat else "–",
                                         fmt(med(s["retransmits"] for s in tcp)), ev]))
        lines += ["", md_row(["pair", "path", "ping RTT ms (median of round averages) [min-max]",
                              "MPI ping-pong 8 B one-way us (NetPIPE) [min-max]", "MPI x native (same pair)"]),
                  md_row(["---"] * 5)]
        for pair in pairs:
            nat_mpi = med(s["value"] for s in ss if s["pair"] == pair and s["config"] == "native"
                          and s["metric"] == "mpi_lat_us" and s.get("value"))
            for cfg in ("native", pair):
                rtt = [s["rtt_ms"] for s in ss if s["pair"] == pair and s["config"] == cfg and s["metric"] == "rtt"
                       and s["rtt_ms"]]
                mpi = [s["value"] for s in ss if s["pair"] == pair and s["config"] == cfg
                       and s["metric"] == "mpi_lat_us" and s.get("value")]
                v = med(mpi)
                lines.append(md_row([pair, cfg, f"{fmt(med(rtt))} [{spread(rtt)}]" if rtt else "–",
                                     f"{fmt(v)} [{spread(mpi)}]" if mpi else "–",
                                     f"{v / nat_mpi:.2f}" if v and nat_mpi else "–"]))
        failed = [s for s in ss if s.get("error")]
        if failed:
            lines += ["", f"{len(failed)} measurement(s) failed: " + "; ".join(
                f"{s['pair']} {s['config']} {s['metric']}: {s['error'][:120]}" for s in failed[:5])]
        losses = [s["path_loss_down"] for s in ss if s["metric"] == "tcp" and s.get("path_loss_down") is not None]
        if losses:
            lines += ["", f"Loss the forwarder applied to the TCP data direction per run: {spread(losses, lambda x: f'{x * 100:.2f} %')}."]
        if w.get("liveness"):
            lines += ["", "While the rounds ran (a guest-to-guest echo every 0.1 s, each host's reach path to the "
                      "other sampled every second):", "",
                      md_row(["pair", "echoes answered", "longest stall (s)", "host", "path samples not direct",
                              "link samples not up", "etcd lease kept", "etcd sessions added", "rekeys"]),
                      md_row(["---"] * 9)]
            for pair, lv in w["liveness"].items():
                for h in [k for k in lv if isinstance(lv[k], dict)]:
                    x = lv[h]
                    lines.append(md_row([pair, f"{lv['echoes_answered']}/{lv['echoes_sent']}", lv["longest_stall_s"], h,
                                         f"{x['not_direct']}/{x['path_samples']}",
                                         f"{x['link_not_up']}/{x['path_samples']}", "yes" if x["lease_kept"] else "**no**",
                                         x["etcd_sessions_added"], "–" if x["rekeys"] is None else x["rekeys"]]))
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


def _plot_wan(doc: dict, ax) -> None:
    """TCP over the wide-area path, per pair, configuration and congestion control."""
    w = doc.get("wan")
    if w:
        pairs = list(dict.fromkeys(s["pair"] for s in w["samples"]))
        cfgs = [(pair, c, cc) for pair in pairs for cc in CCS for c in ("native", pair)]
        tcp = [[s["mbps"] for s in w["samples"] if s["pair"] == pair and s["config"] == c and s.get("cc") == cc
                and s["metric"] == "tcp" and s.get("mbps")] for pair, c, cc in cfgs]
        ax.boxplot([t if t else [float("nan")] for t in tcp],
                   labels=[f"{'native' if c == 'native' else 'vnet'}\n{cc}\n({pair})" for pair, c, cc in cfgs])
        ax.tick_params(axis="x", labelsize=7)
        ax.set_ylabel("Mbit/s")
        ax.set_yscale("log")
        ax.set_title(f"20 ms RTT, {w['path']['loss']} loss each way: TCP over the path")


def plot(doc: dict, out: Path) -> list:
    plt = pyplot()
    if not doc.get("matrix"):
        # A run of other phases only (--phases): the wide-area panel alone.
        fig, wan_ax = plt.subplots(1, 1, figsize=(8, 4.8))
        _plot_wan(doc, wan_ax)
        return [save(fig, out / "reach.png")]
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
    _plot_wan(doc, axes[1])
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
                    + a.rounds * len(THROUGHPUT_PAIRS) * (a.tcp_seconds + 1) + 40 + len(TRY_PAIRS) * a.tries * 4
                    + a.rounds * (4 * a.tcp_seconds + 4 * (2 + MPI_REPEATS * 0.16))
                    + a.rounds * 3 * a.tcp_seconds,
                    1 + npairs + 9 * a.rounds + len(TRY_PAIRS) * a.tries + len(THROUGHPUT_PAIRS) * a.rounds + 6 * a.rounds)
    with guarded(doc["meta"]["notes"], prog):
        lab = wanlab.new_lab("reach")
        wan = wanlab.WanLab(lab)
        etcd = EtcdServer(lab, overlay=OVERLAY_MATRIX)
        wan.adopt(etcd.ns)
        etcd.start()
        if "matrix" in a.phases:
            run_matrix(lab, wan, etcd, a, prog, doc)
        if "tries" in a.phases:
            run_tries(lab, wan, etcd, a, prog, doc)
        if "throughput" in a.phases:
            run_throughput(lab, wan, etcd, a, prog, doc, rng)
        if "wan" in a.phases:
            run_wan(lab, wan, etcd, a, prog, doc, rng, raw)
        if "forwarder" in a.phases:
            run_forwarder(lab, wan, a, prog, doc)
        doc["topology"] = wan.describe()
        etcd.stop()
    finish(doc, prog, out / "reach.json", lambda: plot(doc, out), write_summary, out / "summary.md")
    print(summary(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
