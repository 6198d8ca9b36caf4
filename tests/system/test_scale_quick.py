"""The scale harness still runs (issue #13): ``python3 -m bench.scale --quick`` starts its own etcd,
runs N=10 and N=50 real vnet agents with recording data planes through bring-up, a join, a
move, a storm of moves and a death, and writes scale.json, summary.md and the plot.

No speed is asserted (a shared 2-core machine); what is asserted is that every step converged
on every agent it concerns and that the harness's correctness check (every agent's derived
links and routes equal a fresh derivation from the store) found no agent wrong."""

import json

from test_bench_quick import require, run_quick
from vnetlab import netlab

PNG = b"\x89PNG\r\n\x1a\n"


def test_scale_quick(tmp_path):
    require(netlab.REPO / "target" / "release" / "vnet-scale")
    out = tmp_path / "scale"
    run_quick("scale", out, 600)
    doc = json.loads((out / "scale.json").read_text())
    assert [run["hosts"] for run in doc["runs"]] == [10, 50]
    for run in doc["runs"]:
        steps = {s["step"]: s for s in run["steps"]}
        assert set(steps) == {"bring-up", "join", "move", "storm", "death"}
        for name, s in steps.items():
            assert s["agents_wrong_after"] == 0, f"N={run['hosts']} {name}: agents differ from the store"
            if name != "bring-up":
                assert s["not_converged"] == 0, f"N={run['hosts']} {name}: not every agent converged"
                assert s["agents_probed"] > 0 and s["p99_s"] is not None
    assert (out / "summary.md").read_text().startswith("# vnet etcd control plane at scale")
    assert (out / "scale.png").read_bytes()[:8] == PNG
