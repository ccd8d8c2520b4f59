"""docs/protocol.md §4 behaviours of the sync client, one test per id of
``clients/scenarios.json``, against the real server and ringlock-testkit."""

from __future__ import annotations

import errno
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
    Cluster,
    Recorder,
    RawConnection,
    Server,
    Testkit,
    assert_backoff_shape,
    assert_no_connection,
    assert_refused_secret,
    assert_sent_only_tls,
    assert_tls_failure,
    cli_acquire,
    raw_line,
    refusing_address,
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


@scenario("shutting-down-retried")
def test_shutting_down_retried(fresh_server: Server, key: Callable[[str], str]) -> None:
    name = key("stopping")
    holder = RawConnection(fresh_server.address)
    try:
        assert holder.call(f"A {name} 60 0").startswith("A ")
        with ringlock.Client(fresh_server.address) as client:
            lock = client.lock(name, lease=30, wait=20)
            with ThreadPoolExecutor(1) as pool:
                granted = pool.submit(lock.acquire)
                wait_until(lambda: holder.call(f"I {name}").split()[-1] == "1", "the acquire to be queued")
                # The stopping server answers the queued acquire
                # shutting-down, which had no effect: the client sends it
                # again to the next server, within its wait.
                assert fresh_server.terminate() == 0
                fresh_server.restart()
                assert granted.result(20) is True
            assert lock.release() is True
    finally:
        holder.close()


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


@scenario("wait-forms")
def test_wait_forms(server: Server, key: Callable[[str], str]) -> None:
    name = key("forms")
    with ringlock.Client(server.address) as holder_client, ringlock.Client(server.address) as client:
        holder = holder_client.lock(name, lease=30)
        assert holder.acquire()
        with ThreadPoolExecutor(1) as pool:
            # Each returns while the holder holds the key (one queued behind
            # it would not): never queued.
            for wait in (ringlock.TRY_ONCE, 0):
                tried = pool.submit(client.lock(name, lease=30, wait=wait).acquire)
                assert tried.result(20) is False, f"wait={wait!r} while held"
            assert pool.submit(client.lock(name, lease=30).acquire, blocking=False).result(20) is False
        assert client.inspect(name).waiters == 0, "no try left queued behind the holder"
        assert client.lock(name, lease=30, wait=0.2).acquire() is False, "the wait ran out"
        for wait in (-1, 86_401, float("inf"), float("nan")):
            with pytest.raises(ValueError, match=r"TRY_ONCE \(0\), 0\.001 to 86400 seconds, or NO_LIMIT \(None\)"):
                client.lock(name, lease=30, wait=wait)
        queued = client.lock(name, lease=30, wait=ringlock.NO_LIMIT)
        with ThreadPoolExecutor(1) as pool:
            granted = pool.submit(queued.acquire)
            wait_until(lambda: client.inspect(name).waiters == 1, "the NO_LIMIT acquire to queue")
            assert holder.token is not None
            holder_token = holder.token
            assert holder.release()
            assert granted.result(20) is True
        assert queued.token is not None and queued.token > holder_token
        assert queued.release()
        free = client.lock(name, lease=30, wait=ringlock.TRY_ONCE)
        assert free.acquire() is True, "a free key is taken at once"
        assert free.release()


@scenario("held-asks-server")
def test_held_asks_server(fresh_server: Server, key: Callable[[str], str]) -> None:
    with ringlock.Client(fresh_server.address) as client:
        lock = client.lock(key("asked"), lease=30)
        assert lock.held() is False, "not acquired"
        assert lock.acquire()
        assert lock.held() is True
        assert raw_line(fresh_server.address, f"R {key('asked')} {lock.token}") == f"R {key('asked')}"
        assert lock.held() is False, "released elsewhere with its token"
        assert lock.locked() is True, "the local view cannot know"
        other = client.lock(key("asked"), lease=30)
        assert other.acquire()
        assert lock.held() is False, "another grant's token holds the key"
        assert other.release()

        forgotten = client.lock(key("restart"), lease=30)
        assert forgotten.acquire() and forgotten.held()
        fresh_server.kill()
        fresh_server.restart()
        assert forgotten.held() is False, "the restarted server holds no grant of it"
        assert forgotten.locked() is True, "the local view cannot know"

        short = client.lock(key("short"), lease=0.1)
        assert short.acquire() and short.locked()
        wait_until(lambda: not short.locked(), "the lease to run out locally")
        assert short.lost is None, "not auto-extended: run out, not declared lost"
        wait_until(lambda: not short.held(), "the server to expire it")


@scenario("lock-from-key-and-token")
def test_lock_from_key_and_token(server: Server, key: Callable[[str], str]) -> None:
    name = key("cli")
    token = cli_acquire(server.address, name)
    with ringlock.Client(server.address) as client:
        wrong = client.lock_from(name, token + 1)
        assert wrong.held() is False, "a wrong token"
        assert wrong.release() is False, "a wrong token releases nothing"
        lock = client.lock_from(name, token)
        assert lock.token == token and lock.locked() and lock.held()
        lock.extend(20)
        assert lock.release() is True
        assert client.inspect(name).token is None, "released from Python"
        with pytest.raises(ValueError, match="u64"):
            client.lock_from(name, -1)
        with pytest.raises(ValueError):
            client.lock_from("two words", 1)
        with pytest.raises(ValueError):
            client.lock_from(name, token, lease=0)


@scenario("single-node-restart-reports-lost")
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
            assert lock.held() is False
        assert sorted(id(lock) for lock, _ in seen) == sorted(id(lock) for lock in locks), "each callback once"


@scenario("error-kinds")
def test_error_kinds(key: Callable[[str], str]) -> None:
    name = key("errors")
    server = Server("--max-lease", "60")
    try:
        error_kinds(server.address, name)
    finally:
        server.stop()


def error_kinds(address: str, name: str) -> None:
    with ringlock.Client(address) as client:
        # Bad arguments, refused before sending, naming the range.
        with pytest.raises(ValueError, match=r"0\.001 seconds up to the server's --max-lease"):
            client.lock(name, lease=0)
        with pytest.raises(ValueError, match=r"0\.001 to 86400 seconds"):
            client.lock(name, lease=30, wait=-1)
        # A lease above the server's limit: its bad-lease, naming the limit.
        with pytest.raises(ringlock.RinglockError, match="--max-lease") as refused:
            client.lock(name, lease=120).acquire()
        assert refused.value.code == "bad-lease"
        # Timeout: no grant.
        holder = client.lock(name, lease=30)
        assert holder.acquire()
        assert client.lock(name, lease=30, wait=0.05).acquire() is False
        with pytest.raises(ringlock.LockTimeoutError), client.lock(name, lease=30, wait=0.05):
            pytest.fail("the body ran without the lock")
        # Not holder, once the grant is gone.
        assert holder.token is not None
        stale = client.lock_from(name, holder.token)
        assert holder.release() is True
        with pytest.raises(ringlock.LockLostError) as lost:
            stale.extend(10)
        assert lost.value.code == "not-holder"
        assert stale.release() is False, "nothing left to release"
    # No connection: a ConnectionError with the address and the OS error.
    sock, address = refusing_address()
    with sock, ringlock.Client(address, connect_limit=0.3) as unreachable:
        with pytest.raises(ConnectionError) as raised:
            unreachable.ping()
        error = raised.value
        assert isinstance(error, ringlock.NoConnectionError)
        assert error.address == address and error.errno == errno.ECONNREFUSED
        assert f"{address} (connection refused)" in str(error)


@scenario("failover-keeps-auto-extended-lock")
def test_failover_keeps_auto_extended_lock(cluster: Cluster) -> None:
    lease = 3.0
    lost: list[ringlock.LockLostError] = []
    with ringlock.Client(cluster.addresses) as holder_client, ringlock.Client(cluster.addresses) as rival:
        active = cluster.wait_single_active("an active node")
        _, since = cluster.table(active)
        lock = holder_client.lock(
            "failover/kept", lease=lease, auto_extend=True, on_lost=lambda lock, error: lost.append(error)
        )
        assert lock.acquire()
        token = lock.token
        cluster.wait_replicated(active, since)
        cluster.kill(active)
        assert cluster.wait_single_active("a standby to take over") != active
        # Longer than the lease: granted unless the extends reach the new active.
        taken = rival.lock("failover/kept", lease=30, wait=lease * 1.5)
        assert taken.acquire() is False, f"the key stayed held through the failover\n{cluster.logs()}"
        assert lost == [] and lock.lost is None and not lock.lost_event.is_set(), "not reported lost"
        assert lock.locked()
        assert lock.held() is True, "held on the new active"
        lock.extend(lease)
        assert lock.token == token
        assert lock.release() is True, "the old token releases it"
        after = rival.lock("failover/kept", lease=30, wait=ringlock.TRY_ONCE)
        assert after.acquire() is True
        assert token is not None and after.token is not None and after.token > token, "the new active's epoch"
        assert after.release()
