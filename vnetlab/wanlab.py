"""wanlab: the wide-area lab. Hosts behind NAT routers of each kind, firewalls, a path with a
small MTU, and paths with delay, jitter, loss and a rate, all built on ``netlab`` (its hosts
run vnetd and guests exactly as on the plain underlay; its cleanup removes everything).

The wide-area lab
=================

Topology (every box a network namespace of the lab, names ``vl<hex>-<role>``)::

    public host ─┐                             ┌─ site S1: router ─ LAN bridge ─ hosts
    public host ─┼── the public segment (br0) ─┼─ site S2: [path] ─ router ─ LAN ─ hosts
      (etcd, a   │     198.18.0.0/24           └─ site S3: transit ═(small MTU)═ router ─ LAN ─ hosts
      future relay)

- **The public segment** is netlab's wire bridge with public addresses (198.18.0.0/24, the
  benchmarking range, not RFC 1918: later code that treats private addresses specially sees
  the difference). Public hosts are ordinary netlab hosts on it.
- **A site** is a router namespace with a WAN leg ``wan0`` on the public segment and a LAN
  bridge ``lan0`` holding its hosts (10.<n>.0.0/24 by default; two sites may be given the same
  private subnet). Site hosts are netlab ``Host`` objects (``eth0`` on the LAN, default route
  via the router) and run vnetd and guests like any other.
- **A path** (``Path``) puts ``vnet-pathem`` (crates/vnet-pathem, this kernel has no netem)
  in a namespace of its own between a namespace's WAN leg and the public bridge: a bump in the
  wire, transparent at L2, adding delay, jitter, loss and a rate per direction. The devices
  that send into it have segmentation offloads off, so loss and rate apply per packet.
- **A small path MTU** (``wan_mtu``) puts a transit router between the public segment and the
  site's router, joined by a point-to-point link with that MTU: both routers forward over it
  and answer an oversized DF datagram with ICMP "fragmentation needed" as Linux does. (An MTU
  on a leg of the shared bridge would not do: a bridge silently drops frames bigger than its
  port, no ICMP.) Routes to the site's public prefixes go via the transit.

NAT kinds (``nat=``), each an nftables ruleset in the router's namespace (table ``wanlab``;
``Router.ruleset()`` renders it; the lab's tests check each kind behaves as its kind):

- ``none``: plain routing. The LAN holds public addresses (198.18.<n>.0/24), routed to by every
  namespace on the public segment.
- ``full-cone`` (endpoint-independent mapping and filtering): ``masquerade`` in postrouting,
  plus a dynamic map ``fullcone`` (public port -> private address . port) written by a filter
  chain that runs after the NAT (``ct reply proto-dst`` is then the port really given, even if
  masquerade had to pick another), and a ``dnat ... to udp dport map @fullcone`` in prerouting:
  any public address may then send to a mapped port. UDP only (TCP is port-restricted).
- ``port-restricted`` (endpoint-independent mapping, address-and-port-dependent filtering):
  plain ``masquerade``: Linux keeps the source port when the tuple is free (and reuses the
  mapping of a socket for its next destinations), and only conntrack's replies come in.
- ``symmetric`` (endpoint-dependent mapping): ``masquerade random``: every new destination
  gets its own port, and only replies come in.
- ``one-to-one``: the site's first host gets a public address of its own (an extra address on
  ``wan0``): ``dnat`` to it in prerouting, ``snat`` from it in postrouting, ports kept; other
  hosts of the site are masqueraded behind the router's address.

Every router also keeps its own WAN address closed as a home router does (input: replies and
pings only, the rest dropped). This matters for hole punching behind ``masquerade``: a punch
datagram that arrives before the local side has sent its own would otherwise be delivered to
the router, leave a conntrack entry for that address pair, and make masquerade map the local
side's answer to another port. Dropped in input, the entry is never confirmed.

Firewall options (table ``wanlab_fw``, changeable at run time with ``Router.firewall``):
``drop_fragments`` (any IP fragment, in prerouting before conntrack reassembles them, both
directions), ``drop_udp`` (forwarded UDP; TCP passes), ``drop_frag_needed`` (ICMP
"fragmentation needed", forwarded or sent by the router itself, and on a small-MTU site by
its transit router too, which answers for the inbound direction: a PMTU black hole both
ways), and
``loss_pct`` (random loss both ways on the WAN leg, nft ``numgen random``, the
``statistic`` match's equivalent). Conntrack's UDP timeouts are per namespace sysctls
(``Router.udp_timeouts``), so a test can make a mapping expire in seconds.

Usage::

    lab = netlab.Lab("x", subnet=wanlab.PUBLIC)   # or wanlab.new_lab("x")
    wan = wanlab.WanLab(lab)
    pub = wan.public_host("P")
    s = wan.site("S1", nat="symmetric", path=wanlab.Path(delay="10ms", loss="0.5%"))
    h = s.host("H1")                              # a netlab.Host behind the NAT
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Optional

from . import netlab
from .procs import LabError, stop_pid, wait_until

PUBLIC = "198.18.0"  # the public segment, /24
NAT_KINDS = ("none", "full-cone", "port-restricted", "symmetric", "one-to-one")
PATHEM = netlab._bin("VNET_PATHEM", "target/release/vnet-pathem")
MAPPING_TIMEOUT = 120  # the full-cone map's entry timeout by default (conntrack's UDP stream)


def new_lab(tag: str = "wan", **kw) -> netlab.Lab:
    """A netlab Lab whose underlay is the public segment."""
    return netlab.Lab(tag, subnet=PUBLIC, **kw)


def ethtool_off(ns: netlab.Netns, dev: str, *features: str) -> None:
    """Turn offloads off on ``dev`` (features this device lacks are ignored by ethtool)."""
    args = []
    for f in features:
        args += [f, "off"]
    ns.exec("ethtool", "-K", dev, *args, check=False)


# --- a path with delay, jitter, loss, rate --------------------------------------------------

@dataclass
class Path:
    """What ``vnet-pathem`` does on a path, as its SPEC words: ``delay``/``jitter`` ("10ms"),
    ``loss`` ("0.5%"), ``rate`` ("100mbit"), ``limit`` (frames). Both directions alike;
    ``up``/``down`` (SPEC strings) override for frames leaving / entering the namespace."""
    delay: str = ""
    jitter: str = ""
    loss: str = ""
    rate: str = ""
    limit: str = ""
    up: str = ""
    down: str = ""
    realtime: Optional[int] = 10

    def both(self) -> str:
        words = {"delay": self.delay, "jitter": self.jitter, "loss": self.loss, "rate": self.rate,
                 "limit": self.limit}
        return ",".join(f"{k}={v}" for k, v in words.items() if v)


class Pathem:
    """``vnet-pathem`` in a bump namespace between ``inside`` (device ``pe0``, toward the
    namespace it serves) and ``outside`` (``pe1``, toward the public bridge): "a_to_b" is the
    upstream direction. Stopped by PID; ``counters()`` asks it for its JSON (SIGUSR1)."""

    def __init__(self, ns: netlab.Netns, path: Path):
        if not PATHEM.exists():
            raise LabError(f"{PATHEM} missing: cargo build --release -p vnet-pathem (or set VNET_PATHEM)")
        self.ns, self.path = ns, path
        self.out = ns.lab.workdir / f"pathem-{ns.role}.json"
        self.err = ns.lab.workdir / f"pathem-{ns.role}.log"
        argv = [PATHEM, "--a", "pe0", "--b", "pe1", "--both", path.both(), "--ab", path.up, "--ba", path.down]
        if path.realtime:
            argv += ["--realtime", path.realtime]
        with open(self.out, "wb") as o, open(self.err, "wb") as e:
            self.proc = ns.popen(*argv, stdin=subprocess.DEVNULL, stdout=o, stderr=e)
        wait_until(self._started, 10, 0.02, what=f"vnet-pathem in {ns.name}")

    def _started(self) -> bool:
        if self.proc.poll() is not None:
            raise LabError(f"vnet-pathem in {self.ns.name} exited: {self.err.read_text(errors='replace')[-2000:]}")
        return "seed" in self.err.read_text(errors="replace")

    def _last(self) -> dict:
        lines = self.out.read_text(errors="replace").strip().splitlines()
        return json.loads(lines[-1]) if lines else {}

    def counters(self) -> dict:
        """Its counters now: {"a_to_b": {"impairment", "counters"}, "b_to_a": ...}."""
        n = len(self.out.read_text(errors="replace").splitlines())
        self.proc.send_signal(signal.SIGUSR1)
        wait_until(lambda: len(self.out.read_text(errors="replace").splitlines()) > n, 5, 0.02,
                   what="vnet-pathem's counters")
        return self._last()

    def stop(self) -> dict:
        """SIGTERM; its final counters."""
        stop_pid(self.proc)
        return self._last()


# --- routers --------------------------------------------------------------------------------

@dataclass
class Firewall:
    drop_fragments: bool = False
    drop_udp: bool = False
    drop_frag_needed: bool = False
    loss_pct: float = 0.0


class Router(netlab.Netns):
    """A site's router: ``wan0`` (public), ``lan0`` (a bridge with the site's hosts)."""

    def __init__(self, lab: netlab.Lab, role: str, nat: str, wan_ip: str, lan_net: str,
                 public_ip: Optional[str] = None):
        if nat not in NAT_KINDS:
            raise LabError(f"unknown NAT kind {nat!r} (one of {', '.join(NAT_KINDS)})")
        super().__init__(lab, role)
        self.nat, self.wan_ip, self.lan_net = nat, wan_ip, lan_net
        self.lan_ip = f"{lan_net}.1"
        self.public_ip = public_ip  # one-to-one: the first host's public address
        self.one_to_one_host: Optional[str] = None
        self.fw = Firewall()
        self.transit: Optional[netlab.Netns] = None  # a small-MTU site's transit router
        self.mapping_timeout = MAPPING_TIMEOUT
        self.sysctl("net.ipv4.ip_forward", 1)
        self.ip_link("add", "lan0", "type", "bridge")
        self.ip("addr", "add", f"{self.lan_ip}/24", "dev", "lan0")
        self.ip_link("set", "lan0", "up")
        self._nports = 0

    # -- the rules --
    def ruleset(self) -> str:
        """The NAT kind's table ``wanlab`` (see the module header for why each rule)."""
        lines = ["table ip wanlab {"]
        if self.nat == "full-cone":
            lines += ["  map fullcone {",
                      "    type inet_service : ipv4_addr . inet_service",
                      f"    flags dynamic,timeout; timeout {self.mapping_timeout}s; size 65535",
                      "  }"]
        # the router's own address: replies and pings only (see the header)
        lines += ["  chain input {", "    type filter hook input priority filter; policy accept;",
                  '    iifname "wan0" ct state established,related accept',
                  '    iifname "wan0" icmp type echo-request accept',
                  '    iifname "wan0" drop', "  }"]
        pre, post = [], []
        fwd = ["    type filter hook forward priority filter; policy accept;"]
        if self.nat != "none":
            fwd += ['    iifname "wan0" ct state established,related accept',
                    '    iifname "wan0" ct status dnat accept',
                    '    iifname "wan0" drop']
        if self.nat == "full-cone":
            pre.append('    iifname "wan0" meta l4proto udp dnat ip to udp dport map @fullcone')
            post.append('    oifname "wan0" masquerade')
        elif self.nat == "port-restricted":
            post.append('    oifname "wan0" masquerade')
        elif self.nat == "symmetric":
            post.append('    oifname "wan0" masquerade random')
        elif self.nat == "one-to-one":
            if self.one_to_one_host:
                pre.append(f'    iifname "wan0" ip daddr {self.public_ip} dnat ip to {self.one_to_one_host}')
                post.append(f'    oifname "wan0" ip saddr {self.one_to_one_host} snat ip to {self.public_ip}')
            post.append('    oifname "wan0" masquerade')
        if self.nat != "none":
            # a nat chain in prerouting, even empty, makes the kernel reverse-NAT replies there
            lines += ["  chain prerouting {", "    type nat hook prerouting priority dstnat; policy accept;",
                      *pre, "  }",
                      "  chain postrouting {", "    type nat hook postrouting priority srcnat; policy accept;",
                      *post, "  }"]
        if self.nat == "full-cone":
            # after the NAT (srcnat + 10): the reply tuple holds the public port really given
            lines += ["  chain record_mapping {",
                      "    type filter hook postrouting priority srcnat + 10; policy accept;",
                      '    oifname "wan0" meta l4proto udp update @fullcone { ct reply proto-dst '
                      f"timeout {self.mapping_timeout}s : ct original ip saddr . ct original proto-src }}",
                      "  }"]
        lines += ["  chain forward {", *fwd, "  }", "}"]
        return "\n".join(lines) + "\n"

    def firewall_ruleset(self) -> str:
        """Table ``wanlab_fw``: the firewall options now set."""
        fw = self.fw
        early = ["    type filter hook prerouting priority -450; policy accept;"]
        late = ["    type filter hook postrouting priority 300; policy accept;"]
        fwd = ["    type filter hook forward priority -10; policy accept;"]
        out = ["    type filter hook output priority -10; policy accept;"]
        if fw.drop_fragments:
            # before conntrack's reassembly (priority -400): MF set or a fragment offset
            early.append("    ip frag-off & 0x3fff != 0 counter drop")
        if fw.drop_udp:
            fwd.append("    meta l4proto udp counter drop")
        if fw.drop_frag_needed:
            rule = "    icmp type destination-unreachable icmp code frag-needed counter drop"
            fwd.append(rule)
            out.append(rule)
        if fw.loss_pct > 0:
            n = int(round(fw.loss_pct * 100))  # per 10,000
            early.append(f'    iifname "wan0" numgen random mod 10000 < {n} counter drop')
            late.append(f'    oifname "wan0" numgen random mod 10000 < {n} counter drop')
        return ("table ip wanlab_fw {\n"
                + "".join(f"  chain {name} {{\n" + "\n".join(body) + "\n  }\n"
                          for name, body in (("before_defrag", early), ("leaving", late), ("forwarded", fwd), ("from_router", out)))
                + "}\n")

    def apply(self) -> None:
        """(Re)load both tables."""
        text = ""
        for t in ("wanlab", "wanlab_fw"):
            if self.exec("nft", "list", "table", "ip", t, check=False).returncode == 0:
                text += f"delete table ip {t}\n"
        text += self.ruleset() + self.firewall_ruleset()
        r = self.exec("nft", "-f", "-", input=text, check=False)
        if r.returncode != 0:
            raise LabError(f"nft refused the rules of {self.name}: {r.stderr}\n{text}")
        if self.transit is not None:
            self._apply_transit()

    def _apply_transit(self) -> None:
        """The transit router of a small-MTU site answers oversized DF datagrams coming in
        (toward the site): with ``drop_frag_needed`` its "fragmentation needed" are dropped
        too (table ``wanlab_fw`` there), so neither direction learns the path's MTU."""
        t = self.transit
        text = ""
        if t.exec("nft", "list", "table", "ip", "wanlab_fw", check=False).returncode == 0:
            text += "delete table ip wanlab_fw\n"
        if self.fw.drop_frag_needed:
            rule = "    icmp type destination-unreachable icmp code frag-needed counter drop"
            text += ("table ip wanlab_fw {\n"
                     "  chain forwarded {\n    type filter hook forward priority -10; policy accept;\n"
                     f"{rule}\n  }}\n"
                     "  chain from_router {\n    type filter hook output priority -10; policy accept;\n"
                     f"{rule}\n  }}\n}}\n")
        if text:
            r = t.exec("nft", "-f", "-", input=text, check=False)
            if r.returncode != 0:
                raise LabError(f"nft refused the rules of {t.name}: {r.stderr}\n{text}")

    def firewall(self, **opts) -> None:
        """Change firewall options (``Firewall``'s fields) and reload."""
        for k, v in opts.items():
            if not hasattr(self.fw, k):
                raise LabError(f"unknown firewall option {k!r}")
            setattr(self.fw, k, v)
        self.apply()

    def fw_counters(self) -> dict:
        """Packets each firewall rule dropped: {rule text: packets}."""
        out = {}
        for ns, prefix in ((self, ""), (self.transit, "transit:")):
            if ns is None:
                continue
            r = ns.exec("nft", "-j", "list", "table", "ip", "wanlab_fw", check=False)
            if r.returncode != 0:
                continue
            for item in json.loads(r.stdout).get("nftables", []):
                rule = item.get("rule")
                if not rule:
                    continue
                for e in rule.get("expr", []):
                    if "counter" in e:
                        out[f"{prefix}{rule['chain']}#{rule.get('handle')}"] = e["counter"]["packets"]
        return out

    def udp_timeouts(self, unreplied: int, stream: Optional[int] = None) -> None:
        """Conntrack's UDP timeouts in this namespace (30 s / 120 s by default); the full-cone
        map's entries follow (its rules are reloaded, so set this before traffic)."""
        stream = stream if stream is not None else unreplied
        self.sysctl("net.netfilter.nf_conntrack_udp_timeout", unreplied)
        self.sysctl("net.netfilter.nf_conntrack_udp_timeout_stream", stream)
        if self.nat == "full-cone":
            self.mapping_timeout = max(unreplied, stream)
            self.apply()

    def conntrack(self) -> str:
        """The conntrack table of this namespace (``conntrack -L``)."""
        return self.exec("conntrack", "-L", check=False).stdout

    def flush_conntrack(self) -> None:
        self.exec("conntrack", "-F", check=False)

    def lan_port(self) -> str:
        self._nports += 1
        return f"l{self._nports}"


# --- sites ----------------------------------------------------------------------------------

class Site:
    """A router and its LAN (see the module header). ``host()`` adds a netlab Host on it."""

    def __init__(self, wan: "WanLab", name: str, index: int, router: Router, gateway: str,
                 transit: Optional[netlab.Netns], pathem: Optional[Pathem]):
        self.wan, self.name, self.index, self.router = wan, name, index, router
        self.gateway = gateway  # the site's next hop on the public segment
        self.transit, self.pathem = transit, pathem
        self.hosts: list[netlab.Host] = []

    @property
    def nat(self) -> str:
        return self.router.nat

    @property
    def public_ip(self) -> str:
        """The address the site's (first) host is seen with on the public side."""
        r = self.router
        if r.nat == "none":
            return self.hosts[0].underlay_ip if self.hosts else ""
        if r.nat == "one-to-one":
            return r.public_ip
        return r.wan_ip

    def host(self, role: str) -> netlab.Host:
        lab = self.wan.lab
        r = self.router
        h = netlab.Host(lab, role, None)
        ip = f"{r.lan_net}.{len(self.hosts) + 2}"
        port = r.lan_port()
        r.ip_link("add", port, "type", "veth", "peer", "name", "eth0", "netns", h.name)
        r.ip_link("set", port, "master", "lan0")
        r.ip_link("set", port, "up")
        h.ip("addr", "add", f"{ip}/24", "dev", "eth0")
        h.ip_link("set", "eth0", "up")
        h.ip("route", "add", "default", "via", r.lan_ip)
        h.underlay_ip = ip
        h.site = self
        if r.nat == "one-to-one" and not self.hosts:
            r.one_to_one_host = ip
            r.apply()
        self.hosts.append(h)
        lab.register_host(h)
        return h

    def describe(self) -> dict:
        r = self.router
        return {"name": self.name, "nat": r.nat, "router_wan": r.wan_ip, "lan": f"{r.lan_net}.0/24",
                "public_ip": self.public_ip, "gateway": self.gateway,
                "transit": self.transit is not None, "path": self.pathem.path.both() if self.pathem else None,
                "firewall": vars(r.fw), "hosts": {h.role: h.underlay_ip for h in self.hosts}}


class WanLab:
    """Builds the wide-area topology on a netlab ``Lab`` whose underlay is the public segment
    (``new_lab``); everything goes with the lab's cleanup."""

    def __init__(self, lab: netlab.Lab):
        if lab.subnet != PUBLIC:
            # the lab's underlay becomes the public segment (a Lab made with its default
            # subnet, as the tests' fixture makes it, before anything is on it)
            if lab.wire is not None or lab.hosts:
                raise LabError(f"the lab's underlay is {lab.subnet}.0/24 with hosts on it: make it with new_lab()")
            lab.subnet = PUBLIC
        self.lab = lab
        self.sites: list[Site] = []
        self.public: list[netlab.Netns] = []  # every namespace with an address on the segment
        self.routes: list[tuple] = []  # (prefix, via) every public namespace knows
        self.paths: list[Pathem] = []
        self._extra_ip = 200  # public addresses handed out for one-to-one NAT

    # -- the public segment --
    def _attach(self, ns: netlab.Netns, dev: str, ip: Optional[str], path: Optional[Path]) -> str:
        """``dev`` of ``ns`` on the public bridge, directly or through a ``Path``."""
        lab = self.lab
        wire = lab.underlay()
        port, ip = lab.wire_port(ip)
        if path is None:
            wire.ip_link("add", port, "type", "veth", "peer", "name", dev, "netns", ns.name)
        else:
            bump = netlab.Netns(lab, f"{ns.role}-path")
            wire.ip_link("add", port, "type", "veth", "peer", "name", "pe1", "netns", bump.name)
            ns.ip_link("add", dev, "type", "veth", "peer", "name", "pe0", "netns", bump.name)
            # per-packet loss and rate: nothing sends super-frames into the forwarder
            ethtool_off(wire, port, "tso", "gso", "gro")
            ethtool_off(ns, dev, "tso", "gso", "gro")
            for d in ("pe0", "pe1"):
                ethtool_off(bump, d, "tso", "gso", "gro")
                bump.ip_link("set", d, "up")
        wire.ip_link("set", port, "master", "br0")
        wire.ip_link("set", port, "up")
        ns.ip("addr", "add", f"{ip}/24", "dev", dev)
        ns.ip_link("set", dev, "up")
        if path is not None:
            pe = Pathem(bump, path)
            self.paths.append(pe)
            ns.pathem = pe
        self._join_public(ns)
        return ip

    def adopt(self, ns: netlab.Netns) -> None:
        """A namespace already on the public segment (``lab.host()``, such as etcdlab's) learns
        the segment's routes, now and later."""
        self._join_public(ns)

    def _join_public(self, ns: netlab.Netns) -> None:
        self.public.append(ns)
        for prefix, via in self.routes:
            self._route(ns, prefix, via)

    @staticmethod
    def _route(ns: netlab.Netns, prefix: str, via: str) -> None:
        own = {a["local"] for l in json.loads(ns.ip("-j", "addr", "show").stdout) for a in l.get("addr_info", [])}
        if via not in own:
            ns.ip("route", "replace", prefix, "via", via)

    def add_public_route(self, prefix: str, via: str) -> None:
        """Every namespace on the public segment (now and later) routes ``prefix`` via ``via``."""
        self.routes.append((prefix, via))
        for ns in self.public:
            self._route(ns, prefix, via)

    def public_host(self, role: str, ip: Optional[str] = None, path: Optional[Path] = None) -> netlab.Host:
        """A netlab host on the public segment (``path``: behind a vnet-pathem bump)."""
        h = netlab.Host(self.lab, role, None)
        h.pathem = None
        h.underlay_ip = self._attach(h, "eth0", ip, path)
        h.site = None
        self.lab.register_host(h)
        return h

    # -- sites --
    def site(self, name: str, nat: str = "port-restricted", lan: Optional[str] = None,
             wan_mtu: Optional[int] = None, path: Optional[Path] = None,
             firewall: Optional[dict] = None) -> Site:
        """A router (``nat`` kind) with a LAN; ``lan`` its /24 as "a.b.c" (default 10.<n>.0,
        public 198.18.<n> for ``none``); ``wan_mtu`` a transit link with that MTU; ``path`` a
        vnet-pathem bump on its WAN side; ``firewall`` the ``Firewall`` options."""
        n = len(self.sites) + 1
        if lan is None:
            lan = f"198.18.{n}" if nat == "none" else f"10.{n}.0"
        role = f"{name}-r"
        public_ip = None
        if nat == "one-to-one":
            public_ip = f"{PUBLIC}.{self._extra_ip + n}"
        transit = None
        if wan_mtu:
            # transit (public side) ═ small-MTU p2p link ═ router; the router's WAN on 198.19.n.0/30
            transit = netlab.Netns(self.lab, f"{name}-t")
            transit.sysctl("net.ipv4.ip_forward", 1)
            transit.pathem = None
            gateway = self._attach(transit, "wan0", None, path)
            wan_ip = f"198.19.{n}.2"
            router = Router(self.lab, role, nat, wan_ip, lan, public_ip)
            router.transit = transit
            transit.ip_link("add", "down0", "type", "veth", "peer", "name", "wan0", "netns", router.name)
            transit.ip_link("set", "down0", "mtu", wan_mtu)
            router.ip_link("set", "wan0", "mtu", wan_mtu)
            transit.ip("addr", "add", f"198.19.{n}.1/30", "dev", "down0")
            router.ip("addr", "add", f"{wan_ip}/30", "dev", "wan0")
            transit.ip_link("set", "down0", "up")
            router.ip_link("set", "wan0", "up")
            router.ip("route", "add", "default", "via", f"198.19.{n}.1")
            self.add_public_route(f"198.19.{n}.0/30", gateway)
            pathem = transit.pathem
        else:
            router = Router(self.lab, role, nat, "", lan, public_ip)
            router.pathem = None
            router.wan_ip = gateway = self._attach(router, "wan0", None, path)
            pathem = router.pathem
        if public_ip:
            router.ip("addr", "add", f"{public_ip}/32", "dev", "wan0")
            if transit is not None:
                transit.ip("route", "add", f"{public_ip}/32", "via", router.wan_ip)
                self.add_public_route(f"{public_ip}/32", gateway)
        if nat == "none":
            if transit is not None:
                transit.ip("route", "add", f"{lan}.0/24", "via", router.wan_ip)
            self.add_public_route(f"{lan}.0/24", gateway)
        if firewall:
            for k, v in firewall.items():
                setattr(router.fw, k, v)
        router.apply()
        site = Site(self, name, n, router, gateway, transit, pathem)
        self.sites.append(site)
        return site

    def describe(self) -> dict:
        """The topology, for a results file."""
        return {"public_segment": f"{PUBLIC}.0/24",
                "public_hosts": {ns.role: ns.underlay_ip for ns in self.public if isinstance(ns, netlab.Host)},
                "sites": [s.describe() for s in self.sites]}


# --- measuring helpers the tests and the benchmark share -----------------------------------

@dataclass
class UdpProbe:
    """What a site's socket saw: the mapped (ip, port) per reflector, and which unsolicited
    senders got through."""
    local: tuple
    mapped: dict = field(default_factory=dict)
    admitted: dict = field(default_factory=dict)


def recv_from(sock, want_src: Optional[tuple], payload: bytes, timeout: float) -> bool:
    """Whether ``payload`` arrives on ``sock`` (from ``want_src`` if given) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        sock.settimeout(left)
        try:
            data, src = sock.recvfrom(4096)
        except OSError:
            return False
        if data == payload and (want_src is None or src[:2] == tuple(want_src)):
            return True


def punch(a: netlab.Netns, a_ip: str, b: netlab.Netns, b_ip: str, stun_server: tuple,
          duration: float = 2.0, interval: float = 0.05) -> dict:
    """Simultaneous-open UDP hole punching with plain sockets, as a reference for what the
    NATs allow: each side binds one socket, learns its mapping from ``stun_server``, and then
    both at once send a token from that same socket to the other's mapped address every
    ``interval``, answering any source that sends the peer's token (a peer-reflexive address,
    as ICE learns it). Each side goes on sending ``3`` more rounds after it has heard the other,
    so the other's NAT has seen its outbound datagram. Returns per side what it heard and from
    where, and ``punched`` when both heard each other."""
    import threading
    from . import stun
    sides = {}
    for name, ns, ip in (("a", a, a_ip), ("b", b, b_ip)):
        s = ns.socket()
        s.bind((ip, 0))
        sides[name] = {"sock": s, "local": s.getsockname(), "mapped": stun.binding(s, stun_server)}
    tokens = {"a": b"punch-a-" + a_ip.encode(), "b": b"punch-b-" + b_ip.encode()}
    start = threading.Barrier(2)

    def run(me: str, peer: str):
        st = sides[me]
        sock, targets = st["sock"], [tuple(sides[peer]["mapped"])]
        heard_from, extra = None, 3
        start.wait()
        end = time.monotonic() + duration
        while time.monotonic() < end and extra > 0:
            for t in targets:
                try:
                    sock.sendto(tokens[me], t)
                except OSError:
                    pass
            if heard_from:
                extra -= 1
            until = time.monotonic() + interval
            while (left := until - time.monotonic()) > 0:
                sock.settimeout(left)
                try:
                    data, src = sock.recvfrom(2048)
                except OSError:
                    break
                if data == tokens[peer] and heard_from is None:
                    heard_from = src[:2]
                    if heard_from not in targets:
                        targets.append(heard_from)
        st["heard_from"] = heard_from

    threads = [threading.Thread(target=run, args=(m, p)) for m, p in (("a", "b"), ("b", "a"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration + 5)
    out = {}
    for name, st in sides.items():
        st["sock"].close()
        peer = "b" if name == "a" else "a"
        heard = st.get("heard_from")
        out[name] = {"local": list(st["local"]), "mapped": list(st["mapped"]),
                     "heard_from": list(heard) if heard else None,
                     "peer_reflexive": bool(heard) and tuple(heard) != tuple(sides[peer]["mapped"])}
    out["punched"] = bool(out["a"]["heard_from"] and out["b"]["heard_from"])
    return out
