#!/usr/bin/env bash
# Lock throughput of an active node with 2 standbys attached, against a
# standalone node, both driven by ringlock-bench (uncontended, pipelined).
#
# A 3-node cluster and a standalone node run side by side on loopback; the
# runs alternate (standalone, cluster, standalone, ...) so that both see the
# same moments of a shared machine, and the ratio is taken per pair.
#
# Placement, as in a deployment where the nodes have hosts of their own as
# far as two CPUs allow: the shard core of the measured node (the standalone,
# or the cluster's active) is pinned to SHARD_CPU alone; the load generator,
# the active's replication core and both standbys share OTHER_CPU. On a
# 2-core machine that CPU cannot carry the generator at full speed and the
# replication work at once, so the ratio measured here is a floor. Each run
# therefore also reports the CPU time the shard core, the active's
# replication core and the standbys spent per lock cycle (from
# /proc/<pid>/task/<tid>/schedstat): with the replication core and the
# standbys on CPUs of their own, the active's throughput is bounded by its
# shard core, so the ratio of the shard cores' time per cycle is the
# projected ratio, and the replication core's time per cycle says how many
# cycles/s one replication core can carry.
#
# Usage: scripts/cluster-throughput.sh [--pairs 5] [--seconds 4] [--connections 64]
#                                      [--depth 64] [--base-port 7840]
#   Environment: SHARD_CPU (1), OTHER_CPU (0), CARGO_TARGET_DIR.
set -euo pipefail
source "$(dirname "$0")/cluster-lib.sh"
CLUSTER_BASE_PORT=7840
PAIRS=5
SECONDS_PER_RUN=4
CONNECTIONS=64
DEPTH=64
SHARD_CPU="${SHARD_CPU:-1}"
OTHER_CPU="${OTHER_CPU:-0}"
while (($# > 0)); do
    case "$1" in
        --pairs) PAIRS="$2"; shift 2 ;;
        --seconds) SECONDS_PER_RUN="$2"; shift 2 ;;
        --connections) CONNECTIONS="$2"; shift 2 ;;
        --depth) DEPTH="$2"; shift 2 ;;
        --base-port) CLUSTER_BASE_PORT="$2"; shift 2 ;;
        -h | --help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "cluster-throughput.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

(cd "$RINGLOCK_ROOT" && cargo build --release --quiet -p ringlock --bin ringlock -p ringlock-bench)
BENCH_BIN="${CARGO_TARGET_DIR:-$RINGLOCK_ROOT/target}/release/ringlock-bench"
cluster_init
STANDALONE_PID=""
cleanup() {
    if [[ -n "$STANDALONE_PID" ]]; then
        kill -TERM "$STANDALONE_PID" 2>/dev/null || true
        wait "$STANDALONE_PID" 2>/dev/null || true
    fi
    cluster_stop
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Node 0 is the active: its shard core on SHARD_CPU, its replication core on
# OTHER_CPU; the standbys entirely on OTHER_CPU.
CLUSTER_NODE_FLAGS=("--cpus $SHARD_CPU --replication-cpu $OTHER_CPU" "--no-pin" "--no-pin")
CLUSTER_NODE_CPUS=("" "$OTHER_CPU" "$OTHER_CPU")
cluster_start
standalone_addr="127.0.0.1:$((CLUSTER_BASE_PORT + 100))"
setsid "$RINGLOCK_BIN" --listen "$standalone_addr" --data-dir "$CLUSTER_DIR/data-standalone" --shards 1 \
    --cpus "$SHARD_CPU" >"$CLUSTER_DIR/standalone.log" 2>&1 &
STANDALONE_PID=$!
cluster_wait_active 0 60 >/dev/null
deadline=$((SECONDS + 30))
until [[ "$(ringlock_ping "$standalone_addr")" == "P active"* ]]; do
    if ((SECONDS > deadline)); then
        echo "the standalone node did not start; see $CLUSTER_DIR/standalone.log" >&2
        exit 1
    fi
    sleep 0.05
done

# Prints the summed on-CPU nanoseconds of the threads of pid $1 whose name
# starts with $2 (the kernel keeps 15 characters of a thread's name).
thread_ns() {
    local task total=0
    for task in /proc/"$1"/task/*; do
        if [[ "$(cat "$task/comm" 2>/dev/null)" == "$2"* ]]; then
            total=$((total + $(cut -d' ' -f1 "$task/schedstat")))
        fi
    done
    echo "$total"
}

# run LABEL ADDR PID...: one measured run against ADDR; the first PID is the
# measured node, the others standbys. Appends a line to the results.
run() {
    local label="$1" addr="$2" node="$3"
    shift 3
    local out="$CLUSTER_DIR/$label.json"
    # The counters are read once the warm-up second has passed, and again
    # just before the measured time ends.
    taskset -c "$OTHER_CPU" "$BENCH_BIN" run --target ringlock --addr "$addr" --cpus "$OTHER_CPU" \
        --workload uncontended -c "$CONNECTIONS" -d "$DEPTH" --warmup 1 --duration "$((SECONDS_PER_RUN + 1))" \
        --json >"$out" &
    local bench=$!
    sleep 1.2
    local shard0 repl0 others0=0 start end pid
    shard0="$(thread_ns "$node" ringlock-shard)"
    repl0="$(thread_ns "$node" ringlock-replic)"
    for pid in "$@"; do others0=$((others0 + $(thread_ns "$pid" ringlock))); done
    start="$(date +%s%N)"
    sleep "$SECONDS_PER_RUN"
    local shard1 repl1 others1=0
    shard1="$(thread_ns "$node" ringlock-shard)"
    repl1="$(thread_ns "$node" ringlock-replic)"
    for pid in "$@"; do others1=$((others1 + $(thread_ns "$pid" ringlock))); done
    end="$(date +%s%N)"
    wait "$bench"
    python3 - "$out" "$label" "$((end - start))" "$((shard1 - shard0))" "$((repl1 - repl0))" \
        "$((others1 - others0))" <<'EOF' | tee -a "$CLUSTER_DIR/results.txt"
import json, sys
out, label = sys.argv[1], sys.argv[2]
elapsed_ns, shard_ns, replication_ns, standby_ns = (int(v) for v in sys.argv[3:7])
report = json.load(open(out))
cycles = report["cycles_per_s"]
errors = sum(report.get("errors", {}).values()) + sum(report.get("timeouts", {}).values())
def per_cycle(ns):
    return ns / elapsed_ns * 1e9 / cycles if cycles else 0.0
print(f"{label} cycles_per_s={cycles:.0f} errors={errors} shard_cpu={shard_ns / elapsed_ns * 100:.1f}% "
      f"shard_ns_per_cycle={per_cycle(shard_ns):.0f} replication_ns_per_cycle={per_cycle(replication_ns):.0f} "
      f"standbys_ns_per_cycle={per_cycle(standby_ns):.0f} "
      f"generator_cpu={report.get('generator_cpu_percent') or 0:.0f}%")
EOF
}

# Prints the `"table":{...}` of every node's `S`, space-separated.
tables() {
    local addr host port line fd out=()
    for addr in "${CLUSTER_ADDRS[@]}"; do
        host="${addr%:*}" port="${addr##*:}"
        line=""
        if { exec {fd}<>"/dev/tcp/$host/$port"; } 2>/dev/null; then
            printf 'S\n' >&"$fd"
            read -r -t 2 line <&"$fd" || line=""
            exec {fd}>&-
        fi
        out+=("$(grep -o '"table":{[^}]*}' <<<"$line" || echo '?')")
    done
    echo "${out[*]}"
}

# Waits up to 60 s until both standbys hold the active's table (same stream
# and version in `S`); fails if they do not.
wait_caught_up() {
    local deadline=$((SECONDS + 60)) now
    while true; do
        now="$(tables)"
        read -r active first second <<<"$now"
        if [[ "$active" != "?" && "$first" == "$active" && "$second" == "$active" ]]; then
            return 0
        fi
        if ((SECONDS > deadline)); then
            echo "the standbys did not catch up with the active within 60 s: $now" >&2
            return 1
        fi
        sleep 0.2
    done
}

: >"$CLUSTER_DIR/results.txt"
echo "logs and raw results in $CLUSTER_DIR"
echo "uncontended ${CONNECTIONS}x$DEPTH, $SECONDS_PER_RUN s a run, $PAIRS pairs;" \
    "shard core on CPU $SHARD_CPU, the rest on CPU $OTHER_CPU"
for ((pair = 1; pair <= PAIRS; pair++)); do
    run standalone "$standalone_addr" "$STANDALONE_PID"
    run cluster "${CLUSTER_ADDRS[0]}" "${CLUSTER_PIDS[0]}" "${CLUSTER_PIDS[1]}" "${CLUSTER_PIDS[2]}"
    # Replication is asynchronous: standbys that fell behind on CPU 0 catch
    # up before the next run, which would otherwise share the CPU with them.
    # That they do also shows they applied everything the active served.
    wait_caught_up
done
echo "tables (active, standby, standby): $(tables)"

python3 - "$CLUSTER_DIR/results.txt" <<'EOF'
import statistics, sys
runs = {"standalone": [], "cluster": []}
for line in open(sys.argv[1]):
    label, *fields = line.split()
    runs[label].append(dict(field.split("=") for field in fields))
def median(label, key):
    return statistics.median(float(run[key].rstrip("%")) for run in runs[label])
ratios = [float(c["cycles_per_s"]) / float(s["cycles_per_s"]) for s, c in zip(runs["standalone"], runs["cluster"])]
print()
print("| | standalone | active, 2 standbys |")
print("|---|---:|---:|")
for key, name in [("cycles_per_s", "lock cycles/s (median)"), ("shard_cpu", "shard core CPU (%)"),
                  ("shard_ns_per_cycle", "shard core ns per cycle"),
                  ("replication_ns_per_cycle", "replication core ns per cycle"),
                  ("standbys_ns_per_cycle", "both standbys ns per cycle"),
                  ("generator_cpu", "generator CPU (%)")]:
    print(f"| {name} | {median('standalone', key):.0f} | {median('cluster', key):.0f} |")
print()
projected = median("standalone", "shard_ns_per_cycle") / median("cluster", "shard_ns_per_cycle")
replication = median("cluster", "replication_ns_per_cycle")
print("throughput ratio, active with 2 standbys / standalone, per pair:",
      " ".join(f"{r:.2f}" for r in ratios), f"(median {statistics.median(ratios):.2f})")
print(f"projected ratio with the replication work off these two CPUs (shard core time per cycle): {projected:.2f};",
      f"one replication core carries up to {1e9 / replication / 1e6:.2f} M cycles/s" if replication else "")
EOF
