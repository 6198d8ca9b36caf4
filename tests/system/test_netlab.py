"""Self-checks of the netlab harness itself (no vnetd needed): underlay, kernel VXLAN
hosts, helpers and cleanup."""

import os
import socket

import pytest

from vnetlab import netlab

pytestmark = pytest.mark.no_vnetd


def test_underlay_and_cleanup(lab):
    a, b = lab.host("A"), lab.host("B")
    r = a.ping(b.underlay_ip, count=2)
    assert r.received == 2, r.output
    assert r.avg_ms is not None and r.avg_ms > 0
    names = [a.name, b.name, lab.wire.name]
    assert all(os.path.exists(f"/run/netns/{n}") for n in names)
    lab.close()
    assert not any(os.path.exists(f"/run/netns/{n}") for n in names)


def test_kernel_vxlan_hosts(lab):
    """Two kernel-VXLAN hosts: the reference setup vnet must interoperate with."""
    ka = lab.kernel_vxlan_host("KA", vni=7)
    kb = lab.kernel_vxlan_host("KB", vni=7, peers=[ka.underlay_ip])
    ka.add_peer(kb.underlay_ip)
    ga = lab.guest("ga", ip="192.168.50.1")
    gb = lab.guest("gb", ip="192.168.50.2")
    ka.add_vm(ga, mac=netlab.mac(7, 1, 1))
    kb.add_vm(gb, mac=netlab.mac(7, 2, 1))
    r = ga.ping(gb.ip_addr, count=2)
    assert r.received == 2, r.output
    # the traffic really went through the VXLAN devices
    assert ka.link_counters("vx7")["tx_packets"] >= 2
    res = lab.iperf(gb, gb.ip_addr, ga, seconds=1)
    assert res.gbps > 0.05


def test_sockets_in_namespace(lab):
    a, b = lab.host("A"), lab.host("B")
    rx = b.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind((b.underlay_ip, 4789))
    rx.settimeout(2)
    tx = a.socket(socket.AF_INET, socket.SOCK_DGRAM)
    pkt = netlab.vxlan(5, netlab.ether("ff:ff:ff:ff:ff:ff", "02:00:00:00:00:01"))
    tx.sendto(pkt, (b.underlay_ip, 4789))
    data, src = rx.recvfrom(2000)
    assert data == pkt and src[0] == a.underlay_ip
    tx.close()
    rx.close()


def test_parse_ping():
    out = ("--- 1.2.3.4 ping statistics ---\n3 packets transmitted, 2 received, 33.3333% packet loss, time 402ms\n"
           "rtt min/avg/max/mdev = 0.040/0.055/0.070/0.015 ms\n")
    r = netlab.parse_ping(out)
    assert (r.sent, r.received, round(r.loss), r.avg_ms) == (3, 2, 33, 0.055)
    r = netlab.parse_ping("2 packets transmitted, 0 received, 100% packet loss, time 1s\n")
    assert (r.received, r.loss, r.avg_ms, r.ok) == (0, 100.0, None, False)
