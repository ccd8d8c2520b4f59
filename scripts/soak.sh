#!/usr/bin/env bash
# Soak: a three-node ringlock cluster on loopback under client load, with a
# random fault every few seconds (kill -9 and restart, Ctrl+C and restart,
# SIGSTOP/SIGCONT, a partition of the peer links, closed or silent (every
# byte dropped, nothing closed), every client connection
# to a node cut, a client that stops reading), for a bounded time. Every
# client observation is recorded and checked afterwards (tests/history);
# the run ends with a summary table and exits non-zero if an invariant broke
# outside a failover window or a node crashed.
#
# Usage: scripts/soak.sh [SECONDS] [--clients N] [--seed S] [--faults LIST] [--summary FILE]
#   SECONDS     how long to inject faults (default 60)
#   --clients   client threads, each with its own client (default 8)
#   --seed      replay the fault schedule of an earlier run
#   --faults    only these faults, comma-separated:
#               kill,ctrl-c,pause,partition,cut,stall,silent-partition
#   --summary   also write the summary table (Markdown) to FILE
# Cutting client connections uses `ss -K` (CAP_NET_ADMIN); without it that
# fault is counted as skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

SOAK_SECONDS=60
while (($# > 0)); do
    case "$1" in
        --clients) export SOAK_CLIENTS="$2"; shift 2 ;;
        --seed) export SOAK_SEED="$2"; shift 2 ;;
        --faults) export SOAK_FAULTS="$2"; shift 2 ;;
        --summary) SOAK_SUMMARY="$(realpath -m "$2")"; export SOAK_SUMMARY; shift 2 ;;
        -h | --help) sed -n '2,19p' "$0"; exit 0 ;;
        [0-9]*) SOAK_SECONDS="$1"; shift ;;
        *) echo "soak.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
export SOAK_SECONDS

# The same optimised build with debug assertions as scripts/test.sh, so that
# a soak after the tests rebuilds nothing. The test harness ends every node
# it started, also when the run fails.
exec cargo test --profile test-release --test soak -- --ignored --exact soak --nocapture
