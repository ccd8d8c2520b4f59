#!/usr/bin/env bash
# What --min-standbys 1 costs: a two-node cluster on loopback (node 0 the
# active, node 1 its standby, one shard core each), without and with the
# flag, in alternating rounds. Each round measures, against the active:
#   - latency: one connection, one request in flight (acquire then release
#     of random keys), p50 and p99 of the acquire and of the release;
#   - pipelined throughput: CONNECTIONS x DEPTH, closed loop.
# The generator is pinned to BENCH_CPU, the two nodes to SERVER_CPU (the
# same CPU: this host has two).
#
# Usage: scripts/min-standbys-cost.sh [--bin target/release/ringlock]
# Settings (environment): ROUNDS [3], DURATION [3], WARMUP [0.5],
# CONNECTIONS [16], DEPTH [64], BENCH_CPU [0], SERVER_CPU [1],
# HEARTBEAT_MS [100], FAILOVER_MS [1000].
# Output: a table on stdout (median over the rounds of each figure).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release/ringlock
while (($# > 0)); do
    case "$1" in
        --bin) BIN="$2"; shift 2 ;;
        -h | --help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "min-standbys-cost.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
ROUNDS=${ROUNDS:-3} DURATION=${DURATION:-3} WARMUP=${WARMUP:-0.5}
CONNECTIONS=${CONNECTIONS:-16} DEPTH=${DEPTH:-64}
BENCH_CPU=${BENCH_CPU:-0} SERVER_CPU=${SERVER_CPU:-1}
BENCH=target/release/ringlock-bench
[ -x "$BIN" ] || nice cargo build --release --quiet -p ringlock
[ -x "$BENCH" ] || nice cargo build --release --quiet -p ringlock-bench

DIR=$(mktemp -d)
PIDS=()
stop_nodes() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    PIDS=()
}
cleanup() {
    stop_nodes
    rm -rf "$DIR"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Starts the two nodes with --min-standbys $1 and waits until node 0 grants.
start_nodes() {
    local min=$1 ports=() index
    for index in 0 1 2 3; do ports+=("$(free_port)"); done
    CLIENT=127.0.0.1:${ports[0]}
    local peers="127.0.0.1:${ports[0]}@127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}@127.0.0.1:${ports[3]}"
    for index in 0 1; do
        rm -rf "$DIR/data$index"
        "$BIN" --peers "$peers" --node $index --listen "127.0.0.1:${ports[$((2 * index))]}" --shards 1 \
            --cpus "$SERVER_CPU" --replication-cpu "$SERVER_CPU" --data-dir "$DIR/data$index" \
            --heartbeat-ms "${HEARTBEAT_MS:-100}" --failover-ms "${FAILOVER_MS:-1000}" --min-standbys "$min" \
            2>"$DIR/node$index.log" &
        PIDS+=($!)
    done
    python3 - "$CLIENT" <<'PY'
import socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
deadline = time.time() + 30
while time.time() < deadline:
    try:
        with socket.create_connection((host, int(port)), timeout=1) as conn:
            reader = conn.makefile("rb")
            while time.time() < deadline:
                conn.sendall(b"A probe 0.01 0\n")
                if reader.readline().startswith(b"A probe "):
                    # Both nodes up, the standby caught up (with the flag,
                    # the grant needed it); it has a moment to settle.
                    time.sleep(0.5)
                    sys.exit(0)
                time.sleep(0.05)
    except OSError:
        time.sleep(0.05)
sys.exit("node 0 never granted")
PY
}

run_bench() {
    "$BENCH" run --target ringlock --addr "$CLIENT" --workload uncontended --cpus "$BENCH_CPU" \
        --duration "$DURATION" --warmup "$WARMUP" --json "$@"
}

for round in $(seq 1 "$ROUNDS"); do
    for min in 0 1; do
        start_nodes "$min"
        run_bench -c 1 -d 1 >"$DIR/latency-$min-$round.json"
        run_bench -c "$CONNECTIONS" -d "$DEPTH" >"$DIR/pipelined-$min-$round.json"
        stop_nodes
    done
done

python3 - "$DIR" "$ROUNDS" "$CONNECTIONS" "$DEPTH" <<'PY'
import json, statistics, sys
directory, rounds, connections, depth = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def load(kind, min_standbys, round_):
    return json.load(open(f"{directory}/{kind}-{min_standbys}-{round_}.json"))
def median(values):
    return statistics.median(values)
rows = []
for min_standbys in (0, 1):
    latency = [load("latency", min_standbys, r) for r in range(1, rounds + 1)]
    pipelined = [load("pipelined", min_standbys, r) for r in range(1, rounds + 1)]
    figures = {
        "acquire p50 us": median([run["acquire_latency_us"]["p50"] for run in latency]),
        "acquire p99 us": median([run["acquire_latency_us"]["p99"] for run in latency]),
        "release p50 us": median([run["release_latency_us"]["p50"] for run in latency]),
        "release p99 us": median([run["release_latency_us"]["p99"] for run in latency]),
        "1x1 ops/s": median([run["ops_per_s"] for run in latency]),
        f"{connections}x{depth} ops/s": median([run["ops_per_s"] for run in pipelined]),
        f"{connections}x{depth} acquire p99 us": median([run["acquire_latency_us"]["p99"] for run in pipelined]),
    }
    errors = sum(sum(run["errors"].values()) for run in latency + pipelined)
    rows.append((min_standbys, figures, errors))
names = list(rows[0][1])
print("| --min-standbys | " + " | ".join(names) + " | errors |")
print("|---|" + "---:|" * (len(names) + 1))
for min_standbys, figures, errors in rows:
    print(f"| {min_standbys} | " + " | ".join(f"{figures[name]:,.0f}" for name in names) + f" | {errors} |")
PY
