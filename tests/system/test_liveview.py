"""The live view (issue #12) in a real browser: Debian's headless Chromium, driven over the
Chrome DevTools Protocol, loads vnetd's page from a running 3-host overlay (etcd, traffic
between guests), and the test checks what a person would look at: the three hosts in the
overlay's picture, their guests, and rates that move while traffic flows. The screenshot goes
to the test's work directory and to results/liveview.png."""

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from vnetlab import httplab
from vnetlab import netlab

TOKEN = "view-token-7"


@pytest.fixture
def etcd(etcd):
    """conftest's etcd, for tests that need Chromium too."""
    if not Path(httplab.CHROMIUM).exists():
        pytest.fail("chromium is not installed: run scripts/setup.sh")
    return etcd


def test_live_view_of_a_three_host_overlay(lab, etcd, record):
    hosts, guests = httplab.etcd_overlay(lab, etcd, 3, token=TOKEN, http_on_underlay=False)
    h1 = hosts[0]
    g1, g2, g3 = guests
    # Traffic that lasts while the page is watched: g1 -> g2 (TCP) and g3 -> g1 (UDP, 20 Mbit/s).
    srv2 = g2.popen("iperf3", "-s", "-p", "5201")
    srv1 = g1.popen("iperf3", "-s", "-p", "5202")
    netlab.wait_until(lambda: ":5201 " in g2.exec("ss", "-Htln").stdout and
                      ":5202 " in g1.exec("ss", "-Htln").stdout, 10, what="iperf3 servers")
    # The UDP datagrams fit the overlay (guests at MTU 1500 over a 1500-byte underlay: frames
    # of up to 1450 bytes of IP): etcd's links are reach links, whose oversized frames are
    # answered with "fragmentation needed", and a connected UDP socket takes that as EMSGSIZE.
    c1 = g1.popen("iperf3", "-c", g2.ip_addr, "-p", "5201", "-t", "40", "-b", "300M",
                  stdout=open(lab.workdir / "iperf3-g1.txt", "w"), stderr=subprocess.STDOUT)
    c3 = g3.popen("iperf3", "-c", g1.ip_addr, "-p", "5202", "-u", "-t", "40", "-b", "20M",
                  "-l", "1400", stdout=open(lab.workdir / "iperf3-g3.txt", "w"),
                  stderr=subprocess.STDOUT)
    browser = httplab.Chromium(lab, h1)
    try:
        t0 = time.monotonic()
        browser.navigate(f"http://{h1.http}/#token={TOKEN}")
        hosts_shown = netlab.wait_until(
            lambda: browser.eval("[...document.querySelectorAll('#graph [data-host]')].map(e => e.dataset.host).sort()"),
            20, 0.5, what="hosts in the overlay picture")
        assert hosts_shown == ["h1", "h2", "h3"]
        record("page_to_hosts_s", round(time.monotonic() - t0, 2))
        # The token in the fragment was taken and removed from the address bar.
        assert browser.eval("location.hash") == ""
        assert browser.eval("document.getElementById('status').className") == "status ok"

        # Guests per host, from the placements in etcd.
        boxes = browser.eval("[...document.querySelectorAll('#guests [data-host]')].map(e => [e.dataset.host, e.querySelectorAll('li').length])")
        assert sorted(boxes) == [["h1", 1], ["h2", 1], ["h3", 1]]

        # This host's link to h2 carries g1's TCP flow: its rate is shown and moves.
        out_rate = "Number(document.querySelector('#ports tr[data-port=\"link:c-h2-v1\"] td.out')?.dataset.rate || 0)"
        samples = []
        for _ in range(6):
            samples.append(browser.eval(out_rate))
            time.sleep(1.1)
        record("link_rate_samples_mbit", [round(s * 8 / 1e6, 1) for s in samples])
        assert sum(1 for s in samples if s > 1e5) >= 4, samples
        assert len(set(samples)) >= 3, f"the rate did not move: {samples}"

        # The overlay's picture: the h1-h2 and h1-h3 edges carry traffic (from the published
        # matrices), and the heat map has the two busy guest pairs.
        edge = "Number(document.querySelector('#graph line[data-edge=\"%s\"]')?.dataset.rate || 0)"
        netlab.wait_until(lambda: browser.eval(edge % "h1-h2") > 1e5 and browser.eval(edge % "h1-h3") > 1e5,
                          15, 0.5, what="traffic on the h1-h2 and h1-h3 edges")
        assert browser.eval(edge % "h2-h3") == 0
        hot = set(browser.eval("[...document.querySelectorAll('#heatmap td')].filter(td => Number(td.dataset.rate) > 0).map(td => td.dataset.pair)"))
        # The two flows (and their TCP acknowledgements back), nothing between h2 and h3.
        assert {"h1/vm>h2/vm", "h3/vm>h1/vm"} <= hot, hot
        assert not hot & {"h2/vm>h3/vm", "h3/vm>h2/vm"}, hot
        record("heat_map_hot_cells", sorted(hot))
        # The listener's own page: nothing from elsewhere was loaded.
        resources = browser.eval("performance.getEntriesByType('resource').map(r => r.name)")
        assert all(r.startswith(f"http://{h1.http}/") for r in resources), resources

        time.sleep(1.5)
        shot = browser.screenshot(lab.workdir / "liveview.png")
        out = netlab.REPO / "results"
        out.mkdir(exist_ok=True)
        shutil.copy(shot, out / "liveview.png")
        record("screenshot", str(out / "liveview.png"))
        assert shot.stat().st_size > 20000
    except Exception:
        # What the page showed, for the failure report (the work directory is kept).
        try:
            browser.screenshot(lab.workdir / "liveview-failed.png")
            (lab.workdir / "liveview-failed.txt").write_text(str(browser.eval("document.body.innerText")))
        except Exception:
            pass
        raise
    finally:
        browser.close()
        for p in (c1, c3, srv1, srv2):
            netlab.stop_pid(p)


def test_live_view_of_one_host_without_etcd(lab, record):
    """Without --etcd the page shows this host alone: its ports with moving rates and its own
    traffic matrix as the heat map; the overlay section stays hidden."""
    if not Path(httplab.CHROMIUM).exists():
        pytest.fail("chromium is not installed: run scripts/setup.sh")
    h = lab.host("solo")
    g1 = lab.guest("s1", ip="192.168.71.1", mac=netlab.mac(1, 9, 1))
    g2 = lab.guest("s2", ip="192.168.71.2", mac=netlab.mac(1, 9, 2))
    h.start_vnetd(config="", args=["--http", "9300"])
    h.add_vm(g1, "vm1", g1.mac)
    h.add_vm(g2, "vm2", g2.mac)
    lab.wait_ping(g1, g2.ip_addr)
    flood = g1.popen("ping", "-i", "0.01", "-s", "1000", g2.ip_addr,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    browser = httplab.Chromium(lab, h)
    try:
        browser.navigate("http://127.0.0.1:9300/")
        rate = "Number(document.querySelector('#ports tr[data-port=\"interface:vm1\"] td.in')?.dataset.rate || 0)"
        netlab.wait_until(lambda: browser.eval(rate) > 1e4, 10, 0.3, what="vm1's rate on the page")
        samples = []
        for _ in range(4):
            samples.append(browser.eval(rate))
            time.sleep(1.1)
        assert all(s > 1e4 for s in samples) and len(set(samples)) >= 2, samples
        assert browser.eval("document.getElementById('overlay-section').hidden") is True
        hot = browser.eval("[...document.querySelectorAll('#local-heatmap td')].filter(td => Number(td.dataset.rate) > 0).map(td => td.dataset.pair)")
        assert f"{g1.mac}>{g2.mac}" in hot and f"{g2.mac}>{g1.mac}" in hot, hot
        record("vm1_rate_samples_kbit", [round(s * 8 / 1e3) for s in samples])
        browser.screenshot(lab.workdir / "liveview-solo.png")
        (netlab.REPO / "results").mkdir(exist_ok=True)
        shutil.copy(lab.workdir / "liveview-solo.png", netlab.REPO / "results" / "liveview-solo.png")
    finally:
        browser.close()
        netlab.stop_pid(flood)
