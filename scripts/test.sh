#!/usr/bin/env bash
# Runs every test of the workspace: unit, model and property tests, the
# black-box tests against the real server, and the doc examples; then the
# Python and Go clients' tests (clients/python/test.sh, clients/go/test.sh).
# Usage: scripts/test.sh [extra nextest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo nextest --version >/dev/null 2>&1; then
    echo "test.sh: cargo-nextest is missing; installing it from crates.io" >&2
    cargo install cargo-nextest --locked
fi

# The tests of vanished client hosts make network namespaces with `ip`
# (iproute2); as root they must run, so install it if it is missing.
if [ "$(id -u)" -eq 0 ] && ! command -v ip >/dev/null 2>&1; then
    echo "test.sh: ip is missing; installing Debian's iproute2 package" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 >/dev/null
fi

# One optimised build with debug assertions on serves every test; the
# black-box tests start the server binary that cargo builds for them.
cargo nextest run --workspace --lib --bins --tests --cargo-profile test-release "$@"
cargo test --workspace --doc --profile test-release --quiet

# The official clients of other languages, against the binaries built above
# (debug assertions on), each through its own test script.
cargo build --profile test-release --quiet -p ringlock -p ringlock-testkit
export RINGLOCK_BIN="$PWD/target/test-release/ringlock"
export RINGLOCK_TESTKIT_BIN="$PWD/target/test-release/ringlock-testkit"
clients/python/test.sh -q
clients/go/test.sh
clients/node/test.sh
