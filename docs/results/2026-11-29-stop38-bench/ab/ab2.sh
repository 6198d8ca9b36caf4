#!/bin/bash
# A/B of vnetd builds: interleaved runs of bench.run (1 round each), both MTUs.
# ./ab2.sh NAME before=DIR after=DIR (DIR holds vnetd and vnetctl); report: ab2_report.py DIR
cd /work/main
out=/work/scratch/ab/$1; shift
mkdir -p $out
for r in 1 2 3 4 5; do
  for v in "$@"; do
    name=${v%%=*}; dir=${v#*=}
    echo "$(date +%T) round $r $name" >> $out/progress
    VNETD=$dir/vnetd VNETCTL=$dir/vnetctl python3 -m bench.run --configs kernel-vxlan,vnet-kernel,vnet-adaptive,vnet-encrypted --metrics tcp1,rtt64 --rounds 1 --mtus 1500,9000 --no-mpi --seed $r --out $out/$name-$r > $out/$name-$r.log 2>&1
  done
done
echo done >> $out/progress
