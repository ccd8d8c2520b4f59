"""The sync API against a real server: what a user sees."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

import ringlock
from harness import Server


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


def test_no_server_is_an_error_not_a_hang(key: Callable[[str], str]) -> None:
    import socket

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"
        with ringlock.Client(address) as client, pytest.raises(ringlock.NoActiveNodeError):
            client.ping()
