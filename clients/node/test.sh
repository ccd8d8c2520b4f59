#!/usr/bin/env bash
# Builds what the Node client's tests need and runs them: npm ci from the
# committed lockfile, tsc, then `node --test` against the real server and
# ringlock-testkit.
#
# Installs Debian's nodejs and npm if `node` is missing, and builds the
# server and the test kit with cargo (release mode, into the workspace's
# target/ or $CARGO_TARGET_DIR) unless RINGLOCK_BIN and RINGLOCK_TESTKIT_BIN
# both name binaries built elsewhere. Extra arguments go to `node --test`,
# e.g. clients/node/test.sh --test-name-pattern=release-retried
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "test.sh: installing nodejs and npm" >&2
    SUDO=""
    [[ "$(id -u)" == 0 ]] || SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq nodejs npm
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if (( major < 20 )); then
    echo "test.sh: Node $major is too old, the client needs Node 20 or later" >&2
    exit 1
fi

if [[ -z "${RINGLOCK_BIN:-}" || -z "${RINGLOCK_TESTKIT_BIN:-}" ]]; then
    (cd "$ROOT" && cargo build --release --quiet -p ringlock -p ringlock-testkit)
fi
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"
export RINGLOCK_BIN="${RINGLOCK_BIN:-$BIN/ringlock}"
export RINGLOCK_TESTKIT_BIN="${RINGLOCK_TESTKIT_BIN:-$BIN/ringlock-testkit}"

cd "$HERE"
npm ci --no-audit --no-fund --loglevel=error
npx tsc -p .
# One file at a time: the scenario tests start servers and kill them, and
# their timings are easier on a loaded host without another file beside.
node --test --test-concurrency=1 "$@" test/*.test.mjs
