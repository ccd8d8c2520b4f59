# Shell functions for benchmarks that drive one ringlock node: start it on
# a free loopback port pinned to a CPU, learn its address, stop it on exit.
# Source it; it runs nothing. Used by scripts/client-throughput.sh and
# clients/go/bench/bench.sh.

# Starts "$BIN/ringlock" (one shard core) pinned to CPU $1, with its data
# directory and log in $2; sets SERVER_PID and ADDR, and stops the server
# and removes $2 when the calling script exits.
server_start() {
    local cpu=$1 work=$2
    SERVER_WORK="$work"
    SERVER_PID=""
    trap server_cleanup EXIT
    trap 'exit 130' INT TERM
    taskset -c "$cpu" "$BIN/ringlock" --listen 127.0.0.1:0 --data-dir "$work/data" --shards 1 \
        --cpus "$cpu" 2>"$work/server.log" &
    SERVER_PID=$!
    ADDR=""
    for _ in $(seq 1 200); do
        ADDR="$(grep -o 'listening on [0-9.:]*' "$work/server.log" | head -n1 | awk '{print $3}' || true)"
        [[ -n "$ADDR" ]] && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
        sleep 0.05
    done
    echo "the server did not start; see $work/server.log" >&2
    exit 1
}

server_cleanup() {
    if [[ -n "${SERVER_PID:-}" ]]; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$SERVER_WORK"
}
