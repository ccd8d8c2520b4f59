"""The promises every official client keeps (issue 34 items 3 to 7), for
the sync and asyncio clients against a real server: the three wait forms,
auto-extend's lost-lock signal, held() asking the server, a lock from
(key, token), and the error kinds."""

from __future__ import annotations

import asyncio
import errno
import os
import re
import signal
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import ringlock
import ringlock.aio
from harness import Server, Testkit, wait_until


def raw_line(address: str, line: str) -> str:
    """One request on a connection of its own; the reply line."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=20) as stream:
        stream.sendall(line.encode() + b"\n")
        return stream.makefile("rb").readline().decode().rstrip("\r\n")


def cli_acquire(address: str, key: str) -> int:
    """Takes ``key`` with ``ringlock-cli acquire``; the token it printed."""
    cli = Path(os.environ["RINGLOCK_BIN"]).with_name("ringlock-cli")
    done = subprocess.run(
        [str(cli), "acquire", "--servers", address, "--lease", "30", key],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(re.findall(r"\d+", done.stdout)[-1])


@pytest.fixture
def client(server: Server) -> ringlock.Client:
    with ringlock.Client(server.address) as made:
        yield made  # type: ignore[misc]


# Wait forms.


def test_wait_forms(client: ringlock.Client, key: Callable[[str], str]) -> None:
    holder = client.lock(key("forms"), lease=30)
    assert holder.acquire()
    for wait in (ringlock.TRY_ONCE, 0, 0.05):
        assert client.lock(key("forms"), wait=wait).acquire() is False, f"wait={wait!r} while held"
    assert client.lock(key("forms")).acquire(timeout=ringlock.TRY_ONCE) is False
    for wait in (-1, 86_401, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"TRY_ONCE \(0\), 0\.001 to 86400 seconds, or NO_LIMIT \(None\)"):
            client.lock(key("forms"), wait=wait)
    queued = client.lock(key("forms"), wait=ringlock.NO_LIMIT)
    granted: list[bool] = []
    waiter = threading.Thread(target=lambda: granted.append(queued.acquire()))
    waiter.start()
    wait_until(lambda: client.inspect(key("forms")).waiters == 1, "the NO_LIMIT acquire queued")
    assert holder.release()
    waiter.join(20)
    assert granted == [True]
    assert queued.release()
    assert client.lock(key("forms"), wait=ringlock.TRY_ONCE).acquire() is True, "a free key is taken"


def test_only_the_explicit_form_tries_once(fresh_server: Server, key: Callable[[str], str]) -> None:
    """A try-once acquire waits for a connection within the connect limit; a
    1 ms wait is a bounded wait, which gives up with its wait."""
    with ringlock.Client(fresh_server.address, connect_limit=20) as client:
        client.ping()
        fresh_server.kill()
        with pytest.raises(ringlock.NoConnectionError):
            client.lock(key("tick"), wait=0.001).acquire()
        result: list[object] = []

        def try_once() -> None:
            try:
                result.append(client.lock(key("tick"), wait=ringlock.TRY_ONCE).acquire())
            except ringlock.RinglockError as error:
                result.append(error)

        trying = threading.Thread(target=try_once)
        trying.start()
        wait_until(lambda: client._router is not None and client.usable_connection_count == 0, "connections down")
        fresh_server.restart()
        trying.join(30)
        assert result == [True]


async def test_wait_forms_aio(server: Server, key: Callable[[str], str]) -> None:
    async with ringlock.aio.Client(server.address) as client:
        holder = client.lock(key("forms"))
        assert await holder.acquire()
        assert await client.lock(key("forms"), wait=ringlock.TRY_ONCE).acquire() is False
        assert await client.lock(key("forms"), wait=0).acquire() is False
        assert await client.lock(key("forms"), wait=0.05).acquire() is False
        with pytest.raises(ValueError, match="NO_LIMIT"):
            client.lock(key("forms"), wait=-0.5)
        assert await holder.release()
        assert await client.lock(key("forms"), wait=ringlock.TRY_ONCE).acquire() is True


# Auto-extend and the lost-lock signal.


def test_single_node_restart_reports_lost(fresh_server: Server, key: Callable[[str], str]) -> None:
    seen: list[tuple[ringlock.Lock, ringlock.LockLostError]] = []

    def on_lost(lock: ringlock.Lock, error: ringlock.LockLostError) -> None:
        seen.append((lock, error))

    with ringlock.Client(fresh_server.address) as client:
        locks = [client.lock(key(f"restart-{index}"), lease=3, auto_extend=True, on_lost=on_lost) for index in range(4)]
        for lock in locks:
            assert lock.acquire()
        fresh_server.kill()
        fresh_server.restart()
        for lock in locks:
            assert lock.lost_event.wait(20), f"{lock} never learned it was lost"
            assert isinstance(lock.lost, ringlock.LockLostError)
            assert not lock.locked()
        assert sorted(id(lock) for lock, _ in seen) == sorted(id(lock) for lock in locks)


async def test_single_node_restart_reports_lost_aio(fresh_server: Server, key: Callable[[str], str]) -> None:
    async with ringlock.aio.Client(fresh_server.address) as client:
        locks = [client.lock(key(f"restart-{index}"), lease=3, auto_extend=True) for index in range(4)]
        for lock in locks:
            assert await lock.acquire()
        await asyncio.to_thread(fresh_server.kill)
        await asyncio.to_thread(fresh_server.restart)
        for lock in locks:
            await asyncio.wait_for(lock.lost_event.wait(), 20)
            assert isinstance(lock.lost, ringlock.LockLostError) and not lock.locked()


def test_release_elsewhere_reports_lost(client: ringlock.Client, server: Server, key: Callable[[str], str]) -> None:
    lock = client.lock(key("taken-away"), lease=0.6, auto_extend=True)
    assert lock.acquire()
    assert raw_line(server.address, f"R {key('taken-away')} {lock.token}") == f"R {key('taken-away')}"
    assert lock.lost_event.wait(20)
    assert lock.lost is not None and lock.lost.code == "not-holder"
    assert not lock.locked()


async def test_release_elsewhere_reports_lost_aio(server: Server, key: Callable[[str], str]) -> None:
    lost = asyncio.Event()
    async with ringlock.aio.Client(server.address) as client:
        lock = client.lock(key("taken-away"), lease=0.6, auto_extend=True, on_lost=lambda lock, error: lost.set())
        assert await lock.acquire()
        await asyncio.to_thread(raw_line, server.address, f"R {key('taken-away')} {lock.token}")
        await asyncio.wait_for(lost.wait(), 20)
        assert lock.lost_event.is_set() and lock.lost is not None and lock.lost.code == "not-holder"


def test_unanswered_extends_lose_the_lock_at_the_lease_end(
    server: Server, kit: Testkit, key: Callable[[str], str]
) -> None:
    """Extends that reach the server but whose answers never come: the lease
    ends without a confirmed extend, so the lock is lost, then and there."""
    proxy, address = kit.proxy(server.address)
    with ringlock.Client(address) as client:
        lock = client.lock(key("unanswered"), lease=0.6, auto_extend=True)
        assert lock.acquire()
        kit("stall-replies", proxy)
        assert lock.lost_event.wait(20)
        assert lock.lost is not None and lock.lost.code == "lost" and not lock.locked()
        kit("resume", proxy)


async def test_unanswered_extends_lose_the_lock_at_the_lease_end_aio(
    server: Server, kit: Testkit, key: Callable[[str], str]
) -> None:
    proxy, address = kit.proxy(server.address)
    async with ringlock.aio.Client(address) as client:
        lock = client.lock(key("unanswered"), lease=0.6, auto_extend=True)
        assert await lock.acquire()
        await asyncio.to_thread(kit, "stall-replies", proxy)
        await asyncio.wait_for(lock.lost_event.wait(), 20)
        assert lock.lost is not None and lock.lost.code == "lost" and not lock.locked()
        await asyncio.to_thread(kit, "resume", proxy)


# held() asks the server; locked() is the local view.


def test_held_asks_the_server(client: ringlock.Client, server: Server, key: Callable[[str], str]) -> None:
    lock = client.lock(key("asked"), lease=30)
    assert lock.held() is False, "not acquired"
    assert lock.acquire()
    assert lock.held() is True
    raw_line(server.address, f"R {key('asked')} {lock.token}")
    assert lock.held() is False
    assert lock.locked() is True, "the local view cannot know"
    other = client.lock(key("asked"))
    assert other.acquire()
    assert lock.held() is False, "another grant's token holds the key"
    assert other.release()

    short = client.lock(key("short"), lease=0.1)
    assert short.acquire() and short.locked()
    wait_until(lambda: not short.locked(), "the lease ran out locally")
    assert short.held() is False


async def test_held_asks_the_server_aio(server: Server, key: Callable[[str], str]) -> None:
    async with ringlock.aio.Client(server.address) as client:
        lock = client.lock(key("asked"), lease=0.2)
        assert await lock.acquire()
        assert await lock.held() is True and lock.locked()
        while lock.locked():
            await asyncio.sleep(0.02)
        assert await lock.held() is False


# A lock from (key, token).


def test_lock_from_key_and_token(client: ringlock.Client, server: Server, key: Callable[[str], str]) -> None:
    token = cli_acquire(server.address, key("cli"))
    lock = client.lock_from(key("cli"), token)
    assert lock.token == token and lock.locked() and lock.held()
    lock.extend(20)
    assert lock.release() is True
    assert client.inspect(key("cli")).token is None
    with pytest.raises(ValueError, match="u64"):
        client.lock_from(key("cli"), -1)
    with pytest.raises(ValueError):
        client.lock_from("two words", 1)


async def test_lock_from_key_and_token_aio(server: Server, key: Callable[[str], str]) -> None:
    token = await asyncio.to_thread(cli_acquire, server.address, key("cli"))
    async with ringlock.aio.Client(server.address) as client:
        lock = client.lock_from(key("cli"), token)
        assert await lock.held()
        assert await lock.release() is True
        assert (await client.inspect(key("cli"))).token is None


# Error kinds.


def test_error_kinds(fresh_server: Server, key: Callable[[str], str]) -> None:
    with ringlock.Client(fresh_server.address) as client:
        with pytest.raises(ValueError, match="--max-lease"):
            client.lock(key("k"), lease=0)
        with pytest.raises(ringlock.RinglockError, match="--max-lease") as refused:
            client.lock(key("k"), lease=48 * 3600).acquire()
        assert refused.value.code == "bad-lease"
        holder = client.lock(key("k"))
        assert holder.acquire()
        with pytest.raises(ringlock.LockTimeoutError), client.lock(key("k"), wait=0.02):
            pass
        token = holder.token
        assert holder.release()
        holder._granted(token, float("inf"))  # type: ignore[arg-type]  # a stale holder
        with pytest.raises(ringlock.LockLostError) as lost:
            holder.extend(10)
        assert lost.value.code == "not-holder"
        # shutting-down: an acquire queued when the server stops.
        blocker = client.lock(key("queued"))
        assert blocker.acquire()
        failure: list[BaseException] = []

        def queued() -> None:
            try:
                client.lock(key("queued")).acquire()
            except ringlock.RinglockError as error:
                failure.append(error)

        waiter = threading.Thread(target=queued)
        waiter.start()
        wait_until(lambda: client.inspect(key("queued")).waiters == 1, "the acquire queued")
        fresh_server.signal(signal.SIGTERM)
        waiter.join(20)
        assert len(failure) == 1 and isinstance(failure[0], ringlock.ShuttingDownError)
        fresh_server.kill()
    # A connection error is a ConnectionError with the address and errno.
    with ringlock.Client(fresh_server.address, connect_limit=0.2) as client:
        with pytest.raises(ConnectionError) as raised:
            client.ping()
        error = raised.value
        assert isinstance(error, ringlock.NoConnectionError)
        assert error.address == fresh_server.address and error.errno == errno.ECONNREFUSED
