"""docs/protocol.md §4 behaviours of the sync client, one test per id of
``clients/scenarios.json``, against the real server and ringlock-testkit."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

import ringlock
import test_silent
from conftest import Scenarios
from harness import (
    ALPHA_SECRET,
    BETA_SECRET,
    AuthFile,
    Certs,
    Recorder,
    Server,
    Testkit,
    assert_backoff_shape,
    assert_no_connection,
    assert_refused_secret,
    assert_sent_only_tls,
    assert_tls_failure,
    wait_until,
)

pytestmark = pytest.mark.testkit

scenario = Scenarios("sync")


def test_every_scenario_has_a_test() -> None:
    scenario.check_complete()


def cycle(client: ringlock.Client, key: str) -> None:
    lock = client.lock(key, lease=10, wait=5)
    assert lock.acquire()
    assert lock.release() is True


@scenario("one-address-two-connections")
def test_one_address_two_connections(server: Server, kit: Testkit) -> None:
    proxy, address = kit.proxy(server.address)
    with ringlock.Client(address) as client:
        assert client.ping().role == "active"
        kit("wait-open", proxy, 2)
        assert client.connection_count == 2


@scenario("round-robin")
def test_round_robin(server: Server, kit: Testkit, key: Callable[[str], str]) -> None:
    first, first_address = kit.proxy(server.address)
    second, second_address = kit.proxy(server.address)
    with ringlock.Client([first_address, second_address]) as client:
        for index in range(6):
            cycle(client, f"{key('rr')}-{index}")
        # Acquires and releases alike: what matters is that both carry requests.
        kit("wait-upstream", first, "-", key("rr"))
        kit("wait-upstream", second, "-", key("rr"))


@scenario("cut-node-left-out-and-reconnected")
def test_cut_node_left_out_and_reconnected(server: Server, kit: Testkit, key: Callable[[str], str]) -> None:
    first, first_address = kit.proxy(server.address)
    second, second_address = kit.proxy(server.address)
    with ringlock.Client([first_address, second_address]) as client:
        client.ping()
        kit("wait-open", first, 1)
        kit("wait-open", second, 1)
        kit("refuse", first, "on")
        kit("cut", first)
        for index in range(20):
            cycle(client, key(f"cut{index}"))
        accepted = kit.count("accepted", first)
        kit("refuse", first, "off")
        kit("wait-accepted", first, accepted + 1)
        kit("wait-open", first, 1)
        wait_until(lambda: client.usable_connection_count == 2, "both connections up")
        for index in range(4):
            cycle(client, key(f"back{index}"))


@scenario("pipelined-pairing-out-of-order")
def test_pipelined_pairing_out_of_order(server: Server, kit: Testkit, key: Callable[[str], str]) -> None:
    count = 16
    proxy, address = kit.proxy(server.address)
    with ringlock.Client(address) as client:
        client.ping()
        kit("reorder", proxy, "on")
        start = threading.Barrier(count)

        def acquire(index: int) -> ringlock.Lock:
            lock = client.lock(key(f"ooo{index}"), lease=10)
            start.wait()
            assert lock.acquire()
            return lock

        with ThreadPoolExecutor(count) as pool:
            locks = list(pool.map(acquire, range(count)))
        kit("resume", proxy)
        assert len({lock.token for lock in locks}) == count
        for index, lock in enumerate(locks):
            assert lock.key == key(f"ooo{index}")
            assert lock.release() is True, "the token was the grant of this key"


@scenario("same-key-in-send-order")
def test_same_key_in_send_order(fresh_server: Server, kit: Testkit) -> None:
    _, address = kit.proxy(fresh_server.address)
    with ringlock.Client(address) as client:
        first = client.lock("same", lease=10)
        assert first.acquire()
        first_token = first.token
        assert first_token is not None
        second = client.lock("same", lease=10, wait=None)
        with ThreadPoolExecutor(1) as pool:
            granted = pool.submit(second.acquire)
            wait_until(lambda: client.stats()["total"]["waiters"] == 1, "the second acquire queued")
            assert first.release() is True
            assert granted.result(20) is True
        assert second.token is not None and second.token > first_token
        assert second.release() is True


@scenario("acquire-moves-on-cut")
def test_acquire_moves_on_cut(server: Server, kit: Testkit, key: Callable[[str], str]) -> None:
    proxy, address = kit.proxy(server.address)
    name = key("moves")
    with ringlock.Client(address) as client:
        client.ping()
        kit("wait-open", proxy, 2)
        kit("stall", proxy)
        lock = client.lock(name, lease=10)
        with ThreadPoolExecutor(1) as pool:
            granted = pool.submit(lock.acquire)
            (connection,) = kit("wait-upstream", proxy, "-", f"A {name} ")
            kit("cut", proxy, connection)
            kit("resume", proxy)
            assert granted.result(20) is True
        assert client.lock(name, lease=10).acquire(timeout=0.2) is False, "held exactly once"
        assert lock.release() is True


@scenario("no-connection-left")
def test_no_connection_left(server: Server, kit: Testkit, key: Callable[[str], str]) -> None:
    proxy, address = kit.proxy(server.address)
    with ringlock.Client(address) as client:
        client.ping()
        # A connection still being accepted when refusing starts would be
        # forwarded after the cut.
        kit("wait-open", proxy, 2)
        kit("refuse", proxy, "on")
        kit("cut", proxy)
        kit("wait-open", proxy, 0)
        started = time.monotonic()
        with pytest.raises(ringlock.NoConnectionError) as raised:
            client.lock(key("nothing"), lease=10, wait=1).acquire()
        assert_no_connection(raised.value, address, time.monotonic() - started, 1.0)


@scenario("restart-within-wait")
def test_restart_within_wait(fresh_server: Server, key: Callable[[str], str]) -> None:
    with ringlock.Client(fresh_server.address) as client:
        before = client.lock(key("before"), lease=30)
        assert before.acquire()
        assert before.token is not None
        fresh_server.kill()
        wait_until(lambda: client.usable_connection_count == 0, "the client to see its connections broken")
        lock = client.lock(key("restarted"), lease=30, wait=20)
        with ThreadPoolExecutor(1) as pool:
            granted = pool.submit(lock.acquire)
            # The acquire waits for a connection; the server comes back
            # within about 100 ms of the kill.
            wait_until(lambda: len(client._router._waiting) == 1, "the acquire to wait for a connection")
            fresh_server.restart()
            assert granted.result(20) is True
        assert lock.token is not None and lock.token > before.token, "a new epoch's token"
        assert lock.release() is True


@scenario("connect-backoff")
def test_connect_backoff(server: Server, kit: Testkit) -> None:
    proxy, address = kit.proxy(server.address)
    kit("refuse", proxy, "on")
    with ringlock.Client(address, connections_per_node=1, reconnect_delay_max=1.0):
        kit("wait-attempts", proxy, 9)
        assert_backoff_shape(kit("attempts", proxy))


@scenario("release-retried")
def test_release_retried(server: Server, kit: Testkit, key: Callable[[str], str]) -> None:
    proxy, address = kit.proxy(server.address)
    name = key("retried")
    with ringlock.Client(address) as client:
        lock = client.lock(name, lease=30)
        assert lock.acquire()
        kit("stall", proxy)
        with ThreadPoolExecutor(1) as pool:
            released = pool.submit(lock.release)
            kit("wait-upstream", proxy, "-", f"R {name} ")
            kit("cut", proxy)
            kit("resume", proxy)
            # The client reconnects at once, inside the 5 s of retries.
            assert released.result(20) is True
        fresh = client.lock(name, lease=10)
        assert fresh.acquire(timeout=0.1), "the key was free at once"
        fresh.release()


@scenario("redirect-followed")
def test_redirect_followed(server: Server, kit: Testkit, key: Callable[[str], str]) -> None:
    fake, fake_address = kit.fake(server.address)
    with ringlock.Client([fake_address, server.address]) as client:
        for index in range(20):
            cycle(client, key(f"redirect{index}"))
        redirected = kit.count("redirected", fake)
        assert redirected >= 1, "round-robin sent some requests to the standby"
        assert client.active_node == server.address
        for index in range(20):
            cycle(client, key(f"after{index}"))
        assert kit.count("redirected", fake) == redirected, "requests go to the active only"


@scenario("redirect-to-no-active")
def test_redirect_to_no_active(kit: Testkit, key: Callable[[str], str]) -> None:
    _, fake_address = kit.fake("-")
    with ringlock.Client(fake_address) as client:
        with pytest.raises(ringlock.NoActiveNodeError) as raised:
            client.lock(key("orphan"), lease=10, wait=0.5).acquire()
        assert raised.value.code == "no-active"


@scenario("timeout-is-not-a-grant")
def test_timeout_is_not_a_grant(server: Server, key: Callable[[str], str]) -> None:
    name = key("contended")
    with ringlock.Client(server.address) as holder_client, ringlock.Client(server.address) as other_client:
        holder = holder_client.lock(name, lease=30)
        assert holder.acquire()
        assert other_client.lock(name, lease=30, wait=0.2).acquire() is False
        with pytest.raises(ringlock.LockTimeoutError), other_client.lock(name, lease=30, wait=0.2):
            pytest.fail("the body ran without the lock")
        holder.extend(30)  # still the holder
        assert holder.release() is True


@scenario("delayed-replies")
def test_delayed_replies(server: Server, kit: Testkit, key: Callable[[str], str]) -> None:
    proxy, address = kit.proxy(server.address)
    kit("delay", proxy, 300)
    with ringlock.Client(address) as client:
        lock = client.lock(key("slow"), lease=10)
        assert lock.acquire()
        token = lock.token
        lock.extend(20)
        assert lock.token == token
        assert lock.release() is True


scenario("silent-connection-suspected")(
    test_silent.test_sync_acquire_on_a_single_black_holed_address_fails_then_the_client_reconnects
)


@scenario("auth-ok")
def test_auth_ok(auth_server: tuple[Server, AuthFile]) -> None:
    server, _ = auth_server
    with ringlock.Client(server.address, secret=ALPHA_SECRET) as client:
        cycle(client, "alpha/ok")
        assert client.authenticated_name == "alpha"
        assert ALPHA_SECRET not in repr(client.settings)


@scenario("auth-wrong")
def test_auth_wrong(auth_server: tuple[Server, AuthFile]) -> None:
    server, _ = auth_server
    with ringlock.Client(server.address, secret="not-the-secret") as client:
        started = time.monotonic()
        with pytest.raises(ringlock.AuthenticationError) as raised:
            client.lock("alpha/wrong", lease=10, wait=1).acquire()
        assert_refused_secret(raised.value, server.address, time.monotonic() - started)
        assert client.authenticated_name is None


@scenario("auth-forbidden-key")
def test_auth_forbidden_key(auth_server: tuple[Server, AuthFile]) -> None:
    server, _ = auth_server
    with ringlock.Client(server.address, secret=ALPHA_SECRET) as client:
        with pytest.raises(ringlock.ForbiddenError) as raised:
            client.lock("beta/theirs", lease=10, wait=1).acquire()
        assert raised.value.code == "forbidden" and raised.value.key == "beta/theirs"
        cycle(client, "alpha/mine")
        assert client.usable_connection_count == 2, "the forbidden key broke no connection"


@scenario("auth-revoked-on-reload")
def test_auth_revoked_on_reload(auth_server: tuple[Server, AuthFile]) -> None:
    server, auth = auth_server
    with (
        ringlock.Client(server.address, secret=ALPHA_SECRET) as alpha,
        ringlock.Client(server.address, secret=BETA_SECRET) as beta,
    ):
        cycle(alpha, "alpha/before")
        cycle(beta, "beta/before")
        wait_until(lambda: alpha.usable_connection_count == 2, "both of alpha's connections up")
        auth.write({"beta": BETA_SECRET})
        server.signal(signal.SIGHUP)
        # The server closes alpha's connections; the client reconnects, and
        # its secret is refused from then on.
        wait_until(lambda: alpha.usable_connection_count == 0, "alpha's connections revoked")
        started = time.monotonic()
        with pytest.raises(ringlock.AuthenticationError) as raised:
            alpha.lock("alpha/after", lease=10, wait=1).acquire()
        assert_refused_secret(raised.value, server.address, time.monotonic() - started)
        cycle(beta, "beta/after")


@scenario("auth-reconnect")
def test_auth_reconnect(auth_server: tuple[Server, AuthFile]) -> None:
    server, _ = auth_server
    with ringlock.Client(server.address, secret=ALPHA_SECRET) as client:
        cycle(client, "alpha/before")
        server.kill()
        wait_until(lambda: client.usable_connection_count == 0, "the client to see its connections broken")
        server.restart()
        # Granted only if the new connections authenticated: the server
        # answers auth-required to anything else.
        lock = client.lock("alpha/after", lease=10, wait=5)
        assert lock.acquire()
        assert lock.release() is True


@scenario("tls-connect")
def test_tls_connect(tls_server: Server, certs: Certs, key: Callable[[str], str]) -> None:
    with ringlock.Client(tls_server.address, tls_ca=certs.path("ca.pem")) as client:
        lock = client.lock(key("tls"), lease=10, wait=5)
        assert lock.acquire()
        lock.extend(20)
        assert lock.release() is True

        def one(index: int) -> bool:
            lock = client.lock(key(f"tls-{index}"), lease=10, wait=5)
            return lock.acquire() and lock.release()

        with ThreadPoolExecutor(64) as pool:
            assert all(pool.map(one, range(64)))


@scenario("tls-mtls")
def test_tls_mtls(mtls_server: Server, certs: Certs) -> None:
    with ringlock.Client(
        mtls_server.address,
        tls_ca=certs.path("ca.pem"),
        tls_cert=certs.path("client.pem"),
        tls_key=certs.path("client-key.pem"),
    ) as client:
        cycle(client, "mtls/with-certificate")
    with ringlock.Client(mtls_server.address, tls_ca=certs.path("ca.pem")) as client:
        started = time.monotonic()
        with pytest.raises(ConnectionError) as raised:
            client.lock("mtls/without", lease=10, wait=1).acquire()
        assert_tls_failure(raised.value, mtls_server.address, time.monotonic() - started, "certificate required")


@scenario("tls-wrong-ca")
def test_tls_wrong_ca(tls_server: Server, certs: Certs) -> None:
    recorder = Recorder(tls_server.address)
    try:
        with ringlock.Client(recorder.address, tls_ca=certs.path("other-ca.pem")) as client:
            started = time.monotonic()
            with pytest.raises(ringlock.TLSError) as raised:
                client.lock("tls/wrong-ca", lease=10, wait=1).acquire()
            assert_tls_failure(raised.value, recorder.address, time.monotonic() - started, "not trusted")
        assert_sent_only_tls(recorder, "tls/wrong-ca")
    finally:
        recorder.close()
