# Shell functions shared by scripts/cluster.sh, scripts/failover-demo.sh and
# scripts/failover-bench.sh: start a ringlock cluster on loopback, ask every
# node its role with `P`, restart and stop nodes. Source it; it runs nothing.
#
# Settings (environment, read by cluster_init):
#   CLUSTER_NODES         number of nodes (default 3)
#   CLUSTER_BASE_PORT     client port of node 0; node i listens on base + i,
#                         its peer transport on base + i + 10000 (default 7700)
#   CLUSTER_DIR           logs and data directories (default: a new temp dir)
#   CLUSTER_HEARTBEAT_MS  --heartbeat-ms (default: the server's, 100)
#   CLUSTER_FAILOVER_MS   --failover-ms (default: the server's, 1000)
#   CLUSTER_EXTRA_FLAGS   more ringlock flags for every node
#   CLUSTER_NODE_FLAGS    an array: element i replaces node i's --no-pin
#                         (e.g. "--cpus 1 --replication-cpu 0")
#   CLUSTER_NODE_CPUS     an array: element i runs node i under taskset -c
#   CARGO_TARGET_DIR      where cargo builds (default: target)

RINGLOCK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RINGLOCK_BIN="${CARGO_TARGET_DIR:-$RINGLOCK_ROOT/target}/release/ringlock"

# Builds the server and the measuring clients in release mode. Always the
# same set, so that the scripts do not rebuild the server for one another
# (building the examples changes the features cargo unifies).
cluster_build() {
    (cd "$RINGLOCK_ROOT" && cargo build --release -p ringlock --bin ringlock \
        -p ringlock-client --example failover_probe --example throughput)
}

# Reads the settings and fills CLUSTER_ADDRS and CLUSTER_PEERS_FLAG.
cluster_init() {
    CLUSTER_NODES="${CLUSTER_NODES:-3}"
    CLUSTER_BASE_PORT="${CLUSTER_BASE_PORT:-7700}"
    CLUSTER_DIR="${CLUSTER_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/ringlock-cluster.XXXXXX")}"
    mkdir -p "$CLUSTER_DIR"
    CLUSTER_ADDRS=()
    CLUSTER_PIDS=()
    local i
    for ((i = 0; i < CLUSTER_NODES; i++)); do
        CLUSTER_ADDRS+=("127.0.0.1:$((CLUSTER_BASE_PORT + i))")
    done
    CLUSTER_PEERS_FLAG="$(IFS=,; echo "${CLUSTER_ADDRS[*]}")"
}

# Starts node $1 in the background, appending to its log.
cluster_start_node() {
    local i="$1"
    local flags=(--listen "${CLUSTER_ADDRS[$i]}" --peers "$CLUSTER_PEERS_FLAG" --node "$i"
        --data-dir "$CLUSTER_DIR/data-$i" --shards 1)
    # shellcheck disable=SC2206 # the node's flags are words on purpose
    flags+=(${CLUSTER_NODE_FLAGS[$i]:---no-pin})
    local launcher=()
    [[ -n "${CLUSTER_NODE_CPUS[$i]:-}" ]] && launcher=(taskset -c "${CLUSTER_NODE_CPUS[$i]}")
    [[ -n "${CLUSTER_HEARTBEAT_MS:-}" ]] && flags+=(--heartbeat-ms "$CLUSTER_HEARTBEAT_MS")
    [[ -n "${CLUSTER_FAILOVER_MS:-}" ]] && flags+=(--failover-ms "$CLUSTER_FAILOVER_MS")
    # shellcheck disable=SC2206 # extra flags are words on purpose
    flags+=(${CLUSTER_EXTRA_FLAGS:-})
    echo "--- $(date +%T.%N) start: $RINGLOCK_BIN ${flags[*]}" >>"$CLUSTER_DIR/node-$i.log"
    # A session of its own, so that a Ctrl+C in the terminal reaches only the
    # script, which then stops the nodes in order; setsid does not fork here
    # (a background job is no process group leader), so $! is the node.
    setsid "${launcher[@]}" "$RINGLOCK_BIN" "${flags[@]}" >>"$CLUSTER_DIR/node-$i.log" 2>&1 &
    CLUSTER_PIDS[i]=$!
}

# Starts every node at once.
cluster_start() {
    local i
    for ((i = 0; i < CLUSTER_NODES; i++)); do
        cluster_start_node "$i"
    done
}

# Prints node $1's answer to `P`, or `-` if it does not answer within 1 s.
cluster_ping() {
    ringlock_ping "${CLUSTER_ADDRS[$1]}"
}

# Prints the answer to `P` of the server at address $1 (host:port), or `-`.
ringlock_ping() {
    local address="$1" line=""
    local host="${address%:*}" port="${address##*:}"
    # The braces keep the 2>/dev/null to the connect attempt; a plain exec
    # would silence the shell's stderr for good.
    if { exec {fd}<>"/dev/tcp/$host/$port"; } 2>/dev/null; then
        printf 'P\n' >&"$fd"
        read -r -t 1 line <&"$fd" || line=""
        exec {fd}>&-
    fi
    echo "${line:--}"
}

# Prints one line with every node's `P`.
cluster_show() {
    local i out=""
    for ((i = 0; i < CLUSTER_NODES; i++)); do
        out+="  node $i: $(cluster_ping "$i" | tr -d '\r')"
    done
    echo "$(date +%T.%N | cut -c1-12)$out"
}

# Index of the node that answers `P active`, if exactly one does and every
# other running node is a standby naming it; nothing otherwise.
cluster_single_active() {
    local i line active="" active_addr="" count=0
    local lines=()
    for ((i = 0; i < CLUSTER_NODES; i++)); do
        lines[i]="$(cluster_ping "$i")"
        if [[ "${lines[i]}" == "P active "* ]]; then
            active="$i"
            active_addr="${CLUSTER_ADDRS[$i]}"
            count=$((count + 1))
        fi
    done
    [[ "$count" == 1 ]] || return 1
    for ((i = 0; i < CLUSTER_NODES; i++)); do
        line="${lines[i]}"
        [[ "$line" == "-" || "$i" == "$active" ]] && continue
        [[ "$line" == "P standby "*" $active_addr" ]] || return 1
    done
    echo "$active"
}

# Indices of the nodes whose process has ended, one a line.
cluster_dead_nodes() {
    local i
    for ((i = 0; i < CLUSTER_NODES; i++)); do
        if [[ -z "${CLUSTER_PIDS[i]:-}" ]] || ! kill -0 "${CLUSTER_PIDS[i]}" 2>/dev/null; then
            echo "$i"
        fi
    done
}

# Prints why node $1 ended: the last lines of its log.
cluster_explain_dead() {
    echo "node $1 is not running; the end of $CLUSTER_DIR/node-$1.log:" >&2
    tail -n 5 "$CLUSTER_DIR/node-$1.log" | sed 's/^/    /' >&2
}

# Waits up to $2 seconds (default 30) until node $1 (or any node, for `any`)
# is the single active; prints its index. Fails at once if every node ended.
cluster_wait_active() {
    local want="$1" deadline=$((SECONDS + ${2:-30})) active i
    while ((SECONDS < deadline)); do
        if active="$(cluster_single_active)" && [[ "$want" == any || "$active" == "$want" ]]; then
            echo "$active"
            return 0
        fi
        if [[ "$(cluster_dead_nodes | wc -l)" == "$CLUSTER_NODES" ]]; then
            for ((i = 0; i < CLUSTER_NODES; i++)); do
                cluster_explain_dead "$i"
            done
            return 1
        fi
        sleep 0.02
    done
    echo "cluster: no single active (wanted $want) within ${2:-30} s:" >&2
    cluster_show >&2
    return 1
}

# Waits for node $1's process to end; prints its exit status.
cluster_wait_exit() {
    local status=0
    wait "${CLUSTER_PIDS[$1]}" 2>/dev/null || status=$?
    echo "$status"
}

# Stops every running node: the standbys first, so that stopping the active
# last does not hand the role from node to node on the way out.
cluster_stop() {
    local i pid active
    active="$(cluster_single_active 2>/dev/null || true)"
    for ((i = CLUSTER_NODES - 1; i >= 0; i--)); do
        if [[ "$i" != "$active" ]]; then
            cluster_signal_node "$i" TERM
        fi
    done
    for ((i = 0; i < CLUSTER_NODES; i++)); do
        if [[ "$i" != "$active" && -n "${CLUSTER_PIDS[i]:-}" ]]; then
            wait "${CLUSTER_PIDS[i]}" 2>/dev/null || true
        fi
    done
    if [[ -n "$active" ]]; then
        cluster_signal_node "$active" TERM
    fi
    for pid in "${CLUSTER_PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    CLUSTER_PIDS=()
}

# Sends signal $2 to node $1 (continuing it first, in case it was stopped).
cluster_signal_node() {
    local pid="${CLUSTER_PIDS[$1]:-}"
    if [[ -n "$pid" ]]; then
        kill -CONT "$pid" 2>/dev/null || true
        kill -"$2" "$pid" 2>/dev/null || true
    fi
}
