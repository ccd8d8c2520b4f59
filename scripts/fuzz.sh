#!/usr/bin/env bash
# Runs every cargo-fuzz target for the given number of seconds each (default 60).
# cargo-fuzz needs a nightly toolchain; without one this says so and stops.
# Usage: scripts/fuzz.sh [seconds per target]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz.sh: no nightly toolchain here (cargo-fuzz needs one); skipping the fuzz run" >&2
    exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz from crates.io" >&2
    cargo install cargo-fuzz --locked
fi
cd fuzz
for target in $(cargo +nightly fuzz list); do
    echo "fuzz.sh: $target for ${seconds}s"
    mkdir -p "corpus/$target"
    cargo +nightly fuzz run "$target" "corpus/$target" "seeds/$target" -- -max_total_time="$seconds" -rss_limit_mb=2048 2>&1 | tail -n 4
done
