"""lapses.png: per cold start of 1,000 agents through 4 proxies, the agents' renewals left
unanswered for a whole TTL and the leases etcd let expire in the bring-up, keep-alives on the
agent's connection (head) against a connection of their own (own). Run from this folder:
python3 plot.py"""
import csv
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent
runs = sorted((p for p in HERE.glob("cold-*") if p.is_dir()),
              key=lambda p: (p.name.split("-")[1], int(p.name.split("-")[2])))
names, lapses, expired, colours = [], [], [], []
for d in runs:
    progress = (d / "raw" / "progress.log").read_text()
    idle_at = float(re.search(r"\[\s*([0-9.]+)s\] N=1000 idle", progress).group(1))
    rows = list(csv.DictReader((d / "raw" / "etcd-timeline-1000-p4.csv").open()))
    names.append(d.name.replace("cold-", ""))
    lapses.append((d / "raw" / "agents-1000.log").read_text(errors="replace").count("whole TTL; it may"))
    expired.append(max(float(r["leases_expired"]) for r in rows if float(r["t"]) <= idle_at))
    colours.append("tab:red" if "head" in d.name else "tab:blue")
fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
a.bar(names, lapses, color=colours)
a.set_title("renewals unanswered for a whole TTL, per bring-up")
b.bar(names, expired, color=colours)
b.set_title("leases etcd let expire in the bring-up")
for ax in (a, b):
    ax.tick_params(axis="x", rotation=45)
fig.suptitle("1,000 agents started at once through 4 gRPC proxies: keep-alives on the agent's "
             "connection (head, red) or their own (own, blue)")
fig.tight_layout()
fig.savefig(HERE / "lapses.png", dpi=90)
