"""The sync API against a real server: what a user sees."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

import ringlock
from harness import InspectStandby, Server, Testkit, wait_until


@pytest.fixture
def client(server: Server) -> ringlock.Client:
    with ringlock.Client(server.address) as made:
        yield made  # type: ignore[misc]


def test_ping_and_stats(client: ringlock.Client, server: Server) -> None:
    pong = client.ping()
    assert pong.role == "active" and pong.active == server.address and pong.epoch > 0
    assert client.stats()["role"] == "active"
    assert client.connection_count == 2


def test_acquire_and_release_like_threading_lock(client: ringlock.Client, key: Callable[[str], str]) -> None:
    lock = client.lock(key("basic"), lease=10, wait=1)
    assert not lock.locked() and lock.token is None
    assert lock.acquire() is True
    assert lock.locked() and isinstance(lock.token, int)
    with pytest.raises(RuntimeError):
        lock.acquire()  # not re-entrant
    other = client.lock(key("basic"), lease=10)
    assert other.acquire(blocking=False) is False
    first_token = lock.token
    assert lock.release() is True
    assert other.acquire(blocking=False) is True
    assert other.token is not None and other.token > first_token
    assert other.release() is True
    with pytest.raises(ringlock.LockNotOwnedError):
        other.release()


def test_context_manager(client: ringlock.Client, key: Callable[[str], str]) -> None:
    with client.lock(key("ctx"), lease=10) as lock:
        assert lock.locked()
        with pytest.raises(ringlock.LockTimeoutError) as raised, client.lock(key("ctx"), wait=0.05):
            pytest.fail("ran without the lock")
        assert isinstance(raised.value, TimeoutError) and raised.value.key == key("ctx")
    assert not lock.locked()
    assert client.lock(key("ctx")).acquire(blocking=False), "released at the end of the block"


def test_extend_sets_the_remaining_lease(client: ringlock.Client, key: Callable[[str], str]) -> None:
    lock = client.lock(key("extend"), lease=60)
    assert lock.acquire()
    lock.extend(0.05)  # shorter: the server takes the key back soon
    successor = client.lock(key("extend"), lease=10)
    assert successor.acquire(timeout=30), "granted once the shortened lease ran out"
    assert lock.release() is False, "nothing left to release"
    with pytest.raises(ringlock.LockNotOwnedError):
        lock.extend(1)
    stale = client.lock(key("extend"), lease=10)
    assert stale.acquire(blocking=False) is False
    successor_token = successor.token
    successor.extend(0.05)
    assert stale.acquire(timeout=30)
    stale._token = successor_token  # an old holder extending after its lease ran out
    with pytest.raises(ringlock.LockLostError) as raised:
        stale.extend(10)
    assert raised.value.code == "not-holder"


def test_auto_extend_keeps_the_lock(client: ringlock.Client, key: Callable[[str], str]) -> None:
    def extends() -> int:
        return int(client.stats()["total"]["extends"])

    with client.lock(key("auto"), lease=0.6, auto_extend=True) as lock:
        start = extends()
        # Three extensions at a third of the lease each: the first lease
        # would have run out by then without them.
        while extends() < start + 3:
            threading.Event().wait(0.05)
        assert lock.lost is None
    assert not lock.locked()


def test_auto_extend_reports_a_lost_lock(client: ringlock.Client, key: Callable[[str], str]) -> None:
    lost = threading.Event()
    seen: list[ringlock.LockLostError] = []

    def on_lost(lock: ringlock.Lock, error: ringlock.LockLostError) -> None:
        seen.append(error)
        lost.set()

    with (
        pytest.raises(ringlock.LockLostError),
        client.lock(key("lost"), lease=0.9, auto_extend=True, on_lost=on_lost) as lock,
    ):
        lock.extend(0.01)  # the server takes it back before the next automatic extension
        assert lost.wait(20)
        assert lock.lost is seen[0]


def test_many_threads_share_a_client(client: ringlock.Client, key: Callable[[str], str]) -> None:
    tokens: list[int] = []

    def work(thread: int) -> None:
        for index in range(20):
            with client.lock(key(f"t{thread}-{index % 3}"), lease=10) as lock:
                assert lock.token is not None
                tokens.append(lock.token)

    threads = [threading.Thread(target=work, args=(thread,)) for thread in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(tokens)) == 16 * 20


def test_inspect_a_free_key(client: ringlock.Client, key: Callable[[str], str]) -> None:
    state = client.inspect(key("free"))
    assert state == ringlock.KeyState(key("free"), None, 0.0, 0)
    assert not state.held
    assert client.inspect(key("free").encode()).key == key("free").encode(), "the key as given"
    with pytest.raises(AttributeError):
        state.token = 1  # type: ignore[misc]  # frozen


def test_inspect_a_held_key(client: ringlock.Client, key: Callable[[str], str]) -> None:
    with client.lock(key("held"), lease=10) as lock:
        state = client.inspect(key("held"))
        assert state.held and state.token == lock.token
        assert 0 < state.lease_left <= 10
        assert state.waiters == 0
        lock.extend(60)
        assert 10 < client.inspect(key("held")).lease_left <= 60
    assert client.inspect(key("held")) == ringlock.KeyState(key("held"), None, 0.0, 0), "free once released"


def test_inspect_counts_queued_acquires(client: ringlock.Client, key: Callable[[str], str]) -> None:
    name = key("queued")
    holder = client.lock(name, lease=30)
    assert holder.acquire()

    def wait_for_it() -> int:
        lock = client.lock(name, lease=10, wait=30)
        assert lock.acquire()
        token = lock.token
        assert lock.release()
        return token  # type: ignore[return-value]

    with ThreadPoolExecutor(3) as pool:
        waiting = [pool.submit(wait_for_it) for _ in range(3)]
        wait_until(lambda: client.inspect(name).waiters == 3, "three queued acquires")
        state = client.inspect(name)
        assert state.token == holder.token and state.lease_left > 0
        held_by = holder.token
        assert holder.release()
        tokens = [future.result(30) for future in waiting]
    assert all(token > held_by for token in tokens)  # type: ignore[operator]
    assert client.inspect(name) == ringlock.KeyState(name, None, 0.0, 0)


def test_inspect_refuses_a_bad_key_before_sending(client: ringlock.Client) -> None:
    for bad in ("", "two words", "x" * 251, "-", "nul\0"):
        with pytest.raises(ValueError):
            client.inspect(bad)
    assert client.ping().role == "active", "nothing was sent: the connections are fine"


def test_inspect_follows_a_standby_redirect(server: Server, key: Callable[[str], str]) -> None:
    standby = InspectStandby(server.address)
    try:
        with ringlock.Client(standby.address) as client:
            # Given only the standby: its M names the active, which answers.
            assert client.inspect(key("moved")) == ringlock.KeyState(key("moved"), None, 0.0, 0)
            assert standby.redirected >= 1 and client.active_node == server.address
            with client.lock(key("moved"), lease=10) as lock:
                assert client.inspect(key("moved")).token == lock.token
    finally:
        standby.close()


def test_bad_arguments_are_refused_before_sending(client: ringlock.Client) -> None:
    with pytest.raises(ValueError):
        client.lock("two words")
    with pytest.raises(ValueError):
        client.lock("k", lease=0)
    with pytest.raises(ValueError):
        ringlock.Client([])


def test_a_closed_client_fails_fast(server: Server, key: Callable[[str], str]) -> None:
    client = ringlock.Client(server.address)
    client.ping()
    client.close()
    with pytest.raises(ringlock.NoActiveNodeError):
        client.lock(key("closed")).acquire()


def test_no_server_is_a_connection_error_naming_the_address_and_errno(key: Callable[[str], str]) -> None:
    import errno
    import socket

    # Bound but not listening: connections are refused, and no other test
    # can take the port meanwhile.
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"
        with ringlock.Client(address, connect_limit=0.3) as client:
            with pytest.raises(ConnectionError) as raised:
                client.ping()
            with pytest.raises(ringlock.NoConnectionError):
                client.lock(key("nowhere"), lease=10).acquire(blocking=False)
    error = raised.value
    assert isinstance(error, ringlock.NoConnectionError) and isinstance(error, ringlock.NoActiveNodeError)
    assert error.errno == errno.ECONNREFUSED
    assert error.addresses == [address]
    assert error.failures[0].errno == errno.ECONNREFUSED
    assert 0.2 <= error.waited < 10, error.waited
    assert str(error).startswith("no usable connection after 0.")
    assert f"{address} (connection refused)" in str(error), str(error)


@pytest.mark.testkit
def test_a_ping_to_a_node_that_accepts_then_closes_fails_within_the_connect_limit(server: Server, kit: Testkit) -> None:
    proxy, address = kit.proxy(server.address)
    # Every connection is accepted and closed at once, before it answers:
    # the ping goes out on each and is cut, which must not start its wait
    # for a connection over.
    kit("refuse", proxy, "on")
    outcome: list[BaseException | None] = []

    def ping() -> None:
        try:
            client.ping()
        except BaseException as error:  # handed to the test's thread
            outcome.append(error)
        else:
            outcome.append(None)

    with ringlock.Client(address, connect_limit=1.0, reconnect_delay_max=0.2) as client:
        # A thread, so that a hang fails the test rather than blocking it.
        pinger = threading.Thread(target=ping, daemon=True)
        pinger.start()
        pinger.join(60)
        assert outcome, "the ping still waits"
    error = outcome[0]
    assert isinstance(error, ringlock.NoConnectionError), repr(error)
    assert error.addresses == [address]


@pytest.mark.testkit
def test_an_extend_of_a_grant_that_waited_longer_than_its_lease_waits_for_a_connection(
    server: Server, kit: Testkit, key: Callable[[str], str]
) -> None:
    proxy, address = kit.proxy(server.address)
    with ringlock.Client(server.address) as other, ringlock.Client(address, reconnect_delay_max=0.2) as client:
        # The holder's lease runs out 8 s from now, and only then is the key
        # granted to the acquire below, whose 5 s lease starts with the grant.
        assert other.lock(key("late-grant"), lease=8).acquire()
        lock = client.lock(key("late-grant"), lease=5)
        assert lock.acquire()
        # No connection: the extend waits for one within the lease it has left.
        kit("refuse", proxy, "on")
        kit("cut", proxy)
        wait_until(lambda: client.usable_connection_count == 0, "both connections to be seen broken")
        outcome: list[BaseException | None] = []

        def extend() -> None:
            try:
                lock.extend(5)
            except BaseException as error:  # handed to the test's thread
                outcome.append(error)
            else:
                outcome.append(None)

        extender = threading.Thread(target=extend, daemon=True)
        extender.start()
        assert client._router is not None
        router = client._router
        wait_until(lambda: len(router._waiting) == 1 or bool(outcome), "the extend to wait for a connection, or to end")
        kit("refuse", proxy, "off")
        extender.join(60)
        assert outcome == [None], "extended once a connection came back"
        assert lock.release() is True
