"""Lock cycles/s of the ringlock Python client in plain TCP and over TLS,
side by side on one server each, in one run on one machine.

One cycle is an acquire and its acknowledged release of a key no one else
holds. Three loads, each ``--seconds`` long after a short warm-up, each
measured in plain TCP and then over TLS, ``--rounds`` times alternated
(medians are kept):

- the sync client, one thread;
- the sync client, 64 threads (their requests pipelined over its two
  connections: the batches the TLS layer seals together);
- the asyncio client, 64 tasks.

The script makes certificates with ``ringlock-testkit certs`` and starts
two ``ringlock`` servers (``--shards 1 --no-pin``), one of them with
``--tls-cert``, on free loopback ports; it stops both.

    python clients/python/bench/tls.py --seconds 3 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ringlock
import ringlock.aio

ROOT = Path(__file__).resolve().parents[3]
THREADS = 64
TASKS = 64
WARMUP_S = 0.5


@contextmanager
def ringlock_server(binary: Path, *args: str) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="ringlock-bench-") as data:
        command = [str(binary), "--listen", "127.0.0.1:0", "--shards", "1", "--no-pin", "--data-dir", data, *args]
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            assert process.stderr is not None
            for raw in process.stderr:
                found = re.search(r"listening on (\S+?);?\s", raw.decode(errors="replace"))
                if found:
                    break
            else:
                raise RuntimeError("ringlock exited before listening")
            process.stderr.close()
            yield found.group(1).rstrip(";")
        finally:
            process.kill()
            process.wait()


def sync_threads(address: str, options: dict[str, Any], threads: int, seconds: float) -> float:
    """Cycles/s of ``threads`` threads sharing one sync client."""
    with ringlock.Client(address, **options) as client:
        client.ping()
        counts = [0] * threads
        phase = {"measuring": False, "stop": False}

        def work(number: int) -> None:
            index = 0
            while not phase["stop"]:
                lock = client.lock(f"bench-{number}-{index}", lease=30)
                lock.acquire()
                lock.release()
                index += 1
                if phase["measuring"]:
                    counts[number] += 1

        workers = [threading.Thread(target=work, args=(number,)) for number in range(threads)]
        for worker in workers:
            worker.start()
        time.sleep(WARMUP_S)
        phase["measuring"] = True
        start = time.perf_counter()
        time.sleep(seconds)
        total = sum(counts)
        elapsed = time.perf_counter() - start
        phase["stop"] = True
        for worker in workers:
            worker.join()
        return total / elapsed


async def aio_tasks(address: str, options: dict[str, Any], seconds: float) -> float:
    """Cycles/s of ``TASKS`` tasks sharing one asyncio client."""
    async with ringlock.aio.Client(address, **options) as client:
        await client.ping()
        counts = [0] * TASKS
        phase = {"measuring": False, "stop": False}

        async def work(number: int) -> None:
            index = 0
            while not phase["stop"]:
                lock = client.lock(f"bench-{number}-{index}", lease=30)
                await lock.acquire()
                await lock.release()
                index += 1
                if phase["measuring"]:
                    counts[number] += 1

        tasks = [asyncio.create_task(work(number)) for number in range(TASKS)]
        await asyncio.sleep(WARMUP_S)
        phase["measuring"] = True
        start = time.perf_counter()
        await asyncio.sleep(seconds)
        total = sum(counts)
        elapsed = time.perf_counter() - start
        phase["stop"] = True
        await asyncio.gather(*tasks)
        return total / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each measurement (default 3)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds, plain and TLS alternated; medians are kept")
    parser.add_argument("--ringlock", type=Path, default=ROOT / "target" / "release" / "ringlock")
    parser.add_argument("--testkit", type=Path, default=ROOT / "target" / "release" / "ringlock-testkit")
    args = parser.parse_args()
    for binary in (args.ringlock, args.testkit):
        if not binary.exists():
            parser.error(f"{binary} is missing: cargo build --release -p ringlock -p ringlock-testkit")

    loads = ("sync, one thread", f"sync, {THREADS} threads", f"asyncio, {TASKS} tasks")
    figures: dict[tuple[str, str], list[float]] = {(load, mode): [] for load in loads for mode in ("plain", "tls")}
    with tempfile.TemporaryDirectory(prefix="ringlock-bench-certs-") as certs:
        subprocess.run([str(args.testkit), "certs", certs], check=True, stdout=subprocess.DEVNULL)
        tls_args = ("--tls-cert", os.path.join(certs, "server.pem"), "--tls-key", os.path.join(certs, "server-key.pem"))
        with ringlock_server(args.ringlock) as plain, ringlock_server(args.ringlock, *tls_args) as secured:
            servers = {"plain": (plain, {}), "tls": (secured, {"tls_ca": os.path.join(certs, "ca.pem")})}
            for _ in range(args.rounds):
                for mode, (address, options) in servers.items():
                    figures[(loads[0], mode)].append(sync_threads(address, options, 1, args.seconds))
                    figures[(loads[1], mode)].append(sync_threads(address, options, THREADS, args.seconds))
                    figures[(loads[2], mode)].append(asyncio.run(aio_tasks(address, options, args.seconds)))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.seconds:g} s each, {args.rounds} round(s)")
    print(f"{'lock cycles/s':<28}{'plain':>12}{'TLS':>12}{'TLS/plain':>11}")
    for load in loads:
        plain_median = statistics.median(figures[(load, "plain")])
        tls_median = statistics.median(figures[(load, "tls")])
        print(f"{load:<28}{plain_median:>12,.0f}{tls_median:>12,.0f}{tls_median / plain_median:>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
