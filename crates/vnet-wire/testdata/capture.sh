#!/bin/bash
# Run as root from anywhere: prints "direction ethertype length hex" per frame A received
# or sent; kernel-frames.txt names them in that order.
# Captures kernel-made ICMP "frag needed" / "packet too big", a TCP SYN and a UDP datagram
# (complete checksums: tx offload off) as known vectors for vnet-wire's tests.
set -e
P=vl7e3a-
A=${P}a R=${P}r B=${P}b
cleanup() { for n in $A $R $B; do ip netns del $n 2>/dev/null || true; done; }
trap cleanup EXIT
cleanup
for n in $A $R $B; do ip netns add $n; done
ip link add ${P}ar netns $A type veth peer name ${P}ra netns $R
ip link add ${P}rb netns $R type veth peer name ${P}br netns $B
ip -n $A link set ${P}ar address 52:54:00:00:00:0a
ip -n $R link set ${P}ra address 52:54:00:00:00:01
ip -n $A addr add 10.99.1.1/24 dev ${P}ar; ip -n $A addr add fd99:1::1/64 dev ${P}ar nodad
ip -n $R addr add 10.99.1.2/24 dev ${P}ra; ip -n $R addr add fd99:1::2/64 dev ${P}ra nodad
ip -n $R addr add 10.99.2.2/24 dev ${P}rb; ip -n $R addr add fd99:2::2/64 dev ${P}rb nodad
ip -n $B addr add 10.99.2.1/24 dev ${P}br; ip -n $B addr add fd99:2::1/64 dev ${P}br nodad
ip -n $R link set ${P}rb mtu 1280; ip -n $B link set ${P}br mtu 1280
for n in $A $R $B; do ip -n $n link set lo up; done
ip -n $A link set ${P}ar up; ip -n $R link set ${P}ra up; ip -n $R link set ${P}rb up; ip -n $B link set ${P}br up
ip -n $A route add default via 10.99.1.2; ip -n $A -6 route add default via fd99:1::2
ip -n $B route add default via 10.99.2.2; ip -n $B -6 route add default via fd99:2::2
ip netns exec $R sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
ip netns exec $A ethtool -K ${P}ar tx off >/dev/null
ip netns exec $R ethtool -K ${P}ra tx off >/dev/null
sleep 1
ip netns exec $A python3 "$(dirname "$0")"/capture.py ${P}ar
