"""The storm's etcd bytes per event (above idle) and the watchers etcd held, per run of
1,000 agents through 4 proxies in waves: before the splice (857371c) against it.
/usr/bin/python3 plot.py  ->  waves.png (Debian's python3-matplotlib)"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent


def storm(run_dir: Path):
    doc = json.loads((run_dir / "scale.json").read_text())
    run = doc["runs"][0]
    s = next((s for s in run.get("steps", []) if s["step"] == "storm"), None)
    return None if s is None else (s["etcd_sent_bytes_per_event_above_idle"], s["etcd_watchers"])


groups = [("before (857371c)", sorted(HERE.glob("ab-before-*"))),
          ("splice", sorted(HERE.glob("ab-splice-*")) + sorted(HERE.glob("main-*")) + sorted(HERE.glob("more-*"))),
          ("splice, agents in a cgroup\n(cpu.shares 102)", sorted(HERE.glob("cgroup-*")))]
groups = [g for g in groups if g[1]]
fig, ax = plt.subplots(figsize=(10, 4.5))
for x, (name, dirs) in enumerate(groups):
    pts = [p for p in (storm(d) for d in dirs) if p]
    for k, (b, w) in enumerate(pts):
        xx = x + (k - len(pts) / 2) * min(0.05, 0.8 / max(len(pts), 1))
        ax.scatter(xx, b / 1e3, color="tab:red" if w > 20 else "tab:green")
        ax.annotate(f"{w:.0f}", (xx, b / 1e3), fontsize=7, xytext=(3, 3), textcoords="offset points")
    failed = len(dirs) - len(pts)
    ax.text(x, 40, f"{len(dirs)} runs" + (f"; {failed} stopped in the storm (not shown)" if failed else ""),
            ha="center", fontsize=8)
ax.set(xticks=list(range(len(groups))), xticklabels=[g[0] for g in groups], yscale="log", ylim=(1, 60),
       ylabel="etcd KB sent per storm event (above idle)",
       title="1,000 agents in waves through 4 proxies (labels: watchers on etcd; green = coalesced)")
fig.tight_layout()
fig.savefig(HERE / "waves.png", dpi=110)
