#!/usr/bin/env bash
# Runs the Python client's tests against the real server and ringlock-testkit.
#
#   clients/python/test.sh [pytest arguments...]
#
# Builds both binaries if they are missing or older than their sources
# (cargo decides), unless RINGLOCK_BIN and RINGLOCK_TESTKIT_BIN name them;
# makes a venv in clients/python/.venv (or $RINGLOCK_PY_VENV), installs the
# package with its test extras, and runs pytest; exits non-zero on any
# failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${RINGLOCK_PY_VENV:-$here/.venv}"
python="${PYTHON:-python3}"

# The caller may name binaries it built already (scripts/test.sh passes its
# test builds); otherwise the release builds are made or brought up to date.
if [[ -z "${RINGLOCK_BIN:-}" || -z "${RINGLOCK_TESTKIT_BIN:-}" ]]; then
    (cd "$root" && cargo build --release --quiet -p ringlock -p ringlock-testkit)
    export RINGLOCK_BIN="$root/target/release/ringlock"
    export RINGLOCK_TESTKIT_BIN="$root/target/release/ringlock-testkit"
fi

if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$here[test]"

cd "$here"
exec "$venv/bin/python" -m pytest -p no:cacheprovider "$@"
