"""The table of this folder's scale runs: bring-up, leases etcd let expire during the bring-up
(from raw/etcd-timeline-*.csv, before the join step began), etcd's watchers and bytes per event
in the storm. Run from this folder: python3 summarise.py"""
import csv
import json
import re
from pathlib import Path

HERE = Path(__file__).parent


def run(d: Path):
    j = json.loads((d / "scale.json").read_text())
    r = j["runs"][0] if "runs" in j else j
    steps = {s["step"]: s for s in r.get("steps", [])}
    progress = (d / "raw" / "progress.log").read_text()
    m = re.search(r"\[\s*([0-9.]+)s\] N=\d+ idle", progress)
    idle_at = float(m.group(1)) if m else None
    expired = None
    tl = sorted((d / "raw").glob("etcd-timeline-*.csv"))
    if tl and idle_at is not None:
        rows = list(csv.DictReader(tl[0].open()))
        before = [float(x["leases_expired"]) for x in rows if float(x["t"]) <= idle_at]
        expired = int(max(before, default=0))
    b, st = steps.get("bring-up", {}), steps.get("storm", {})
    return {
        "run": d.name,
        "bring-up s": f"{b['wall_s']:.1f}" if b else "-",
        "leases expired in the bring-up (etcd)": "-" if expired is None else expired,
        "watchers in the storm": f"{st['etcd_watchers']:.0f}" if st else "-",
        "KB per storm event above idle": f"{st['etcd_sent_bytes_per_event_above_idle'] / 1e3:.1f}" if st else "-",
        "storm p50 s": f"{st['p50_s']:.2f}" if st else "-",
        "leases lost (harness)": st.get("leases_lost", "-") if st else r.get("error", "failed"),
    }


rows = [run(d) for d in sorted(HERE.iterdir(), key=lambda p: (re.sub(r"\d+$", "", p.name), int(re.search(r"(\d+)$", p.name).group(1)) if re.search(r"(\d+)$", p.name) else 0))
        if (d / "scale.json").exists()]
cols = list(rows[0])
print("| " + " | ".join(cols) + " |")
print("|" + " --- |" * len(cols))
for r in rows:
    print("| " + " | ".join(str(r[c]) for c in cols) + " |")
