#!/bin/bash
# A/B of vnetd builds: interleaved runs of bench.run (1 round each)
cd /work/main
out=/work/scratch/ab/$1; shift
mkdir -p $out
for r in 1 2 3 4 5; do
  for v in "$@"; do
    name=${v%%=*}; dir=${v#*=}
    VNETD=$dir/target/release/vnetd VNETCTL=$dir/target/release/vnetctl python3 -m bench.run --configs kernel-vxlan,vnet-adaptive,vnet-polling --metrics tcp1,rtt64 --rounds 1 --mtus 1500 --no-mpi --seed $r --out $out/$name-$r > $out/$name-$r.log 2>&1
  done
done
