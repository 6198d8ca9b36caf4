import json,sys,glob,statistics,collections
out=sys.argv[1]
vals=collections.defaultdict(list)
# out: a directory of <build>-<round>.json (bench.run's samples.json of each run)
for f in sorted(glob.glob(out+'/*-[0-9].json')):
    name=f.split('/')[-1].rsplit('-',1)[0]
    for s in json.load(open(f))['samples']:
        if s['metric'] in ('tcp1_gbps','rtt64_p50_us'):
            vals[(s['wire_mtu'],s['metric'],s['config'],name)].append(s['value'])
names=sorted({k[3] for k in vals})
print("| MTU | metric | config | " + " | ".join(f"{n}: median (min-max), n" for n in names)+" |")
print("| --- | --- | --- | " + " | ".join("---" for n in names)+" |")
for key in sorted({k[:3] for k in vals}):
    cells=[]
    for n in names:
        v=vals.get(key+(n,),[])
        cells.append(f"{statistics.median(v):.3g} ({min(v):.3g}-{max(v):.3g}), {len(v)}" if v else "-")
    print(f"| {key[0]} | {key[1]} | {key[2]} | "+" | ".join(cells)+" |")
