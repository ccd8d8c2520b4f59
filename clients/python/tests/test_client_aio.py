"""The asyncio API against a real server: what a user sees."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

import ringlock
import ringlock.aio
from harness import InspectStandby, Server, Testkit, wait_until


@pytest.fixture
async def client(server: Server) -> AsyncIterator[ringlock.aio.Client]:
    async with ringlock.aio.Client(server.address) as made:
        yield made


async def test_ping_and_stats(client: ringlock.aio.Client, server: Server) -> None:
    pong = await client.ping()
    assert pong.role == "active" and pong.active == server.address
    assert (await client.stats())["role"] == "active"
    assert client.connection_count == 2


async def test_acquire_release_and_context_manager(client: ringlock.aio.Client, key: Callable[[str], str]) -> None:
    lock = client.lock(key("basic"), lease=10)
    assert await lock.acquire()
    assert await client.lock(key("basic")).acquire(blocking=False) is False
    with pytest.raises(ringlock.LockTimeoutError):
        async with client.lock(key("basic"), wait=0.05):
            pytest.fail("ran without the lock")
    assert await lock.release() is True
    with pytest.raises(ringlock.LockNotOwnedError):
        await lock.release()
    async with client.lock(key("basic"), lease=10) as held:
        assert held.token is not None and held.token > 0


async def test_extend_sets_the_remaining_lease(client: ringlock.aio.Client, key: Callable[[str], str]) -> None:
    lock = client.lock(key("extend"), lease=60)
    assert await lock.acquire()
    await lock.extend(0.05)
    assert await client.lock(key("extend"), lease=10).acquire(timeout=30)
    assert await lock.release() is False


async def test_auto_extend_reports_a_lost_lock(client: ringlock.aio.Client, key: Callable[[str], str]) -> None:
    lost = asyncio.Event()

    def on_lost(lock: ringlock.aio.Lock, error: ringlock.LockLostError) -> None:
        lost.set()

    with pytest.raises(ringlock.LockLostError):
        async with client.lock(key("lost"), lease=0.9, auto_extend=True, on_lost=on_lost) as lock:
            await lock.extend(0.01)
            await asyncio.wait_for(lost.wait(), 20)


async def test_auto_extend_keeps_the_lock(client: ringlock.aio.Client, key: Callable[[str], str]) -> None:
    async def extends() -> int:
        return int((await client.stats())["total"]["extends"])

    async with client.lock(key("auto"), lease=0.6, auto_extend=True) as lock:
        start = await extends()
        while await extends() < start + 3:
            await asyncio.sleep(0.05)
        assert lock.lost is None


async def test_a_cancelled_acquire_releases_a_late_grant(
    client: ringlock.aio.Client, key: Callable[[str], str]
) -> None:
    holder = client.lock(key("cancel"), lease=30)
    assert await holder.acquire()
    waiter = asyncio.create_task(client.lock(key("cancel"), lease=30).acquire())
    while (await client.stats())["total"]["waiters"] < 1:
        await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    # The cancelled request is still queued on the server; the grant it
    # gets is released at once, so the key comes free for the next one.
    assert await holder.release() is True
    assert await client.lock(key("cancel"), lease=10).acquire(timeout=30)


async def test_many_tasks_share_a_client(client: ringlock.aio.Client, key: Callable[[str], str]) -> None:
    async def work(task: int) -> list[int]:
        tokens = []
        for index in range(20):
            async with client.lock(key(f"t{task}-{index % 3}"), lease=10) as lock:
                assert lock.token is not None
                tokens.append(lock.token)
        return tokens

    results = await asyncio.gather(*(work(task) for task in range(64)))
    assert len({token for tokens in results for token in tokens}) == 64 * 20


async def test_inspect_a_free_and_a_held_key(client: ringlock.aio.Client, key: Callable[[str], str]) -> None:
    free = await client.inspect(key("inspect"))
    assert free == ringlock.KeyState(key("inspect"), None, 0.0, 0) and not free.held
    async with client.lock(key("inspect"), lease=10) as lock:
        state = await client.inspect(key("inspect").encode())
        assert state.key == key("inspect").encode()
        assert state.held and state.token == lock.token
        assert 0 < state.lease_left <= 10 and state.waiters == 0
    assert (await client.inspect(key("inspect"))).token is None


async def test_inspect_counts_queued_acquires(client: ringlock.aio.Client, key: Callable[[str], str]) -> None:
    name = key("queued")
    holder = client.lock(name, lease=30)
    assert await holder.acquire()

    async def wait_for_it() -> int:
        lock = client.lock(name, lease=10, wait=30)
        assert await lock.acquire()
        token = lock.token
        assert await lock.release()
        return token  # type: ignore[return-value]

    waiting = [asyncio.create_task(wait_for_it()) for _ in range(2)]
    for _ in range(2000):
        if (await client.inspect(name)).waiters == 2:
            break
        await asyncio.sleep(0.01)
    state = await client.inspect(name)
    assert state.waiters == 2 and state.token == holder.token
    held_by = holder.token
    assert await holder.release()
    tokens = await asyncio.wait_for(asyncio.gather(*waiting), 30)
    assert all(token > held_by for token in tokens)  # type: ignore[operator]
    assert await client.inspect(name) == ringlock.KeyState(name, None, 0.0, 0)


async def test_inspect_refuses_a_bad_key_before_sending(client: ringlock.aio.Client) -> None:
    for bad in ("", "two words", b"tab\there", "x" * 251, "-"):
        with pytest.raises(ValueError):
            await client.inspect(bad)
    assert (await client.ping()).role == "active"


async def test_inspect_follows_a_standby_redirect(server: Server, key: Callable[[str], str]) -> None:
    standby = InspectStandby(server.address)
    try:
        async with ringlock.aio.Client(standby.address) as client:
            assert (await client.inspect(key("moved"))).token is None
            assert standby.redirected >= 1 and client.active_node == server.address
            async with client.lock(key("moved"), lease=10) as lock:
                assert (await client.inspect(key("moved"))).token == lock.token
    finally:
        standby.close()


async def test_no_server_is_a_connection_error_naming_the_address_and_errno() -> None:
    import errno
    import socket

    # Bound but not listening: connections are refused, and no other test
    # can take the port meanwhile.
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"
        async with ringlock.aio.Client(address, connect_limit=0.3) as client:
            with pytest.raises(ConnectionError) as raised:
                await client.ping()
    error = raised.value
    assert isinstance(error, ringlock.NoConnectionError)
    assert error.errno == errno.ECONNREFUSED and error.addresses == [address]
    assert f"{address} (connection refused)" in str(error), str(error)


@pytest.mark.testkit
async def test_a_ping_to_a_node_that_accepts_then_closes_fails_within_the_connect_limit(
    server: Server, kit: Testkit
) -> None:
    proxy, address = kit.proxy(server.address)
    # Every connection is accepted and closed at once, before it answers:
    # the ping goes out on each and is cut, which must not start its wait
    # for a connection over.
    kit("refuse", proxy, "on")
    async with ringlock.aio.Client(address, connect_limit=1.0, reconnect_delay_max=0.2) as client:
        with pytest.raises(ringlock.NoConnectionError) as raised:
            await asyncio.wait_for(client.ping(), 60)
    assert raised.value.addresses == [address]


@pytest.mark.testkit
async def test_a_cancelled_acquire_is_never_sent(server: Server, kit: Testkit, key: Callable[[str], str]) -> None:
    proxy, address = kit.proxy(server.address)
    kit("refuse", proxy, "on")
    async with (
        ringlock.aio.Client(server.address) as other,
        ringlock.aio.Client(address, reconnect_delay_max=0.2) as client,
    ):
        # Held elsewhere, so that the acquire, if it reached the server,
        # would stay in the key's queue.
        holder = other.lock(key("cancelled"), lease=60)
        assert await holder.acquire()
        cancelled = asyncio.create_task(client.lock(key("cancelled"), lease=30, wait=60).acquire())
        assert client._router is not None
        router = client._router
        await asyncio.to_thread(wait_until, lambda: len(router._waiting) == 1, "the acquire to wait for a connection")
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await asyncio.to_thread(kit, "refuse", proxy, "off")
        await asyncio.to_thread(kit, "wait-open", proxy, 2)
        # An inspect on each connection (round-robin) goes to the key's
        # shard behind anything sent before it on that connection.
        for _ in range(2):
            state = await client.inspect(key("cancelled"))
            assert state.token == holder.token and state.waiters == 0, state
        assert await holder.release() is True


@pytest.mark.testkit
async def test_an_extend_of_a_grant_that_waited_longer_than_its_lease_waits_for_a_connection(
    server: Server, kit: Testkit, key: Callable[[str], str]
) -> None:
    proxy, address = kit.proxy(server.address)
    async with (
        ringlock.aio.Client(server.address) as other,
        ringlock.aio.Client(address, reconnect_delay_max=0.2) as client,
    ):
        # The holder's lease runs out 8 s from now, and only then is the key
        # granted to the acquire below, whose 5 s lease starts with the grant.
        assert await other.lock(key("late-grant"), lease=8).acquire()
        lock = client.lock(key("late-grant"), lease=5)
        assert await lock.acquire()
        # No connection: the extend waits for one within the lease it has left.
        await asyncio.to_thread(kit, "refuse", proxy, "on")
        await asyncio.to_thread(kit, "cut", proxy)
        await asyncio.to_thread(
            wait_until, lambda: client.usable_connection_count == 0, "both connections to be seen broken"
        )
        extended = asyncio.create_task(lock.extend(5))
        assert client._router is not None
        router = client._router
        await asyncio.to_thread(
            wait_until,
            lambda: len(router._waiting) == 1 or extended.done(),
            "the extend to wait for a connection, or to end",
        )
        await asyncio.to_thread(kit, "refuse", proxy, "off")
        await asyncio.wait_for(extended, 60)
        assert await lock.release() is True
