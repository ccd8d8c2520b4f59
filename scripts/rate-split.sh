#!/usr/bin/env bash
# Where the echo server's and ringlock's CPU time goes, per lock operation,
# when both are offered the same open-loop rate: the point the first latency
# goal compares them at (docs/performance.md, "Latency under open-loop
# load").
#
#   scripts/rate-split.sh            # at 80 % of ringlock's saturation today
#   RATE=3000000 scripts/rate-split.sh
#
# Without RATE, ringlock's closed-loop saturation is measured first (best of
# SAT_ROUNDS runs of SAT_DURATION s, CONNECTIONS x DEPTH) and RATE is
# FRACTION of it. Then, for echo and ringlock in turn, a fresh server on
# CPU 1 is offered RATE lock operations per second by ringlock-bench --rate
# on CPU 0 (uncontended, CONNECTIONS x DEPTH) for DURATION s after WARMUP s,
# and perf profiles the server for PROFILE s meanwhile (cpu-clock with call
# stacks, and counts of its io_uring_enter calls and submitted requests;
# the latencies it reports are measured with perf running, which costs the
# server core some of its time, so they are not scripts/latency.sh's).
# bench/rate_split.py splits each server's CPU time per operation into its
# own work, idle polling, sends (with the generator's receive that loopback
# runs inside them), receives and the rest of the kernel.
#
# Output: bench/results/rate-split.md and rate-split.json.
# Settings (environment): RATE, FRACTION [0.8], SAT_ROUNDS [2],
# SAT_DURATION [3], DURATION [4], WARMUP [1], PROFILE [2], CONNECTIONS [16],
# DEPTH [64], MAX_PRESSURE [5], TRIES [2], QUIET_WAIT_S [10], RESULTS
# [bench/results], RINGLOCK_BIN [target/release/ringlock]. About a minute.
# Needs perf (Debian: apt-get install linux-perf) and root or
# kernel.perf_event_paranoid <= 1 for the tracepoint counts.
set -euo pipefail

cd "$(dirname "$0")/.."
FRACTION=${FRACTION:-0.8}
SAT_ROUNDS=${SAT_ROUNDS:-2}
SAT_DURATION=${SAT_DURATION:-3}
DURATION=${DURATION:-4}
WARMUP=${WARMUP:-1}
PROFILE=${PROFILE:-2}
CONNECTIONS=${CONNECTIONS:-16}
DEPTH=${DEPTH:-64}
SERVER_CPU=1
BENCH_CPU=0
RESULTS=${RESULTS:-bench/results}
MAX_PRESSURE=${MAX_PRESSURE:-5}
TRIES=${TRIES:-2}
QUIET_WAIT_S=${QUIET_WAIT_S:-10}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
BIN=$TARGET_DIR/release

# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh

if ! command -v perf >/dev/null; then
    echo "scripts/rate-split.sh needs perf on PATH (Debian: apt-get install linux-perf)" >&2
    exit 1
fi
if awk -v d="$PROFILE" -v w="$DURATION" 'BEGIN { exit !(d > w) }'; then
    echo "PROFILE ($PROFILE s) must not be longer than DURATION ($DURATION s)" >&2
    exit 1
fi
log "building (release)"
cargo build --release --quiet -p ringlock -p ringlock-bench
bench_workdir ringlock-rate-split

SHAPE=(--workload uncontended -c "$CONNECTIONS" -d "$DEPTH")
if [ -z "${RATE:-}" ]; then
    best=0
    for round in $(seq 1 "$SAT_ROUNDS"); do
        start_ringlock
        bench "saturation-$round" ringlock "$RINGLOCK_ADDR" "$RINGLOCK_PID" "${SHAPE[@]}" \
            --duration "$SAT_DURATION" --warmup "$WARMUP"
        stop "$RINGLOCK_PID"
        best=$(json_field "${RUN_FILES[-1]}" "max($best, run['ops_per_s'])")
    done
    RATE=$(awk -v s="$best" -v f="$FRACTION" 'BEGIN { printf "%d", s * f }')
    log "ringlock's closed-loop saturation $best lock ops/s; offering $FRACTION of it: $RATE"
fi

# profile LABEL PID: perf on the server from the end of the warm-up for
# PROFILE seconds, in the background (its job in PROFILE_JOB).
profile() {
    local label=$1 pid=$2
    (
        sleep "$WARMUP"
        perf stat -e syscalls:sys_enter_io_uring_enter,io_uring:io_uring_submit_req -p "$pid" \
            -o "$WORK/$label.stat" -- sleep "$PROFILE" &
        perf record -e cpu-clock -F 2000 -g -p "$pid" -o "$WORK/$label.data" -- sleep "$PROFILE"
        wait
    ) >/dev/null 2>&1 &
    PROFILE_JOB=$!
}

SPLITS=()
RUN=("${SHAPE[@]}" --rate "$RATE" --duration "$DURATION" --warmup "$WARMUP")
for target in echo ringlock; do
    wait_quiet
    if [ "$target" = echo ]; then
        start_echo
        pid=$ECHO_PID addr=$ECHO_ADDR
    else
        start_ringlock
        pid=$RINGLOCK_PID addr=$RINGLOCK_ADDR
    fi
    # One try: a retried run would need a new profile. perf's own work is
    # CPU pressure too (a few %), so the run is not judged by it; the table
    # reports the pressure each run met.
    profile "$target" "$pid"
    TRIES=1 MAX_PRESSURE=100 bench "rate" "$target" "$addr" "$pid" "${RUN[@]}"
    wait "$PROFILE_JOB" || true
    stop "$pid"
    if [ ! -s "$WORK/$target.data" ]; then
        echo "perf recorded nothing for $target; is perf allowed here (kernel.perf_event_paranoid)?" >&2
        exit 1
    fi
    SPLITS+=("$target:${RUN_FILES[-1]}:$WORK/$target.data:$WORK/$target.stat")
done

mkdir -p "$RESULTS"
python3 bench/rate_split.py --markdown "$RESULTS/rate-split.md" --json "$RESULTS/rate-split.json" \
    --command "RATE=$RATE DURATION=$DURATION PROFILE=$PROFILE CONNECTIONS=$CONNECTIONS DEPTH=$DEPTH scripts/rate-split.sh" \
    "${SPLITS[@]}"
cat "$RESULTS/rate-split.md"
