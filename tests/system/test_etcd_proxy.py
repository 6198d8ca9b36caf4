"""Distributed control through etcd's gRPC proxy (issue #19): vnetd --etcd daemons and vnetctl
--etcd given the proxy's address instead of etcd's build the same overlay, take a join and a
move exactly as they do from etcd directly, and etcd holds fewer watches than the daemons
opened (the proxy coalesces them). Debian's etcd 3.4 has the proxy (``etcd grpc-proxy
start``); it does not serve etcd's JSON gateway, so this needs the daemons' gRPC client.

The proxy runs in the etcd namespace beside etcd (``vnetlab.etcdlab.GrpcProxy``), stopped by
PID; the overlay helpers are test_etcd's."""

import time

from test_etcd import Overlay, agent_args, assert_all_ping
from vnetlab import netlab
from vnetlab.etcdlab import GrpcProxy

FETCH = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"


def etcd_watchers(etcd) -> int:
    """The watchers etcd itself holds (its /metrics gauge), read from the etcd namespace."""
    page = etcd.ns.exec("python3", "-c", FETCH, f"http://{etcd.endpoint}/metrics").stdout
    for line in page.splitlines():
        if line.startswith("etcd_debugging_mvcc_watcher_total "):
            return int(float(line.split()[1]))
    raise AssertionError("etcd's /metrics has no etcd_debugging_mvcc_watcher_total")


def test_overlay_join_and_move_through_grpc_proxy(lab, etcd, record):
    proxy = GrpcProxy(etcd)
    proxy.start()
    try:
        t0 = time.monotonic()
        ov = Overlay(lab, proxy, 3)
        ov.wait_mesh()
        record("grpc_proxy_mesh_of_3_s", round(time.monotonic() - t0, 3))
        assert_all_ping(lab, ov.all_pairs())
        for h in ov.hosts:
            assert h.ctl_json("show", "cluster", "json")["agent"]["connected"] is True

        # A join: a fourth host, through the proxy too.
        h4 = lab.host("h4")
        g4 = lab.guest("g4", ip="192.168.60.4", mac=netlab.mac(1, 4, 1))
        t0 = time.monotonic()
        h4.start_vnetd(config=f"interface add vm tap mac {g4.mac} netns {g4.name} vni 1\n",
                       args=agent_args(proxy, h4))
        g4.configure(h4.interface("vm")["ifname"])
        ov.hosts.append(h4)
        ov.guests.append(g4)
        ov.wait_mesh()
        record("grpc_proxy_join_s", round(time.monotonic() - t0, 3))
        assert_all_ping(lab, [(g4, g.ip_addr) for g in ov.guests[:3]])

        # Every daemon watches two ranges; etcd sees the proxy's coalesced watches instead.
        opened = 2 * len(ov.hosts)
        netlab.wait_until(lambda: etcd_watchers(etcd) < opened, 10, 0.2,
                          what=f"etcd to hold fewer than the {opened} watches the daemons opened")
        record("grpc_proxy_etcd_watchers_for_4_daemons", etcd_watchers(etcd))

        # A move, by vnetctl through the proxy: every other host routes the MAC to h2, then the
        # NIC leaves h1 (which then has no guest left, so no links) and arrives on h2.
        h1, h2, h3, _ = ov.hosts
        g1 = ov.guests[0]
        t0 = time.monotonic()
        assert "moved" in proxy.ctl("move", 1, g1.mac, "h2", "vmig")
        netlab.wait_until(lambda: all(ov.routes(h).get(g1.mac) == ("link", "c-h2-v1") for h in (h3, ov.hosts[3])),
                          10, 0.05, what="the moved MAC routed to h2 on every other host")
        record("grpc_proxy_move_s", round(time.monotonic() - t0, 3))
        h1.ctl("interface", "del", "vm")
        h2.ctl("interface", "add", "vmig", "tap", "mac", g1.mac, "netns", g1.name, "vni", 1)
        g1.configure(h2.interface("vmig")["ifname"])
        netlab.wait_until(lambda: ov.routes(h2).get(g1.mac) == ("interface", "vmig"), 10, 0.05,
                          what="h2 to route the moved MAC to its new NIC")
        lab.wait_ping(ov.guests[2], g1.ip_addr, timeout=10)
        lab.wait_ping(g4, g1.ip_addr, timeout=10)
    finally:
        proxy.stop()
