#!/usr/bin/env bash
# Two builds of ringlock's server against each other and against the echo
# ceiling, in many short interleaved rounds: to tell a change of a few
# percent from this host's noise.
#
#   scripts/ab.sh OLD_SERVER [NEW_SERVER]
#
# OLD_SERVER is a `ringlock` binary built from another commit (copy
# target/release/ringlock aside before changing the code); NEW_SERVER
# defaults to target/release/ringlock, built first. The echo server and both
# builds run side by side, each pinned to CPU 1, and each round drives the
# three in turn (the generator pinned to CPU 0), closed loop, uncontended,
# CONNECTIONS x DEPTH, DURATION s after WARMUP s; the order rotates from one
# round to the next. On this host a server's speed can change from one
# second to the next (docs/performance.md), so one long run of each build
# compares two different moments; many short adjacent runs, and the median
# of the rounds' ratios, compare like with like.
#
# Output: new/old, new/echo and old/echo as the median of the rounds'
# ratios with their quartiles, on stdout and in RESULTS/ab.md and ab.json
# (every run's JSON included). Settings (environment): ROUNDS [30],
# DURATION [1], WARMUP [0.3], CONNECTIONS [16], DEPTH [64], RESULTS
# [bench/results]. About ROUNDS x 3 x (DURATION + WARMUP + 0.3) s.
set -euo pipefail

cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || [ $# -gt 2 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 2
fi
OLD_SERVER=$(realpath "$1")
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
NEW_SERVER=$(realpath "${2:-$BIN/ringlock}")
# Every round is kept as it ran: a retry would part it from its neighbours.
MAX_PRESSURE=100
TRIES=1
QUIET_WAIT_S=0
SKIP_CHART=1

# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh

for server in "$OLD_SERVER" "$NEW_SERVER"; do
    if [ ! -x "$server" ]; then
        echo "no server binary at $server" >&2
        exit 1
    fi
done
bench_prerequisites
bench_workdir ringlock-ab
ROOT=$WORK

start_echo
mkdir -p "$ROOT/old" "$ROOT/new"
WORK=$ROOT/old RINGLOCK_BIN=$OLD_SERVER start_ringlock
OLD_PID=$RINGLOCK_PID OLD_ADDR=$RINGLOCK_ADDR
WORK=$ROOT/new RINGLOCK_BIN=$NEW_SERVER start_ringlock
NEW_PID=$RINGLOCK_PID NEW_ADDR=$RINGLOCK_ADDR
log "echo $ECHO_ADDR, old $OLD_ADDR ($OLD_SERVER), new $NEW_ADDR ($NEW_SERVER)"

names=(echo old new)
for round in $(seq 1 "$ROUNDS"); do
    for turn in 0 1 2; do
        name=${names[$(((round + turn) % 3))]}
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
    --command "ROUNDS=$ROUNDS DURATION=$DURATION WARMUP=$WARMUP CONNECTIONS=$CONNECTIONS DEPTH=$DEPTH scripts/ab.sh" \
    "${RUN_FILES[@]}"
log "results: $RESULTS/ab.md, $RESULTS/ab.json"
