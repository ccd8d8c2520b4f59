#!/usr/bin/env bash
# Lock ops/s of ringlock in several shard and CPU layouts on this host, for
# choosing --shards, --cpus and --no-pin (docs/tuning.md).
#
# Each layout is a string of server flags. The server runs with them on a
# free loopback port, under `taskset -c <its --cpus>` when it has --cpus;
# the load generator (ringlock-bench, uncontended) is pinned to BENCH_CPU and
# drives it in three shapes: 64 connections x 64 in flight, 16 x 64, and
# 64 x 1 (no pipelining). Prints one markdown row per layout.
#
# Usage: tuning/layouts.sh [LAYOUT...]
#   With no LAYOUT, the layouts of docs/tuning.md's table:
#   '--shards 1 --cpus 1' '--shards 1 --no-pin' '--shards 2 --cpus 0,1' '--shards 2 --no-pin'
#   Environment: BENCH_CPU (0), DURATION (s, 4), WARMUP (s, 1), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
esac
BENCH_CPU="${BENCH_CPU:-0}"
DURATION="${DURATION:-4}"
WARMUP="${WARMUP:-1}"
if (($# == 0)); then
    set -- '--shards 1 --cpus 1' '--shards 1 --no-pin' '--shards 2 --cpus 0,1' '--shards 2 --no-pin'
fi

cargo build --release --quiet -p ringlock --bin ringlock -p ringlock-bench
BIN="${CARGO_TARGET_DIR:-target}/release"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ringlock-layouts.XXXXXX")"
SERVER_PID=""
cleanup() {
    if [[ -n "$SERVER_PID" ]]; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Prints "<rate>" for ops/s: 6.25 M, 329 k.
human() { python3 -c 'import sys; r = float(sys.argv[1]); print(f"{r / 1e6:.2f} M" if r >= 1e6 else f"{r / 1e3:.0f} k")' "$1"; }

echo "| server layout | 64 conns × 64 in flight | 16 × 64 | 64 × 1 (no pipelining) |"
echo "|---|---:|---:|---:|"
for layout in "$@"; do
    read -r -a flags <<<"$layout"
    cpus=""
    for ((i = 0; i < ${#flags[@]}; i++)); do
        [[ "${flags[i]}" == --cpus ]] && cpus="${flags[i + 1]:-}"
    done
    launcher=()
    [[ -n "$cpus" ]] && launcher=(taskset -c "$cpus")
    rm -rf "$WORK/data"
    "${launcher[@]}" "$BIN/ringlock" --listen 127.0.0.1:0 --data-dir "$WORK/data" "${flags[@]}" \
        2>"$WORK/server.log" &
    SERVER_PID=$!
    addr=""
    for _ in $(seq 1 200); do
        addr="$(grep -o 'listening on [0-9.:]*' "$WORK/server.log" | head -n1 | awk '{print $3}' || true)"
        [[ -n "$addr" ]] && break
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.log" >&2; exit 1; }
        sleep 0.05
    done
    [[ -n "$addr" ]] || { echo "the server did not start; see its log:" >&2; cat "$WORK/server.log" >&2; exit 1; }
    row="| \`$layout\` |"
    for shape in "64 64" "16 64" "64 1"; do
        read -r connections depth <<<"$shape"
        rate="$(taskset -c "$BENCH_CPU" "$BIN/ringlock-bench" run --target ringlock --addr "$addr" \
            --cpus "$BENCH_CPU" -c "$connections" -d "$depth" --duration "$DURATION" --warmup "$WARMUP" \
            --server-pid "$SERVER_PID" --json |
            python3 -c 'import json, sys; print(json.load(sys.stdin)["ops_per_s"])')"
        row+=" $(human "$rate") |"
    done
    echo "$row"
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
done
