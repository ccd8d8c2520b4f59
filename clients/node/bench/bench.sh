#!/usr/bin/env bash
# Lock cycles/s and p99 from one Node process: the ringlock client (1 and 64
# loops, its default two connections and one connection) next to
# ringlock-bench (one connection, 64 in flight) on the same server, and
# Redis used as a lock from Node (redlock on one Redis; ioredis with
# SET NX PX and a compare-and-delete script) at 1 and 64 loops.
#
# Servers (ringlock with one shard core, redis-server) pinned to SERVER_CPU,
# the loads to CLIENT_CPU, one after the other, in one run. Each Node line
# also gives the Node process's and the server's CPU time per cycle
# (node_cpu_us, server_cpu_us), and bench/roundtrip.mjs the floor of one
# unpipelined round trip from Node on a bare socket (P to ringlock, PING to
# Redis): at 1 loop a cycle is two round trips for both.
#
# With --before DIR (another checkout's clients/node, its dist/ built, e.g.
# from `git worktree add`), each ringlock client line is run first with
# that build, then with this one, so that both see the same moments of a
# shared machine.
#
# With --rounds N, the whole set runs N times over (on the same servers),
# and bench/summary.mjs prints each line's median and the ratios the issue
# sets goals for, round by round.
#
# Usage: clients/node/bench/bench.sh [--seconds 4] [--rounds 1] [--before DIR]
#   Environment: SERVER_CPU (1), CLIENT_CPU (0), RINGLOCK_BIN and
#   RINGLOCK_BENCH_BIN (default: built with cargo --release).
#   Needs redis-server (Debian: apt-get install -y redis-server).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
NODE_DIR="$(cd "$HERE/.." && pwd)"
ROOT="$(cd "$NODE_DIR/../.." && pwd)"
SECONDS_PER_RUN=4
ROUNDS=1
BEFORE=""
SERVER_CPU="${SERVER_CPU:-1}"
CLIENT_CPU="${CLIENT_CPU:-0}"
while (($# > 0)); do
    case "$1" in
        --seconds) SECONDS_PER_RUN="$2"; shift 2 ;;
        --before) BEFORE="$(cd "$2" && pwd)"; shift 2 ;;
        --rounds) ROUNDS="$2"; shift 2 ;;
        -h | --help) sed -n '2,28p' "$0"; exit 0 ;;
        *) echo "bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
command -v redis-server >/dev/null || { echo "bench.sh: redis-server is missing" >&2; exit 1; }

(cd "$NODE_DIR" && npm ci --no-audit --no-fund --loglevel=error && npx tsc -p .)
(cd "$HERE" && npm ci --no-audit --no-fund --loglevel=error)
if [[ -z "${RINGLOCK_BIN:-}" || -z "${RINGLOCK_BENCH_BIN:-}" ]]; then
    (cd "$ROOT" && cargo build --release --quiet -p ringlock -p ringlock-bench)
fi
RELEASE="${CARGO_TARGET_DIR:-$ROOT/target}/release"
BIN="$(dirname "${RINGLOCK_BIN:-$RELEASE/ringlock}")"
BENCH="${RINGLOCK_BENCH_BIN:-$RELEASE/ringlock-bench}"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ringlock-node-bench.XXXXXX")"
source "$ROOT/scripts/server-lib.sh"
server_start "$SERVER_CPU" "$WORK"
REDIS_PID=""
stop_all() {
    [[ -n "$REDIS_PID" ]] && { kill "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; }
    server_cleanup
}
trap stop_all EXIT

# A free port for redis: the kernel picks one, released just before use.
REDIS_PORT="$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')"
taskset -c "$SERVER_CPU" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    >"$WORK/redis.log" 2>&1 &
REDIS_PID=$!
for _ in $(seq 1 100); do
    node -e "require('net').connect($REDIS_PORT,'127.0.0.1').on('connect',()=>process.exit(0)).on('error',()=>process.exit(1))" \
        2>/dev/null && break
    sleep 0.05
done

on_client() { taskset -c "$CLIENT_CPU" "$@"; }
run() { on_client node "$HERE/bench.mjs" "$@"; }
client() {
    if [[ -n "$BEFORE" ]]; then
        echo -n "before: "
        SERVER_PID="$SERVER_PID" on_client node "$BEFORE/bench/bench.mjs" ringlock "$ADDR" "$@"
    fi
    SERVER_PID="$SERVER_PID" run ringlock "$ADDR" "$@"
}
one_round() {
    SERVER_PID="$SERVER_PID" on_client node "$HERE/roundtrip.mjs" ringlock "$ADDR" "$SECONDS_PER_RUN"
    SERVER_PID="$REDIS_PID" on_client node "$HERE/roundtrip.mjs" redis "$REDIS_PORT" "$SECONDS_PER_RUN"
    client 1 "$SECONDS_PER_RUN"
    client 64 "$SECONDS_PER_RUN"
    client 64 "$SECONDS_PER_RUN" 1
    # Its generator's and the server's CPU time per cycle, as the Node lines.
    on_client "$BENCH" run --target ringlock --addr "$ADDR" --cpus "$CLIENT_CPU" --server-pid "$SERVER_PID" \
        -c 1 -d 64 --duration "$SECONDS_PER_RUN" --warmup 1 --json |
        node -e 'let t="";process.stdin.on("data",d=>t+=d).on("end",()=>{const r=JSON.parse(t),c=r.cycles_per_s;
            const us=(percent)=>((percent/100)*1e6/c).toFixed(1);
            console.log(`ringlock-bench loops=64 connections=1 cycles/s=${Math.round(c)} `+
                `generator_cpu_us=${us(r.generator_cpu_percent)} server_cpu_us=${us(r.server.cpu_percent)}`)})'
    for target in redlock ioredis; do
        SERVER_PID="$REDIS_PID" run "$target" "$REDIS_PORT" 1 "$SECONDS_PER_RUN"
        SERVER_PID="$REDIS_PID" run "$target" "$REDIS_PORT" 64 "$SECONDS_PER_RUN"
    done
}
for round in $(seq 1 "$ROUNDS"); do
    ((ROUNDS == 1)) || echo "round $round"
    one_round
done | tee "$WORK/lines.txt"
((ROUNDS == 1)) || node "$HERE/summary.mjs" <"$WORK/lines.txt"
