import socket, sys, time, select
ifn = sys.argv[1]
rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
rx.bind((ifn, 0))
def send():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO
    s.bind(("10.99.1.1", 40000))
    s.sendto(bytes((i * 7 + 3) & 0xff for i in range(1400)), ("10.99.2.1", 9999))
    s6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s6.bind(("fd99:1::1", 40000))
    s6.sendto(bytes((i * 7 + 3) & 0xff for i in range(1400)), ("fd99:2::1", 9999))
    t = socket.socket(socket.AF_INET, socket.SOCK_STREAM); t.setblocking(False)
    t.bind(("10.99.1.1", 40001))
    try: t.connect(("10.99.2.1", 9998))
    except BlockingIOError: pass
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("10.99.1.1", 40002))
    u.sendto(b"vnet-wire known vector", ("10.99.2.1", 9997))
    time.sleep(0.5)
    return (s, s6, t, u)
keep = send()
end = time.time() + 2
while time.time() < end:
    r, _, _ = select.select([rx], [], [], 0.2)
    if not r: continue
    data, addr = rx.recvfrom(65535)
    et = data[12:14].hex()
    print(addr[2], et, len(data), data.hex())
