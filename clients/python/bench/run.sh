#!/usr/bin/env bash
# Runs bench.py in a venv with redis-py, after building the server and
# installing redis-server (Debian's package) if it is missing.
#
#   clients/python/bench/run.sh [--seconds 3] [--rounds 1]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
package="$(cd "$here/.." && pwd)"
root="$(cd "$package/../.." && pwd)"
venv="${RINGLOCK_PY_VENV:-$package/.venv}"

if ! command -v redis-server >/dev/null; then
    apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
fi
(cd "$root" && cargo build --release --quiet -p ringlock)
if [[ ! -x "$venv/bin/python" ]]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$package[bench]"
exec "$venv/bin/python" "$here/bench.py" "$@"
