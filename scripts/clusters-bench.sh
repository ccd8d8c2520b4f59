#!/usr/bin/env bash
# Two single-node clusters of one shard core each (pinned to CPU 0 and CPU
# 1) against one node of two shard cores (CPUs 0 and 1), driven by the same
# load generator (not pinned: it time-shares the CPUs with the servers),
# uncontended, pipelined (16 x 64) and unpipelined (64 x 1). `--cluster`
# deals the connections to the two clusters in turn and each draws only the
# keys of its cluster. PASSES passes, each running the four cells once in
# turn; prints each cell's figures and the median of the passes' ratios
# (docs/performance.md, "Several clusters").
#
# Usage: scripts/clusters-bench.sh
#   Environment: PASSES [4], DURATION [5] s, WARMUP [1] s.
set -euo pipefail
cd "$(dirname "$0")/.."
PASSES=${PASSES:-4}
DURATION=${DURATION:-5}
WARMUP=${WARMUP:-1}
cargo build --release --quiet -p ringlock -p ringlock-bench
B=${CARGO_TARGET_DIR:-target}/release
dir=$(mktemp -d)
cleanup() {
    kill $(jobs -p) 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
a=127.0.0.1:$(port) b=127.0.0.1:$(port) c=127.0.0.1:$(port)
"$B/ringlock" --listen "$a" --shards 1 --cpus 0 --data-dir "$dir/a" 2>"$dir/a.log" &
"$B/ringlock" --listen "$b" --shards 1 --cpus 1 --data-dir "$dir/b" 2>"$dir/b.log" &
"$B/ringlock" --listen "$c" --shards 2 --cpus 0,1 --data-dir "$dir/c" 2>"$dir/c.log" &
for address in "$a" "$b" "$c"; do
    for _ in $(seq 100); do
        "$B/ringlock-bench" run --addr "$address" -c 1 -d 1 --duration 0.1 --warmup 0 >/dev/null 2>&1 && break
        sleep 0.1
    done
done

for pass in $(seq "$PASSES"); do
    for shape in pipelined unpipelined; do
        if [ "$shape" = pipelined ]; then flags=(-c 16 -d 64); else flags=(-c 64 -d 1); fi
        common=("${flags[@]}" --duration "$DURATION" --warmup "$WARMUP" --json)
        "$B/ringlock-bench" run "${common[@]}" --cluster "a=$a" --cluster "b=$b" >"$dir/$pass-$shape-clusters.json"
        "$B/ringlock-bench" run "${common[@]}" --addr "$c" >"$dir/$pass-$shape-node.json"
    done
done

python3 - "$dir" "$PASSES" <<'PY'
import json, statistics, sys
folder, passes = sys.argv[1], int(sys.argv[2])
def ops(name):
    return json.load(open(f"{folder}/{name}.json"))["ops_per_s"]
def text(value):
    return f"{value / 1e6:.2f} M" if value >= 1e6 else f"{value / 1e3:.0f} k"
print("| lock ops/s | 2 clusters × 1 shard core | 1 node × 2 shard cores | ratio (median of the passes') |")
print("|---|---:|---:|---:|")
for shape, label in (("pipelined", "pipelined, 16 connections × 64 in flight"),
                     ("unpipelined", "unpipelined, 64 connections × 1")):
    clusters = [ops(f"{p}-{shape}-clusters") for p in range(1, passes + 1)]
    node = [ops(f"{p}-{shape}-node") for p in range(1, passes + 1)]
    ratio = statistics.median(x / y for x, y in zip(clusters, node))
    print(f"| {label} | {', '.join(map(text, clusters))} | {', '.join(map(text, node))} | {ratio:.2f} |")
PY
