"""Frames and datagrams built by hand for the tests: MACs, Ethernet frames, VXLAN headers, and
the records of a vnet TCP link stream."""

from __future__ import annotations

import struct


def mac_bytes(mac: str) -> bytes:
    return bytes(int(x, 16) for x in mac.split(":"))


def ether(dst: str, src: str, ethertype: int = 0x88B5, payload: bytes = b"") -> bytes:
    """An Ethernet frame (no FCS). 0x88B5 is the IEEE 'local experimental' ethertype."""
    return mac_bytes(dst) + mac_bytes(src) + struct.pack("!H", ethertype) + payload


def vxlan(vni: int, frame: bytes, flags: int = 0x08) -> bytes:
    """A VXLAN header (RFC 7348: flags, 3 reserved, VNI << 8) followed by ``frame``."""
    return struct.pack("!B3xI", flags, vni << 8) + frame


def mac(vni: int, host: int, guest: int) -> str:
    """Deterministic locally administered unicast MAC for a test guest."""
    return f"52:54:00:{vni:02x}:{host:02x}:{guest:02x}"


def stream_hello(vni: int) -> bytes:
    """Greeting of a vnet TCP link stream: b"VNET", version 1, 24-bit VNI
    (the framing is defined in crates/vnet-wire/src/stream.rs)."""
    return b"VNET" + bytes([1]) + vni.to_bytes(3, "big")


def stream_record(vni: int, frame: bytes) -> bytes:
    """One record of a TCP link stream: 4-byte big-endian length, VXLAN header, frame."""
    body = vxlan(vni, frame)
    return struct.pack("!I", len(body)) + body
