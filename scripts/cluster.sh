#!/usr/bin/env bash
# Starts a ringlock cluster of 3 nodes on loopback in one command: builds the
# server in release mode, starts every node with its own data directory and
# log, prints the addresses and the roles, and stops every node on Ctrl+C.
#
# Usage: scripts/cluster.sh [--nodes N] [--base-port 7700] [--dir DIR] [-- more ringlock flags]
#   Node i listens for clients on 127.0.0.1:(base + i) and for its peers on
#   127.0.0.1:(base + i + 10000). Logs: DIR/node-i.log; data: DIR/data-i.
#   Environment: CLUSTER_HEARTBEAT_MS, CLUSTER_FAILOVER_MS (see scripts/cluster-lib.sh).
set -euo pipefail
source "$(dirname "$0")/cluster-lib.sh"

while (($# > 0)); do
    case "$1" in
        --nodes) CLUSTER_NODES="$2"; shift 2 ;;
        --base-port) CLUSTER_BASE_PORT="$2"; shift 2 ;;
        --dir) CLUSTER_DIR="$2"; shift 2 ;;
        --) shift; CLUSTER_EXTRA_FLAGS="$*"; break ;;
        -h | --help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "cluster.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

cluster_build
cluster_init
trap 'echo; echo "stopping the cluster"; cluster_stop; exit 0' INT TERM
cluster_start

echo "ringlock cluster of $CLUSTER_NODES nodes, logs and data in $CLUSTER_DIR"
for ((i = 0; i < CLUSTER_NODES; i++)); do
    echo "  node $i: clients 127.0.0.1:$((CLUSTER_BASE_PORT + i)), peers 127.0.0.1:$((CLUSTER_BASE_PORT + i + 10000)), pid ${CLUSTER_PIDS[i]}, log $CLUSTER_DIR/node-$i.log"
done
echo "client addresses: $CLUSTER_PEERS_FLAG"
if active="$(cluster_wait_active any 30)"; then
    echo "node $active is active:"
elif [[ "$(cluster_dead_nodes | wc -l)" == "$CLUSTER_NODES" ]]; then
    echo "every node has exited" >&2
    exit 1
else
    echo "no single active yet:"
fi
last="$(cluster_show)"
echo "$last"
echo "Ctrl+C stops every node."
# Report role changes and nodes that end, until stopped.
reported_dead=""
while true; do
    now="$(cluster_show)"
    if [[ "${now#* }" != "${last#* }" ]]; then
        echo "$now"
        last="$now"
    fi
    dead="$(cluster_dead_nodes | tr '\n' ' ')"
    if [[ "$dead" != "$reported_dead" ]]; then
        for i in $dead; do
            [[ " $reported_dead " == *" $i "* ]] || cluster_explain_dead "$i"
        done
        reported_dead="$dead"
    fi
    sleep 1
done
