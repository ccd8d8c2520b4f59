#!/usr/bin/env bash
# The TLS walk-through of docs/security.md, run end to end on this host:
# certificates made with openssl, a three-node cluster on loopback with
# mutual TLS between its peers and TLS plus an auth file for its clients,
# then, under load, every certificate, CA and secret rotated with SIGHUP,
# counting the requests that failed.
#
#   scripts/tls-walkthrough.sh [SECONDS]
#
# The load runs for SECONDS (default 24) while the rotations happen:
# ringlock-bench on long-lived TLS connections to the active (its errors
# are counted), and a loop of ringlock-cli acquire and release, each call a
# new TLS connection and a new `U`, so that every handshake after a rotation
# uses the files just put in place. The rotations, in order: every node's
# peer certificate (same CA), the client port's certificate (same CA), the
# client secret (a second secret for the name, clients moved to it, the old
# one removed), the client-facing CA (both trusted, new certificate, old CA
# withdrawn), the peer CA (the same three steps), then a standby restarted
# (kill -9), whose new peer connections pass with the new CA alone. Exits
# non-zero if a
# request failed, a reload was refused, or the cluster does not end with
# one active and two standbys. Everything lives in a temporary directory,
# removed at exit: no key is kept. About 40 s.
set -euo pipefail
cd "$(dirname "$0")/.."
LOAD_SECONDS=${1:-24}
if ! command -v openssl >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "tls-walkthrough: openssl is missing; install Debian's openssl package" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssl >/dev/null
fi
nice cargo build --release --quiet -p ringlock --bin ringlock --bin ringlock-cli
nice cargo build --release --quiet -p ringlock-bench
BIN=$(realpath "${CARGO_TARGET_DIR:-target}/release")
work=$(mktemp -d /tmp/ringlock-walkthrough.XXXXXX)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    [[ -n ${KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
cd "$work"

say() { printf '== %s\n' "$*"; }

# A CA: FILE.pem and FILE.key.
make_ca() {
    openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -days 1 \
        -subj "/CN=$2" -keyout "$1.key" -out "$1.pem" 2>/dev/null
}

# A certificate for 127.0.0.1 signed by CA, usable as server and client,
# written as FILE.key then FILE.pem, each in one rename (the key first).
make_cert() {
    local ca=$1 file=$2
    openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -subj "/CN=127.0.0.1" \
        -keyout "$file.key.new" -out "$file.csr" 2>/dev/null
    openssl x509 -req -in "$file.csr" -CA "$ca.pem" -CAkey "$ca.key" -CAcreateserial -days 1 \
        -out "$file.pem.new" \
        -extfile <(printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n') 2>/dev/null
    mv "$file.key.new" "$file.key"
    mv "$file.pem.new" "$file.pem"
}

# Replaces FILE with the concatenation of the other arguments, in one rename.
bundle() {
    local file=$1
    shift
    cat "$@" > "$file.new"
    mv "$file.new" "$file"
}

new_secret() { head -c 32 /dev/urandom | base64 | tr -d '=+/'; }
digest() { printf %s "$1" | sha256sum | cut -d' ' -f1; }

reload_all() {
    for pid in "${pids[@]:0:3}"; do kill -HUP "$pid"; done
    sleep 0.5
}

say "certificates: a peer CA and one certificate per node; a client-facing CA and the client port's certificate"
make_ca peer-ca "walk-through peer CA"
for node in 0 1 2; do make_cert peer-ca "node$node"; done
cp peer-ca.pem peer-trust.pem
make_ca client-ca "walk-through client CA"
make_cert client-ca server
cp client-ca.pem client-trust.pem

say "the auth file: app (every key) and ops (every key and S)"
app_secret=$(new_secret)
ops_secret=$(new_secret)
printf 'app %s *\nops %s *,stats\n' "$(digest "$app_secret")" "$(digest "$ops_secret")" > auth
printf '%s' "$app_secret" > app.secret

read -r -a ports <<< "$(python3 -c '
import socket
socks = [socket.socket() for _ in range(6)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')"
peers="127.0.0.1:${ports[0]}@127.0.0.1:${ports[3]},127.0.0.1:${ports[1]}@127.0.0.1:${ports[4]},127.0.0.1:${ports[2]}@127.0.0.1:${ports[5]}"
servers="127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"

say "three nodes: --peers $peers"
start_node() {
    "$BIN/ringlock" --node "$1" --peers "$peers" --data-dir "data$1" --shards 1 --no-pin \
        --tls-cert server.pem --tls-key server.key --auth-file auth \
        --peer-tls-cert "node$1.pem" --peer-tls-key "node$1.key" --peer-tls-ca peer-trust.pem \
        >> "node$1.log" 2>&1 &
    pids[$1]=$!
}
for node in 0 1 2; do start_node "$node"; done

cli() {
    RINGLOCK_SECRET=$(cat app.secret) "$BIN/ringlock-cli" --servers "$servers" --tls-ca client-trust.pem \
        --connect-limit "${limit:-5}" "$@"
}

active=""
for _ in $(seq 100); do
    if roles=$(cli ping 2>/dev/null) && active=$(awk '$2 == "active" { print $1; exit }' <<< "$roles") && [[ -n $active ]]; then
        break
    fi
    sleep 0.1
done
[[ -n $active ]] || { echo "no node became active:"; tail -n 5 node*.log; exit 1; }
say "active: $active"

say "load for ${LOAD_SECONDS} s: ringlock-bench on 4 TLS connections, and ringlock-cli calls in a loop"
"$BIN/ringlock-bench" run --target ringlock --addr "${active%% *}" --tls-ca client-ca.pem \
    --secret "$app_secret" --connections 4 --depth 8 --warmup 0 --duration "$LOAD_SECONDS" > bench.out 2>&1 &
bench=$!
(
    ok=0 failed=0 n=0
    while [[ ! -e stop ]]; do
        key="walk/$((n % 8))"
        n=$((n + 1))
        if token=$(cli acquire "$key" --lease 10 --wait 5 2>> cli-errors.log) && cli release "$key" "$token" > /dev/null 2>> cli-errors.log; then
            ok=$((ok + 1))
        else
            failed=$((failed + 1))
        fi
    done
    echo "$ok $failed" > cli.counts
) &
loop=$!
sleep 3

say "rotate every node's peer certificate (same CA), SIGHUP"
for node in 0 1 2; do make_cert peer-ca "node$node"; done
reload_all
sleep 2

say "rotate the client port's certificate (same CA), SIGHUP"
make_cert client-ca server
reload_all
sleep 2

say "rotate the app secret: add the new one, SIGHUP, move the clients, remove the old one, SIGHUP"
app_secret_2=$(new_secret)
printf 'app %s *\n' "$(digest "$app_secret_2")" >> auth
reload_all
printf '%s' "$app_secret_2" > app.secret.new && mv app.secret.new app.secret
sleep 1
grep -v "$(digest "$app_secret")" auth > auth.new && mv auth.new auth
reload_all
sleep 2

say "rotate the client-facing CA: clients trust both, new server certificate, SIGHUP, old CA withdrawn"
make_ca client-ca-2 "walk-through client CA 2"
bundle client-trust.pem client-ca.pem client-ca-2.pem
sleep 1
make_cert client-ca-2 server
reload_all
sleep 1
bundle client-trust.pem client-ca-2.pem
sleep 2

say "rotate the peer CA: nodes trust both, SIGHUP, new node certificates, SIGHUP, old CA withdrawn, SIGHUP"
make_ca peer-ca-2 "walk-through peer CA 2"
bundle peer-trust.pem peer-ca.pem peer-ca-2.pem
reload_all
for node in 0 1 2; do make_cert peer-ca-2 "node$node"; done
reload_all
bundle peer-trust.pem peer-ca-2.pem
reload_all

say "restart a standby (kill -9): its new peer connections must pass with the new CA alone"
standby=0
while [[ "127.0.0.1:${ports[$standby]}" == "${active%% *}" ]]; do standby=$((standby + 1)); done
kill -9 "${pids[$standby]}"
wait "${pids[$standby]}" 2>/dev/null || true
start_node "$standby"
rejoined=no
for _ in $(seq 150); do
    seen=$(limit=1 cli ping 2>/dev/null || true)
    if grep -q "^127.0.0.1:${ports[$standby]} standby" <<< "$seen"; then
        rejoined=yes
        break
    fi
    sleep 0.2
done

wait "$bench" || true
touch stop
wait "$loop"
read -r cli_ok cli_failed < cli.counts

say "after the rotations"
roles=$(cli ping)
echo "$roles"
bench_line=$(grep -E "error" bench.out | head -n 3 || true)
failed_reloads=$( (grep -c "stay" node*.log || true) | awk -F: '{ sum += $2 } END { print sum + 0 }')
old_ca_refused=no
if ! RINGLOCK_SECRET=$(cat app.secret) "$BIN/ringlock-cli" --servers "$servers" --tls-ca client-ca.pem \
    --connect-limit 2 ping > /dev/null 2>&1; then
    old_ca_refused=yes
fi
old_secret_refused=no
if ! RINGLOCK_SECRET=$app_secret "$BIN/ringlock-cli" --servers "$servers" --tls-ca client-trust.pem \
    --connect-limit 2 acquire walk/old --lease 1 --wait 1 > /dev/null 2>&1; then
    old_secret_refused=yes
fi
bench_errors=$(python3 - bench.out <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
found = re.findall(r"errors: (none|\d+)", text) + re.findall(r"timeouts: (none|\d+)", text)
print(sum(0 if n == "none" else int(n) for n in found) if found else "unknown")
EOF
)
echo
echo "| check | result |"
echo "|---|---|"
echo "| ringlock-cli acquire+release cycles ok / failed | $cli_ok / $cli_failed |"
echo "| ringlock-bench errors and timeouts | $bench_errors |"
echo "| reloads refused (\"... stay\" in the logs) | $failed_reloads |"
echo "| a client that trusts only the old client CA is refused | $old_ca_refused |"
echo "| the removed secret is refused | $old_secret_refused |"
echo "| the restarted standby rejoined over the new peer CA | $rejoined |"
echo "| roles | $(awk '{ print $2 }' <<< "$roles" | sort | uniq -c | tr -s ' ' | tr '\n' ';') |"
echo
grep -E "requests/s|ops/s|errors:" bench.out | head -n 3
status=0
[[ $cli_failed == 0 && $cli_ok -gt 0 ]] || { echo "ringlock-cli calls failed:"; tail -n 5 cli-errors.log; status=1; }
[[ $bench_errors == 0 ]] || { echo "ringlock-bench saw errors: $bench_line"; status=1; }
[[ $failed_reloads == 0 ]] || { echo "a reload was refused:"; grep -h "stay" node*.log | head -n 5; status=1; }
[[ $old_ca_refused == yes && $old_secret_refused == yes && $rejoined == yes ]] || status=1
[[ $(grep -c " active" <<< "$roles") == 1 && $(grep -c " standby" <<< "$roles") == 2 ]] || { echo "roles: $roles"; status=1; }
exit "$status"
