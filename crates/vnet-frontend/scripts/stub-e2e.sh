#!/usr/bin/env bash
# End-to-end check of vhost-frontend against guest/vhost_user_stub.py (a tiny Python
# vhost-user-net backend bridged to a TAP) in a private network namespace.
#
#   crates/vnet-frontend/scripts/stub-e2e.sh [path/to/vhost-frontend] [path/to/vhost_user_stub.py]
#
# Needs root (netns, TAP), python3, tcpdump. Cleans up its namespace and processes on exit.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
F=${1:-${CARGO_TARGET_DIR:-$ROOT/target}/release/vhost-frontend}
STUB=${2:-$ROOT/guest/vhost_user_stub.py}
NS=vfe-$$
D=$(mktemp -d /tmp/vfe-XXXXXX)
SOCK=$D/sock
TAP=vfetap0
PIDS=()
FAILS=0
PASSES=0

cleanup() {
    # Everything we started: our PIDs and whatever still runs in our namespace.
    for p in "${PIDS[@]}" $(ip netns pids "$NS" 2>/dev/null); do kill "$p" 2>/dev/null; done
    sleep 0.2
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    ip netns del "$NS" 2>/dev/null
    rm -rf "$D"
}
trap cleanup EXIT

ok() { echo "PASS: $*"; PASSES=$((PASSES + 1)); }
bad() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }

[ -x "$F" ] || { echo "no binary $F"; exit 1; }
[ -f "$STUB" ] || { echo "no stub $STUB"; exit 1; }
ip netns add "$NS" || exit 1
# No IPv6 chatter (router solicitations, MLD) on the TAP: the frames we count are ours.
ip netns exec "$NS" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
# A persistent TAP: it survives the stub's restarts, so captures on it are not cut short.
ip -n "$NS" tuntap add "$TAP" mode tap || exit 1
ip -n "$NS" link set "$TAP" mtu 9000 up

# Starts one stub instance (it exits when the frontend disconnects) and brings the TAP up.
start_stub() { # [ext] [stub options...]; ext: the extension with EVENT_IDX, MRG_RXBUF, REPLY_ACK
    rm -f "$D/stub.out"
    local cmd=("$STUB")
    if [ "${1:-}" = ext ]; then
        cmd=("$HERE/stub_ext.py" "$STUB")
        shift
    fi
    ip netns exec "$NS" python3 "${cmd[@]}" --socket "$SOCK" --tap "$TAP" "$@" >"$D/stub.out" 2>>"$D/stub.err" &
    STUB_PID=$!
    PIDS+=("$STUB_PID")
    for _ in $(seq 100); do grep -q LISTENING "$D/stub.out" 2>/dev/null && break; sleep 0.05; done
    ip -n "$NS" link set "$TAP" mtu 9000 up
}

# Waits for the stub to exit by itself (it does when the frontend disconnects), else kills it.
stop_stub() {
    for _ in $(seq 50); do kill -0 "$STUB_PID" 2>/dev/null || break; sleep 0.1; done
    kill "$STUB_PID" 2>/dev/null
    wait "$STUB_PID" 2>/dev/null
}

# Starts a bench in the background, its JSON report in $D/NAME.json; BENCH_PID is its PID.
bench_bg() { # NAME bench-options...
    local name=$1
    shift
    timeout 60 "$F" --socket "$SOCK" bench "$@" --json >"$D/$name.json" &
    BENCH_PID=$!
    PIDS+=("$BENCH_PID")
}

# Runs the frontend in the foreground (its JSON report on stdout) and checks it: exit 0 and
# CHECK, Python statements on the report `j` (asserts; they may print figures).
check_json() { # WHAT CHECK frontend-options...
    local what=$1 check=$2 out rc
    shift 2
    out=$(timeout 60 "$F" --socket "$SOCK" "$@")
    rc=$?
    if [ "$rc" = 0 ] && echo "$out" | python3 -c "import json,sys; j=json.load(sys.stdin); $check"; then
        ok "$what"
    else
        bad "$what: rc=$rc"; echo "$out"
    fi
}

# After `wait "$BENCH_PID"`: the background bench NAME exited RC, and CHECK (as for
# check_json) holds on its report $D/NAME.json.
check_report() { # RC NAME WHAT CHECK
    local rc=$1 name=$2 what=$3 check=$4
    if [ "$rc" = 0 ] && python3 -c "import json,sys; j=json.load(open(sys.argv[1])); $check" "$D/$name.json"; then
        ok "$what"
    else
        bad "$what: rc=$rc"; cat "$D/$name.json"
    fi
}

# Frames written to the TAP from the namespace reach the stub, which hands them to our rx ring.
inject() { # count size
    ip netns exec "$NS" python3 - "$TAP" "$1" "$2" <<'EOF'
import socket, struct, sys, time
tap, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((tap, 0))
frame = b"\x02\x00\x00\x00\x00\x01" + b"\x02\x00\x00\x00\x00\x02" + b"\x88\xb5" + bytes(size - 14)
for i in range(n):
    s.send(frame)
    if i % 50 == 49:
        time.sleep(0.01)  # the stub is slow; keep its backlog small
EOF
}

echo "== probe"
start_stub
if out=$(timeout 30 "$F" --socket "$SOCK" probe) && echo "$out" | grep -q '"VERSION_1"'; then
    ok "probe: $(echo "$out" | tr -d ' \n' | head -c 200)"
else
    bad "probe"
fi
stop_stub

for size in 64 1514; do
    echo "== bench tx size $size (captured on the TAP)"
    start_stub
    ip netns exec "$NS" tcpdump --immediate-mode -B 65536 -i "$TAP" -U -w "$D/tx$size.pcap" udp 2>/dev/null &
    TP=$!
    PIDS+=("$TP")
    sleep 1
    out=$(timeout 60 "$F" --socket "$SOCK" bench --role tx --size "$size" --count 3000 --rate 20000 --json)
    rc=$?
    sleep 1
    kill "$TP" 2>/dev/null; wait "$TP" 2>/dev/null
    frames=$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["frames"])' 2>/dev/null)
    seen=$(tcpdump -r "$D/tx$size.pcap" -nn 2>/dev/null | grep -c "length $((size - 42))")
    badck=$(tcpdump -r "$D/tx$size.pcap" -nn -vv 2>/dev/null | grep -ci "bad")
    goodck=$(tcpdump -r "$D/tx$size.pcap" -nn -vv 2>/dev/null | grep -c "udp sum ok")
    if [ "$rc" = 0 ] && [ "$frames" = 3000 ] && [ "$seen" = 3000 ] && [ "$badck" = 0 ] && [ "$goodck" = 3000 ]; then
        ok "tx $size: 3000 frames completed, 3000 on the TAP, checksums good"
    else
        bad "tx $size: rc=$rc frames=$frames on_tap=$seen bad_checksums=$badck udp_sum_ok=$goodck"
        echo "$out"
    fi
    stop_stub
done

echo "== bench tx with guest memory at 4 GiB, 2 queue pairs"
start_stub --queues 2
check_json "tx at gpa 4 GiB over 2 queue pairs" 'assert j["frames"]==4000 and j["queues"]==2, j' \
    --gpa-base 0x100000000 --queue-pairs 2 bench --role tx --size 300 --count 4000 --json
stop_stub

echo "== bench rx (frames injected into the TAP)"
start_stub
bench_bg rx --role rx --size 200 --count 500
sleep 1
inject 500 200
wait "$BENCH_PID"
rc=$?
frames=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["frames"])' "$D/rx.json" 2>/dev/null)
if [ "$rc" = 0 ] && [ "$frames" = 500 ]; then
    ok "rx: 500 frames received ($(tr -d ' \n' <"$D/rx.json" | grep -o '"calls":[0-9]*'))"
else
    bad "rx: rc=$rc frames=$frames"
    cat "$D/rx.json"
fi
stop_stub

echo "== bench both"
start_stub
bench_bg both --role both --size 128 --duration 2 --idle 1
sleep 0.5
inject 200 128
wait "$BENCH_PID"
check_report $? both "both: tx and rx on one connection" \
    'assert j["tx"]["frames"]>0 and j["rx"]["frames"]>=200, j'
stop_stub

echo "== disconnect mid-run"
start_stub
bench_bg disc --role tx --size 64 --duration 30 --rate 1000
sleep 1
kill "$STUB_PID"
wait "$BENCH_PID"
rc=$?
if [ "$rc" = 2 ] && grep -q closed "$D/disc.json"; then
    ok "disconnect reported, exit 2"
else
    bad "disconnect: rc=$rc"
    cat "$D/disc.json"
fi

echo "== extended stub: EVENT_IDX, MRG_RXBUF, REPLY_ACK"
start_stub ext
out=$(timeout 30 "$F" --socket "$SOCK" probe)
if echo "$out" | grep -q '"EVENT_IDX"' && echo "$out" | grep -q '"MRG_RXBUF"' && echo "$out" | grep -q '"reply_ack": true'; then
    ok "ext probe: EVENT_IDX, MRG_RXBUF, REPLY_ACK negotiated"
else
    bad "ext probe"; echo "$out"
fi
stop_stub
start_stub ext
check_json "ext tx with EVENT_IDX" \
    'assert j["event_idx"] and j["frames"]==20000 and j["kicks"]>0 and j["kicks"]<=20000/32, j; print("   kicks", j["kicks"], "calls", j["calls"], "rekicks", j["rekicks"])' \
    bench --role tx --size 512 --count 20000 --json
stop_stub
start_stub ext
bench_bg rxm --role rx --size 6000 --count 300
sleep 1
inject 300 6000
wait "$BENCH_PID"
check_report $? rxm "ext rx: 6000-byte frames over mergeable 4 KiB buffers" \
    'assert j["mrg_rxbuf"] and j["event_idx"] and j["frames"]==300 and j["bytes"]==300*6000 and j["size_mismatch"]==0 and j["bad_used"]==0, j; print("   calls", j["calls"], "kicks", j["kicks"])'
stop_stub

start_stub ext
check_json "ext tx with --no-event-idx --no-mrg-rxbuf" \
    'assert not j["event_idx"] and not j["mrg_rxbuf"] and j["frames"]==5000, j' \
    --no-event-idx --no-mrg-rxbuf bench --role tx --size 128 --count 5000 --json
stop_stub

echo "== hostile (stub restarted for each variant; it is not robust, crashes are expected)"
(
    while true; do
        ip netns exec "$NS" python3 "$STUB" --socket "$SOCK" --tap "$TAP" >/dev/null 2>>"$D/hostile-stub.err"
        sleep 0.05
    done
) &
LOOP=$!
PIDS+=("$LOOP")
# Background ARP traffic so the rx cases see frames.
(
    while true; do
        ip -n "$NS" link set "$TAP" up 2>/dev/null
        ip netns exec "$NS" python3 - "$TAP" 2>/dev/null <<'EOF'
import socket, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[1], 0))
f = b"\xff" * 6 + b"\x02\x00\x00\x00\x00\x02" + b"\x08\x06" + bytes(46)
for _ in range(20):
    s.send(f)
    time.sleep(0.02)
EOF
        sleep 0.1
    done
) &
TRAF=$!
PIDS+=("$TRAF")
timeout 600 "$F" --socket "$SOCK" --timeout 5 hostile --case all --rx-wait 1 >"$D/hostile.json" 2>"$D/hostile.err"
rc=$?
kill "$TRAF" "$LOOP" 2>/dev/null
n=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j["variants"])' "$D/hostile.json" 2>/dev/null)
if [ -n "$n" ] && [ "$n" -gt 30 ]; then
    ok "hostile: $n variants reported (rc=$rc)"
    python3 - "$D/hostile.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
for r in j["results"]:
    print(f'   {r["case"]}/{r["variant"]}: {r["verdict"]} canary_intact={r["canary_intact"]} '
          f'answers_after={r["answers_after"]} works_after_reinit={r["works_after_reinit"]}')
EOF
else
    bad "hostile: no report (rc=$rc)"
    tail -20 "$D/hostile.err"
fi

echo "$PASSES passed, $FAILS failed"
[ "$FAILS" = 0 ]
