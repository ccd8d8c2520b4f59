"""The promises every official client keeps (issue 34 items 3 to 7), for
the sync and asyncio clients against a real server, beyond their scenarios
of clients/scenarios.json (test_scenarios_sync.py, test_scenarios_aio.py):
a try with no connection waits for one, auto-extend's lost-lock signal
when the lock is taken away or its extends go unanswered, and an acquire
queued at shutdown."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

import ringlock
import ringlock.aio
from harness import Server, Testkit, raw_line, wait_until


@pytest.fixture
def client(server: Server) -> ringlock.Client:
    with ringlock.Client(server.address) as made:
        yield made  # type: ignore[misc]


# Wait forms.


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


# Auto-extend and the lost-lock signal.


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


# Error kinds.


def test_an_acquire_queued_when_the_server_stops_waits_for_the_next_within_its_limit(
    fresh_server: Server, key: Callable[[str], str]
) -> None:
    """An acquire answered shutting-down waits for the next server like one
    whose connection broke; with none back within the connect limit, it
    raises NoConnectionError saying the server was shutting down."""
    with ringlock.Client(fresh_server.address, connect_limit=1.0) as client:
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
        assert fresh_server.terminate() == 0
        waiter.join(20)
        assert len(failure) == 1 and isinstance(failure[0], ringlock.NoConnectionError), failure
        assert failure[0].shutting_down and "(the server was shutting down)" in str(failure[0])
        fresh_server.kill()
