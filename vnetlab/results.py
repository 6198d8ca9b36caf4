"""What the lab's measurements return: ping's counts and average round trip, iperf3's goodput
at the receiver, parsed from the tools' own output."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Optional

from .procs import LabError


@dataclass
class PingResult:
    sent: int
    received: int
    loss: float  # percent
    avg_ms: Optional[float]
    output: str

    @property
    def ok(self) -> bool:
        return self.received > 0


@dataclass
class IperfResult:
    gbps: float  # receiver-side goodput, Gbit/s
    bytes: int  # bytes received by the server
    retransmits: Optional[int]
    raw: dict = field(repr=False, default_factory=dict)


_PING_COUNTS = re.compile(r"(\d+) packets transmitted, (\d+) (?:packets )?received")
_PING_LOSS = re.compile(r"([\d.]+)% packet loss")
_PING_RTT = re.compile(r"= [\d.]+/([\d.]+)/[\d.]+")


def parse_ping(out: str) -> PingResult:
    m = _PING_COUNTS.search(out)
    sent, recv = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    m = _PING_LOSS.search(out)
    loss = float(m.group(1)) if m else 100.0
    m = _PING_RTT.search(out)
    return PingResult(sent, recv, loss, float(m.group(1)) if m else None, out)


def parse_iperf(out: str) -> IperfResult:
    j = json.loads(out)
    if "error" in j:
        raise LabError(f"iperf3: {j['error']}")
    end = j["end"]
    recv = end.get("sum_received") or end["sum"]
    sent = end.get("sum_sent", {})
    return IperfResult(recv["bits_per_second"] / 1e9, int(recv["bytes"]), sent.get("retransmits"), j)
