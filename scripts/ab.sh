#!/usr/bin/env bash
# Two builds of ringlock's server against each other and against the echo
# ceiling, in many short interleaved rounds: to tell a change of a few
# percent from this host's noise.
#
#   scripts/ab.sh OLD_SERVER [NEW_SERVER]
#
# OLD_SERVER is a `ringlock` binary built from another commit (copy
# target/release/ringlock aside before changing the code); NEW_SERVER
# defaults to target/release/ringlock, which is then built first (the load
# generator always is). The echo server and both builds run side by side,
# each pinned to CPU 1, and each round drives the three in turn (the
# generator pinned to CPU 0), closed loop, uncontended, CONNECTIONS x
# DEPTH, DURATION s after WARMUP s. The rounds go through the six orders of
# the three in turn, so that over every six rounds each build runs first,
# second and third as often, after each of the others as often. On this
# host a server's speed can change from one second to the next
# (docs/performance.md), so one long run of each build compares two
# different moments; many short adjacent runs, and the median of the
# rounds' ratios, compare like with like. Every run is kept as it ran (a
# retry would part it from its neighbours); the report gives the CPU
# pressure and steal of the runs, to tell a disturbed comparison.
#
# Output: new/old, new/echo and old/echo as the median of the rounds'
# ratios with their quartiles, on stdout and in RESULTS/ab.md and ab.json
# (every run's JSON included). Settings (environment): ROUNDS [30, best a
# multiple of 6], DURATION [1], WARMUP [0.3], CONNECTIONS [16], DEPTH [64],
# RESULTS [bench/results]. About ROUNDS x 3 x (DURATION + WARMUP + 0.3) s.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$SCRIPT" | sed '$d; s/^# \{0,1\}//'; }
SCRIPT=$(realpath "$0")
case "${1:-}" in
    -h | --help)
        usage
        exit 0
        ;;
esac
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    usage >&2
    exit 2
fi
# Paths as the caller gave them, before the working folder changes.
OLD_SERVER=$(realpath -m "$1")
NEW_SERVER=${2:+$(realpath -m "$2")}
cd "$(dirname "$SCRIPT")/.."

ROUNDS=${ROUNDS:-30}
DURATION=${DURATION:-1}
WARMUP=${WARMUP:-0.3}
CONNECTIONS=${CONNECTIONS:-16}
DEPTH=${DEPTH:-64}
SERVER_CPU=1
BENCH_CPU=0
RESULTS=${RESULTS:-bench/results}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
BIN=$TARGET_DIR/release
MAX_PRESSURE=100
TRIES=1
QUIET_WAIT_S=0

# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh

if [ -z "$NEW_SERVER" ]; then
    log "building the load generator and the server (release)"
    cargo build --release --quiet -p ringlock-bench -p ringlock
    NEW_SERVER=$(realpath "$BIN/ringlock")
else
    log "building the load generator (release)"
    cargo build --release --quiet -p ringlock-bench
fi
for server in "$OLD_SERVER" "$NEW_SERVER"; do
    if [ ! -x "$server" ]; then
        echo "no server binary at $server" >&2
        exit 1
    fi
done
if cmp -s "$OLD_SERVER" "$NEW_SERVER"; then
    log "note: the two server binaries are the same file contents; new/old measures only the noise"
fi
if [ $((ROUNDS % 6)) -ne 0 ]; then
    log "note: ROUNDS=$ROUNDS is not a multiple of 6, so the orders are not all run as often"
fi

bench_workdir ringlock-ab
start_echo
RINGLOCK_BIN=$OLD_SERVER start_ringlock 1 "$SERVER_CPU" old
OLD_PID=$RINGLOCK_PID OLD_ADDR=$RINGLOCK_ADDR
RINGLOCK_BIN=$NEW_SERVER start_ringlock 1 "$SERVER_CPU" new
NEW_PID=$RINGLOCK_PID NEW_ADDR=$RINGLOCK_ADDR
log "echo $ECHO_ADDR, old $OLD_ADDR ($OLD_SERVER), new $NEW_ADDR ($NEW_SERVER)"

ORDERS=("echo old new" "new old echo" "old new echo" "echo new old" "new echo old" "old echo new")
for round in $(seq 1 "$ROUNDS"); do
    for name in ${ORDERS[$(((round - 1) % 6))]}; do
        case $name in
            echo) target=echo addr=$ECHO_ADDR pid=$ECHO_PID ;;
            old) target=ringlock addr=$OLD_ADDR pid=$OLD_PID ;;
            new) target=ringlock addr=$NEW_ADDR pid=$NEW_PID ;;
        esac
        bench "round-$round-$name" "$target" "$addr" "$pid" --workload uncontended \
            -c "$CONNECTIONS" -d "$DEPTH" --duration "$DURATION" --warmup "$WARMUP"
    done
done

mkdir -p "$RESULTS"
python3 bench/ab_report.py --out "$RESULTS/ab" --old "$OLD_SERVER" --new "$NEW_SERVER" \
    --command "ROUNDS=$ROUNDS DURATION=$DURATION WARMUP=$WARMUP CONNECTIONS=$CONNECTIONS DEPTH=$DEPTH scripts/ab.sh $OLD_SERVER $NEW_SERVER" \
    "${RUN_FILES[@]}"
log "results: $RESULTS/ab.md, $RESULTS/ab.json"
