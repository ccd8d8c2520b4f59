#!/usr/bin/env bash
# Measures what a 2-node cluster does when a partition between its nodes
# heals: node 0 (the active) is cut off from node 1 at a router, without a
# reset, while a client on node 0's own host keeps acquiring and releasing;
# node 1 promotes itself (no quorum, by design); then the cut is healed.
# Prints the epochs node 0 granted in, and how long after the heal (and how
# many grants) node 0 went on granting in its old epoch, below node 1's.
# A second client, on node 1's host, acquires and releases the same keys
# through node 1 meanwhile; the script counts the holds of the two clients
# that overlap (each hold from its grant's arrival to its release, or to
# its acquire's send time plus the lease) and the grants of a key whose
# token is not above the key's earlier ones. With --min-standbys 1 both
# must be 0 (docs/operations.md, "--min-standbys").
#
# The nodes run in network namespaces (root and iproute2 needed) behind a
# router namespace: `link` sets the router's end of node 0's link down and
# up, `route` black-holes node 0's address at the router and removes the
# route. Nothing leaves the namespaces this script makes.
#
# Usage: scripts/partition-heal.sh [--bin target/release/ringlock] [--cut-s 7] [--mode route|link]
#                                  [--min-standbys 0|1] [--hold-ms 0]
#   --hold-ms: each client holds a grant up to this long (at random) before
#   its release, so that holds of the two clients can overlap visibly.
#   Environment: CLUSTER_HEARTBEAT_MS, CLUSTER_FAILOVER_MS (server defaults 100 / 1000).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release/ringlock
CUT_S=7
MODE=route
MIN_STANDBYS=0
HOLD_MS=0
while (($# > 0)); do
    case "$1" in
        --bin) BIN="$2"; shift 2 ;;
        --cut-s) CUT_S="$2"; shift 2 ;;
        --mode) MODE="$2"; shift 2 ;;
        --min-standbys) MIN_STANDBYS="$2"; shift 2 ;;
        --hold-ms) HOLD_MS="$2"; shift 2 ;;
        -h | --help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "partition-heal.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$BIN" ] || cargo build --release --quiet -p ringlock
TIMINGS=(--heartbeat-ms "${CLUSTER_HEARTBEAT_MS:-100}" --failover-ms "${CLUSTER_FAILOVER_MS:-1000}"
    --min-standbys "$MIN_STANDBYS")

id=$$
R=rlph$id-r A=rlph$id-a B=rlph$id-b
DIR=$(mktemp -d)
cleanup() {
    kill -9 $(jobs -p) 2>/dev/null || true
    wait 2>/dev/null || true
    for ns in $A $B $R; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$DIR"
}
trap cleanup EXIT
for ns in $R $A $B; do ip netns add "$ns"; ip -n "$ns" link set lo up; done
ip netns exec $R sysctl -qw net.ipv4.ip_forward=1
ip link add ph${id}a netns $A type veth peer name ph${id}ra netns $R
ip link add ph${id}b netns $B type veth peer name ph${id}rb netns $R
ip -n $A addr add 10.78.1.2/24 dev ph${id}a
ip -n $B addr add 10.78.2.2/24 dev ph${id}b
ip -n $R addr add 10.78.1.1/24 dev ph${id}ra
ip -n $R addr add 10.78.2.1/24 dev ph${id}rb
for link in "$A ph${id}a" "$B ph${id}b" "$R ph${id}ra" "$R ph${id}rb"; do ip -n ${link% *} link set ${link#* } up; done
ip -n $A route add default via 10.78.1.1
ip -n $B route add default via 10.78.2.1

PEERS=10.78.1.2:7700,10.78.2.2:7700
ip netns exec $A "$BIN" --peers $PEERS --node 0 --shards 1 --data-dir "$DIR/a" "${TIMINGS[@]}" 2>"$DIR/a.log" &
ip netns exec $B "$BIN" --peers $PEERS --node 1 --shards 1 --data-dir "$DIR/b" "${TIMINGS[@]}" 2>"$DIR/b.log" &

now_ms() { python3 -c 'import time; print(int(time.time() * 1000))'; }
cut() {
    case "$MODE" in
        link) ip -n $R link set ph${id}ra "$1" ;;
        route) ip -n $R route "$2" blackhole 10.78.1.2/32 ;;
        *) echo "partition-heal.sh: --mode is route or link" >&2; exit 2 ;;
    esac
}

# The client: acquire (wait 0.2 s), release, in a loop; one line per grant:
# the time in ms since the epoch it arrived, the token, the key, and the
# time its hold ended (release sent, or acquire sent + lease).
cat >"$DIR/load.py" <<'PY'
import random, socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
hold_s = float(sys.argv[3]) / 1000
end = time.time() + float(sys.argv[2])
conn, reader, count, lease_ms = None, None, 0, 5000
while time.time() < end:
    try:
        if conn is None:
            # Longer than a held grant waits for its no-standby answer.
            conn = socket.create_connection((host, int(port)), timeout=2)
            reader = conn.makefile("rb")
        count += 1
        key = f"k{count % 50}"
        sent = int(time.time() * 1000)
        conn.sendall(f"A {key} {lease_ms / 1000} 0.2\n".encode())
        reply = reader.readline().split()
        if not reply:
            raise OSError("closed")
        if reply[0] == b"A":
            granted = int(time.time() * 1000)
            if hold_s:
                time.sleep(random.random() * hold_s)
            conn.sendall(f"R {key} {int(reply[2])}\n".encode())
            hold_end = min(int(time.time() * 1000), sent + lease_ms)
            print(granted, int(reply[2]), key, hold_end, flush=True)
            reader.readline()
        else:
            time.sleep(0.01)
    except OSError:
        conn = None
        time.sleep(0.05)
PY
sleep 2.5
ip netns exec $A python3 "$DIR/load.py" 10.78.1.2:7700 $((CUT_S + 7)) "$HOLD_MS" >"$DIR/grants" &
LOAD=$!
ip netns exec $B python3 "$DIR/load.py" 10.78.2.2:7700 $((CUT_S + 7)) "$HOLD_MS" >"$DIR/grants-b" &
LOAD_B=$!
sleep 1
cut down add
sleep "$CUT_S"
HEAL=$(now_ms)
cut up del
wait $LOAD $LOAD_B
python3 - "$DIR/grants" "$HEAL" "$MODE" "$CUT_S" "$DIR/grants-b" "$MIN_STANDBYS" <<'PY'
import sys
def read(path):
    return [(int(t), int(token), key, int(end)) for t, token, key, end in (line.split() for line in open(path))]
rows = [(t, token) for t, token, _, _ in read(sys.argv[1])]
holds = [(t, token, key, end, "a") for t, token, key, end in read(sys.argv[1])]
holds += [(t, token, key, end, "b") for t, token, key, end in read(sys.argv[5])]
by_key = {}
for hold in sorted(holds):
    by_key.setdefault(hold[2], []).append(hold)
overlaps = decreases = 0
for grants in by_key.values():
    for index, (t, token, _, end, client) in enumerate(grants):
        overlaps += sum(1 for (t0, _, _, end0, c0) in grants[:index] if c0 != client and t0 < end and t < end0)
        decreases += any(token <= earlier[1] for earlier in grants[:index])
print(f"--min-standbys {sys.argv[6]}: {len(holds)} grants to the two clients, {overlaps} overlapping holds, "
      f"{decreases} token decreases")
heal, mode, cut_s = int(sys.argv[2]), sys.argv[3], sys.argv[4]
first_epoch = rows[0][1] >> 40
after = [(t, token >> 40) for t, token in rows if t >= heal]
old = [t for t, epoch in after if epoch == first_epoch]
new = [t for t, epoch in after if epoch != first_epoch]
print(f"mode {mode}, cut {cut_s} s: node 0 granted in epochs {sorted({token >> 40 for _, token in rows})}")
print(f"  after the heal: {len(after)} grants, {len(old)} of them in the old epoch {first_epoch}")
if new:
    print(f"  old-epoch grants went on for {max(old, default=heal) - heal} ms after the heal; "
          f"first grant in a new epoch {new[0] - heal} ms after it")
else:
    print(f"  no grant in a new epoch within {rows[-1][0] - heal} ms of the heal")
PY
