#!/usr/bin/env bash
# Latency as users feel it: open-loop load on ringlock, Redis used as a lock
# and the loopback echo ceiling, each swept from 10 % to beyond its own
# saturation, plotted as latency against throughput.
#
#   scripts/latency.sh
#
# 1. Saturation: each target's closed-loop throughput with the sweep's shape
#    (CONNECTIONS x LANES), with scripts/bench.sh's pipelined shape
#    (CONNECTIONS x DEPTH, the same unless LANES is set) and unpipelined
#    (64 x 1), in ROUNDS rounds, the targets' order reversed every other
#    round. A target's saturation rate is its best round at the sweep's
#    shape.
# 2. Sweep: `ringlock-bench run --rate R` at each of FRACTIONS of the
#    target's own saturation, latency counted from each request's intended
#    send time, so waiting behind a slow reply counts (no coordinated
#    omission). Two more points feed the goals: echo at 80 % of ringlock's
#    saturation, and ringlock at Redis's saturation rate.
# 3. Contended: 16 hot keys, 64 connections x 16, at each of
#    CONTENDED_RATES, for ringlock and Redis.
#
# Servers on SERVER_CPU, the generator on BENCH_CPU, as in scripts/bench.sh,
# with the same pressure-aware retries: a run whose CPU pressure or steal
# was above MAX_PRESSURE % is done again (up to TRIES tries, after waiting up
# to QUIET_WAIT_S for a quieter moment) and the least disturbed try is kept.
# Each step has a retry budget (RETRY_BUDGET_S: 180, 300 and 120 s by
# default); past it, each remaining run of the step gets one try and no
# wait, so that a busy machine cannot stretch the whole beyond about 15
# minutes.
#
# Output: bench/results/latency.md (tables and the goals' ratios),
# latency.json (every run), latency.png (the chart).
#
# Settings (environment), defaults in brackets, about 4 minutes on a quiet
# machine and at most about 15 on a busy one:
#   CONNECTIONS [16], DEPTH [64]: scripts/bench.sh's pipelined shape, for
#     the pipelined throughput goal
#   LANES [DEPTH]: the sweep's depth, the most requests a connection keeps
#     in flight (past it a request waits, and its wait counts in its
#     latency; `held` says how many did). With 64, requests wait for a lane
#     from about half of saturation on, even the echo server's; LANES=256
#     makes that rarer, with its own saturation rounds at CONNECTIONS x
#     LANES, but the generator then tracks 4 times the requests and falls
#     behind its schedule sooner (docs/performance.md)
#   FRACTIONS ["0.1 0.25 0.5 0.7 0.8 0.9 1.0 1.1 1.25"]
#   DURATION [3], WARMUP [1]: seconds per sweep point
#   SAT_DURATION [4], ROUNDS [3]: the closed-loop saturation runs
#   CONTENDED_RATES ["20k 50k 100k 200k"] lock operations per second
#   TARGETS ["echo ringlock redis"], SKIP_CONTENDED=1, SKIP_CHART=1
#   SERVER_CPU [1], BENCH_CPU [0], MAX_PRESSURE [5], TRIES [2],
#   QUIET_WAIT_S [10], RETRY_BUDGET_S ["180 300 120"], RESULTS [bench/results]
# A short run: FRACTIONS="0.1 0.5 0.8 1.0 1.25" DURATION=2 SAT_DURATION=2 ROUNDS=1 TRIES=1
set -euo pipefail

cd "$(dirname "$0")/.."
CONNECTIONS=${CONNECTIONS:-16}
DEPTH=${DEPTH:-64}
LANES=${LANES:-$DEPTH}
FRACTIONS=${FRACTIONS:-0.1 0.25 0.5 0.7 0.8 0.9 1.0 1.1 1.25}
DURATION=${DURATION:-3}
WARMUP=${WARMUP:-1}
SAT_DURATION=${SAT_DURATION:-4}
ROUNDS=${ROUNDS:-3}
CONTENDED_RATES=${CONTENDED_RATES:-20k 50k 100k 200k}
TARGETS=${TARGETS:-echo ringlock redis}
SERVER_CPU=${SERVER_CPU:-1}
BENCH_CPU=${BENCH_CPU:-0}
RESULTS=${RESULTS:-bench/results}
MAX_PRESSURE=${MAX_PRESSURE:-5}
TRIES=${TRIES:-2}
QUIET_WAIT_S=${QUIET_WAIT_S:-10}
RETRY_BUDGET_S=${RETRY_BUDGET_S:-180 300 120}
read -r -a STEP_BUDGETS <<<"$RETRY_BUDGET_S"
TARGET_DIR=${CARGO_TARGET_DIR:-target}
BIN=$TARGET_DIR/release
COMMAND="CONNECTIONS=$CONNECTIONS LANES=$LANES DEPTH=$DEPTH FRACTIONS=\"$FRACTIONS\" DURATION=$DURATION WARMUP=$WARMUP \
SAT_DURATION=$SAT_DURATION ROUNDS=$ROUNDS CONTENDED_RATES=\"$CONTENDED_RATES\" scripts/latency.sh"

# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh

bench_prerequisites
bench_workdir ringlock-latency
started=$SECONDS

for target in $TARGETS; do
    case $target in
        echo) start_echo ;;
        ringlock) start_ringlock ;;
        redis) start_redis ;;
        *) echo "unknown target $target (echo, ringlock, redis)" >&2; exit 1 ;;
    esac
done

# address_of TARGET / pid_of TARGET
address_of() { case $1 in echo) echo "$ECHO_ADDR" ;; ringlock) echo "$RINGLOCK_ADDR" ;; redis) echo "$REDIS_ADDR" ;; esac; }
pid_of() { case $1 in echo) echo "$ECHO_PID" ;; ringlock) echo "$RINGLOCK_PID" ;; redis) echo "$REDIS_PID" ;; esac; }

# on TARGET LABEL [flags...]: one pressure-aware run of TARGET.
on() {
    local target=$1 label=$2
    shift 2
    if [ $((SECONDS - step_started)) -gt "$step_budget" ] && [ "$TRIES" != 1 ]; then
        log "past this step's retry budget ($step_budget s): one try per run until the next step"
        TRIES=1
        QUIET_WAIT_S=0
    fi
    bench "$label" "$target" "$(address_of "$target")" "$(pid_of "$target")" "$@"
}

ALL_TRIES=$TRIES
ALL_QUIET_WAIT_S=$QUIET_WAIT_S
# step N: starts step N's retry budget and restores the retries.
step() {
    step_started=$SECONDS
    step_budget=${STEP_BUDGETS[$(($1 - 1))]:-${STEP_BUDGETS[-1]}}
    TRIES=$ALL_TRIES
    QUIET_WAIT_S=$ALL_QUIET_WAIT_S
}

step 1
log "1. saturation: closed loop, $ROUNDS round(s) of ${SAT_DURATION} s"
SHAPE=(--workload uncontended -c "$CONNECTIONS" -d "$LANES")
for round in $(seq 1 "$ROUNDS"); do
    order=$TARGETS
    if [ $((round % 2)) -eq 0 ]; then
        order=$(echo "$TARGETS" | tr ' ' '\n' | tac | tr '\n' ' ')
    fi
    for target in $order; do
        on "$target" "closed-${CONNECTIONS}x${LANES}" "${SHAPE[@]}" --duration "$SAT_DURATION" --warmup 1
        if [ "$DEPTH" != "$LANES" ]; then
            on "$target" "closed-${CONNECTIONS}x${DEPTH}" --workload uncontended -c "$CONNECTIONS" -d "$DEPTH" \
                --duration "$SAT_DURATION" --warmup 1
        fi
        on "$target" closed-64x1 --workload uncontended -c 64 -d 1 --duration "$SAT_DURATION" --warmup 1
    done
done
saturation() {
    python3 bench/latency_report.py saturation "closed-${CONNECTIONS}x${LANES}" "$1" "${RUN_FILES[@]}"
}
declare -A SATURATION
for target in $TARGETS; do
    SATURATION[$target]=$(saturation "$target")
    log "  $target saturates at ${SATURATION[$target]} ops/s"
done

step 2
log "2. sweep: open loop at $FRACTIONS of each target's saturation, ${DURATION} s each"
OPEN=("${SHAPE[@]}" --duration "$DURATION" --warmup "$WARMUP")
for target in $TARGETS; do
    for fraction in $FRACTIONS; do
        rate=$(awk -v s="${SATURATION[$target]}" -v f="$fraction" 'BEGIN { printf "%.0f", s * f }')
        on "$target" "sweep-$fraction" "${OPEN[@]}" --rate "$rate"
    done
done
# The goals' own points: the same rate on two targets.
if [ -n "${SATURATION[ringlock]:-}" ] && [ -n "${SATURATION[echo]:-}" ]; then
    rate=$(awk -v s="${SATURATION[ringlock]}" 'BEGIN { printf "%.0f", s * 0.8 }')
    on echo goal-at-ringlock-0.8 "${OPEN[@]}" --rate "$rate"
fi
if [ -n "${SATURATION[ringlock]:-}" ] && [ -n "${SATURATION[redis]:-}" ]; then
    rate=$(awk -v s="${SATURATION[redis]}" 'BEGIN { printf "%.0f", s }')
    on ringlock goal-at-redis-1.0 "${OPEN[@]}" --rate "$rate"
fi

if [ "${SKIP_CONTENDED:-0}" != 1 ]; then
    step 3
    log "3. contended: 16 hot keys, 64 x 16, at $CONTENDED_RATES ops/s"
    for target in ringlock redis; do
        case " $TARGETS " in *" $target "*) ;; *) continue ;; esac
        for rate in $CONTENDED_RATES; do
            on "$target" "contended-$rate" --workload contended --hot-keys 16 -c 64 -d 16 --wait 10 \
                --duration "$DURATION" --warmup "$WARMUP" --rate "$rate"
        done
    done
fi

mkdir -p "$RESULTS"
chart=(--chart "$RESULTS/latency.png")
if [ "${SKIP_CHART:-0}" = 1 ]; then
    chart=()
fi
python3 bench/latency_report.py report --json "$RESULTS/latency.json" --markdown "$RESULTS/latency.md" \
    "${chart[@]}" --command "$COMMAND" --shape "${CONNECTIONS}x${LANES}" \
    --throughput-shape "${CONNECTIONS}x${DEPTH}" --elapsed-s $((SECONDS - started)) \
    "${RUN_FILES[@]}"
cat "$RESULTS/latency.md"
log "results: $RESULTS/latency.md, $RESULTS/latency.json${chart:+, $RESULTS/latency.png} ($((SECONDS - started)) s)"
