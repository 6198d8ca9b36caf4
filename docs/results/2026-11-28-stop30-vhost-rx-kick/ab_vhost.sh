#!/bin/bash
# old (5840f08) and new (8e6ca8b) vnetd alternated: bench.vhost, 1 round each, 5 pairs.
# Each built with `cargo build --release -p vnetd -p vnetctl` into its own target dir.
cd /work/main
for i in 1 2 3 4 5; do
  for v in old new; do
    VNETD=/work/s30/$v-target/release/vnetd VNETCTL=/work/s30/$v-target/release/vnetctl \
      flock /tmp/vnet-bench.lock python3 -m bench.vhost --rounds 1 --out /work/s30/abv/$v-$i > /work/s30/abv-$v-$i.log 2>&1
    echo "$v-$i rc=$?"
  done
done
