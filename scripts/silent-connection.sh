#!/usr/bin/env bash
# How long each official client takes to end an acquire with a wait of 1 s
# when its node goes silent: a host that lost power or a partition, played
# by ringlock-testkit's black hole (the proxy accepts and reads, answers
# nothing, and neither closes nor resets). docs/protocol.md §4 says each
# client ends it within its wait plus suspect_after + ping_timeout (1 s
# each by default) and a tick, with its "no connection" error.
#
# For each client (Rust blocking API, Python sync, Go, Node.js), in turn:
# a fresh proxy to one server; the client connects through it with its
# default settings and pings; the proxy is black-holed; the client's
# acquire is timed from the call to its return; the black hole is lifted.
# Prints one line per client: name, seconds, outcome.
#
# Usage: scripts/silent-connection.sh
#   Needs Python 3; Node.js 20 with the client built (cd clients/node &&
#   npm ci && npx tsc -p .); the Go toolchain that clients/go/test.sh
#   installs in clients/go/.toolchain. A client whose toolchain is missing
#   is skipped, with a note. Environment: CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
cargo build --release --quiet -p ringlock --bin ringlock -p ringlock-testkit --bin ringlock-testkit \
    -p ringlock-client --example silent_acquire
BIN="${CARGO_TARGET_DIR:-target}/release"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ringlock-silent.XXXXXX")"
source scripts/server-lib.sh
server_start 0 "$WORK"

# The test kit runs until its standard input closes: the script holds it
# open on fd 3, so the kit ends with the script.
mkfifo "$WORK/kit-in"
"$BIN/ringlock-testkit" <"$WORK/kit-in" >"$WORK/kit-out" 2>"$WORK/kit-err" &
KIT_PID=$!
exec 3>"$WORK/kit-in"
cleanup() {
    exec 3>&- 4>&-
    wait "$KIT_PID" 2>/dev/null || true
    server_cleanup
}
trap cleanup EXIT
CONTROL=""
for _ in $(seq 1 100); do
    CONTROL="$(awk '/^ringlock-testkit control/ {print $3}' "$WORK/kit-out")"
    [[ -n "$CONTROL" ]] && break
    sleep 0.05
done
[[ -n "$CONTROL" ]] || { echo "silent-connection.sh: the test kit did not start" >&2; exit 1; }
exec 4<>"/dev/tcp/${CONTROL%:*}/${CONTROL##*:}"
# Sends one control command; prints the fields of its `ok` reply.
kit() {
    local reply
    echo "$*" >&4
    read -r reply <&4
    [[ "$reply" == ok* ]] || { echo "silent-connection.sh: $*: $reply" >&2; exit 1; }
    echo "${reply#ok }"
}

# The other clients' programs: connect to $1, ping, print "ready", wait
# for a line on stdin, time the acquire, print "<seconds> <outcome>".
cat >"$WORK/silent.py" <<'PY'
import sys, time
import ringlock
client = ringlock.Client(sys.argv[1])
client.ping()
print("ready", flush=True)
sys.stdin.readline()
started = time.monotonic()
try:
    how = "granted" if client.lock("silent/py", lease=10, wait=1).acquire() else "timed out"
except ringlock.RinglockError as error:
    how = type(error).__name__
print(f"{time.monotonic() - started:.2f} {how}", flush=True)
client.close()
PY
cat >"$WORK/silent.mjs" <<'JS'
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";
const { Client } = await import(pathToFileURL(process.argv[2]).href);
const client = new Client(process.argv[3]);
await client.ping();
console.log("ready");
const lines = createInterface({ input: process.stdin });
await new Promise((resolve) => lines.once("line", resolve));
const started = performance.now();
let how;
try {
  await client.acquire("silent/node", { lease: 10, wait: 1 });
  how = "granted";
} catch (error) {
  how = error.constructor.name;
}
console.log(`${((performance.now() - started) / 1000).toFixed(2)} ${how}`);
lines.close();
await client.close();
JS
mkdir -p "$WORK/go"
cat >"$WORK/go/main.go" <<'GO'
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"ringlock.dev/ringlock"
)

func main() {
	ctx := context.Background()
	client, err := ringlock.Dial(ctx, []string{os.Args[1]})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	if _, err := client.Ping(ctx); err != nil {
		panic(err)
	}
	fmt.Println("ready")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	started := time.Now()
	_, err = client.Acquire(ctx, "silent/go", 10*time.Second, time.Second)
	how := "granted"
	switch {
	case errors.Is(err, ringlock.ErrNoConnection):
		how = "ErrNoConnection"
	case errors.Is(err, ringlock.ErrTimeout):
		how = "ErrTimeout"
	case err != nil:
		how = err.Error()
	}
	fmt.Printf("%.2f %s\n", time.Since(started).Seconds(), how)
}
GO

# Runs one client program (the rest of the arguments) against a fresh
# black-holed proxy and prints "<name> <seconds> <outcome>".
measure() {
    local name=$1 proxy address ready result
    shift
    read -r proxy address <<<"$(kit proxy "$ADDR")"
    coproc CLIENT { "$@" "$address"; }
    read -r ready <&"${CLIENT[0]}" || true
    [[ "$ready" == ready ]] || { echo "silent-connection.sh: $name did not start" >&2; exit 1; }
    kit blackhole "$proxy" on >/dev/null
    echo go >&"${CLIENT[1]}"
    read -r result <&"${CLIENT[0]}"
    kit blackhole "$proxy" off >/dev/null
    wait "$CLIENT_PID" || true
    kit close "$proxy" >/dev/null
    echo "$name $result"
}

measure rust "$BIN/examples/silent_acquire"
PYTHONPATH="$ROOT/clients/python/src" measure python python3 "$WORK/silent.py"
GO="$ROOT/clients/go/.toolchain/go/bin/go"
if [[ -x "$GO" ]]; then
    (
        cd "$WORK/go"
        export GOTOOLCHAIN=local GOPROXY=off GOFLAGS=-mod=mod
        export GOCACHE="$ROOT/clients/go/.toolchain/cache" GOPATH="$ROOT/clients/go/.toolchain/gopath"
        "$GO" mod init example.com/silent >/dev/null 2>&1
        "$GO" mod edit -require=ringlock.dev/ringlock@v0.0.0 -replace=ringlock.dev/ringlock="$ROOT/clients/go"
        "$GO" build -o silent .
    )
    measure go "$WORK/go/silent"
else
    echo "go skipped: no toolchain in clients/go/.toolchain (clients/go/test.sh installs it)"
fi
if [[ -f "$ROOT/clients/node/dist/index.js" ]] && command -v node >/dev/null; then
    measure node node "$WORK/silent.mjs" "$ROOT/clients/node/dist/index.js"
else
    echo "node skipped: build clients/node first (npm ci && npx tsc -p .)"
fi
