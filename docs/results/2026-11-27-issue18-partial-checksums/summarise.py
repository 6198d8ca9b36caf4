"""Per (wire MTU, metric, configuration): each old/new run's median and the pooled medians of
the alternated runs in <folder>/<old|new>-<i>/samples.json. Usage: python3 summarise.py [runs|tcp1-runs] [metric,...]"""
import collections, json, pathlib, statistics as st, sys

here = pathlib.Path(__file__).parent
# The run folder: runs/ (the whole suite, 5 pairs) or tcp1-runs/ (TCP 1 stream, 8 pairs x 2 rounds).
folder = sys.argv.pop(1) if len(sys.argv) > 1 and sys.argv[1].endswith("runs") else "runs"
metrics = sys.argv[1].split(",") if len(sys.argv) > 1 else [
    "tcp1_gbps", "tcp4_gbps", "udp_loss_pct", "udp_gbps", "rtt64_p50_us", "cpu_s_per_gb_tcp1", "vnetd_cpu_s_per_gb_tcp1"]
runs = collections.defaultdict(lambda: collections.defaultdict(list))
pooled = collections.defaultdict(lambda: collections.defaultdict(list))
for d in sorted(here.glob(f"{folder}/*-*")):
    v = d.name.split("-")[0]
    per = collections.defaultdict(list)
    for x in json.loads((d / "samples.json").read_text())["samples"]:
        if x["metric"] in metrics:
            per[(x["wire_mtu"], x["metric"], x["config"])].append(x["value"])
    for k, vals in per.items():
        runs[k][v].append(st.median(vals))
        pooled[k][v].extend(vals)
print("| MTU | metric | configuration | old, each run | new, each run | old | new | new/old |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for k in sorted(runs, key=lambda k: (k[0], metrics.index(k[1]), k[2])):
    po, pn = pooled[k].get("old"), pooled[k].get("new")
    if not po or not pn:
        continue
    mo, mn = st.median(po), st.median(pn)
    each = lambda l: ", ".join(f"{x:.3g}" for x in l)
    ratio = f"{mn / mo:.2f}" if mo else "-"
    print(f"| {k[0]} | {k[1]} | {k[2]} | {each(runs[k]['old'])} | {each(runs[k]['new'])} | {mo:.3g} | {mn:.3g} | {ratio} |")
