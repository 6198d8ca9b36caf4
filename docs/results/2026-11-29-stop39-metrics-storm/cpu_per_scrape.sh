#!/bin/bash
# vnetd's CPU per /metrics scrape at 1,000 links (the route storm bench's configuration, no
# storm): for each build, one vnetd in a namespace of its own, 10 scrapes to warm up, then 300
# scrapes with curl; CPU = the process's utime+stime (/proc/PID/stat, dead threads included:
# a scrape runs on a connection thread that ends) over the 300. Rounds alternate the builds.
# usage: cpu_per_scrape.sh ROUNDS NAME=DIR/vnetd ...   (root)
set -u
rounds=$1; shift
work=$(mktemp -d /tmp/vnet-scrape-XXXX)
ns=vnscrape$$
trap 'kill $(cat $work/pid 2>/dev/null) 2>/dev/null; ip netns del $ns 2>/dev/null; rm -rf $work' EXIT
python3 - "$work/cfg.vnet" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    for h in range(1000):
        f.write(f"link add h{h} udp 10.77.{(h + 1) >> 8}.{(h + 1) & 0xff}\n")
        for g in range(8):
            f.write("route add any 02:%02x:%02x:%02x:%02x:00 link h%d\n" % ((h >> 16) & 255, (h >> 8) & 255, h & 255, g, h))
PY
ip netns add $ns && ip -n $ns link set lo up
for r in $(seq 1 $rounds); do
  for spec in "$@"; do
    name=${spec%%=*}; bin=${spec#*=}
    rm -rf $work/s
    ip netns exec $ns $bin --config $work/cfg.vnet --state-dir $work/s --control 127.0.0.1:7600 \
      --http 127.0.0.1:7680 > $work/vnetd.log 2>&1 & echo $! > $work/pid
    pid=$(cat $work/pid)
    for i in $(seq 1 100); do
      ip netns exec $ns curl -s -o /dev/null http://127.0.0.1:7680/metrics && break; sleep 0.1
    done
    for i in $(seq 1 10); do ip netns exec $ns curl -s -o /dev/null http://127.0.0.1:7680/metrics; done
    a=$(awk '{print $14+$15}' /proc/$pid/stat)
    for i in $(seq 1 300); do ip netns exec $ns curl -s -o /dev/null http://127.0.0.1:7680/metrics; done
    b=$(awk '{print $14+$15}' /proc/$pid/stat)
    tick=$(getconf CLK_TCK)
    echo "round $r $name cpu_ms_per_scrape $(echo "($b-$a)*1000/$tick/300" | bc -l | cut -c1-6)"
    kill $pid; wait $pid 2>/dev/null; rm -f $work/pid
  done
done
