#!/usr/bin/env python3
"""Clients that ask and never read, against a running server: opens
CONNECTIONS connections from this host that each send LINE ("S" by
default) as fast as their sockets take it, for SECONDS, without reading a
reply; prints the server's RSS before, during and after they close, and a
bystander's round trip for `P` during the flood.

    scripts/slow-readers.py PORT SERVER_PID [CONNECTIONS=1000] [LINE=S] [SECONDS=8]

Run the server on one core and this on the other (taskset), with `ulimit -n`
above CONNECTIONS. docs/operations.md ("Slow readers") has its figures.
"""
import socket
import sys
import time


def rss_mib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return -1


def main() -> None:
    port, pid = int(sys.argv[1]), int(sys.argv[2])
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    line = (sys.argv[4] if len(sys.argv) > 4 else "S").encode() + b"\n"
    seconds = float(sys.argv[5]) if len(sys.argv) > 5 else 8.0
    address = ("127.0.0.1", port)
    before = rss_mib(pid)
    readers = []
    for _ in range(count):
        conn = socket.create_connection(address)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.setblocking(False)
        readers.append(conn)
    batch = line * (8000 // len(line))
    end = time.time() + seconds
    while time.time() < end:
        for conn in readers:
            try:
                conn.send(batch)
            except OSError:
                pass
    during = rss_mib(pid)
    bystander = socket.create_connection(address)
    started = time.time()
    bystander.sendall(b"P\n")
    bystander.recv(100)
    round_trip_ms = (time.time() - started) * 1000
    for conn in readers:
        conn.close()
    time.sleep(3)
    after = rss_mib(pid)
    print(f"{count} readers of {line.strip().decode()!r}: RSS before {before} MiB, during {during} MiB, "
          f"after {after} MiB; a bystander's P during the flood: {round_trip_ms:.1f} ms")


if __name__ == "__main__":
    main()
