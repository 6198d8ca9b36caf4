"""What one full read of an overlay costs etcd through its JSON gateway against its gRPC API
(what ``etcdctl`` uses), issue #13: the measurement that moved vnet's agents from the gateway
to gRPC in issue #19 (they now read over gRPC, in pages of 10,000 keys:
docs/design/etcd-agent.md).

Starts its own etcd on loopback (data in /dev/shm), fills it with the keys of N hosts x 8
guests in vnet's schema (host records and placements, as the agents write them), and reads
the whole prefix R times each way: through the gateway in one answer, through the gateway in
pages of 1,000 keys (what the agents did before #19), and over gRPC (``etcdctl get --prefix -w
protobuf``). Reports per read: wall time, etcd's CPU (from /proc), and the answer's size.
etcd is stopped by PID at the end.

    python3 -m bench.etcd_gateway_cost [--hosts 1000] [--reads 10]
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import subprocess
import time
import urllib.request

from vnetlab.etcdlab import etcd_argv
from vnetlab.procs import stop_pid

from .etcd import free_port, shm_dir
from .machine import proc_cpu


def b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--reads", type=int, default=10)
    args = ap.parse_args()
    cp, pp = free_port(), free_port()
    data = shm_dir("vnet-gwcost-")
    url = f"http://127.0.0.1:{cp}"
    etcd = subprocess.Popen(etcd_argv("g", data, url, f"http://127.0.0.1:{pp}"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)

    def post(path: str, body: dict) -> bytes:
        req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.read()

    try:
        for _ in range(100):
            try:
                post("/v3/kv/range", {"key": b64("x")})
                break
            except OSError:
                time.sleep(0.1)
        prefix = "/vnet/gw/"
        ops = []
        for i in range(args.hosts):
            h = f"h{i:05d}"
            rec = {"host_id": h, "addr": f"10.200.{i // 250}.{i % 250 + 1}", "udp_port": 4789, "capabilities": ["vxlan"], "version": 1}
            ops.append({"request_put": {"key": b64(f"{prefix}hosts/{h}"), "value": b64(json.dumps(rec, separators=(",", ":")))}})
            for g in range(8):
                mac = f"52:54:{(i >> 8) & 255:02x}:{i & 255:02x}:00:{g:02x}"
                rec = {"mac": mac, "vni": 1, "host_id": h, "name": f"g{g}", "epoch": 0}
                ops.append({"request_put": {"key": b64(f"{prefix}interfaces/1/{mac}"), "value": b64(json.dumps(rec, separators=(",", ":")))}})
        for k in range(0, len(ops), 100):
            post("/v3/kv/txn", {"success": ops[k:k + 100]})
        start, end = b64(prefix), b64(prefix[:-1] + chr(ord(prefix[-1]) + 1))

        def whole() -> int:
            return len(post("/v3/kv/range", {"key": start, "range_end": end}))

        def paged() -> int:
            size, key = 0, start
            rev = 0
            while True:
                body = {"key": key, "range_end": end, "limit": 1000}
                if rev:
                    body["revision"] = rev
                raw = post("/v3/kv/range", body)
                size += len(raw)
                r = json.loads(raw)
                rev = rev or int(r["header"]["revision"])
                kvs = r.get("kvs", [])
                if not r.get("more") or not kvs:
                    return size
                key = b64(base64.b64decode(kvs[-1]["key"]) + b"\0")

        def grpc() -> int:
            return len(subprocess.run(["etcdctl", "--endpoints", url, "get", "--prefix", prefix, "-w", "protobuf"],
                                      capture_output=True, check=True).stdout)

        print(f"{args.hosts} hosts x 8 guests: {len(ops)} keys; {args.reads} reads each way")
        print("| read | wall ms | etcd CPU ms | answer MB |")
        print("| --- | --- | --- | --- |")
        for label, fn in (("gateway, one answer", whole), ("gateway, pages of 1000", paged), ("gRPC (etcdctl)", grpc)):
            c0, t0 = proc_cpu(etcd.pid), time.time()
            size = 0
            for _ in range(args.reads):
                size = fn()
            c1, t1 = proc_cpu(etcd.pid), time.time()
            print(f"| {label} | {(t1 - t0) / args.reads * 1000:.0f} | {(c1 - c0) / args.reads * 1000:.0f} | {size / 1e6:.2f} |")
    finally:
        stop_pid(etcd, timeout=10)
        shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
