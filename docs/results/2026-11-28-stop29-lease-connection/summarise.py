"""The tables of this folder's runs. Scale runs (folders with scale.json): bring-up, leases
etcd let expire (raw/etcd-timeline-*.csv) in the bring-up (before the idle step), by the
storm's end and in all (the harness's shutdown included), the agents' renewals unanswered
for a whole TTL (their warnings in raw/agents-N.log), etcd's watchers and bytes per event in
the storm. Daemon runs (daemons.json): the slowest
daemon per step. Run from this folder: python3 summarise.py"""
import csv
import json
import re
from pathlib import Path

HERE = Path(__file__).parent


def order(p: Path):
    m = re.search(r"(\d+)$", p.name)
    return (re.sub(r"\d+$", "", p.name), int(m.group(1)) if m else 0)


def expired_until(rows, t):
    return int(max((float(x["leases_expired"]) for x in rows if float(x["t"]) <= t), default=0))


def scale(d: Path):
    j = json.loads((d / "scale.json").read_text())
    out = []
    for r in j.get("runs", [j]):
        steps = {s["step"]: s for s in r.get("steps", [])}
        n = r.get("hosts", r.get("n", "?"))
        progress = (d / "raw" / "progress.log").read_text()
        at = {m.group(2): float(m.group(1))
              for m in re.finditer(rf"\[\s*([0-9.]+)s\] N={n} (\w+)", progress)}
        tl = sorted((d / "raw").glob(f"etcd-timeline-{n}-*.csv"))
        rows = list(csv.DictReader(tl[0].open())) if tl else []
        agents = d / "raw" / f"agents-{n}.log"
        lapses = agents.read_text(errors="replace").count("whole TTL; it may") if agents.exists() else "-"
        b, st = steps.get("bring-up", {}), steps.get("storm", {})
        out.append({
            "run": d.name,
            "N": n,
            "bring-up s": f"{b['wall_s']:.1f}" if b else "-",
            "renewals unanswered for a TTL (agents)": lapses,
            "leases expired in the bring-up (etcd)": expired_until(rows, at["idle"]) if rows and "idle" in at else "-",
            "leases expired by the storm's end (etcd)": expired_until(rows, at["storm"]) if rows and "storm" in at else "-",
            "leases expired to the timeline's end (etcd)": int(float(rows[-1]["leases_expired"])) if rows else "-",
            "watchers in the storm": f"{st['etcd_watchers']:.0f}" if st else "-",
            "KB per storm event above idle": f"{st['etcd_sent_bytes_per_event_above_idle'] / 1e3:.1f}" if st else "-",
            "etcd ms per storm event above idle": f"{st['etcd_cpu_ms_per_event_above_idle']:.2f}" if st else "-",
            "storm p50 s": f"{st['p50_s']:.2f}" if st else "-",
        })
    return out


def daemons(d: Path):
    j = json.loads((d / "daemons.json").read_text())
    s = {x["step"]: x for x in j["steps"]}
    return {"run": d.name, **{f"{k} max s": f"{s[k]['max_s']:.3f}" for k in ("bring-up", "join", "move") if k in s}}


def table(rows):
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + " --- |" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "-")) for c in cols) + " |")
    print()


dirs = sorted((p for p in HERE.iterdir() if p.is_dir()), key=order)
table([r for d in dirs if (d / "scale.json").exists() for r in scale(d)])
table([daemons(d) for d in dirs if (d / "daemons.json").exists()])
