#!/usr/bin/env python3
"""A tiny vhost-user-net backend that bridges one VM to a TAP device, for testing the guest
tooling (guest/qemu.py's VhostUser NIC, QEMU's memfd shared memory) without vnetd.

    ip netns exec NS python3 guest/vhost_user_stub.py --socket /tmp/x.sock --tap tapX [--client]

It listens on --socket (QEMU connects: QEMU's ``-chardev socket,path=...`` without server=on),
or with --client connects to a QEMU that listens (``server=on``). It attaches to TAP --tap
(created if missing) in the namespace it runs in, and moves frames both ways: split
virtqueues, no EVENT_IDX, no indirect descriptors, no offloads, no mergeable buffers (so the
guest does all checksums and segmentation). Slow (Python), single-threaded, for tests only;
it is NOT a model for vnetd's data path. It exits when QEMU disconnects.

Known problem (guest/README.md): at full iperf3 speed the guest sometimes reports
"input.0:id N is not a head!" (RX ring corruption, not root-caused); low rates are fine.
"""

from __future__ import annotations

import argparse
import fcntl
import mmap
import os
import selectors
import socket
import struct
import sys
import time

# vhost-user requests
GET_FEATURES, SET_FEATURES, SET_OWNER, RESET_OWNER = 1, 2, 3, 4
SET_MEM_TABLE, SET_LOG_BASE, SET_LOG_FD = 5, 6, 7
SET_VRING_NUM, SET_VRING_ADDR, SET_VRING_BASE, GET_VRING_BASE = 8, 9, 10, 11
SET_VRING_KICK, SET_VRING_CALL, SET_VRING_ERR = 12, 13, 14
GET_PROTOCOL_FEATURES, SET_PROTOCOL_FEATURES, GET_QUEUE_NUM, SET_VRING_ENABLE = 15, 16, 17, 18
SEND_RARP, NET_SET_MTU = 19, 20
NAMES = {v: k for k, v in globals().items() if k.isupper() and isinstance(v, int)}

F_VERSION_1 = 1 << 32
F_PROTOCOL_FEATURES = 1 << 30
F_NET_MQ = 1 << 22
PROTO_F_MQ = 1 << 0
HDR_LEN = 12  # virtio_net_hdr_mrg_rxbuf: always this size with VERSION_1
VRING_DESC_F_NEXT, VRING_DESC_F_WRITE = 1, 2

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000


def log(*a):
    print("[vhost-user-stub]", *a, file=sys.stderr, flush=True)


class Memory:
    def __init__(self):
        self.regions = []  # (gpa, size, uva, mmap, mmap_offset)

    def set_table(self, payload: bytes, fds: list[int]):
        for r in self.regions:
            r[3].close()
        self.regions = []
        n, = struct.unpack_from("<I", payload, 0)
        for i in range(n):
            gpa, size, uva, off = struct.unpack_from("<QQQQ", payload, 8 + 32 * i)
            mm = mmap.mmap(fds[i], off + size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            os.close(fds[i])
            self.regions.append((gpa, size, uva, mm, off))
            log(f"region {i}: gpa={gpa:#x} size={size:#x} uva={uva:#x} mmap_offset={off:#x}")

    def gpa(self, addr: int, length: int):
        for gpa, size, _uva, mm, off in self.regions:
            if gpa <= addr and addr + length <= gpa + size:
                return mm, off + addr - gpa
        raise ValueError(f"guest address {addr:#x}+{length} outside guest memory")

    def uva(self, addr: int):
        for _gpa, size, uva, mm, off in self.regions:
            if uva <= addr < uva + size:
                return mm, off + addr - uva
        raise ValueError(f"VMM address {addr:#x} outside guest memory")


class Vring:
    def __init__(self, index: int):
        self.index = index
        self.num = 0
        self.addrs = None
        self.last_avail = 0
        self.kick = None
        self.call = None
        self.enabled = False
        self.desc = self.avail = self.used = None

    def ready(self):
        return self.desc is not None and self.kick is not None

    def map(self, mem: Memory):
        d, u, a = self.addrs
        self.desc, self.used, self.avail = mem.uva(d), mem.uva(u), mem.uva(a)

    def avail_idx(self):
        mm, o = self.avail
        return struct.unpack_from("<H", mm, o + 2)[0]

    def pop(self):
        """Next available head, or None."""
        if self.last_avail == self.avail_idx():
            return None
        mm, o = self.avail
        head, = struct.unpack_from("<H", mm, o + 4 + 2 * (self.last_avail % self.num))
        self.last_avail = (self.last_avail + 1) & 0xFFFF
        return head

    def chain(self, head: int, mem: Memory):
        """[(mmap, offset, len, writable)] of the descriptor chain at ``head``."""
        out = []
        mm, o = self.desc
        i = head
        for _ in range(self.num):
            addr, ln, flags, nxt = struct.unpack_from("<QIHH", mm, o + 16 * i)
            m, off = mem.gpa(addr, ln)
            out.append((m, off, ln, bool(flags & VRING_DESC_F_WRITE)))
            if not flags & VRING_DESC_F_NEXT:
                return out
            i = nxt
        raise ValueError("descriptor chain loops")

    def push(self, head: int, length: int):
        mm, o = self.used
        idx, = struct.unpack_from("<H", mm, o + 2)
        struct.pack_into("<II", mm, o + 4 + 8 * (idx % self.num), head, length)
        struct.pack_into("<H", mm, o + 2, (idx + 1) & 0xFFFF)

    def notify(self):
        if self.call is not None:
            os.write(self.call, (1).to_bytes(8, "little"))


class Backend:
    def __init__(self, conn: socket.socket, tap_fd: int, queues: int):
        self.conn, self.tap, self.queues = conn, tap_fd, queues
        self.mem = Memory()
        self.rings: dict[int, Vring] = {}
        self.features = 0
        self.sel = selectors.DefaultSelector()
        self.sel.register(conn, selectors.EVENT_READ, ("ctl", None))
        self.sel.register(tap_fd, selectors.EVENT_READ, ("tap", None))
        self.pending: list[bytes] = []  # frames from the TAP waiting for receive buffers
        self.stats = {"to_guest": 0, "from_guest": 0, "dropped": 0}

    def ring(self, i: int) -> Vring:
        if i not in self.rings:
            self.rings[i] = Vring(i)
        return self.rings[i]

    # -- control plane --
    def recv_exact(self, n: int, fds: list):
        """``n`` bytes of the connection (None if it closed first); the file descriptors that
        came with them are appended to ``fds``."""
        got = b""
        while len(got) < n:
            data, anc, _flags, _ = self.conn.recvmsg(n - len(got), socket.CMSG_SPACE(8 * 4))
            if not data:
                return None
            got += data
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    fds += list(struct.unpack(f"<{len(cdata) // 4}i", cdata[: len(cdata) // 4 * 4]))
        return got

    def recv_msg(self):
        fds = []
        hdr = self.recv_exact(12, fds)
        if hdr is None:
            return None
        req, flags, size = struct.unpack("<III", hdr)
        payload = self.recv_exact(size, fds)
        if payload is None:
            return None
        return req, flags, payload, fds

    def reply(self, req: int, payload: bytes):
        self.conn.sendall(struct.pack("<III", req, 0x1 | 0x4, len(payload)) + payload)

    def handle(self, req, flags, p, fds):
        log(NAMES.get(req, req), p[:16].hex() if p else "", f"fds={len(fds)}" if fds else "")
        if req == GET_FEATURES:
            mq = F_NET_MQ if self.queues > 1 else 0
            self.reply(req, struct.pack("<Q", F_VERSION_1 | F_PROTOCOL_FEATURES | mq))
        elif req == SET_FEATURES:
            self.features, = struct.unpack_from("<Q", p)
            log(f"features {self.features:#x}")
        elif req == GET_PROTOCOL_FEATURES:
            self.reply(req, struct.pack("<Q", PROTO_F_MQ))
        elif req == GET_QUEUE_NUM:
            self.reply(req, struct.pack("<Q", self.queues))
        elif req == SET_MEM_TABLE:
            self.mem.set_table(p, fds)
            for r in self.rings.values():
                if r.addrs:
                    r.map(self.mem)
        elif req == SET_VRING_NUM:
            i, n = struct.unpack_from("<II", p)
            self.ring(i).num = n
        elif req == SET_VRING_BASE:
            i, n = struct.unpack_from("<II", p)
            self.ring(i).last_avail = n
        elif req == SET_VRING_ADDR:
            i, _fl, d, u, a, _log = struct.unpack_from("<IIQQQQ", p)
            r = self.ring(i)
            r.addrs = (d, u, a)
            r.map(self.mem)
        elif req in (SET_VRING_KICK, SET_VRING_CALL, SET_VRING_ERR):
            v, = struct.unpack_from("<Q", p)
            r = self.ring(v & 0xFF)
            fd = None if v & 0x100 else fds[0]
            if req == SET_VRING_KICK:
                if r.kick is not None:
                    self.sel.unregister(r.kick)
                    os.close(r.kick)
                r.kick = fd
                if fd is not None:
                    self.sel.register(fd, selectors.EVENT_READ, ("kick", r))
                    if not self.features & F_PROTOCOL_FEATURES:
                        r.enabled = True
            elif req == SET_VRING_CALL:
                if r.call is not None:
                    os.close(r.call)
                r.call = fd
            elif fd is not None:
                os.close(fd)
        elif req == SET_VRING_ENABLE:
            i, on = struct.unpack_from("<II", p)
            self.ring(i).enabled = bool(on)
        elif req == GET_VRING_BASE:
            i, _ = struct.unpack_from("<II", p)
            r = self.ring(i)
            if r.kick is not None:
                self.sel.unregister(r.kick)
                os.close(r.kick)
                r.kick = None
            self.reply(req, struct.pack("<II", i, r.last_avail))
        else:
            for fd in fds:
                os.close(fd)
        if flags & 0x8 and req not in (GET_FEATURES, GET_PROTOCOL_FEATURES, GET_QUEUE_NUM, GET_VRING_BASE):
            self.reply(req, struct.pack("<Q", 0))  # REPLY_ACK (not offered; harmless)

    # -- data plane --
    def from_guest(self, r: Vring):
        done = False
        while r.ready() and r.enabled:
            head = r.pop()
            if head is None:
                break
            frame = b"".join(bytes(m[o:o + ln]) for m, o, ln, w in r.chain(head, self.mem) if not w)
            r.push(head, 0)
            done = True
            if len(frame) > HDR_LEN:
                os.write(self.tap, frame[HDR_LEN:])
                self.stats["from_guest"] += 1
        if done:
            r.notify()

    def to_guest(self):
        r = self.rings.get(0)  # frames to the guest always go to the first receive queue
        if r is None or not (r.ready() and r.enabled):
            if len(self.pending) > 64:
                self.stats["dropped"] += len(self.pending) - 64
                del self.pending[:-64]
            return
        done = False
        while self.pending:
            head = r.pop()
            if head is None:
                break
            data = bytes(HDR_LEN - 2) + struct.pack("<H", 1) + self.pending.pop(0)  # num_buffers=1
            pos = 0
            for m, o, ln, w in r.chain(head, self.mem):
                if not w or pos >= len(data):
                    continue
                n = min(ln, len(data) - pos)
                m[o:o + n] = data[pos:pos + n]
                pos += n
            r.push(head, pos)
            done = True
            self.stats["to_guest"] += 1
        if done:
            r.notify()
        if len(self.pending) > 256:
            self.stats["dropped"] += len(self.pending) - 256
            del self.pending[:-256]

    def run(self):
        while True:
            for key, _ in self.sel.select(timeout=1.0):
                kind, r = key.data
                if kind == "ctl":
                    m = self.recv_msg()
                    if m is None:
                        log("frontend disconnected", self.stats)
                        return
                    self.handle(*m)
                elif kind == "tap":
                    try:
                        self.pending.append(os.read(self.tap, 65536))
                    except BlockingIOError:
                        pass
                    self.to_guest()
                elif kind == "kick":
                    try:
                        os.read(r.kick, 8)
                    except BlockingIOError:
                        pass
                    if r.index % 2 == 1:
                        self.from_guest(r)
                    else:
                        self.to_guest()


def open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--tap", required=True)
    ap.add_argument("--client", action="store_true", help="connect to a listening QEMU")
    ap.add_argument("--queues", type=int, default=1)
    ap.add_argument("--connect-timeout", type=float, default=30)
    a = ap.parse_args()
    tap = open_tap(a.tap)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if a.client:
        deadline = time.monotonic() + a.connect_timeout
        while True:
            try:
                conn.connect(a.socket)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    else:
        if os.path.exists(a.socket):
            os.unlink(a.socket)
        conn.bind(a.socket)
        conn.listen(1)
        log(f"listening on {a.socket}")
        print("LISTENING", flush=True)
        c, _ = conn.accept()
        conn.close()
        conn = c
    log("connected")
    Backend(conn, tap, a.queues).run()


if __name__ == "__main__":
    main()
