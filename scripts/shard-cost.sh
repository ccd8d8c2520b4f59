#!/usr/bin/env bash
# Per-request CPU cost of ringlock's server, split into the work a shard
# core does for a request on its own keys and the extra work of a request
# that crosses to another core, and the throughput it projects for 4, 8 and
# 16 shard cores (docs/performance.md, "Multi-core projection").
#
#   scripts/shard-cost.sh
#
# This machine has 2 CPUs, so more shard cores cannot be measured for real.
# In ROUNDS rounds, the configurations in turn, each with a fresh server:
#   own:        --shards 1 on CPU 1, the generator pinned to CPU 0: every
#               request on the core that owns its key, no time-sharing.
#   own-shared: --shards 1 on CPU 1, the generator unpinned, time-shared
#               with the server: the control for the next one.
#   two-shards: --shards 2 on CPUs 0 and 1, the generator unpinned: the
#               connections go round the two cores and the keys hash over
#               them, so half the requests hop to the other core and back.
# Each run is closed-loop, uncontended, CONNECTIONS x DEPTH; the server's
# CPU time (all threads, from /proc) over its lock ops gives its cost per
# request. The hop's cost per request is (two-shards - own-shared) / (1/2).
# The time-shared runs make CPU pressure themselves (three busy threads on
# two CPUs), so only the `own` runs are retried when disturbed; the others
# start at once, which also keeps PERF=1's profile within the run.
#
# With PERF=1, the last round's own-shared and two-shards runs are also
# profiled with perf (2 s, cpu-clock) and bench/perf_split.py's shares of
# the server's time (idle polling and sleeps, cross-core messages, the
# rest) are added to the table.
#
# Output: bench/results/shard-cost.md and shard-cost.json.
# Settings (environment): ROUNDS [3], DURATION [4], WARMUP [1],
# CONNECTIONS [16], DEPTH [64], MAX_PRESSURE [5], TRIES [2], QUIET_WAIT_S
# [10], RESULTS [bench/results], RINGLOCK_BIN [target/release/ringlock]. About
# 1-2 minutes.
set -euo pipefail

cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-4}
WARMUP=${WARMUP:-1}
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
SKIP_CHART=1

# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh

if [ "${PERF:-0}" = 1 ] && ! command -v perf >/dev/null; then
    echo "PERF=1 needs perf on PATH (Debian: apt-get install linux-perf)" >&2
    exit 1
fi
bench_prerequisites
bench_workdir ringlock-shard-cost

PERF_LABELS=()
PERF_JOB=""
# profile_during LABEL PID: with PERF=1 in the last round, profiles the
# server for 2 s once the warm-up is over, in the background.
profile_during() {
    PERF_JOB=""
    if [ "${PERF:-0}" = 1 ] && [ "$round" = "$ROUNDS" ] && [ "$1" != own ]; then
        (sleep "$WARMUP"; perf record -e cpu-clock -F 2000 -g -p "$2" -o "$WORK/perf-$1.data" -- sleep 2) \
            >/dev/null 2>&1 &
        PERF_JOB=$!
        PERF_LABELS+=("$1")
    fi
}
profile_wait() {
    if [ -n "$PERF_JOB" ]; then
        wait "$PERF_JOB" || true
    fi
}

RUN=(--workload uncontended -c "$CONNECTIONS" -d "$DEPTH" --duration "$DURATION" --warmup "$WARMUP")
for round in $(seq 1 "$ROUNDS"); do
    order="own own-shared two-shards"
    if [ $((round % 2)) -eq 0 ]; then
        order="two-shards own-shared own"
    fi
    for config in $order; do
        case $config in
            own)
                start_ringlock 1 1
                BENCH_TASKSET="taskset -c 0" BENCH_PIN="--cpus 0" \
                    bench own ringlock "$RINGLOCK_ADDR" "$RINGLOCK_PID" "${RUN[@]}"
                ;;
            own-shared)
                start_ringlock 1 1
                profile_during own-shared "$RINGLOCK_PID"
                TRIES=1 QUIET_WAIT_S=0 BENCH_TASKSET="" BENCH_PIN="" bench own-shared ringlock "$RINGLOCK_ADDR" "$RINGLOCK_PID" "${RUN[@]}"
                ;;
            two-shards)
                start_ringlock 2 0,1
                profile_during two-shards "$RINGLOCK_PID"
                TRIES=1 QUIET_WAIT_S=0 BENCH_TASKSET="" BENCH_PIN="" bench two-shards ringlock "$RINGLOCK_ADDR" "$RINGLOCK_PID" "${RUN[@]}"
                ;;
        esac
        profile_wait
        stop "$RINGLOCK_PID"
    done
done

mkdir -p "$RESULTS"
python3 bench/shard_cost_report.py --json "$RESULTS/shard-cost.json" --markdown "$RESULTS/shard-cost.md" \
    --command "ROUNDS=$ROUNDS DURATION=$DURATION CONNECTIONS=$CONNECTIONS DEPTH=$DEPTH scripts/shard-cost.sh" \
    "${RUN_FILES[@]}"
if [ ${#PERF_LABELS[@]} -gt 0 ]; then
    {
        echo "Shares of the server's CPU time by perf (bench/perf_split.py), last round:"
        echo
        for label in "${PERF_LABELS[@]}"; do
            echo "- $label: $(python3 bench/perf_split.py "$WORK/perf-$label.data" | paste -sd ';' | sed 's/;/; /g')"
        done
        echo
    } >>"$RESULTS/shard-cost.md"
fi
cat "$RESULTS/shard-cost.md"
