# Shell functions shared by the benchmarks that drive ringlock, Redis and
# the echo server side by side with ringlock-bench (scripts/bench.sh,
# scripts/latency.sh). Source it after setting SERVER_CPU, BENCH_CPU, BIN,
# MAX_PRESSURE and TRIES; it runs nothing but defines:
#
#   log, bench_prerequisites, bench_workdir (sets WORK, stops every started
#   server on exit), start_echo, start_ringlock, start_redis (each sets
#   <NAME>_PID and <NAME>_ADDR), stop, pressure_now, wait_quiet,
#   run_disturbance, json_field, and bench, which runs ringlock-bench once
#   per try until a try is undisturbed and appends the kept JSON to RUN_FILES.
#
# QUIET_WAIT_S (default 120) bounds how long wait_quiet waits for the CPU
# pressure to fall below MAX_PRESSURE before a run. RINGLOCK_BIN (default
# $BIN/ringlock) names the server binary start_ringlock runs, so that a copy
# built from another commit can be measured against the current one.

log() { printf '== %s\n' "$*" >&2; }

# Builds the release binaries, installs Debian's redis-server and python3's
# matplotlib if they are missing (matplotlib unless SKIP_CHART=1).
bench_prerequisites() {
    log "building (release)"
    cargo build --release --quiet -p ringlock -p ringlock-bench
    if ! command -v redis-server >/dev/null; then
        log "installing Debian's redis-server"
        if [ "$(id -u)" -ne 0 ]; then
            echo "redis-server is missing and this is not root: run apt-get install -y redis-server" >&2
            exit 1
        fi
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
    fi
    if [ "${SKIP_CHART:-0}" != 1 ] && ! python3 -c 'import matplotlib' 2>/dev/null; then
        log "installing matplotlib for the chart"
        python3 -m pip install --quiet matplotlib
    fi
}

PIDS=()
RUN_FILES=()

# Makes a scratch folder, WORK, removed on exit after every server started
# by the functions below is stopped.
bench_workdir() {
    WORK=$(mktemp -d "/tmp/${1:-ringlock-bench}.XXXXXX")
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM
}

bench_cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$WORK"
}

# Waits for "listening on <addr>" in a log and prints the address.
wait_listening() {
    local logfile=$1 pid=$2 address=""
    for _ in $(seq 1 200); do
        address=$(grep -o 'listening on [0-9.:]*' "$logfile" 2>/dev/null | head -n1 | awk '{print $3}' || true)
        if [ -n "$address" ]; then
            echo "$address"
            return
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "server $pid died:" >&2
            cat "$logfile" >&2
            exit 1
        fi
        sleep 0.05
    done
    echo "server $pid did not start in 10 s:" >&2
    cat "$logfile" >&2
    exit 1
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Each starter sets <NAME>_PID and <NAME>_ADDR.
start_echo() {
    taskset -c "$SERVER_CPU" "$BIN/ringlock-bench" echo-server --listen 127.0.0.1:0 2>"$WORK/echo.log" &
    ECHO_PID=$!
    PIDS+=("$ECHO_PID")
    ECHO_ADDR=$(wait_listening "$WORK/echo.log" "$ECHO_PID")
}

# start_ringlock [SHARDS CPUS [NAME [FLAGS...]]]: one shard on SERVER_CPU
# unless told otherwise; NAME (default ringlock) names its data folder and
# log in WORK, so that several servers can run side by side; FLAGS are more
# server flags (--tls-cert..., --auth-file...).
start_ringlock() {
    local shards=${1:-1} cpus=${2:-$SERVER_CPU} name=${3:-ringlock}
    shift $(($# < 3 ? $# : 3))
    rm -rf "${WORK:?}/$name-data"
    taskset -c "$cpus" "${RINGLOCK_BIN:-$BIN/ringlock}" --listen 127.0.0.1:0 --data-dir "$WORK/$name-data" \
        --shards "$shards" --cpus "$cpus" "$@" 2>"$WORK/$name.log" &
    RINGLOCK_PID=$!
    PIDS+=("$RINGLOCK_PID")
    RINGLOCK_ADDR=$(wait_listening "$WORK/$name.log" "$RINGLOCK_PID")
}

# start_redis [FLAGS...]: FLAGS are more redis-server flags (--tls-port...).
start_redis() {
    local port
    port=$(free_port)
    taskset -c "$SERVER_CPU" redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
        --protected-mode no --daemonize no --logfile "$WORK/redis.log" --dir "$WORK" "$@" >/dev/null &
    REDIS_PID=$!
    PIDS+=("$REDIS_PID")
    REDIS_ADDR=127.0.0.1:$port
    for _ in $(seq 1 200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return
        fi
        if ! kill -0 "$REDIS_PID" 2>/dev/null; then
            echo "redis-server died:" >&2
            cat "$WORK/redis.log" >&2
            exit 1
        fi
        sleep 0.05
    done
    echo "redis-server did not start in 10 s" >&2
    exit 1
}

stop() {
    local pid=$1
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# The CPU pressure of the last 10 s, in percent.
pressure_now() {
    awk '/^some/ { sub("avg10=", "", $2); print $2 }' /proc/pressure/cpu 2>/dev/null || echo 0
}

# Waits up to QUIET_WAIT_S seconds for the pressure to fall below MAX_PRESSURE.
wait_quiet() {
    local waited=0
    while awk -v p="$(pressure_now)" -v max="$MAX_PRESSURE" 'BEGIN { exit !(p >= max) }' &&
        [ $waited -lt "${QUIET_WAIT_S:-120}" ]; do
        sleep 2
        waited=$((waited + 2))
    done
}

# How disturbed a run was: the larger of its CPU pressure and the CPU the
# hypervisor stole from this machine meanwhile (percent of one CPU), both of
# which slow one side of the comparison and not the other.
run_disturbance() {
    python3 -c 'import json, sys; run = json.load(open(sys.argv[1]))
print(max(run.get("cpu_pressure_percent") or 0, run.get("cpu_steal_percent") or 0))' "$1"
}

# json_field FILE PYTHON-EXPRESSION-OF-run: prints one value of a run's JSON.
json_field() {
    python3 -c 'import json, sys; run = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}

# bench LABEL TARGET ADDR PID [ringlock-bench run flags...]
# (TRIES=1 in the environment of one call: no retry, as for hold.)
# BENCH_TASKSET (default: taskset -c BENCH_CPU) and BENCH_PIN (default:
# --cpus BENCH_CPU) say where the generator runs; set both empty to leave it
# unpinned.
bench() {
    local label=$1 target=$2 addr=$3 pid=$4
    shift 4
    local out="$WORK/run-$(printf '%03d' ${#RUN_FILES[@]})-$label-$target.json"
    local try best=""
    local -a taskset_prefix pin
    read -r -a taskset_prefix <<<"${BENCH_TASKSET-taskset -c $BENCH_CPU}"
    read -r -a pin <<<"${BENCH_PIN---cpus $BENCH_CPU}"
    for try in $(seq 1 "$TRIES"); do
        wait_quiet
        log "$label on $target ($addr)${best:+, try $try}"
        "${taskset_prefix[@]}" "$BIN/ringlock-bench" run --target "$target" --addr "$addr" "${pin[@]}" \
            --server-pid "$pid" --label "$label" --json "$@" >"$out.try"
        local disturbance
        disturbance=$(run_disturbance "$out.try")
        if [ -z "$best" ] || awk -v p="$disturbance" -v b="$best" 'BEGIN { exit !(p < b) }'; then
            mv "$out.try" "$out"
            best=$disturbance
        fi
        if awk -v p="$best" -v max="$MAX_PRESSURE" 'BEGIN { exit !(p < max) }'; then
            break
        fi
        log "  disturbed: cpu pressure or steal ${disturbance}% during the run"
    done
    rm -f "$out.try"
    RUN_FILES+=("$out")
}

# make_certs DIR: a CA and a server certificate for 127.0.0.1 and localhost
# (ECDSA P-256, as rcgen makes in the tests), made by the openssl command
# for this run only: DIR/ca.pem, DIR/server.pem, DIR/server.key.
make_certs() {
    local dir=$1
    mkdir -p "$dir"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj "/CN=ringlock bench CA" -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=localhost" \
        -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n' >"$dir/ext"
    openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial -days 2 \
        -extfile "$dir/ext" -out "$dir/server.pem" 2>/dev/null
}

# connect_rate LABEL TARGET ADDR PID [ringlock-bench connect-rate flags...]:
# one connect-rate run, its JSON appended to RATE_FILES.
RATE_FILES=()
connect_rate() {
    local label=$1 target=$2 addr=$3 pid=$4
    shift 4
    local out="$WORK/rate-$(printf '%03d' ${#RATE_FILES[@]})-$label-$target.json"
    local -a taskset_prefix pin
    read -r -a taskset_prefix <<<"${BENCH_TASKSET-taskset -c $BENCH_CPU}"
    read -r -a pin <<<"${BENCH_PIN---cpus $BENCH_CPU}"
    wait_quiet
    log "$label on $target ($addr)"
    "${taskset_prefix[@]}" "$BIN/ringlock-bench" connect-rate --target "$target" --addr "$addr" "${pin[@]}" \
        --server-pid "$pid" --label "$label" --json "$@" >"$out"
    RATE_FILES+=("$out")
}
