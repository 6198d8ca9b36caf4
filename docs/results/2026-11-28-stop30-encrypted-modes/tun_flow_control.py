"""Does a TAP push back on a UDP sender when nobody reads it? (issue #18's UDP-loss goal)

A TAP in a namespace of its own, opened and never read; a UDP socket in that namespace sends
1,400-byte datagrams to a neighbour behind the TAP for 2 s with a blocking send (2 s timeout).
With flow control the send would block once the queues fill; without it every send returns at
once and the TAP counts the overflow as TX drops. Run once with the TAP's default qdisc and
once with `pfifo limit 100` (a qdisc only pushes back if the driver stops its queue). Run as
root: `python3 tun_flow_control.py`.
"""
import fcntl
import os
import struct
import subprocess

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI = 0x0002, 0x1000
SENDER = r'''
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2.0)
n, t = 0, time.time()
try:
    while time.time() - t < 2:
        s.sendto(b"x" * 1400, ("10.250.0.2", 9))
        n += 1
    print(f"sent {n} datagrams in 2 s, no send blocked")
except socket.timeout:
    print(f"a send blocked after {n} datagrams: flow control")
'''


def run(qdisc):
    ns, tap = f"tunfc{os.getpid()}", f"tunfc{os.getpid()}"[-15:]
    subprocess.run(["ip", "netns", "add", ns], check=True)
    fd = None
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", tap.encode(), IFF_TAP | IFF_NO_PI))
        subprocess.run(["ip", "link", "set", tap, "netns", ns], check=True)

        def inns(*a):
            return subprocess.run(["ip", "netns", "exec", ns, *a], check=True, capture_output=True, text=True).stdout
        inns("ip", "addr", "add", "10.250.0.1/24", "dev", tap)
        inns("ip", "link", "set", tap, "up")
        inns("ip", "neigh", "add", "10.250.0.2", "lladdr", "02:00:00:00:00:02", "dev", tap)
        if qdisc:
            inns("tc", "qdisc", "replace", "dev", tap, "root", *qdisc.split())
        print(f"--- qdisc: {qdisc or 'default'}")
        print(inns("python3", "-c", SENDER).strip())
        print(inns("tc", "-s", "qdisc", "show", "dev", tap).strip())
        print(inns("ip", "-s", "link", "show", tap).strip())
    finally:
        if fd is not None:
            os.close(fd)
        subprocess.run(["ip", "netns", "del", ns], check=False)


if __name__ == "__main__":
    run(None)
    run("pfifo limit 100")
