#!/usr/bin/env bash
# Shows a ringlock cluster failing over with clients running: starts 3 nodes
# on loopback, then, under a client load (client/examples/failover_probe.rs),
#   1. kill -9 of the active (node 0): node 1 promotes;
#   2. Ctrl+C of the new active (node 1): it hands off to node 2 and exits 0;
#   3. node 0 restarts: it rejoins as a standby, catches up, and takes the
#      active role back by hand-off.
# Every node's `P` is printed as it goes; logs are kept in the directory shown.
#
# Usage: scripts/failover-demo.sh [--base-port 7720] [--dir DIR]
#   Environment: CLUSTER_HEARTBEAT_MS, CLUSTER_FAILOVER_MS (server defaults 100 / 1000).
set -euo pipefail
source "$(dirname "$0")/cluster-lib.sh"
CLUSTER_BASE_PORT=7720
while (($# > 0)); do
    case "$1" in
        --base-port) CLUSTER_BASE_PORT="$2"; shift 2 ;;
        --dir) CLUSTER_DIR="$2"; shift 2 ;;
        -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "failover-demo.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

cluster_build
PROBE="${CARGO_TARGET_DIR:-$RINGLOCK_ROOT/target}/release/examples/failover_probe"
cluster_init
WATCH_PID=""
cleanup() {
    if [[ -n "$WATCH_PID" ]]; then
        kill "$WATCH_PID" 2>/dev/null || true
    fi
    cluster_stop
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Prints every node's P whenever a role changes, in the background.
watch_roles() {
    local last="" now
    while true; do
        now="$(cluster_show)"
        if [[ "${now#* }" != "${last#* }" ]]; then
            echo "    $now"
            last="$now"
        fi
        sleep 0.05
    done
}

probe() {
    "$PROBE" $(printf -- '--addr %s ' "${CLUSTER_ADDRS[@]}") --pid "$1" --signal "$2" --after-ms 1500
}

step() { echo; echo "== $*"; }

step "starting 3 nodes (logs in $CLUSTER_DIR)"
cluster_start
cluster_wait_active 0 >/dev/null
cluster_show
watch_roles &
WATCH_PID=$!

step "kill -9 of the active, node 0 (pid ${CLUSTER_PIDS[0]}), under load"
probe "${CLUSTER_PIDS[0]}" KILL
cluster_wait_exit 0 >/dev/null
cluster_wait_active 1 >/dev/null
echo "node 1 is active"

step "Ctrl+C (SIGINT) of the new active, node 1 (pid ${CLUSTER_PIDS[1]}), under load"
probe "${CLUSTER_PIDS[1]}" INT
echo "node 1 exited with status $(cluster_wait_exit 1)"
cluster_wait_active 2 >/dev/null
echo "node 2 is active"

step "node 0 restarts: it catches up as a standby, then takes over by hand-off"
cluster_start_node 0
cluster_wait_active 0 60 >/dev/null
echo "node 0 is active again"
kill "$WATCH_PID" 2>/dev/null
wait "$WATCH_PID" 2>/dev/null || true
WATCH_PID=""
cluster_show

step "done; stopping the cluster (logs stay in $CLUSTER_DIR)"
