"""Reading vnet's own counters (``show stats json``): drops by reason, and how much a port's
counter grew between two snapshots."""

from __future__ import annotations


def drops(stats: dict, reason: str) -> int:
    """Total of one drop reason over the daemon and all its ports."""
    n = stats.get("daemon", {}).get("drops", {}).get(reason, 0)
    return n + sum(p.get("drops", {}).get(reason, 0) for p in stats.get("ports", []))


def new_drops(before: dict, after: dict) -> dict:
    """Drop counters that grew between two ``show stats json``: {"port:reason": n}."""
    def flat(st):
        d = {f"daemon:{r}": n for r, n in st.get("daemon", {}).get("drops", {}).items()}
        for p in st.get("ports", []):
            d.update({f"{p['name']}:{r}": n for r, n in p.get("drops", {}).items()})
        return d
    b, a = flat(before), flat(after)
    return {k: n - b.get(k, 0) for k, n in a.items() if n > b.get(k, 0)}


def port_of(stats: dict, name: str) -> dict:
    for p in stats["ports"]:
        if p["name"] == name:
            return p
    raise KeyError(name)


def delta(before: dict, after: dict, name: str, key: str) -> int:
    """Growth of counter ``key`` (rx_frames, tx_bytes, ...) of port ``name`` between two stats."""
    return port_of(after, name)[key] - port_of(before, name)[key]
