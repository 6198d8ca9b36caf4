"""Real clients for vnetd's HTTP listener in the system tests: HTTP from inside a lab namespace,
a Prometheus server (Debian's ``prometheus``), and headless Chromium (Debian's ``chromium``)
driven over the Chrome DevTools Protocol.

Everything is started by the test in a namespace of its lab, with its files in the lab's work
directory, and stopped by PID (the lab stops what ``Netns.popen`` started, whatever happens).
Chromium speaks CDP over a pipe (``--remote-debugging-pipe``: NUL-terminated JSON on its fds
3 and 4), so no port is opened and no websocket library is needed."""

from __future__ import annotations

import base64
import fcntl
import http.client
import json
import os
import select
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional

from . import netlab
from .etcdlab import OVERLAY, TTL

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def http_get(ns, url: str, headers: Optional[dict] = None, timeout: float = 10.0):
    """GET ``url`` from inside namespace ``ns``: (status, headers, body bytes)."""
    with netlab.in_netns(ns.name):
        req = urllib.request.Request(url, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()


def raw_exchange(ns, addr: str, data: bytes, timeout: float = 10.0, pause: float = 0.0) -> tuple:
    """Send ``data`` on a new TCP connection from ``ns`` and read until the server closes.
    Returns (response bytes, seconds until closed)."""
    host, port = addr.rsplit(":", 1)
    s = ns.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    t0 = time.monotonic()
    s.connect((host, int(port)))
    out = b""
    try:
        s.sendall(data)
        if pause:
            time.sleep(pause)
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except (ConnectionResetError, BrokenPipeError):
        pass
    finally:
        s.close()
    return out, time.monotonic() - t0


class Prometheus:
    """A Prometheus server in namespace ``ns`` on 127.0.0.1:``port``, data in the work dir."""

    def __init__(self, lab, ns, scrape_configs: list, port: int = 9090):
        self.lab, self.ns, self.port = lab, ns, port
        self.dir = lab.workdir / "prometheus"
        self.dir.mkdir(exist_ok=True)
        cfg = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "scrape_configs": scrape_configs,
        }
        # JSON is YAML.
        (self.dir / "prometheus.yml").write_text(json.dumps(cfg, indent=1))
        log = open(self.dir / "prometheus.log", "ab")
        self.proc = ns.popen(PROMETHEUS, "--config.file", self.dir / "prometheus.yml",
                             "--storage.tsdb.path", self.dir / "data",
                             "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "warn",
                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        netlab.wait_until(self.ready, 30, 0.2, what="prometheus to be ready")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise netlab.LabError(f"prometheus exited: {self.log()[-2000:]}")
        try:
            return http_get(self.ns, self.url("/-/ready"), timeout=2)[0] == 200
        except OSError:
            return False

    def log(self) -> str:
        try:
            return (self.dir / "prometheus.log").read_text(errors="replace")
        except OSError:
            return ""

    def api(self, path: str, **params) -> dict:
        q = urllib.parse.urlencode(params)
        status, _, body = http_get(self.ns, self.url(f"/api/v1/{path}?{q}"))
        doc = json.loads(body)
        if status != 200 or doc.get("status") != "success":
            raise netlab.LabError(f"prometheus {path} {params}: HTTP {status}: {body[:500]!r}")
        return doc["data"]

    def query(self, expr: str) -> list:
        """Instant query: [(labels, float value)]."""
        data = self.api("query", query=expr)
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def value(self, expr: str) -> Optional[float]:
        r = self.query(expr)
        if len(r) > 1:
            raise netlab.LabError(f"{expr}: {len(r)} series, expected one: {r}")
        return r[0][1] if r else None

    def stop(self):
        netlab.stop_pid(self.proc)


class Chromium:
    """Headless Chromium in namespace ``ns``, driven over CDP on a pipe."""

    def __init__(self, lab, ns, width: int = 1400, height: int = 1000):
        self.lab, self.ns = lab, ns
        self.profile = lab.workdir / "chromium-profile"
        self.profile.mkdir(exist_ok=True)
        # Pipe ends numbered 10 and up, so that the shell's moves to 3 and 4 cannot clash.
        def high(fd):
            h = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
            os.close(fd)
            return h
        cmd_r, self.cmd_w = map(high, os.pipe())   # our commands -> chromium's fd 3
        self.resp_r, resp_w = map(high, os.pipe())  # chromium's fd 4 -> us
        argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars",
                f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
                "--remote-debugging-pipe", "about:blank"]
        # bash: dash takes only one-digit descriptors in redirections.
        shell = f'exec 3<&{cmd_r} 4>&{resp_w} {cmd_r}<&- {resp_w}>&-; exec "$@"'
        self.log_path = lab.workdir / "chromium.log"
        log = open(self.log_path, "ab")
        self.proc = ns.popen("bash", "-c", shell, "chromium", *argv, pass_fds=(cmd_r, resp_w),
                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        os.close(cmd_r)
        os.close(resp_w)
        self.buf = b""
        self.next_id = 0
        self.session = None
        targets = self.call("Target.getTargets")["targetInfos"]
        page = next((t for t in targets if t["type"] == "page"), None)
        target = page["targetId"] if page else self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from chromium")
            r, _, _ = select.select([self.resp_r], [], [], left)
            if r:
                chunk = os.read(self.resp_r, 1 << 20)
                if not chunk:
                    raise netlab.LabError(f"chromium closed its pipe: {self.log_path.read_text(errors='replace')[-2000:]}")
                self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, timeout: float = 30.0, **params) -> dict:
        self.next_id += 1
        mid = self.next_id
        msg = {"id": mid, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            msg["sessionId"] = self.session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read_message(deadline)
            if m.get("id") == mid:
                if "error" in m:
                    raise netlab.LabError(f"CDP {method}: {m['error']}")
                return m.get("result", {})

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def eval(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise netlab.LabError(f"JS {expression!r}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        params = {"format": "png"}
        if full_page:
            h = self.eval("Math.ceil(document.documentElement.scrollHeight)") or 1000
            w = self.eval("Math.ceil(document.documentElement.scrollWidth)") or 1400
            params["clip"] = {"x": 0, "y": 0, "width": w, "height": h, "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", **params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except Exception:
            pass
        netlab.stop_pid(self.proc, timeout=5)
        for fd in (self.cmd_w, self.resp_r):
            try:
                os.close(fd)
            except OSError:
                pass


def etcd_overlay(lab, etcd, n: int, token: Optional[str] = None, http_port: int = 9300,
                 http_on_underlay: bool = True, matrix_interval: int = 1, advertise: bool = True):
    """``n`` hosts (h1..hn) with one guest each (192.168.70.i, MAC 52:54:00:01:0i:01) whose
    vnetd runs with ``--etcd`` and ``--http`` (on the host's underlay address, or loopback).
    Returns (hosts, guests); waits for the full mesh of derived links."""
    hosts, guests = [], []
    for i in range(1, n + 1):
        h = lab.host(f"h{i}")
        g = lab.guest(f"g{i}", ip=f"192.168.70.{i}", mac=netlab.mac(1, i, 1))
        http = f"{h.underlay_ip if http_on_underlay else '127.0.0.1'}:{http_port}"
        args = ["--etcd", etcd.endpoint, "--overlay", OVERLAY, "--host-id", h.role,
                "--etcd-lease-ttl", TTL, "--etcd-matrix-interval", matrix_interval, "--http", http]
        if advertise:
            args += ["--advertise-addr", h.underlay_ip]
        h.start_vnetd(config=f"interface add vm tap mac {g.mac} netns {g.name} vni 1\n",
                      args=args, token=token)
        h.http = http
        g.configure(h.interface("vm")["ifname"])
        hosts.append(h)
        guests.append(g)

    def mesh():
        for h in hosts:
            links = {l["name"] for l in h.ctl_json("show", "links", "json")}
            if links != {f"c-{o.role}-v1" for o in hosts if o is not h}:
                return False
        return True
    netlab.wait_until(mesh, 20, 0.1, what="the derived full mesh")
    return hosts, guests
