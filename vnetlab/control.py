"""The control port spoken directly, line by line, for the tests that send it malformed or
hostile input (test_control.py, test_robustness.py) and for the grammar's vectors
(test_control_vectors.py). Its own module because it is one wire contract (the grammar of
docs/control-language.md, "The control port"), apart from building namespaces: it needs only a
host's control address and a socket in its namespace, so it imports nothing of netlab.
"""

from __future__ import annotations

import re
import socket
from typing import Optional


class ControlClient:
    """A raw connection to a vnetd control port from inside its host namespace. It speaks the
    grammar of docs/control-language.md ("The control port") as the Rust client does
    (crates/vnet-client); tests/vectors/control-port.txt pins both (test_control_vectors.py)."""

    MAX_BATCH_BYTES = 1 << 20
    MAX_BATCH_LINES = 100_000

    def __init__(self, host, timeout: float = 5.0):
        """``host`` is a netlab ``Host`` (its ``control`` address and ``socket()`` in its namespace)."""
        addr, port = host.control.rsplit(":", 1)
        self.sock = host.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect((addr, int(port)))
        self.buf = b""

    @classmethod
    def over(cls, sock: socket.socket) -> "ControlClient":
        """A client on a connected socket (the grammar's test uses a socket pair)."""
        c = cls.__new__(cls)
        c.sock, c.buf = sock, b""
        return c

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def readline(self) -> Optional[str]:
        """One line of the answer, or None when the daemon closed the connection."""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode(errors="replace")

    @staticmethod
    def count(status: Optional[str]) -> Optional[int]:
        """N of an ``ok N`` status line (digits only), else None."""
        m = re.fullmatch(r"ok ([0-9]+)", status or "")
        return int(m.group(1)) if m else None

    def answer(self) -> tuple[Optional[str], list]:
        """(status line, output lines) of one answer: ``ok N`` + N lines, or ``error MSG``;
        None where the daemon closed the connection."""
        status = self.readline()
        lines = []
        for _ in range(self.count(status) or 0):
            lines.append(self.readline())
            if lines[-1] is None:
                break
        return status, lines

    @classmethod
    def outcome(cls, status: Optional[str], lines: list) -> tuple[str, object]:
        """What an answer means, as the Rust client tells it: ("ok", lines), ("refused",
        message), ("closed", None) or ("bad-answer", status)."""
        if status is None or None in lines:
            return "closed", None
        if cls.count(status) is not None:
            return "ok", lines
        if status.startswith("error "):
            return "refused", status[len("error "):]
        return "bad-answer", status

    def command(self, line: str) -> tuple[Optional[str], list]:
        if "\n" in line:
            raise ValueError("a command is one line")
        self.send_raw(line.encode() + b"\n")
        return self.answer()

    def auth(self, token: str) -> tuple[Optional[str], list]:
        if not token or any(c.isspace() for c in token):
            raise ValueError("a token is one word")
        return self.command(f"auth {token}")

    def batch(self, lines: list) -> tuple[Optional[str], list]:
        """``batch N`` and the N lines of a script, refused here as vnetd would refuse it."""
        if any("\n" in l for l in lines):
            raise ValueError("a script line is one line")
        if sum(len(l.encode()) + 1 for l in lines) > self.MAX_BATCH_BYTES or len(lines) > self.MAX_BATCH_LINES:
            raise ValueError("the script is over vnetd's bounds for one batch: split it")
        self.send_raw("".join(f"{l}\n" for l in [f"batch {len(lines)}", *lines]).encode())
        return self.answer()

    def closed_by_peer(self, timeout: float = 3.0) -> bool:
        """True once the daemon has closed the connection (EOF or reset)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                d = self.sock.recv(65536)
                if not d:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def close(self) -> None:
        self.sock.close()
