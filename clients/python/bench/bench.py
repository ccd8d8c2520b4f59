"""Lock cycles/s of the ringlock Python client against redis-py's locks.

One cycle is an acquire and its acknowledged release of a key no one else
holds (distinct keys). Four measurements, each ``--seconds`` long after a
short warm-up, in one run on one machine:

- ringlock's sync client, one thread;
- redis-py's ``Lock`` (sync), one thread;
- ringlock's asyncio client, 64 tasks;
- redis-py's asyncio lock, 64 tasks (its pool gives each task a connection).

The script starts its own ``ringlock`` server (``--shards 1 --no-pin``) and
``redis-server`` (no persistence) on free loopback ports, and stops both.
Needs redis-py (``pip install ./clients/python[bench]``).

    python clients/python/bench/bench.py --seconds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
import redis.asyncio

import ringlock
import ringlock.aio

ROOT = Path(__file__).resolve().parents[3]
TASKS = 64
WARMUP_S = 0.5


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def ringlock_server(binary: Path) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="ringlock-bench-") as data:
        command = [str(binary), "--listen", "127.0.0.1:0", "--shards", "1", "--no-pin", "--data-dir", data]
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            assert process.stderr is not None
            for raw in process.stderr:
                found = re.search(r"listening on (\S+?);?\s", raw.decode(errors="replace"))
                if found:
                    break
            else:
                raise RuntimeError("ringlock exited before listening")
            # Nothing reads its log from here on: keep it quiet.
            process.stderr.close()
            yield found.group(1).rstrip(";")
        finally:
            process.kill()
            process.wait()


@contextmanager
def redis_server(binary: str) -> Iterator[int]:
    port = free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.close()
        yield port
    finally:
        process.kill()
        process.wait()


def timed_loop(cycle: Callable[[int], None], seconds: float) -> float:
    """Cycles/s of ``cycle(i)`` run back to back for ``seconds``."""
    index = 0
    end = time.perf_counter() + WARMUP_S
    while time.perf_counter() < end:
        cycle(index)
        index += 1
    count = 0
    start = time.perf_counter()
    end = start + seconds
    while True:
        for _ in range(64):
            cycle(index)
            index += 1
        count += 64
        now = time.perf_counter()
        if now >= end:
            return count / (now - start)


async def timed_tasks(cycle: Callable[[str], object], seconds: float) -> float:
    """Cycles/s of ``TASKS`` tasks each running ``await cycle(key)`` back to back."""
    counts = [0] * TASKS
    measuring = False
    stop = False

    async def task(number: int) -> None:
        index = 0
        while not stop:
            await cycle(f"bench-{number}-{index}")  # type: ignore[misc]
            index += 1
            if measuring:
                counts[number] += 1

    tasks = [asyncio.create_task(task(number)) for number in range(TASKS)]
    await asyncio.sleep(WARMUP_S)
    measuring = True
    start = time.perf_counter()
    await asyncio.sleep(seconds)
    total = sum(counts)
    elapsed = time.perf_counter() - start
    stop = True
    await asyncio.gather(*tasks)
    return total / elapsed


def ringlock_sync(address: str, seconds: float) -> float:
    with ringlock.Client(address) as client:
        client.ping()

        def cycle(index: int) -> None:
            lock = client.lock(f"bench-{index}", lease=30)
            lock.acquire()
            lock.release()

        return timed_loop(cycle, seconds)


def redis_sync(port: int, seconds: float) -> float:
    client = redis.Redis(port=port)
    client.ping()

    def cycle(index: int) -> None:
        lock = client.lock(f"bench-{index}", timeout=30)
        lock.acquire()
        lock.release()

    try:
        return timed_loop(cycle, seconds)
    finally:
        client.close()


async def ringlock_aio(address: str, seconds: float) -> float:
    async with ringlock.aio.Client(address) as client:
        await client.ping()

        async def cycle(key: str) -> None:
            lock = client.lock(key, lease=30)
            await lock.acquire()
            await lock.release()

        return await timed_tasks(cycle, seconds)


async def redis_aio(port: int, seconds: float) -> float:
    client = redis.asyncio.Redis(port=port)
    await client.ping()

    async def cycle(key: str) -> None:
        lock = client.lock(key, timeout=30)
        await lock.acquire()
        await lock.release()

    try:
        return await timed_tasks(cycle, seconds)
    finally:
        await client.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each measurement (default 3)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the four measurements; medians are kept")
    parser.add_argument("--ringlock", type=Path, default=ROOT / "target" / "release" / "ringlock")
    parser.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if not args.ringlock.exists():
        parser.error(f"{args.ringlock} is missing: cargo build --release -p ringlock")

    figures: dict[str, list[float]] = {"ringlock_sync": [], "redis_sync": [], "ringlock_aio": [], "redis_aio": []}
    with ringlock_server(args.ringlock) as address, redis_server(args.redis_server) as port:
        for _ in range(args.rounds):
            figures["ringlock_sync"].append(ringlock_sync(address, args.seconds))
            figures["redis_sync"].append(redis_sync(port, args.seconds))
            figures["ringlock_aio"].append(asyncio.run(ringlock_aio(address, args.seconds)))
            figures["redis_aio"].append(asyncio.run(redis_aio(port, args.seconds)))
    medians = {name: statistics.median(values) for name, values in figures.items()}
    sync_ratio = medians["ringlock_sync"] / medians["redis_sync"]
    aio_ratio = medians["ringlock_aio"] / medians["redis_aio"]
    print(
        f"python {sys.version.split()[0]}, redis-py {redis.__version__}, {os.cpu_count()} CPUs, {args.seconds:g} s each"
    )
    print(f"{'lock cycles/s':<40}{'ringlock':>12}{'redis-py':>12}{'ratio':>8}")
    print(
        f"{'sync, one thread':<40}{medians['ringlock_sync']:>12,.0f}{medians['redis_sync']:>12,.0f}{sync_ratio:>8.2f}"
    )
    print(
        f"{f'asyncio, {TASKS} tasks':<40}{medians['ringlock_aio']:>12,.0f}{medians['redis_aio']:>12,.0f}{aio_ratio:>8.2f}"
    )
    if args.json:
        args.json.write_text(
            json.dumps({"rounds": figures, "sync_ratio": sync_ratio, "asyncio_ratio": aio_ratio}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
