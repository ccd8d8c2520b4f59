#!/usr/bin/env bash
# Lock cycles/s through one shared Rust client, next to the load generator
# on the same server, and the ceiling the operating system sets for
# blocking threads on one CPU.
#
# One server (one shard core, pinned to SERVER_CPU); on CLIENT_CPU, in turn
# and ROUNDS times, so that all see the same moments of a shared machine:
#   - threads: one client shared by 64 threads, blocking API
#     (client/examples/throughput.rs --threads 64);
#   - tasks:   one client shared by 64 async tasks on one thread
#     (client/examples/throughput.rs --tasks 64);
#   - bench:   ringlock-bench, one connection, 64 requests in flight;
#   - floor:   64 threads that only block and wake each other, no network
#     (client/examples/wake_floor.rs): half its rate bounds any blocking
#     client's lock cycles/s with 64 threads on that CPU.
# Prints every run, then the medians and their ratios to the bench.
#
# Usage: scripts/client-throughput.sh [--rounds 3] [--seconds 4]
#   Environment: SERVER_CPU (1), CLIENT_CPU (0), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3
SECONDS_PER_RUN=4
SERVER_CPU="${SERVER_CPU:-1}"
CLIENT_CPU="${CLIENT_CPU:-0}"
while (($# > 0)); do
    case "$1" in
        --rounds) ROUNDS="$2"; shift 2 ;;
        --seconds) SECONDS_PER_RUN="$2"; shift 2 ;;
        -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "client-throughput.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

cargo build --release --quiet -p ringlock --bin ringlock -p ringlock-bench \
    -p ringlock-client --example throughput --example wake_floor
BIN="${CARGO_TARGET_DIR:-target}/release"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ringlock-client-throughput.XXXXXX")"
source "$(dirname "$0")/server-lib.sh"
server_start "$SERVER_CPU" "$WORK"

on_client() { taskset -c "$CLIENT_CPU" "$@"; }
# Each run prints "<name> <lock cycles/s>".
for ((round = 1; round <= ROUNDS; round++)); do
    on_client "$BIN/examples/throughput" --addr "$ADDR" --threads 64 --seconds "$SECONDS_PER_RUN" |
        sed -n 's/.* \([0-9]*\) cycles\/s.*/threads \1/p'
    on_client "$BIN/examples/throughput" --addr "$ADDR" --tasks 64 --seconds "$SECONDS_PER_RUN" |
        sed -n 's/.* \([0-9]*\) cycles\/s.*/tasks \1/p'
    on_client "$BIN/ringlock-bench" run --target ringlock --addr "$ADDR" --cpus "$CLIENT_CPU" -c 1 -d 64 \
        --duration "$SECONDS_PER_RUN" --warmup 1 --json |
        python3 -c 'import json, sys; print("bench", round(json.load(sys.stdin)["cycles_per_s"]))'
    on_client "$BIN/examples/wake_floor" --threads 64 --seconds "$SECONDS_PER_RUN" |
        sed -n 's/.*at most \([0-9]*\) blocking.*/floor \1/p'
done | tee "$WORK/runs.txt"

python3 - "$WORK/runs.txt" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, rate = line.split()
    runs.setdefault(name, []).append(float(rate))
bench = statistics.median(runs["bench"])
names = {
    "threads": "one client, 64 blocking threads",
    "tasks": "one client, 64 async tasks on one thread",
    "bench": "ringlock-bench, 1 connection x 64 in flight",
    "floor": "ceiling of 64 blocking threads (wake_floor / 2)",
}
print()
print("| lock cycles/s on one client CPU | median | / ringlock-bench |")
print("|---|---:|---:|")
for name, label in names.items():
    value = statistics.median(runs[name])
    print(f"| {label} | {value:,.0f} | {value / bench:.2f} |")
EOF
