#!/usr/bin/env bash
# Measures failovers of a 3-node ringlock cluster on loopback, as the clients
# see them, and prints a table:
#   - kill -9 of the active under load: time to the first grant by the new
#     active, the time the clients saw no grant, and grants lost per kill;
#   - Ctrl+C (SIGINT) of the active under load: the same for the hand-off,
#     where no grant should be lost;
#   - replication lag under that load, before each failover (how long a
#     change existed on the active before a standby had applied it, sampled
#     every 5 ms);
#   - lock cycles/s of the active with 2 standbys attached against a
#     standalone node (scripts/cluster-throughput.sh, which says how).
# Each failover run kills or stops node 0 under the load of
# client/examples/failover_probe.rs, waits for node 1 to be active, then
# restarts node 0, which catches up and takes the active role back.
#
# Usage: scripts/failover-bench.sh [--runs 20] [--base-port 7740] [--dir DIR] [--no-throughput]
#   Environment: CLUSTER_HEARTBEAT_MS, CLUSTER_FAILOVER_MS (server defaults 100 / 1000).
set -euo pipefail
source "$(dirname "$0")/cluster-lib.sh"
CLUSTER_BASE_PORT=7740
RUNS=20
THROUGHPUT=1
while (($# > 0)); do
    case "$1" in
        --runs) RUNS="$2"; shift 2 ;;
        --base-port) CLUSTER_BASE_PORT="$2"; shift 2 ;;
        --dir) CLUSTER_DIR="$2"; shift 2 ;;
        --no-throughput) THROUGHPUT=0; shift ;;
        -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "failover-bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

cluster_build
EXAMPLES="${CARGO_TARGET_DIR:-$RINGLOCK_ROOT/target}/release/examples"
cluster_init
RESULTS="$CLUSTER_DIR/results.txt"
: >"$RESULTS"
trap cluster_stop EXIT
trap 'exit 130' INT TERM

addr_flags() { printf -- '--addr %s ' "${CLUSTER_ADDRS[@]}"; }

echo "logs, data and raw results in $CLUSTER_DIR"
echo "heartbeat ${CLUSTER_HEARTBEAT_MS:-100 (default)} ms, failover ${CLUSTER_FAILOVER_MS:-1000 (default)} ms, $RUNS runs per signal"
cluster_start
for signal in KILL INT; do
    for ((run = 1; run <= RUNS; run++)); do
        cluster_wait_active 0 60 >/dev/null
        # shellcheck disable=SC2046 # one word per flag
        line="$("$EXAMPLES/failover_probe" $(addr_flags) --pid "${CLUSTER_PIDS[0]}" --signal "$signal")"
        status="$(cluster_wait_exit 0)"
        echo "$line exit_status=$status" | tee -a "$RESULTS"
        cluster_wait_active 1 60 >/dev/null
        cluster_start_node 0
    done
done
cluster_wait_active 0 60 >/dev/null

# p50 and max of field $2 over the lines of signal $1.
summary() {
    grep "^signal=$1 " "$RESULTS" | tr ' ' '\n' | grep "^$2=" | cut -d= -f2 | sort -g |
        awk '{ v[NR] = $1; sum += $1 } END { if (NR == 0) { print "- | - | -"; exit }
             printf "%s | %s | %.2f\n", v[int((NR + 1) / 2)], v[NR], sum / NR }'
}

echo
echo "| measure ($RUNS runs each) | p50 | max | mean |"
echo "|---|---|---|---|"
echo "| kill -9 → first grant by the new active (ms) | $(summary KILL first_grant_ms) |"
echo "| kill -9: last grant of the old active → first of the new (ms) | $(summary KILL gap_ms) |"
echo "| kill -9: grants lost per kill | $(summary KILL lost) |"
echo "| Ctrl+C → first grant by the successor (ms) | $(summary INT first_grant_ms) |"
echo "| Ctrl+C: time with no active, last grant of the old → first of the new (ms) | $(summary INT gap_ms) |"
echo "| Ctrl+C: grants lost per hand-off | $(summary INT lost) |"
echo "| replication lag under load, p50 of each run's median (ms) | $(summary '[A-Z]*' lag_p50_ms) |"
echo "| replication lag under load, each run's largest (ms) | $(summary '[A-Z]*' lag_max_ms) |"
echo
echo "Ctrl+C runs whose node exited with a status other than 0:" \
    "$(grep '^signal=INT' "$RESULTS" | grep -c 'exit_status=[1-9]' || true) of $RUNS"

if ((THROUGHPUT)); then
    cluster_stop
    echo
    echo "throughput: the active with 2 standbys against a standalone node (scripts/cluster-throughput.sh)"
    "$RINGLOCK_ROOT/scripts/cluster-throughput.sh" --base-port "$((CLUSTER_BASE_PORT + 200))"
fi
