"""Silent connections (docs/protocol.md §4, issue 35 item 1): a node whose
host vanished or a partition (no reset, no close), played by the test
kit's black hole. A request ends or moves within its own limit plus the
suspicion grace, never only when the link comes back: each test lifts the
black hole only after the call returned, with a generous outer deadline
that fails it instead."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

import ringlock
import ringlock.aio
from harness import Server, Testkit

pytestmark = pytest.mark.testkit

# Short limits, so that a request on the black-holed connection can still be
# granted elsewhere within its wait; the tests accept a failure too.
QUICK = {"suspect_after": 0.2, "ping_timeout": 0.2}
OUTER_DEADLINE_S = 20


def two_proxies(server: Server, kit: Testkit) -> tuple[str, str, str, str]:
    first, first_address = kit.proxy(server.address)
    second, second_address = kit.proxy(server.address)
    return first, first_address, second, second_address


def test_sync_acquire_on_a_black_holed_address_is_granted_elsewhere_or_fails(
    server: Server, kit: Testkit, key: Callable[[str], str]
) -> None:
    dark, dark_address, _, good_address = two_proxies(server, kit)
    pool = ThreadPoolExecutor(2)
    with ringlock.Client([dark_address, good_address], **QUICK) as client:
        client.ping()
        client.ping()
        kit("wait-open", dark, 1)
        kit("blackhole", dark, "on")
        try:
            # Round-robin puts one of two acquires on each connection.
            calls = [pool.submit(client.lock(key(name), lease=10, wait=1).acquire) for name in ("a", "b")]
            outcomes: list[object] = []
            for call in calls:
                try:
                    outcomes.append(call.result(OUTER_DEADLINE_S))
                except ringlock.NoConnectionError as error:
                    outcomes.append(error)
            # The client cut the black-holed connection (it is suspected only
            # with a request in flight) and connected again.
            kit("wait-accepted", dark, 2)
            for outcome in outcomes:
                assert outcome is True or isinstance(outcome, ringlock.NoConnectionError), outcome
            assert outcomes.count(True) >= 1, "the acquire on the good connection was granted"
        finally:
            # Only now: the calls returned, or the outer deadline failed the test.
            kit("blackhole", dark, "off")
            pool.shutdown()
        assert client.ping().role == "active"


def test_sync_acquire_on_a_single_black_holed_address_fails_then_the_client_reconnects(
    server: Server, kit: Testkit, key: Callable[[str], str]
) -> None:
    proxy, address = kit.proxy(server.address)
    pool = ThreadPoolExecutor(1)
    with ringlock.Client(address) as client:
        client.ping()
        kit("wait-open", proxy, 2)
        kit("blackhole", proxy, "on")
        try:
            call = pool.submit(client.lock(key("single"), lease=10, wait=1).acquire)
            # Past the outer deadline, result() raises TimeoutError instead.
            with pytest.raises(ringlock.NoConnectionError):
                call.result(OUTER_DEADLINE_S)
        finally:
            kit("blackhole", proxy, "off")
            pool.shutdown()
        assert client.ping().role == "active", "the client reconnected once the link was back"
        lock = client.lock(key("single"), lease=10, wait=5)
        assert lock.acquire() is True
        lock.release()


async def control(kit: Testkit, *words: object) -> list[str]:
    return await asyncio.to_thread(kit, *words)


async def outcome_of(call: object) -> object:
    try:
        return await asyncio.wait_for(call, OUTER_DEADLINE_S)  # type: ignore[arg-type]
    except ringlock.NoConnectionError as error:
        return error


async def test_aio_acquire_on_a_black_holed_address_is_granted_elsewhere_or_fails(
    server: Server, kit: Testkit, key: Callable[[str], str]
) -> None:
    dark, dark_address, _, good_address = two_proxies(server, kit)
    async with ringlock.aio.Client([dark_address, good_address], **QUICK) as client:
        await client.ping()
        await client.ping()
        await control(kit, "wait-open", dark, 1)
        await control(kit, "blackhole", dark, "on")
        try:
            locks = [client.lock(key(name), lease=10, wait=1) for name in ("a", "b")]
            outcomes = await asyncio.gather(*(outcome_of(lock.acquire()) for lock in locks))
            await control(kit, "wait-accepted", dark, 2)
            for outcome in outcomes:
                assert outcome is True or isinstance(outcome, ringlock.NoConnectionError), outcome
            assert outcomes.count(True) >= 1, "the acquire on the good connection was granted"
        finally:
            await control(kit, "blackhole", dark, "off")
        assert (await client.ping()).role == "active"


async def test_aio_acquire_on_a_single_black_holed_address_fails_then_the_client_reconnects(
    server: Server, kit: Testkit, key: Callable[[str], str]
) -> None:
    proxy, address = kit.proxy(server.address)
    async with ringlock.aio.Client(address) as client:
        await client.ping()
        await control(kit, "wait-open", proxy, 2)
        await control(kit, "blackhole", proxy, "on")
        try:
            outcome = await outcome_of(client.lock(key("single"), lease=10, wait=1).acquire())
            assert isinstance(outcome, ringlock.NoConnectionError), outcome
        finally:
            await control(kit, "blackhole", proxy, "off")
        assert (await client.ping()).role == "active", "the client reconnected once the link was back"
        lock = client.lock(key("single"), lease=10, wait=5)
        assert await lock.acquire() is True
        await lock.release()


def test_sync_waiting_acquire_keeps_its_answering_connection(
    server: Server, kit: Testkit, key: Callable[[str], str]
) -> None:
    """A connection whose request waits its turn reads nothing for a while:
    it is pinged, answers, and stays up."""
    proxy, address = kit.proxy(server.address)
    with ringlock.Client(server.address) as holder, ringlock.Client(address, **QUICK) as client:
        assert holder.lock(key("busy"), lease=1.5).acquire()
        kit("wait-open", proxy, 2)
        lock = client.lock(key("busy"), lease=10, wait=10)
        assert lock.acquire(), "granted once the holder's lease ran out, after several pings"
        assert kit.count("accepted", proxy) == 2, "an answering connection was cut"
        kit("wait-upstream", proxy, "-", "P")
        assert lock.release() is True


async def test_aio_waiting_acquire_keeps_its_answering_connection(
    server: Server, kit: Testkit, key: Callable[[str], str]
) -> None:
    proxy, address = kit.proxy(server.address)
    with ringlock.Client(server.address) as holder:
        assert holder.lock(key("busy"), lease=1.5).acquire()
        async with ringlock.aio.Client(address, **QUICK) as client:
            lock = client.lock(key("busy"), lease=10, wait=10)
            assert await lock.acquire(), "granted once the holder's lease ran out, after several pings"
            assert kit.count("accepted", proxy) == 2, "an answering connection was cut"
            await control(kit, "wait-upstream", proxy, "-", "P")
            assert await lock.release() is True
