"""Worker of ``scripts/restart-soak.sh`` for the Python clients and ringlock-cli.

``--workers`` workers (default 8) loop acquire (lease ``--lease``, wait
``--wait``) then release over ``--keys`` keys while the script restarts the
server under them:

- ``sync``: threads sharing one ``ringlock.Client``;
- ``asyncio``: tasks sharing one ``ringlock.aio.Client``;
- ``cli``: threads each running ``ringlock-cli acquire`` and
  ``ringlock-cli release`` processes (``--cli`` names the binary).

Prints ``ready`` once a first lock cycle went through, runs until its
standard input ends, then prints one JSON line of what the calls saw (the
script reads it and describes the fields). Needs only the client's source
on ``PYTHONPATH`` (``clients/python/src``).

    python clients/python/bench/restart_soak.py sync --addr 127.0.0.1:7700 < some-fifo
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import ringlock
import ringlock.aio


@dataclass
class Tally:
    """What one worker saw."""

    ok: int = 0
    lost_by_restart: int = 0
    not_granted: int = 0
    failed: int = 0
    failures: list[tuple[float, str, str, str]] = field(default_factory=list)
    lost: list[tuple[float, float]] = field(default_factory=list)
    last_answer: float | None = None
    stall: tuple[float, float] = (0.0, 0.0)

    def answered(self, at: float) -> None:
        if self.last_answer is not None and at - self.last_answer > self.stall[1] - self.stall[0]:
            self.stall = (self.last_answer, at)
        self.last_answer = at

    def fail(self, call: str, kind: str, message: str) -> None:
        self.failed += 1
        self.failures.append((time.time(), call, kind, message))

    def released(self, asked_at: float, released: bool) -> None:
        at = time.time()
        if released:
            self.ok += 1
        else:
            self.lost_by_restart += 1
            self.lost.append((asked_at, at))
        self.answered(at)


def kind(error: BaseException) -> str:
    """The error's class, and its server code if it has one."""
    code = getattr(error, "code", None)
    name = type(error).__name__
    return f"{name}({code})" if isinstance(error, ringlock.RinglockError) and code else name


def keys(count: int) -> list[str]:
    return [f"restart-soak/{index}" for index in range(count)]


def stop_on_end_of_input(stop: threading.Event) -> None:
    def read() -> None:
        sys.stdin.buffer.read()
        stop.set()

    threading.Thread(target=read, daemon=True).start()


def sync_worker(
    client: ringlock.Client,
    args: argparse.Namespace,
    index: int,
    stop: threading.Event,
    ready: threading.Event,
    tally: Tally,
) -> None:
    names = keys(args.keys)
    turn = index
    while not stop.is_set():
        turn += 1
        lock = client.lock(names[turn % len(names)], lease=args.lease, wait=args.wait)
        asked_at = time.time()
        try:
            granted = lock.acquire()
        except Exception as error:  # noqa: BLE001 - every error is counted, by kind
            tally.fail("acquire", kind(error), str(error))
            time.sleep(0.05)  # a failure that comes at once must not spin the loop
            continue
        if not granted:
            tally.not_granted += 1
            continue
        acquired_at = time.time()
        tally.ok += 1
        tally.answered(acquired_at)
        try:
            tally.released(asked_at, lock.release())
            ready.set()
        except Exception as error:  # noqa: BLE001
            tally.fail("release", kind(error), str(error))


def cli_worker(
    args: argparse.Namespace, index: int, stop: threading.Event, ready: threading.Event, tally: Tally
) -> None:
    names = keys(args.keys)
    base = [args.cli, "--servers", args.addr]
    turn = index
    while not stop.is_set():
        turn += 1
        key = names[turn % len(names)]
        asked_at = time.time()
        acquire = subprocess.run(
            [*base, "acquire", key, "--lease", str(args.lease), "--wait", str(args.wait)],
            capture_output=True,
            text=True,
            check=False,
        )
        if acquire.returncode == 75:
            tally.not_granted += 1
            continue
        if acquire.returncode != 0:
            tally.fail("acquire", f"exit {acquire.returncode}", acquire.stderr.strip())
            time.sleep(0.05)
            continue
        acquired_at = time.time()
        tally.ok += 1
        tally.answered(acquired_at)
        release = subprocess.run(
            [*base, "release", key, acquire.stdout.split()[-1]], capture_output=True, text=True, check=False
        )
        if release.returncode in (0, 4):
            tally.released(asked_at, release.returncode == 0)
            ready.set()
        else:
            tally.fail("release", f"exit {release.returncode}", release.stderr.strip())


def run_threads(args: argparse.Namespace) -> list[Tally]:
    stop, ready = threading.Event(), threading.Event()
    stop_on_end_of_input(stop)
    tallies = [Tally() for _ in range(args.workers)]
    client = ringlock.Client(args.addr) if args.client == "sync" else None
    threads = []
    for index, tally in enumerate(tallies):
        if client is not None:
            target, extra = sync_worker, (client,)
        else:
            target, extra = cli_worker, ()
        thread = threading.Thread(target=target, args=(*extra, args, index, stop, ready, tally))
        thread.start()
        threads.append(thread)
    while not ready.wait(0.05) and not stop.is_set():
        pass
    print("ready", flush=True)
    for thread in threads:
        thread.join()
    if client is not None:
        client.close()
    return tallies


async def aio_worker(
    client: ringlock.aio.Client,
    args: argparse.Namespace,
    index: int,
    stop: asyncio.Event,
    ready: asyncio.Event,
    tally: Tally,
) -> None:
    names = keys(args.keys)
    turn = index
    while not stop.is_set():
        turn += 1
        lock = client.lock(names[turn % len(names)], lease=args.lease, wait=args.wait)
        asked_at = time.time()
        try:
            granted = await lock.acquire()
        except Exception as error:  # noqa: BLE001
            tally.fail("acquire", kind(error), str(error))
            await asyncio.sleep(0.05)
            continue
        if not granted:
            tally.not_granted += 1
            continue
        acquired_at = time.time()
        tally.ok += 1
        tally.answered(acquired_at)
        try:
            tally.released(asked_at, await lock.release())
            ready.set()
        except Exception as error:  # noqa: BLE001
            tally.fail("release", kind(error), str(error))


async def run_tasks(args: argparse.Namespace) -> list[Tally]:
    loop = asyncio.get_running_loop()
    stop, ready = asyncio.Event(), asyncio.Event()
    stopped = threading.Event()
    stop_on_end_of_input(stopped)
    tallies = [Tally() for _ in range(args.workers)]
    async with ringlock.aio.Client(args.addr) as client:
        tasks = [
            asyncio.create_task(aio_worker(client, args, index, stop, ready, tally))
            for index, tally in enumerate(tallies)
        ]
        while not ready.is_set() and not stopped.is_set():
            await asyncio.sleep(0.05)
        print("ready", flush=True)
        await loop.run_in_executor(None, stopped.wait)
        stop.set()
        await asyncio.gather(*tasks)
    return tallies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("client", choices=["sync", "asyncio", "cli"])
    parser.add_argument("--addr", default="127.0.0.1:7700")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--keys", type=int, default=4)
    parser.add_argument("--lease", type=float, default=10.0)
    parser.add_argument("--wait", type=float, default=5.0)
    parser.add_argument("--cli", default="ringlock-cli", help="the ringlock-cli binary (client cli)")
    args = parser.parse_args()
    tallies = asyncio.run(run_tasks(args)) if args.client == "asyncio" else run_threads(args)
    stall = max((tally.stall for tally in tallies), key=lambda span: span[1] - span[0])
    print(
        json.dumps(
            {
                "client": {"sync": "python", "asyncio": "python-asyncio", "cli": "ringlock-cli"}[args.client],
                "workers": args.workers,
                "ok": sum(tally.ok for tally in tallies),
                "lost_by_restart": sum(tally.lost_by_restart for tally in tallies),
                "not_granted": sum(tally.not_granted for tally in tallies),
                "failed": sum(tally.failed for tally in tallies),
                "stall_s": stall[1] - stall[0],
                "stall_from": stall[0],
                "stall_to": stall[1],
                "failures": [failure for tally in tallies for failure in tally.failures],
                "lost": [lost for tally in tallies for lost in tally.lost],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
