"""The test helper's control-port client (netlab.ControlClient) against the transcripts the
Rust client and the daemon's encoder are checked with (tests/vectors/control-port.txt): the
bytes it sends for each call and what it makes of each answer. No daemon: a socket pair plays
it."""

import socket
import threading

from vnetlab import netlab
from vnetlab.netlab import ControlClient

VECTORS = netlab.REPO / "tests" / "vectors" / "control-port.txt"


def _split(line):
    word, _, rest = line.partition(" ")
    return word, rest


def _cases():
    cases = []
    for line in VECTORS.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        word, rest = _split(line)
        if word == "case":
            cases.append({"title": rest, "line": [], "send": [], "recv": [], "out": []})
        elif word in ("call", "want"):
            cases[-1][word] = rest
        elif word in ("line", "send", "recv", "out"):
            cases[-1][word].append(rest)
        else:
            raise AssertionError(f"unknown word {word!r} in {cases[-1]['title']!r}")
    return cases


def _text(lines):
    return "".join(f"{l}\n" for l in lines)


def _play(case):
    """(what the client sent, the outcome of its call) against a daemon that answers `recv`."""
    ours, daemon = socket.socketpair()
    ours.settimeout(5)
    daemon.settimeout(5)
    daemon.sendall(_text(case["recv"]).encode())
    daemon.shutdown(socket.SHUT_WR)
    sent = []
    reader = threading.Thread(target=lambda: sent.append(b"".join(iter(lambda: daemon.recv(65536), b""))))
    reader.start()
    c = ControlClient.over(ours)
    kind, arg = _split(case["call"])
    try:
        if kind == "command":
            result = ControlClient.outcome(*c.command(arg))
        elif kind == "auth":
            result = ControlClient.outcome(*c.auth(arg))
        elif kind == "batch":
            result = ControlClient.outcome(*c.batch(case["line"]))
        else:
            raise AssertionError(f"unknown call {kind!r}")
    except ValueError:
        result = ("invalid", None)
    c.close()
    reader.join(5)
    daemon.close()
    return sent[0].decode(), result


def test_the_python_client_follows_every_transcript():
    cases = _cases()
    assert len(cases) >= 20, len(cases)
    for case in cases:
        sent, (what, detail) = _play(case)
        assert sent == _text(case["send"]), (case["title"], sent)
        want, arg = _split(case["want"])
        assert what == want, (case["title"], what, detail)
        if want == "ok":
            assert detail == case["out"], (case["title"], detail)
        elif want == "refused":
            assert detail == arg, (case["title"], detail)
