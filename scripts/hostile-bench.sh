#!/usr/bin/env bash
# What hostile clients cost a bystander on a TLS node with an auth file:
# the bystander's p50/p99 acquire and release round trips, idle and during
# each attack (slowloris, garbage, half handshakes, a flood of wrong `U`
# lines, a flood of `P`, ClientHellos of 10 000 extensions, `U` lines of
# 1 MiB, authenticated clients that ask for `S` and never read, a fill of
# the key table), as ratios to idle, and the server's RSS before, during
# and after each. The attacks and the bystander are in
# scripts/hostile-bench.py; certificates are made with openssl in a
# temporary directory and removed at exit (no key is kept).
#
#   scripts/hostile-bench.sh
#
# Settings (environment), defaults in brackets, about 2 minutes:
#   DURATION [5]: seconds the bystander is measured per attack
#   SLOWLORIS [10000], HALF [10000]: connections of those attacks
#   FLOOD_THREADS [4]: threads of each flood
#   SLOW_READERS [2000]: connections that never read
#   FILL_PROCESSES [2]: connections of the key fill, a process each (new
#     200-byte keys with 24-hour leases, pipelined 1000 at a time), run last
#   HANDSHAKE_MS [10000]: the server's --handshake-ms
#   ATTACKS [all]: a comma-separated list of attacks to run after idle
#     (slowloris, garbage, half-handshakes, bad-u-flood, p-flood, big-hellos,
#     long-u-lines, slow-readers, key-fill)
#   SETTLE [2]: seconds between an attack's start and the measurement
#     (0 measures the attack's ramp-up too)
#   SERVER_FLAGS []: more flags for the server, e.g. "--send-buffer-kib 0"
#   SERVER_CPU []: pin the server to this CPU and the bystander and the
#     attackers to the others (unset: nothing is pinned)
#   ATTACK_NICE [0]: niceness of the key fill's processes, so that on the
#     CPUs they share with the bystander they stand for other hosts
#   BYSTANDER_RT []: 1 runs the bystander's thread at SCHED_FIFO priority 1
#     while it measures (needs root), so that it is woken as soon as its
#     reply comes even on a CPU the attackers keep busy, as on a host of
#     its own
# The attackers open up to 10 000 connections at once: the script raises
# its descriptor limit (ulimit -n) to 25 000 (or the hard limit), and fails if
# limit is lower than the attacks' connections and a thousand more.
set -euo pipefail
cd "$(dirname "$0")/.."
ulimit -n 25000 2>/dev/null || ulimit -n "$(ulimit -Hn)"
if (( $(ulimit -n) < ${SLOWLORIS:-10000} + 1000 || $(ulimit -n) < ${HALF:-10000} + 1000 )); then
    echo "ulimit -n is $(ulimit -n): too low for ${SLOWLORIS:-10000} connections" >&2
    exit 1
fi
nice cargo build --release --quiet -p ringlock --bin ringlock
BIN="${CARGO_TARGET_DIR:-target}/release" exec python3 scripts/hostile-bench.py
