#!/usr/bin/env bash
# The run behind docs/performance.md: one after the other on one host,
#   scripts/bench.sh          ringlock, Redis and echo side by side
#   TLS=1 scripts/bench.sh    TLS and authentication
#   scripts/latency.sh        open-loop latency and its goals
#   scripts/clusters-bench.sh two clusters against one node of two cores
# then writes bench/results/run.md: the host (CPU model, CPUs, kernel), the
# commit, and when each part started and ended, beside the three parts'
# own outputs in bench/results/ (latest.*, tls.*, latency.*, clusters.md).
#
# Usage: scripts/performance-run.sh
#   Environment: passed on to the three scripts (ROUNDS, DURATION, ...);
#   SKIP_LATENCY=1 leaves out the latency sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
RESULTS=${RESULTS:-bench/results}
mkdir -p "$RESULTS"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# What the binaries are built from: the tree as it is when the run starts.
commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src shards proto ring bench || echo ' (with local changes)')"

part() {
    local name=$1
    shift
    local start
    start=$(date -u +%FT%TZ)
    "$@"
    printf '| %s | %s | %s |\n' "$name" "$start" "$(date -u +%FT%TZ)" >>"$log"
}

part 'scripts/bench.sh' scripts/bench.sh
part 'TLS=1 scripts/bench.sh' env TLS=1 scripts/bench.sh
[ -n "${SKIP_LATENCY:-}" ] || part 'scripts/latency.sh' scripts/latency.sh
clusters() { scripts/clusters-bench.sh | tee "$RESULTS/clusters.md"; }
part 'scripts/clusters-bench.sh' clusters

model=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
{
    echo "# The run behind docs/performance.md"
    echo
    echo "- host: $(nproc) CPUs, ${model:-unknown CPU}, Linux $(uname -r), $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
    echo "- commit: $commit"
    echo
    echo "| part | started (UTC) | ended |"
    echo "|---|---|---|"
    cat "$log"
} >"$RESULTS/run.md"
cat "$RESULTS/run.md"
