"""A TCP relay whose answers can be held back: what a busy gRPC proxy or a congested path does to
etcd's answers, made deterministic for a test (issue #19).

Everything the client sends goes on to the server at once; what the server sends back is held
while the relay is told to hold (SIGUSR1) and delivered when it is told to release (SIGUSR2).
So requests such as lease renewals reach etcd on time while their answers come late.

    python3 vnetlab/relay.py LISTEN_HOST:PORT SERVER_HOST:PORT

Runs until killed; prints "ready" once it listens. Connections are relayed by threads of their
own; a side that closes closes the other."""

from __future__ import annotations

import signal
import socket
import sys
import threading

released = threading.Event()
released.set()


def split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host, int(port)


def pump(src: socket.socket, dst: socket.socket, held: bool) -> None:
    """Copies src to dst until either side closes; with `held`, each chunk waits for release."""
    try:
        while True:
            chunk = src.recv(65536)
            if not chunk:
                break
            if held:
                released.wait()
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def serve(listen: str, server: str) -> None:
    lsock = socket.create_server(split(listen), reuse_port=False)
    print("ready", flush=True)
    while True:
        client, _ = lsock.accept()
        try:
            upstream = socket.create_connection(split(server), timeout=5)
            upstream.settimeout(None)
        except OSError:
            client.close()
            continue
        for src, dst, held in ((client, upstream, False), (upstream, client, True)):
            threading.Thread(target=pump, args=(src, dst, held), daemon=True).start()


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    signal.signal(signal.SIGUSR1, lambda *_: released.clear())
    signal.signal(signal.SIGUSR2, lambda *_: released.set())
    serve(sys.argv[1], sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
