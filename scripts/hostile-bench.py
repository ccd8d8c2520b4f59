#!/usr/bin/env python3
"""What hostile clients cost a bystander: run by scripts/hostile-bench.sh.

Starts one ringlock node with TLS (certificates made here with openssl in a
temporary directory, removed at exit) and an auth file, then measures a
bystander, one TLS connection from 127.0.0.2 that takes and releases a lock
in a loop, while each attack runs from 127.0.0.1:

  idle              nothing
  slowloris         SLOWLORIS connections sending a ClientHello a byte at a
                    time, each a byte every ~second
  garbage           connections sending 4 KiB of random bytes, in a loop
  half-handshakes   HALF connections that send half a ClientHello and stop
  bad-u-flood       new TLS connections in a loop, each sending a wrong `U`
  p-flood           the same shape with `P` instead (the yardstick)
  big-hellos        connections sending a ClientHello of 10 000 extensions
  long-u-lines      TLS connections sending a `U` line of 1 MiB
  slow-readers      authenticated clients that send `S` and never read
  key-fill          authenticated clients taking new keys with long leases

For each it prints the bystander's p50/p99 of acquire and release round
trips, their ratio to idle, and the server's RSS before, during and after.
Python measures the bystander, so absolute figures include the
interpreter's overhead; the ratios to idle are the point.
"""

import hashlib
import multiprocessing
import os
import random
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

BIN = os.environ["BIN"]
DURATION = float(os.environ.get("DURATION", "5"))
SLOWLORIS = int(os.environ.get("SLOWLORIS", "10000"))
HALF = int(os.environ.get("HALF", "10000"))
FLOOD_THREADS = int(os.environ.get("FLOOD_THREADS", "4"))
SLOW_READERS = int(os.environ.get("SLOW_READERS", "2000"))
FILL_PROCESSES = int(os.environ.get("FILL_PROCESSES", "2"))
HANDSHAKE_MS = int(os.environ.get("HANDSHAKE_MS", "10000"))
ATTACKS = os.environ.get("ATTACKS", "")
SERVER_FLAGS = os.environ.get("SERVER_FLAGS", "").split()
SETTLE = float(os.environ.get("SETTLE", "2"))
# SERVER_CPU pins the server to that CPU and this script (the bystander and
# every attacker) to the others, as when the attackers are other hosts and
# the server has its own core; ATTACK_NICE lowers the attackers' processes
# (the key fill) below the bystander on the CPUs they share.
SERVER_CPU = os.environ.get("SERVER_CPU", "")
ATTACK_NICE = int(os.environ.get("ATTACK_NICE", "0"))
# BYSTANDER_RT runs the bystander's thread at real-time priority (SCHED_FIFO
# 1; needs root), so that on the CPU it shares with the attackers it is
# woken as soon as its reply comes, as on a host of its own. The attackers'
# processes stay at normal priority.
BYSTANDER_RT = os.environ.get("BYSTANDER_RT", "") not in ("", "0")
SECRET = "bystander-" + os.urandom(8).hex()


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(work):
    """A CA and a server certificate for localhost and 127.0.0.1."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
            "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=hostile-bench CA", cwd=work)
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "server.key",
            "-out", "server.csr", "-subj", "/CN=localhost", cwd=work)
    with open(os.path.join(work, "ext"), "w") as ext:
        ext.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
            "server.pem", "-days", "1", "-extfile", "ext", cwd=work)


def start_server(work):
    with open(os.path.join(work, "auth"), "w") as auth:
        auth.write(f"bystander {hashlib.sha256(SECRET.encode()).hexdigest()} *\n")
    log = open(os.path.join(work, "server.log"), "w")
    pin = ["taskset", "-c", SERVER_CPU] if SERVER_CPU else []
    server = subprocess.Popen(
        [*pin, f"{BIN}/ringlock", "--listen", "127.0.0.1:0", "--data-dir", os.path.join(work, "data"),
         "--tls-cert", os.path.join(work, "server.pem"), "--tls-key", os.path.join(work, "server.key"),
         "--auth-file", os.path.join(work, "auth"), "--metrics-listen", "127.0.0.1:0",
         "--max-connections", "30000", "--max-connections-per-ip", "0", "--handshake-ms", str(HANDSHAKE_MS), *SERVER_FLAGS],
        stderr=log, stdout=subprocess.DEVNULL)
    for _ in range(400):
        text = open(os.path.join(work, "server.log")).read()
        listening = re.search(r"listening on ([0-9.]+):(\d+)", text)
        metrics = re.search(r"serving /metrics, /livez and /readyz on ([0-9.]+):(\d+)", text)
        if listening and metrics:
            return server, (listening.group(1), int(listening.group(2))), (metrics.group(1), int(metrics.group(2)))
        if server.poll() is not None:
            sys.exit("the server did not start:\n" + text)
        time.sleep(0.05)
    sys.exit("the server did not start")


def rss(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def samples(address, name):
    """The values of every series of metric `name`."""
    with socket.create_connection(address) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        body = b""
        while chunk := conn.recv(65536):
            body += chunk
    return [float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
            if line.startswith(name + " ") or line.startswith(name + "{")]


def metric(address, name):
    """The sum of every series of metric `name`."""
    return sum(samples(address, name))


def client_context(work):
    context = ssl.create_default_context(cafile=os.path.join(work, "ca.pem"))
    return context


def client_hello(context):
    """The first flight of a real TLS client, without a socket."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def connect_from(source, address):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.connect(address)
    return sock


class Bystander:
    """One TLS connection from 127.0.0.2: acquire, release, timed."""

    def __init__(self, context, address):
        raw = connect_from("127.0.0.2", address)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conn = context.wrap_socket(raw, server_hostname="localhost")
        self.buffer = b""
        reply = self.call(f"U {SECRET}")
        assert reply == "U bystander", reply

    def call(self, line):
        self.conn.sendall(line.encode() + b"\n")
        while b"\n" not in self.buffer:
            chunk = self.conn.recv(4096)
            if not chunk:
                raise ConnectionError("the server closed the bystander")
            self.buffer += chunk
        reply, self.buffer = self.buffer.split(b"\n", 1)
        return reply.decode()

    def measure(self, seconds):
        """Cycles for `seconds`, at real-time priority with BYSTANDER_RT
        (only this thread, and only while measuring: threads and processes
        started before keep theirs)."""
        if BYSTANDER_RT:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        try:
            return self.cycles(seconds)
        finally:
            if BYSTANDER_RT:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))

    def cycles(self, seconds):
        acquires, releases = [], []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            reply = self.call("A bystander/k 30 0")
            acquired = time.perf_counter()
            token = reply.split(" ")[2]
            assert reply.startswith("A bystander/k "), reply
            reply = self.call(f"R bystander/k {token}")
            released = time.perf_counter()
            assert reply == "R bystander/k", reply
            acquires.append(acquired - started)
            releases.append(released - acquired)
        return acquires, releases


def noise():
    """The host's load average and CPU pressure, to say how busy it was."""
    load = open("/proc/loadavg").read().split()[:3]
    try:
        pressure = open("/proc/pressure/cpu").readline().split()[1:3]
    except OSError:
        pressure = ["n/a"]
    return f"load average {' '.join(load)}, CPU pressure {' '.join(pressure)}"


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class Attack:
    """An attack in threads of its own until stopped."""

    def __init__(self):
        self.stopping = threading.Event()
        self.threads = []
        self.sockets = []

    def spawn(self, target, *args):
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)

    def stop(self):
        """Stops sending; the connections stay open for the server to close."""
        self.stopping.set()
        for thread in self.threads:
            thread.join()

    def close(self):
        for sock in self.sockets:
            sock.close()


def slowloris(attack, address, hello, count):
    def run():
        for _ in range(count):
            if attack.stopping.is_set():
                return
            try:
                attack.sockets.append(socket.create_connection(address))
            except OSError:
                break
        sent = 0
        while not attack.stopping.is_set() and sent < len(hello):
            started = time.monotonic()
            for sock in attack.sockets:
                try:
                    sock.send(hello[sent:sent + 1])
                except OSError:
                    pass
            sent += 1
            attack.stopping.wait(max(0.0, 1.0 - (time.monotonic() - started)))
    attack.spawn(run)


def garbage(attack, address):
    def run():
        noise = random.Random(7)
        while not attack.stopping.is_set():
            try:
                with socket.create_connection(address) as sock:
                    sock.sendall(bytes(noise.getrandbits(8) for _ in range(4096)))
                    sock.settimeout(2)
                    while sock.recv(4096):
                        pass
            except OSError:
                pass
    attack.spawn(run)


def half_handshakes(attack, address, hello, count):
    def run():
        for _ in range(count):
            if attack.stopping.is_set():
                return
            try:
                sock = socket.create_connection(address)
                sock.send(hello[: len(hello) // 2])
                attack.sockets.append(sock)
            except OSError:
                break
    attack.spawn(run)


def flood(attack, address, context, line, threads):
    def run():
        while not attack.stopping.is_set():
            try:
                with socket.create_connection(address, timeout=15) as raw:
                    with context.wrap_socket(raw, server_hostname="localhost") as conn:
                        conn.sendall(line)
                        conn.recv(4096)
            except (OSError, ssl.SSLError):
                pass
    for _ in range(threads):
        attack.spawn(run)


def slow_readers(attack, address, context, count):
    """Authenticated clients that send `S` as fast as their sockets take it
    and never read a reply."""
    def run():
        for _ in range(count):
            if attack.stopping.is_set():
                return
            try:
                conn = context.wrap_socket(socket.create_connection(address), server_hostname="localhost")
                conn.sendall(f"U {SECRET}\n".encode())
                conn.setblocking(False)
                attack.sockets.append(conn)
            except (OSError, ssl.SSLError):
                break
        batch = b"S\n" * 2000
        while not attack.stopping.is_set():
            for conn in list(attack.sockets):
                try:
                    conn.send(batch)
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                    pass
                except (OSError, ssl.SSLError):
                    pass
            attack.stopping.wait(0.05)
    attack.spawn(run)


def big_hellos(attack, address, threads):
    """Connections that each send a hand-built ClientHello of 10 000 empty
    extensions (split into records of 16 KiB) and wait for the server to
    close them, in a loop."""
    body = b"\x03\x03" + b"\x5a" * 32 + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    extensions = b"".join((0x4000 + index).to_bytes(2, "big") + b"\x00\x00" for index in range(10_000))
    body += len(extensions).to_bytes(2, "big") + extensions
    handshake = b"\x01" + len(body).to_bytes(3, "big") + body
    hello = b"".join(b"\x16\x03\x01" + len(chunk).to_bytes(2, "big") + chunk
                     for chunk in (handshake[i:i + 16384] for i in range(0, len(handshake), 16384)))

    def run():
        while not attack.stopping.is_set():
            try:
                with socket.create_connection(address, timeout=15) as conn:
                    conn.sendall(hello)
                    while conn.recv(4096):
                        pass
            except OSError:
                pass
    for _ in range(threads):
        attack.spawn(run)


def long_u_lines(attack, address, context, threads):
    """TLS connections that each send a `U` line of 1 MiB, in a loop (each
    is answered `line-too-long` and closed)."""
    line = b"U " + b"x" * (1 << 20) + b"\n"

    def run():
        while not attack.stopping.is_set():
            try:
                with socket.create_connection(address, timeout=15) as raw:
                    with context.wrap_socket(raw, server_hostname="localhost") as conn:
                        try:
                            conn.sendall(line)
                        except (OSError, ssl.SSLError):
                            pass
                        while conn.recv(4096):
                            pass
            except (OSError, ssl.SSLError):
                pass
    for _ in range(threads):
        attack.spawn(run)


def key_fill(attack, address, context, processes, totals):
    """Authenticated clients that take new 200-byte keys with 24-hour leases
    as fast as the server grants them, pipelined 1000 at a time (they read
    their replies). Each runs in a process of its own, so that the
    bystander's thread never waits for this interpreter's lock behind them.
    `totals` counts grants and refusals."""
    stopping = multiprocessing.Event()
    counts = multiprocessing.Array("q", 2)

    def run(index):
        if ATTACK_NICE:
            os.nice(ATTACK_NICE)
        try:
            raw = socket.create_connection(address)
            conn = context.wrap_socket(raw, server_hostname="localhost")
            conn.sendall(f"U {SECRET}\n".encode())
            buffer = b""
            while b"\n" not in buffer:
                buffer += conn.recv(4096)
            buffer = buffer.split(b"\n", 1)[1]
        except (OSError, ssl.SSLError):
            return
        sequence = 0
        while not stopping.is_set():
            lines = []
            for _ in range(1000):
                lines.append(f"A fill/{index}/{sequence:0190d} 86400 1\n")
                sequence += 1
            try:
                conn.sendall("".join(lines).encode())
                answered = granted = 0
                while answered < 1000:
                    chunk = conn.recv(1 << 16)
                    if not chunk:
                        return
                    buffer += chunk
                    *replies, buffer = buffer.split(b"\n")
                    answered += len(replies)
                    granted += sum(1 for reply in replies if reply.startswith(b"A "))
                with counts.get_lock():
                    counts[0] += granted
                    counts[1] += answered - granted
            except (OSError, ssl.SSLError):
                return
        conn.close()

    def supervise():
        workers = [multiprocessing.Process(target=run, args=(index,), daemon=True) for index in range(processes)]
        for worker in workers:
            worker.start()
        attack.stopping.wait()
        stopping.set()
        for worker in workers:
            worker.join(timeout=10)
        totals["granted"], totals["refused"] = counts[0], counts[1]
    attack.spawn(supervise)


def main():
    if SERVER_CPU:
        others = set(range(os.cpu_count())) - {int(SERVER_CPU)}
        os.sched_setaffinity(0, others or {int(SERVER_CPU)})
    work = tempfile.mkdtemp(prefix="ringlock-hostile-")
    server = None
    try:
        make_certificates(work)
        server, address, metrics = start_server(work)
        context = client_context(work)
        hello = client_hello(context)
        bystander = Bystander(context, address)
        bystander.measure(1.0)  # warm up
        fill = {"granted": 0, "refused": 0}
        attacks = [
            ("idle", lambda attack: None),
            (f"slowloris ({SLOWLORIS})", lambda attack: slowloris(attack, address, hello, SLOWLORIS)),
            ("garbage", lambda attack: garbage(attack, address)),
            (f"half-handshakes ({HALF})", lambda attack: half_handshakes(attack, address, hello, HALF)),
            ("bad-u-flood", lambda attack: flood(attack, address, context, b"U wrong-secret\n", FLOOD_THREADS)),
            ("p-flood", lambda attack: flood(attack, address, context, b"P\n", FLOOD_THREADS)),
            ("big-hellos", lambda attack: big_hellos(attack, address, FLOOD_THREADS)),
            ("long-u-lines", lambda attack: long_u_lines(attack, address, context, FLOOD_THREADS)),
            (f"slow-readers ({SLOW_READERS})", lambda attack: slow_readers(attack, address, context, SLOW_READERS)),
            # Last: the keys it takes stay held for the rest of the run.
            (f"key-fill ({FILL_PROCESSES})", lambda attack: key_fill(attack, address, context, FILL_PROCESSES, fill)),
        ]
        if ATTACKS:
            wanted = ["idle", *ATTACKS.split(",")]
            attacks = [(name, start) for name, start in attacks if name.split(" ")[0] in wanted]
        rows = []
        idle = None
        noise_before = noise()
        for name, start in attacks:
            before = rss(server.pid)
            attack = Attack()
            start(attack)
            # Let a connecting attack reach its size before measuring.
            time.sleep(SETTLE if name != "idle" else 0.0)
            acquires, releases = bystander.measure(DURATION)
            during = rss(server.pid)
            pacing = (samples(metrics, "ringlock_turn_share"), samples(metrics, "ringlock_request_cost_seconds"))
            attack.stop()
            # Wait until the server has closed every attacking connection
            # (--handshake-ms closes the slow and half handshakes), then read
            # the memory left.
            deadline = time.monotonic() + HANDSHAKE_MS / 1000 + 10
            while metric(metrics, "ringlock_connections") > 1 and time.monotonic() < deadline:
                time.sleep(0.2)
            after = rss(server.pid)
            attack.close()
            figures = {
                "a50": percentile(acquires, 0.5), "a99": percentile(acquires, 0.99),
                "r50": percentile(releases, 0.5), "r99": percentile(releases, 0.99),
                "n": len(acquires), "before": before, "during": during, "after": after, "pacing": pacing,
            }
            if idle is None:
                idle = figures
            rows.append((name, figures))
            print(f"{name}: {figures}", file=sys.stderr, flush=True)
        print("| attack | bystander cycles | acquire p50 / p99 (µs) | release p50 / p99 (µs) | "
              "p99 ratio to idle (acquire, release) | RSS before / during / after (MiB) |")
        print("|---|---:|---|---|---|---|")
        for name, f in rows:
            print(f"| {name} | {f['n']} | {f['a50'] * 1e6:.0f} / {f['a99'] * 1e6:.0f} | "
                  f"{f['r50'] * 1e6:.0f} / {f['r99'] * 1e6:.0f} | "
                  f"{f['a99'] / idle['a99']:.2f}, {f['r99'] / idle['r99']:.2f} | "
                  f"{f['before'] / 2**20:.1f} / {f['during'] / 2**20:.1f} / {f['after'] / 2**20:.1f} |")
        print()
        print(f"- host before: {noise_before}; after: {noise()}; {os.cpu_count()} CPUs")
        print(f"- bystander p99 idle: acquire {idle['a99'] * 1e6:.0f} µs, release {idle['r99'] * 1e6:.0f} µs")
        if fill["granted"] or fill["refused"]:
            grown = dict(rows)[next(name for name, _ in rows if name.startswith("key-fill"))]
            grown = grown["during"] - grown["before"]
            shares, costs = dict(rows)[next(name for name, _ in rows if name.startswith("key-fill"))]["pacing"]
            per_core = ", ".join(f"{share:.0f} requests at {cost * 1e9:.0f} ns" for share, cost in zip(shares, costs))
            print(f"- key-fill: {fill['granted']} keys granted, {fill['refused']} refused; "
                  f"{grown / max(1, fill['granted']):.0f} bytes of RSS per key granted; a connection's share "
                  f"of a turn at its end, per shard core: {per_core}")
        for name in ["ringlock_tls_handshake_timeouts_total", "ringlock_tls_errors_total",
                     "ringlock_auth_failures_total", "ringlock_auth_slowed_refusals_total"]:
            print(f"- `{name}` {metric(metrics, name):.0f}")
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
