"""Address autodetection (issue #12): ``vnetd --etcd`` without ``--advertise-addr`` advertises
the source address of its route to the first etcd endpoint it reaches (Calico's can-reach),
says so in its log, and refuses only when the route names no address other hosts can use."""

import json
import subprocess

from vnetlab import netlab
from test_etcd import OVERLAY


def test_advertised_address_from_the_route_to_etcd(lab, etcd):
    h = lab.host("h1")
    # A second address on the host, which the route to etcd does not use.
    h.ip("addr", "add", "10.98.0.1/24", "dev", "lo")
    h.start_vnetd(config="", args=["--etcd", f"http://{etcd.endpoint}", "--overlay", OVERLAY,
                                   "--host-id", "h1"])
    netlab.wait_until(lambda: json.loads(etcd.ctl("hosts", "json")), 10, what="the host record")
    (rec,) = json.loads(etcd.ctl("hosts", "json"))
    assert rec["addr"] == h.underlay_ip, rec
    log = h.vnetd.log_text()
    assert f"addr={h.underlay_ip}" in log and "source address of the connection to etcd endpoint" in log, log

    # etcd not answering (yet): the kernel's route still names the address.
    h2 = lab.host("h2")
    silent = f"{lab.subnet}.250:2379"
    h2.start_vnetd(config="", args=["--etcd", silent, "--overlay", OVERLAY, "--host-id", "h2"])
    assert "which does not answer yet" in h2.vnetd.log_text()
    assert f"addr={h2.underlay_ip}" in h2.vnetd.log_text()

    # A route that leaves from loopback names nothing other hosts can reach: refused.
    h3 = lab.host("h3")
    r = h3.exec(netlab.VNETD, "--control", "127.0.0.1:7611", "--etcd", "127.0.0.1:2379",
                "--overlay", OVERLAY, "--host-id", "h3", check=False, timeout=20)
    assert r.returncode == 1
    assert "cannot tell this host's underlay address" in r.stderr and "loopback" in r.stderr, r.stderr
    assert "--advertise-addr" in r.stderr
