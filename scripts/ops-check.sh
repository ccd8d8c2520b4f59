#!/usr/bin/env bash
# Checks what operators deploy: the /metrics page of a real server against
# `promtool check metrics` (Debian's prometheus package), the systemd unit
# with `systemd-analyze verify`, the seccomp profile's JSON, and the
# container image where a docker daemon answers. Installs promtool and
# systemd-analyze with apt-get if they are missing (as root).
# Usage: scripts/ops-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

install_missing() {
    local command=$1 package=$2
    if ! command -v "$command" >/dev/null 2>&1; then
        echo "ops-check: $command is missing; installing Debian's $package package" >&2
        if [ "$(id -u)" -ne 0 ]; then
            echo "ops-check: run as root, or install $package yourself" >&2
            exit 1
        fi
        if [ -z "${apt_updated:-}" ]; then
            apt-get update -qq
            apt_updated=1
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package" >/dev/null
    fi
}
install_missing promtool prometheus
install_missing systemd-analyze systemd
install_missing curl curl

# The test-release profile is the one the tests build, so this is warm
# after scripts/test.sh.
cargo build --profile test-release --bin ringlock --bin ringlock-cli --quiet
bin=target/test-release

work=$(mktemp -d)
server_pid=
cluster_pids=()
cleanup() {
    if [ -n "$server_pid" ]; then kill -9 "$server_pid" 2>/dev/null || true; fi
    for pid in "${cluster_pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

echo "== promtool check metrics on a real scrape"
"$bin/ringlock" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --shards 2 --no-pin \
    --data-dir "$work/data" 2>"$work/log" &
server_pid=$!
for _ in $(seq 100); do
    grep -q "serving /metrics" "$work/log" && break
    sleep 0.1
done
listen=$(sed -n 's/.*listening on \([0-9.:]*\);.*/\1/p' "$work/log" | head -1)
metrics=$(sed -n 's/.*serving \/metrics, \/livez and \/readyz on \([0-9.:]*\).*/\1/p' "$work/log" | head -1)
if [ -z "$listen" ] || [ -z "$metrics" ]; then
    echo "ops-check: the server did not start:" >&2
    cat "$work/log" >&2
    exit 1
fi
# Traffic that fills every family: grants of each kind, a timeout, an
# expiry, errors, waits and hand-offs on a hot key.
"$bin/ringlock-cli" --servers "$listen" run --key ops/hot --lease 5 -- true
token=$("$bin/ringlock-cli" --servers "$listen" acquire ops/hot --lease 0.2)
"$bin/ringlock-cli" --servers "$listen" acquire ops/hot --lease 5 --wait 0.01 >/dev/null 2>&1 || true
"$bin/ringlock-cli" --servers "$listen" acquire ops/hot --lease 5 >/dev/null
"$bin/ringlock-cli" --servers "$listen" release ops/hot "$token" >/dev/null 2>&1 || true
"$bin/ringlock-cli" --servers "$listen" inspect ops/hot >/dev/null
# Waits on keys that are awkward as label values: bytes outside UTF-8, a
# double quote, a backslash. Each must be its own valid series.
python3 - "$listen" <<'PY'
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
holder = socket.create_connection((host, int(port)))
waiter = socket.create_connection((host, int(port)))
for key in (b"ops/\xff", b"ops/\xfe", b'ops/"q\\'):
    holder.sendall(b"A " + key + b" 5 0\n")
    assert holder.recv(4096).startswith(b"A "), key
    waiter.sendall(b"A " + key + b" 5 0.01\n")
    assert waiter.recv(4096).startswith(b"T "), key
PY
# The hot keys are published every 250 ms: scrape until they show.
for _ in $(seq 100); do
    curl -fsS "http://$metrics/metrics" >"$work/metrics"
    grep -qF 'ringlock_hot_key_waits{key="ops/\"q\\\\"}' "$work/metrics" && break
    sleep 0.1
done
grep -q '^ringlock_hot_key_waits{key="ops/hot"}' "$work/metrics"
for label in 'ops/\\xff' 'ops/\\xfe' 'ops/\"q\\\\'; do
    grep -qF "ringlock_hot_key_waits{key=\"$label\"}" "$work/metrics" || {
        echo "ops-check: no hot-key series for $label" >&2
        exit 1
    }
done
promtool check metrics <"$work/metrics"
curl -fsS "http://$metrics/readyz" >/dev/null
kill -TERM "$server_pid"
wait "$server_pid"
server_pid=
echo "ok"

echo "== promtool check metrics on a two-node cluster's scrapes"
# Free loopback ports: two client ports, two peer ports, two metrics ports.
read -r -a ports <<<"$(python3 -c 'import socket
socks = [socket.socket() for _ in range(6)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')"
peers="127.0.0.1:${ports[0]}@127.0.0.1:${ports[2]},127.0.0.1:${ports[1]}@127.0.0.1:${ports[3]}"
for node in 0 1; do
    "$bin/ringlock" --listen "127.0.0.1:${ports[$node]}" --peers "$peers" --node "$node" --no-pin \
        --heartbeat-ms 50 --failover-ms 500 --metrics-listen "127.0.0.1:${ports[$((node + 4))]}" \
        --data-dir "$work/node$node" 2>"$work/node$node.log" &
    cluster_pids+=($!)
done
ready() { curl -fsS "http://127.0.0.1:${ports[$1]}/readyz" >/dev/null 2>&1; }
for _ in $(seq 200); do
    ready 4 && ready 5 && break
    sleep 0.1
done
if ! ready 4 || ! ready 5; then
    echo "ops-check: the cluster's nodes did not become ready:" >&2
    cat "$work/node0.log" "$work/node1.log" >&2
    exit 1
fi
"$bin/ringlock-cli" --servers "127.0.0.1:${ports[1]},127.0.0.1:${ports[0]}" run --key ops/cluster --lease 5 -- true
for node in 0 1; do
    curl -fsS "http://127.0.0.1:${ports[$((node + 4))]}/metrics" >"$work/node$node.metrics"
    promtool check metrics <"$work/node$node.metrics"
done
grep -q '^ringlock_role{role="active"} 1' "$work/node0.metrics"
grep -q '^ringlock_role{role="standby"} 1' "$work/node1.metrics"
grep -q '^ringlock_replication_caught_up 1' "$work/node1.metrics"
grep -q '^ringlock_table_version ' "$work/node1.metrics"
grep -q "^ringlock_replication_lag_deltas 0" "$work/node1.metrics"
for pid in "${cluster_pids[@]}"; do kill -TERM "$pid"; done
for pid in "${cluster_pids[@]}"; do wait "$pid"; done
cluster_pids=()
echo "ok"

echo "== systemd-analyze verify deploy/ringlock.service"
# verify checks that ExecStart's binary exists: a copy of the unit points
# at the binary just built, the rest of it as shipped.
sed "s|^ExecStart=/usr/local/bin/ringlock|ExecStart=$PWD/$bin/ringlock|" deploy/ringlock.service \
    >"$work/ringlock.service"
grep -q "^ExecStart=$PWD/$bin/ringlock" "$work/ringlock.service"
systemd-analyze verify "$work/ringlock.service"
echo "ok"

echo "== seccomp profile"
python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); names = {n for s in p["syscalls"] for n in s["names"]}; missing = {"io_uring_setup", "io_uring_enter", "io_uring_register"} - names; sys.exit(f"missing {missing}" if missing else 0)' \
    deploy/seccomp-ringlock.json
echo "ok"

echo "== Kubernetes manifests against the API schemas; Compose file"
# kubernetes-validate (PyPI) carries the Kubernetes JSON schemas, so this
# needs no cluster; it lives in a venv under target/, made once.
venv=target/ops-venv
if ! "$venv/bin/kubernetes-validate" --version >/dev/null 2>&1; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==1.37.0"
fi
"$venv/bin/kubernetes-validate" --strict --quiet -k 1.33.0 deploy/kubernetes/*.yaml
# The Compose file: every node named in RINGLOCK_PEERS is a service, and
# each service's RINGLOCK_NODE is its own index there.
"$venv/bin/python" - deploy/compose.yaml <<'PY'
import sys, yaml
compose = yaml.safe_load(open(sys.argv[1]))
nodes = {name: service for name, service in compose["services"].items() if "RINGLOCK_NODE" in service.get("environment", {})}
peers = next(iter(nodes.values()))["environment"]["RINGLOCK_PEERS"].split(",")
for name, service in nodes.items():
    env = service["environment"]
    assert env["RINGLOCK_PEERS"].split(",") == peers, f"{name}: another RINGLOCK_PEERS"
    assert peers[int(env["RINGLOCK_NODE"])] == f"{name}:7700", f"{name}: RINGLOCK_NODE is not its index in RINGLOCK_PEERS"
assert sorted(nodes) == sorted(peer.split(":")[0] for peer in peers), "a peer without its service"
PY
echo "ok"

echo "== container image"
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    docker build -f deploy/Dockerfile -t ringlock:ops-check .
    docker run --rm --security-opt seccomp=deploy/seccomp-ringlock.json --entrypoint ringlock ringlock:ops-check --help >/dev/null
    echo "ok"
else
    echo "skipped: no docker daemon answers here"
fi
