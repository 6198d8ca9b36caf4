"""A tiny STUN server and client for the wide-area lab (RFC 8489, formerly 5389: the Binding
method only, over UDP, IPv4): what "an operator-named STUN server" is in a test, and the lab's
own reflector when it checks how a NAT maps and filters.

- ``answer(datagram, source)``: the server's reply to one datagram (pure): a Binding success
  response with XOR-MAPPED-ADDRESS (and the classic MAPPED-ADDRESS, SOFTWARE, FINGERPRINT) for
  a well-formed Binding request, a 420 error for a request with comprehension-required
  attributes it does not know, nothing for anything else (not STUN, a response, a bad length
  or fingerprint): a reflector must never answer garbage, or it becomes an amplifier;
- ``binding(sock, server)``: the client side on a socket the caller owns (so the mapping
  learned is that socket's), with retransmissions as RFC 8489 7.2.1 (shortened for a lab);
- ``StunServer``: the server as a process in a lab namespace (``python3 -m vnetlab.stun
  serve IP PORT``), stopped by PID, which prints its counters as JSON when it ends.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from typing import Optional

MAGIC = 0x2112A442
BINDING_REQUEST = 0x0001
BINDING_SUCCESS = 0x0101
BINDING_ERROR = 0x0111
MAPPED_ADDRESS = 0x0001
XOR_MAPPED_ADDRESS = 0x0020
ERROR_CODE = 0x0009
UNKNOWN_ATTRIBUTES = 0x000A
SOFTWARE = 0x8022
FINGERPRINT = 0x8028
FINGERPRINT_XOR = 0x5354554E
SOFTWARE_NAME = b"vnetlab-stun"
HEADER = struct.Struct("!HHI12s")


class StunError(ValueError):
    pass


def _attr(kind: int, value: bytes) -> bytes:
    return struct.pack("!HH", kind, len(value)) + value + b"\0" * (-len(value) % 4)


def _message(kind: int, txid: bytes, attrs: bytes, fingerprint: bool = True) -> bytes:
    if fingerprint:
        # the length in the header counts the FINGERPRINT attribute (8 bytes) it protects
        head = HEADER.pack(kind, len(attrs) + 8, MAGIC, txid)
        crc = (zlib.crc32(head + attrs) ^ FINGERPRINT_XOR) & 0xFFFFFFFF
        return head + attrs + _attr(FINGERPRINT, struct.pack("!I", crc))
    return HEADER.pack(kind, len(attrs), MAGIC, txid) + attrs


def _attrs(data: bytes) -> list:
    """(type, value, offset) of each attribute; StunError when they do not add up."""
    out, off = [], HEADER.size
    while off < len(data):
        if off + 4 > len(data):
            raise StunError("truncated attribute header")
        kind, length = struct.unpack_from("!HH", data, off)
        end = off + 4 + length
        if end > len(data):
            raise StunError("attribute runs past the message")
        out.append((kind, data[off + 4:end], off))
        off = end + (-length % 4)
    return out


def parse(data: bytes) -> tuple:
    """(message type, transaction id, attributes) of a STUN message; StunError otherwise.
    A FINGERPRINT, when there, must be the last attribute and right."""
    if len(data) < HEADER.size:
        raise StunError("shorter than a STUN header")
    kind, length, cookie, txid = HEADER.unpack_from(data)
    if kind & 0xC000:
        raise StunError("the first two bits are not zero")
    if cookie != MAGIC:
        raise StunError("no magic cookie")
    if length % 4 or length != len(data) - HEADER.size:
        raise StunError("length does not match")
    attrs = _attrs(data)
    for i, (k, v, off) in enumerate(attrs):
        if k == FINGERPRINT:
            if i != len(attrs) - 1 or len(v) != 4:
                raise StunError("FINGERPRINT not last")
            want = (zlib.crc32(data[:off]) ^ FINGERPRINT_XOR) & 0xFFFFFFFF
            if struct.unpack("!I", v)[0] != want:
                raise StunError("bad FINGERPRINT")
    return kind, txid, [(k, v) for k, v, _ in attrs]


def xor_address(ip: str, port: int) -> bytes:
    a = int(ipaddress.IPv4Address(ip))
    return struct.pack("!BBHI", 0, 1, port ^ (MAGIC >> 16), a ^ MAGIC)


def answer(data: bytes, source: tuple) -> Optional[bytes]:
    """The server's reply to ``data`` from ``source`` (ip, port), or None to stay silent."""
    try:
        kind, txid, attrs = parse(data)
    except StunError:
        return None
    if kind != BINDING_REQUEST:
        return None  # responses, indications, other methods: never answered
    unknown = [k for k, _ in attrs if k < 0x8000]
    if unknown:
        err = struct.pack("!HBB", 0, 4, 20) + b"Unknown Attribute"
        body = _attr(ERROR_CODE, err) + _attr(UNKNOWN_ATTRIBUTES, b"".join(struct.pack("!H", k) for k in unknown))
        return _message(BINDING_ERROR, txid, body)
    ip, port = source[0], source[1]
    plain = struct.pack("!BBH4s", 0, 1, port, socket.inet_aton(ip))
    body = (_attr(XOR_MAPPED_ADDRESS, xor_address(ip, port)) + _attr(MAPPED_ADDRESS, plain)
            + _attr(SOFTWARE, SOFTWARE_NAME))
    return _message(BINDING_SUCCESS, txid, body)


def request() -> tuple:
    """A Binding request and its transaction id."""
    txid = secrets.token_bytes(12)
    return _message(BINDING_REQUEST, txid, b""), txid


def mapped_address(data: bytes, txid: bytes) -> tuple:
    """(ip, port) from a Binding success response to ``txid``; StunError otherwise."""
    kind, got, attrs = parse(data)
    if got != txid:
        raise StunError("another transaction")
    if kind != BINDING_SUCCESS:
        raise StunError(f"not a success response (type {kind:#06x})")
    for k, v in attrs:
        if k == XOR_MAPPED_ADDRESS and len(v) == 8 and v[1] == 1:
            _, _, xport, xaddr = struct.unpack("!BBHI", v)
            return str(ipaddress.IPv4Address(xaddr ^ MAGIC)), xport ^ (MAGIC >> 16)
    raise StunError("no IPv4 XOR-MAPPED-ADDRESS")


def binding(sock: socket.socket, server: tuple, timeout: float = 2.0, rto: float = 0.1) -> tuple:
    """Ask ``server`` (ip, port) how it sees ``sock``: the mapped (ip, port). Retransmits with
    a doubling interval from ``rto`` until ``timeout``; other datagrams on the socket are
    skipped. TimeoutError when nothing answers."""
    msg, txid = request()
    deadline = time.monotonic() + timeout
    wait = rto
    old = sock.gettimeout()
    try:
        while time.monotonic() < deadline:
            sock.sendto(msg, server)
            resend = min(deadline, time.monotonic() + wait)
            wait *= 2
            while True:
                left = resend - time.monotonic()
                if left <= 0:
                    break
                sock.settimeout(left)
                try:
                    data, src = sock.recvfrom(2048)
                except socket.timeout:
                    break
                if src[:2] != tuple(server):
                    continue
                try:
                    return mapped_address(data, txid)
                except StunError:
                    continue
        raise TimeoutError(f"no STUN answer from {server[0]}:{server[1]} within {timeout}s")
    finally:
        sock.settimeout(old)


# --- the server as a lab process ---------------------------------------------------------------

def serve(ip: str, port: int) -> int:
    """Answer Binding requests on ip:port until SIGTERM/SIGINT; then print the counters."""
    counts = {"requests": 0, "answered": 0, "errors": 0, "ignored": 0}
    stop = []

    def on_signal(signum, frame):
        stop.append(signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ip, port))
    s.settimeout(0.2)
    print(json.dumps({"listening": f"{ip}:{port}"}), flush=True)
    while not stop:
        try:
            data, src = s.recvfrom(4096)
        except socket.timeout:
            continue
        except InterruptedError:
            continue
        counts["requests"] += 1
        out = answer(data, src)
        if out is None:
            counts["ignored"] += 1
            continue
        counts["errors" if out[1] == 0x11 else "answered"] += 1
        try:
            s.sendto(out, src)
        except OSError:
            pass
    print(json.dumps(counts), flush=True)
    return 0


class StunServer:
    """``serve`` in a lab namespace, on ``ip:port`` of that namespace; stopped by PID."""

    def __init__(self, ns, ip: str, port: int = 3478):
        self.ns, self.ip, self.port = ns, ip, port
        self.log = ns.lab.workdir / f"stun-{ns.role}-{port}.log"
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        with open(self.log, "wb") as f:
            self.proc = ns.popen(sys.executable, "-m", "vnetlab.stun", "serve", ip, port, cwd=repo,
                                 stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while "listening" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"STUN server in {ns.name} did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)

    @property
    def address(self) -> tuple:
        return (self.ip, self.port)

    def stop(self) -> dict:
        """Stop it; its counters (requests, answered, errors, ignored)."""
        from .procs import stop_pid
        stop_pid(self.proc)
        for line in reversed(self.log.read_text(errors="replace").splitlines()):
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if "requests" in d:
                return d
        return {}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="A tiny STUN (RFC 8489 Binding) server or client for the lab")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="answer Binding requests on IP PORT")
    s.add_argument("ip")
    s.add_argument("port", type=int)
    c = sub.add_parser("ask", help="ask a server how it sees this host")
    c.add_argument("ip")
    c.add_argument("port", type=int)
    c.add_argument("--bind", default="0.0.0.0:0")
    a = ap.parse_args(argv)
    if a.cmd == "serve":
        return serve(a.ip, a.port)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    host, _, port = a.bind.rpartition(":")
    sock.bind((host, int(port)))
    ip, port = binding(sock, (a.ip, a.port))
    print(f"{ip}:{port}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
