#!/usr/bin/env python3
"""Test-only extension of guest/vhost_user_stub.py that also offers VIRTIO_RING_F_EVENT_IDX,
VIRTIO_NET_F_MRG_RXBUF and the REPLY_ACK protocol feature, so vhost-frontend's code paths for
them can be exercised without the real backend.

    python3 stub_ext.py PATH/TO/vhost_user_stub.py --socket S --tap T [stub options]

EVENT_IDX: the device writes avail_event (= its next avail index) and only signals when the
driver's used_event asks for it. MRG_RXBUF: a received frame is spread over as many rx
buffers as it needs, num_buffers set in the first one. Same limits as the stub otherwise.
"""

import importlib.util
import os
import struct
import sys

spec = importlib.util.spec_from_file_location("vhost_user_stub", sys.argv.pop(1))
s = importlib.util.module_from_spec(spec)
spec.loader.exec_module(s)

F_EVENT_IDX = 1 << 29
F_MRG_RXBUF = 1 << 15
PF_REPLY_ACK = 1 << 3
NEG = {"event_idx": False, "mrg": False}
COUNT = {"signals": 0, "suppressed": 0}


def need_event(ev, new, old):
    return ((new - ev - 1) & 0xFFFF) < ((new - old) & 0xFFFF)


class Vring(s.Vring):
    def __init__(self, index):
        super().__init__(index)
        self.signalled = 0

    def pop(self):
        if NEG["event_idx"] and self.used is not None:
            mm, o = self.used
            struct.pack_into("<H", mm, o + 4 + 8 * self.num, self.last_avail)
        return super().pop()

    def notify(self):
        if NEG["event_idx"]:
            mm, o = self.used
            new = struct.unpack_from("<H", mm, o + 2)[0]
            am, ao = self.avail
            ev = struct.unpack_from("<H", am, ao + 4 + 2 * self.num)[0]
            old, self.signalled = self.signalled, new
            if not need_event(ev, new, old):
                COUNT["suppressed"] += 1
                return
        COUNT["signals"] += 1
        super().notify()


class Backend(s.Backend):
    def ring(self, i):
        if i not in self.rings:
            self.rings[i] = Vring(i)
        return self.rings[i]

    def handle(self, req, flags, p, fds):
        if req == s.GET_FEATURES:
            s.log("GET_FEATURES (ext)")
            mq = s.F_NET_MQ if self.queues > 1 else 0
            f = s.F_VERSION_1 | s.F_PROTOCOL_FEATURES | mq | F_EVENT_IDX | F_MRG_RXBUF
            self.reply(req, struct.pack("<Q", f))
            return
        if req == s.GET_PROTOCOL_FEATURES:
            self.reply(req, struct.pack("<Q", s.PROTO_F_MQ | PF_REPLY_ACK))
            return
        super().handle(req, flags, p, fds)
        if req == s.SET_FEATURES:
            NEG["event_idx"] = bool(self.features & F_EVENT_IDX)
            NEG["mrg"] = bool(self.features & F_MRG_RXBUF)
            s.log(f"ext: event_idx={NEG['event_idx']} mrg_rxbuf={NEG['mrg']}")

    def to_guest(self):
        r = self.rings.get(0)
        if not NEG["mrg"] or r is None or not (r.ready() and r.enabled):
            return super().to_guest()
        done = False
        while self.pending:
            data = bytearray(s.HDR_LEN) + self.pending[0]
            saved = r.last_avail
            chains, room = [], 0
            while room < len(data):
                head = r.pop()
                if head is None:
                    break
                ch = r.chain(head, self.mem)
                chains.append((head, ch))
                room += sum(ln for _m, _o, ln, w in ch if w)
            if room < len(data):
                r.last_avail = saved  # not enough buffers yet: leave them for later
                break
            struct.pack_into("<H", data, 10, len(chains))
            pos = 0
            for head, ch in chains:
                written = 0
                for m, o, ln, w in ch:
                    if w and pos < len(data):
                        n = min(ln, len(data) - pos)
                        m[o:o + n] = bytes(data[pos:pos + n])
                        pos += n
                        written += n
                r.push(head, written)
            self.pending.pop(0)
            self.stats["to_guest"] += 1
            done = True
        if done:
            r.notify()

    def run(self):
        try:
            super().run()
        finally:
            s.log("ext notifications", COUNT)


s.Backend = Backend
if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    s.main()
