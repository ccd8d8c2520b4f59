#!/usr/bin/env bash
# Side-by-side benchmark of ringlock, Redis used as a lock, and the loopback
# echo ceiling, all driven by ringlock-bench.
#
#   scripts/bench.sh
#
# It builds (release), installs Debian's redis-server if it is missing, and
# python3's matplotlib for the chart if it is missing; starts ringlock
# (--shards 1 --cpus 1), Redis and the echo server, each pinned to CPU 1
# with taskset, and runs the load generator pinned to CPU 0. For each
# workload it drives the three servers one after the other, so that they
# see the same machine, in ROUNDS rounds (the order reversed every other
# round); the table gives each target's median and, for each ratio, the
# median of the rounds' ratios, since on a shared machine two runs minutes
# apart can differ by 10 %. Then it restarts ringlock and Redis fresh and
# fills each with HOLD_KEYS held locks to measure memory per lock.
#
# Output: the table on stdout (also bench/results/latest.md), every run and
# the ratios in bench/results/latest.json, the chart in
# bench/results/latest.png. Everything it starts it stops, on any exit.
#
# The machine may be shared (other builds and tests, other guests of the
# host): every run records the CPU pressure of its measured time
# (/proc/pressure/cpu, the share of time some task waited for a CPU) and the
# CPU the hypervisor stole (/proc/stat), and a run with either above
# MAX_PRESSURE percent is done again, after waiting for a quieter moment, up
# to TRIES times; the least disturbed try is kept. Both are in the JSON and
# in the latency table.
#
# Settings (environment): DURATION (s, default 6), WARMUP (s, default 2),
# ROUNDS (default 5), HOLD_KEYS (default 10000000), SERVER_CPU (1),
# BENCH_CPU (0), RESULTS (bench/results), MAX_PRESSURE (5), TRIES (4),
# SKIP_HOLD=1 to skip the hold runs, SKIP_CHART=1.
#
# TLS=1 runs the encrypted comparison instead (docs/performance.md, "TLS
# and authentication"): certificates made with openssl into the scratch
# folder for this run only; ringlock plain, ringlock with --tls-cert, ringlock
# with --auth-file, and one Redis serving both a plain and a TLS port (its
# --tls-port), each pinned to SERVER_CPU; pipelined 16x64 and unpipelined
# 64x1 on the four plain/TLS targets in ROUNDS rounds, pipelined with and
# without auth, then new connections per second with a full TLS handshake
# (ringlock-bench connect-rate, RATE_S seconds, default 5) on both TLS
# servers. Output: bench/results/tls.md and tls.json.
set -euo pipefail

cd "$(dirname "$0")/.."
DURATION=${DURATION:-6}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-5}
HOLD_KEYS=${HOLD_KEYS:-10000000}
SERVER_CPU=${SERVER_CPU:-1}
BENCH_CPU=${BENCH_CPU:-0}
RESULTS=${RESULTS:-bench/results}
MAX_PRESSURE=${MAX_PRESSURE:-5}
TRIES=${TRIES:-4}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
BIN=$TARGET_DIR/release

# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh

bench_prerequisites
bench_workdir ringlock-bench

if [ "${TLS:-0}" = 1 ]; then
    RATE_S=${RATE_S:-5}
    make_certs "$WORK/tls"
    SECRET=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    printf 'bench %s *\n' "$(printf %s "$SECRET" | sha256sum | cut -d' ' -f1)" >"$WORK/auth"
    start_ringlock
    PLAIN_PID=$RINGLOCK_PID PLAIN_ADDR=$RINGLOCK_ADDR
    start_ringlock 1 "$SERVER_CPU" ringlock-tls --tls-cert "$WORK/tls/server.pem" --tls-key "$WORK/tls/server.key"
    TLS_PID=$RINGLOCK_PID TLS_ADDR=$RINGLOCK_ADDR
    start_ringlock 1 "$SERVER_CPU" ringlock-auth --auth-file "$WORK/auth"
    AUTH_PID=$RINGLOCK_PID AUTH_ADDR=$RINGLOCK_ADDR
    REDIS_TLS_PORT=$(free_port)
    start_redis --tls-port "$REDIS_TLS_PORT" --tls-cert-file "$WORK/tls/server.pem" \
        --tls-key-file "$WORK/tls/server.key" --tls-ca-cert-file "$WORK/tls/ca.pem" --tls-auth-clients no
    REDIS_TLS_ADDR=127.0.0.1:$REDIS_TLS_PORT
    log "ringlock $PLAIN_ADDR, ringlock TLS $TLS_ADDR, ringlock auth $AUTH_ADDR, redis $REDIS_ADDR and TLS $REDIS_TLS_ADDR"
    TLS_FLAGS=(--tls-ca "$WORK/tls/ca.pem")
    TIMING=(--duration "$DURATION" --warmup "$WARMUP")
    for shape in "pipelined-16x64 16 64" "unpipelined-64x1 64 1"; do
        read -r label connections depth <<<"$shape"
        SHAPE=(--workload uncontended -c "$connections" -d "$depth" "${TIMING[@]}")
        for round in $(seq 1 "$ROUNDS"); do
            order="plain tls redis redis-tls"
            if [ $((round % 2)) -eq 0 ]; then
                order="redis-tls redis tls plain"
            fi
            for variant in $order; do
                case $variant in
                    plain) bench "$label" ringlock "$PLAIN_ADDR" "$PLAIN_PID" "${SHAPE[@]}" ;;
                    tls) bench "$label-tls" ringlock "$TLS_ADDR" "$TLS_PID" "${SHAPE[@]}" "${TLS_FLAGS[@]}" ;;
                    redis) bench "$label" redis "$REDIS_ADDR" "$REDIS_PID" "${SHAPE[@]}" ;;
                    redis-tls) bench "$label-tls" redis "$REDIS_TLS_ADDR" "$REDIS_PID" "${SHAPE[@]}" "${TLS_FLAGS[@]}" ;;
                esac
            done
            if [ "$label" = pipelined-16x64 ]; then
                RINGLOCK_SECRET=$SECRET bench "$label-auth" ringlock "$AUTH_ADDR" "$AUTH_PID" "${SHAPE[@]}"
            fi
        done
    done
    RATE=(--duration "$RATE_S" --warmup 1 --threads 4 "${TLS_FLAGS[@]}")
    for round in $(seq 1 "$ROUNDS"); do
        connect_rate connect-tls ringlock "$TLS_ADDR" "$TLS_PID" "${RATE[@]}"
        connect_rate connect-tls redis "$REDIS_TLS_ADDR" "$REDIS_PID" "${RATE[@]}"
    done
    mkdir -p "$RESULTS"
    python3 bench/tls_report.py --out "$RESULTS/tls.json" \
        --command "TLS=1 DURATION=$DURATION WARMUP=$WARMUP ROUNDS=$ROUNDS RATE_S=$RATE_S scripts/bench.sh" \
        "${RUN_FILES[@]}" "${RATE_FILES[@]}" | tee "$RESULTS/tls.md"
    log "results: $RESULTS/tls.json, $RESULTS/tls.md"
    exit 0
fi

start_echo
start_ringlock
start_redis
log "echo $ECHO_ADDR (pid $ECHO_PID), ringlock $RINGLOCK_ADDR (pid $RINGLOCK_PID), redis $REDIS_ADDR (pid $REDIS_PID)"

TIMING=(--duration "$DURATION" --warmup "$WARMUP")
for shape in "pipelined-16x64 16 64" "pipelined-64x64 64 64" "unpipelined-64x1 64 1"; do
    read -r label connections depth <<<"$shape"
    for round in $(seq 1 "$ROUNDS"); do
        # Every other round runs the targets in reverse, so that a machine
        # getting slower or faster over a round favours none of them.
        order="echo ringlock redis"
        if [ $((round % 2)) -eq 0 ]; then
            order="redis ringlock echo"
        fi
        for target in $order; do
            case $target in
                echo) addr=$ECHO_ADDR pid=$ECHO_PID ;;
                ringlock) addr=$RINGLOCK_ADDR pid=$RINGLOCK_PID ;;
                redis) addr=$REDIS_ADDR pid=$REDIS_PID ;;
            esac
            bench "$label" "$target" "$addr" "$pid" --workload uncontended -c "$connections" -d "$depth" "${TIMING[@]}"
        done
    done
done
# 16 hot keys, 64 connections x 16 lanes: 64 clients queue on every key.
CONTENDED=(--workload contended --hot-keys 16 -c 64 -d 16 --wait 10 "${TIMING[@]}")
bench contended-16keys ringlock "$RINGLOCK_ADDR" "$RINGLOCK_PID" "${CONTENDED[@]}"
bench contended-16keys redis "$REDIS_ADDR" "$REDIS_PID" "${CONTENDED[@]}"
stop "$ECHO_PID"

if [ "${SKIP_HOLD:-0}" != 1 ]; then
    # Fresh servers, so the RSS growth is the held locks' alone.
    HOLD=(--workload hold --hold-keys "$HOLD_KEYS" --key-len 16 -c 16 -d 64 --lease 3600 --duration 600)
    stop "$RINGLOCK_PID"
    start_ringlock
    TRIES=1 bench hold ringlock "$RINGLOCK_ADDR" "$RINGLOCK_PID" "${HOLD[@]}"
    stop "$RINGLOCK_PID"
    stop "$REDIS_PID"
    start_redis
    TRIES=1 bench hold redis "$REDIS_ADDR" "$REDIS_PID" "${HOLD[@]}"
fi

mkdir -p "$RESULTS"
"$BIN/ringlock-bench" report --out "$RESULTS/latest.json" \
    --command "DURATION=$DURATION WARMUP=$WARMUP ROUNDS=$ROUNDS HOLD_KEYS=$HOLD_KEYS scripts/bench.sh" "${RUN_FILES[@]}" |
    tee "$RESULTS/latest.md"
if [ "${SKIP_CHART:-0}" != 1 ]; then
    python3 bench/chart.py "$RESULTS/latest.json" "$RESULTS/latest.png"
    log "chart: $RESULTS/latest.png"
fi
log "results: $RESULTS/latest.json, $RESULTS/latest.md"
