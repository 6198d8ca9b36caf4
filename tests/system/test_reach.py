"""Reach (issue #31): hosts behind NATs of every kind, started as a new user starts them (only
``--etcd``), reach each other: direct where the NATs allow a hole to be punched, through a
public relay (``vnetd --relay``) where they do not, with every link encrypted too. The relay
forwards only between members and within its per-pair budget; forged probes are refused and
counted; a NAT that forgets its mapping costs a relayed moment, not the link. Built on the
wide-area lab (``vnetlab/wanlab.py``, its own tests in test_wanlab.py) through
``vnetlab/reachlab.py``."""

import shutil
import time

import pytest

from vnetlab import reachlab

KINDS = ["none", "full-cone", "port-restricted", "symmetric", "symmetric", "one-to-one"]


@pytest.fixture(autouse=True)
def wan_tools():
    missing = [t for t in ("nft", "conntrack") if shutil.which(t) is None]
    if missing:
        pytest.fail(f"missing tools: {', '.join(missing)} (scripts/setup.sh installs nftables, conntrack)")


@pytest.mark.parametrize("encrypt", [False, True], ids=["plain", "encrypted"])
def test_every_nat_pair_reaches_direct_where_it_can(lab, record, encrypt):
    """Six sites (no NAT, full cone, port-restricted, two symmetric, 1:1) and a public relay:
    every pair of guests reaches every other; every pair but symmetric against port-restricted
    or symmetric on a direct path (punched or not) within 5 s of the last daemon's start, the
    rest relayed; the first reply at most 2 s after both daemons joined the overlay.""" 
    bed = reachlab.Bed(lab, KINDS, relays=1, encrypt=encrypt)
    bed.start()
    t_up = max(bed.up.values())
    firsts = reachlab.first_replies(bed, deadline=10, since=bed.joined)
    missing = [f"{bed.kind(a)}<->{bed.kind(b)}" for (a, b), t in firsts.items() if t is None]
    assert not missing, f"no reply in 10 s: {missing}"
    settle = {h: round(bed.joined[h] - bed.up[h], 2) for h in bed.hosts}
    paths = bed.wait_paths(timeout=max(0.5, 5.0 - (time.time() - t_up)))
    took = time.time() - t_up
    replies = reachlab.ping_all(bed, count=3)
    lost = {k: v for k, v in replies.items() if v < 3}
    assert not lost, f"pairs that lost pings: {lost}"
    relayed = [k for k, p in paths.items() if p == "relayed"]
    # Every relayed pair really went through the relay, and nothing else did.
    assert sorted(relayed) == sorted(
        (a, b) for (a, b) in paths if not reachlab.punchable(bed.kind(a), bed.kind(b)))
    assert bed.counter("R1", "relay_forwarded") > 0
    if encrypt:
        for h in bed.hosts.values():
            links = h.ctl_json("show", "links", "json")
            assert links and all(l.get("encrypted") for l in links if l["name"].startswith("c-h")), links
    record(f"reach_matrix_{'encrypted' if encrypt else 'plain'}", {
        "paths": {f"{bed.kind(a)}->{bed.kind(b)}": p for (a, b), p in paths.items()},
        "first_reply_s": {f"{bed.kind(a)}<->{bed.kind(b)}": round(t, 3) for (a, b), t in firsts.items()},
        "all_paths_after_s": round(took, 2), "agent_settle_s": settle})
    # From both agents having read the overlay (their wait for a burst of hosts to settle, up
    # to a few seconds here, is the etcd agent's, #19): the goal is 2 s at the 95th percentile
    # (bench.reach measures it over many tries); one try per pair here, on a shared CI
    # machine: 3 s.
    assert max(firsts.values()) <= 3.0, f"first replies after both joined: {firsts}"
