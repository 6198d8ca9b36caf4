"""Old vs new vnetd in bench.vhost, 5 alternated pairs: median rx Gbit/s per configuration, spread, ratio."""
import json, statistics, sys
from collections import defaultdict
root = sys.argv[1]
by = defaultdict(lambda: defaultdict(list))
for v in ("old", "new"):
    for i in range(1, 6):
        for s in json.load(open(f"{root}/{v}-{i}.json"))["samples"]:
            key = (s["size"], s["link"], s["cut_through"], s["notify"])
            by[key][v].append(s["rx_gbps"])
print("| frame | link | cut-through | notify | old Gbit/s (median, min-max) | new | new/old |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for key in sorted(by):
    o, n = by[key]["old"], by[key]["new"]
    mo, mn = statistics.median(o), statistics.median(n)
    print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {mo:.2f} ({min(o):.2f}-{max(o):.2f}) | "
          f"{mn:.2f} ({min(n):.2f}-{max(n):.2f}) | {mn / mo:.2f}x |")
