"""docs/protocol.md §4 behaviours of the asyncio client, one test per id of
``clients/scenarios.json``, against the real server and ringlock-testkit.

Control commands block until the kit answers, so they run in a thread
(``control``) while the loop serves the client's connections.
"""

from __future__ import annotations

import asyncio
import errno
import signal
import time
from collections.abc import Callable

import pytest

import ringlock
import ringlock.aio
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

scenario = Scenarios("asyncio")


def test_every_scenario_has_a_test() -> None:
    scenario.check_complete()


async def control(kit: Testkit, *words: object) -> list[str]:
    return await asyncio.to_thread(kit, *words)


async def cycle(client: ringlock.aio.Client, key: str) -> None:
    lock = client.lock(key, lease=10, wait=5)
    assert await lock.acquire()
    assert await lock.release() is True


@scenario("one-address-two-connections")
async def test_one_address_two_connections(server: Server, kit: Testkit) -> None:
    proxy, address = kit.proxy(server.address)
    async with ringlock.aio.Client(address) as client:
        assert (await client.ping()).role == "active"
        await control(kit, "wait-open", proxy, 2)
        assert client.connection_count == 2


@scenario("round-robin")
async def test_round_robin(server: Server, kit: Testkit, key: Callable[[str], str]) -> None:
    first, first_address = kit.proxy(server.address)
    second, second_address = kit.proxy(server.address)
    async with ringlock.aio.Client([first_address, second_address]) as client:
        for index in range(6):
            await cycle(client, f"{key('rr')}-{index}")
        await control(kit, "wait-upstream", first, "-", key("rr"))
        await control(kit, "wait-upstream", second, "-", key("rr"))


@scenario("cut-node-left-out-and-reconnected")
async def test_cut_node_left_out_and_reconnected(server: Server, kit: Testkit, key: Callable[[str], str]) -> None:
    first, first_address = kit.proxy(server.address)
    second, second_address = kit.proxy(server.address)
    async with ringlock.aio.Client([first_address, second_address]) as client:
        await client.ping()
        await control(kit, "wait-open", first, 1)
        await control(kit, "wait-open", second, 1)
        await control(kit, "refuse", first, "on")
        await control(kit, "cut", first)
        for index in range(20):
            await cycle(client, key(f"cut{index}"))
        accepted = int((await control(kit, "accepted", first))[0])
        await control(kit, "refuse", first, "off")
        await control(kit, "wait-accepted", first, accepted + 1)
        await control(kit, "wait-open", first, 1)
        while client.usable_connection_count < 2:
            await asyncio.sleep(0.01)
        for index in range(4):
            await cycle(client, key(f"back{index}"))


@scenario("pipelined-pairing-out-of-order")
async def test_pipelined_pairing_out_of_order(server: Server, kit: Testkit, key: Callable[[str], str]) -> None:
    count = 16
    proxy, address = kit.proxy(server.address)
    async with ringlock.aio.Client(address) as client:
        await client.ping()
        await control(kit, "reorder", proxy, "on")
        locks = [client.lock(key(f"ooo{index}"), lease=10) for index in range(count)]
        assert all(await asyncio.gather(*(lock.acquire() for lock in locks)))
        await control(kit, "resume", proxy)
        assert len({lock.token for lock in locks}) == count
        for index, lock in enumerate(locks):
            assert lock.key == key(f"ooo{index}")
            assert await lock.release() is True, "the token was the grant of this key"


@scenario("same-key-in-send-order")
async def test_same_key_in_send_order(fresh_server: Server, kit: Testkit) -> None:
    _, address = kit.proxy(fresh_server.address)
    async with ringlock.aio.Client(address) as client:
        first = client.lock("same", lease=10)
        assert await first.acquire()
        first_token = first.token
        assert first_token is not None
        second = client.lock("same", lease=10, wait=None)
        granted = asyncio.create_task(second.acquire())
        while (await client.stats())["total"]["waiters"] != 1:
            await asyncio.sleep(0.01)
        assert await first.release() is True
        assert await asyncio.wait_for(granted, 20) is True
        assert second.token is not None and second.token > first_token
        assert await second.release() is True


@scenario("acquire-moves-on-cut")
async def test_acquire_moves_on_cut(server: Server, kit: Testkit, key: Callable[[str], str]) -> None:
    proxy, address = kit.proxy(server.address)
    name = key("moves")
    async with ringlock.aio.Client(address) as client:
        await client.ping()
        await control(kit, "wait-open", proxy, 2)
        await control(kit, "stall", proxy)
        lock = client.lock(name, lease=10)
        granted = asyncio.create_task(lock.acquire())
        (connection,) = await control(kit, "wait-upstream", proxy, "-", f"A {name} ")
        await control(kit, "cut", proxy, connection)
        await control(kit, "resume", proxy)
        assert await asyncio.wait_for(granted, 20) is True
        assert await client.lock(name, lease=10).acquire(timeout=0.2) is False, "held exactly once"
        assert await lock.release() is True


@scenario("no-connection-left")
async def test_no_connection_left(server: Server, kit: Testkit, key: Callable[[str], str]) -> None:
    proxy, address = kit.proxy(server.address)
    async with ringlock.aio.Client(address) as client:
        await client.ping()
        # A connection still being accepted when refusing starts would be
        # forwarded after the cut.
        await control(kit, "wait-open", proxy, 2)
        await control(kit, "refuse", proxy, "on")
        await control(kit, "cut", proxy)
        await control(kit, "wait-open", proxy, 0)
        started = time.monotonic()
        with pytest.raises(ringlock.NoConnectionError) as raised:
            await client.lock(key("nothing"), lease=10, wait=1).acquire()
        assert_no_connection(raised.value, address, time.monotonic() - started, 1.0)


@scenario("restart-within-wait")
async def test_restart_within_wait(fresh_server: Server, key: Callable[[str], str]) -> None:
    async with ringlock.aio.Client(fresh_server.address) as client:
        before = client.lock(key("before"), lease=30)
        assert await before.acquire()
        assert before.token is not None
        fresh_server.kill()
        await asyncio.to_thread(
            wait_until, lambda: client.usable_connection_count == 0, "the client to see its connections broken"
        )
        lock = client.lock(key("restarted"), lease=30, wait=20)
        granted = asyncio.create_task(lock.acquire())
        # The acquire waits for a connection; the server comes back within
        # about 100 ms of the kill (restarted in a thread, as the loop must
        # keep serving the client meanwhile).
        assert client._router is not None
        router = client._router
        await asyncio.to_thread(wait_until, lambda: len(router._waiting) == 1, "the acquire to wait for a connection")
        await asyncio.to_thread(fresh_server.restart)
        assert await asyncio.wait_for(granted, 20) is True
        assert lock.token is not None and lock.token > before.token, "a new epoch's token"
        assert await lock.release() is True


@scenario("shutting-down-retried")
async def test_shutting_down_retried(fresh_server: Server, key: Callable[[str], str]) -> None:
    name = key("stopping")
    holder = RawConnection(fresh_server.address)
    try:
        assert holder.call(f"A {name} 60 0").startswith("A ")
        async with ringlock.aio.Client(fresh_server.address) as client:
            lock = client.lock(name, lease=30, wait=20)
            granted = asyncio.create_task(lock.acquire())
            # Waited for in a thread, as the loop must keep serving the
            # client meanwhile.
            await asyncio.to_thread(
                wait_until, lambda: holder.call(f"I {name}").split()[-1] == "1", "the acquire to be queued"
            )
            # The stopping server answers the queued acquire shutting-down,
            # which had no effect: the client sends it again to the next
            # server, within its wait.
            assert await asyncio.to_thread(fresh_server.terminate) == 0
            await asyncio.to_thread(fresh_server.restart)
            assert await asyncio.wait_for(granted, 20) is True
            assert await lock.release() is True
    finally:
        holder.close()


@scenario("connect-backoff")
async def test_connect_backoff(server: Server, kit: Testkit) -> None:
    proxy, address = kit.proxy(server.address)
    await control(kit, "refuse", proxy, "on")
    async with ringlock.aio.Client(address, connections_per_node=1, reconnect_delay_max=1.0):
        await control(kit, "wait-attempts", proxy, 9)
        assert_backoff_shape(await control(kit, "attempts", proxy))


@scenario("release-retried")
async def test_release_retried(server: Server, kit: Testkit, key: Callable[[str], str]) -> None:
    proxy, address = kit.proxy(server.address)
    name = key("retried")
    async with ringlock.aio.Client(address) as client:
        lock = client.lock(name, lease=30)
        assert await lock.acquire()
        await control(kit, "stall", proxy)
        released = asyncio.create_task(lock.release())
        await control(kit, "wait-upstream", proxy, "-", f"R {name} ")
        await control(kit, "cut", proxy)
        await control(kit, "resume", proxy)
        # The client reconnects at once, inside the 5 s of retries.
        assert await asyncio.wait_for(released, 20) is True
        fresh = client.lock(name, lease=10)
        assert await fresh.acquire(timeout=0.1), "the key was free at once"
        await fresh.release()


@scenario("redirect-followed")
async def test_redirect_followed(server: Server, kit: Testkit, key: Callable[[str], str]) -> None:
    fake, fake_address = kit.fake(server.address)
    async with ringlock.aio.Client([fake_address, server.address]) as client:
        for index in range(20):
            await cycle(client, key(f"redirect{index}"))
        redirected = int((await control(kit, "redirected", fake))[0])
        assert redirected >= 1, "round-robin sent some requests to the standby"
        assert client.active_node == server.address
        for index in range(20):
            await cycle(client, key(f"after{index}"))
        assert int((await control(kit, "redirected", fake))[0]) == redirected, "requests go to the active only"


@scenario("redirect-to-no-active")
async def test_redirect_to_no_active(kit: Testkit, key: Callable[[str], str]) -> None:
    _, fake_address = kit.fake("-")
    async with ringlock.aio.Client(fake_address) as client:
        with pytest.raises(ringlock.NoActiveNodeError) as raised:
            await client.lock(key("orphan"), lease=10, wait=0.5).acquire()
        assert raised.value.code == "no-active"


@scenario("timeout-is-not-a-grant")
async def test_timeout_is_not_a_grant(server: Server, key: Callable[[str], str]) -> None:
    name = key("contended")
    async with ringlock.aio.Client(server.address) as holder_client, ringlock.aio.Client(server.address) as other:
        holder = holder_client.lock(name, lease=30)
        assert await holder.acquire()
        assert await other.lock(name, lease=30, wait=0.2).acquire() is False
        with pytest.raises(ringlock.LockTimeoutError):
            async with other.lock(name, lease=30, wait=0.2):
                pytest.fail("the body ran without the lock")
        await holder.extend(30)  # still the holder
        assert await holder.release() is True


@scenario("delayed-replies")
async def test_delayed_replies(server: Server, kit: Testkit, key: Callable[[str], str]) -> None:
    proxy, address = kit.proxy(server.address)
    await control(kit, "delay", proxy, 300)
    async with ringlock.aio.Client(address) as client:
        lock = client.lock(key("slow"), lease=10)
        assert await lock.acquire()
        token = lock.token
        await lock.extend(20)
        assert lock.token == token
        assert await lock.release() is True


scenario("silent-connection-suspected")(
    test_silent.test_aio_acquire_on_a_single_black_holed_address_fails_then_the_client_reconnects
)


@scenario("auth-ok")
async def test_auth_ok(auth_server: tuple[Server, AuthFile]) -> None:
    server, _ = auth_server
    async with ringlock.aio.Client(server.address, secret=ALPHA_SECRET) as client:
        await cycle(client, "alpha/ok")
        assert client.authenticated_name == "alpha"
        assert ALPHA_SECRET not in repr(client.settings)


@scenario("auth-wrong")
async def test_auth_wrong(auth_server: tuple[Server, AuthFile]) -> None:
    server, _ = auth_server
    async with ringlock.aio.Client(server.address, secret="not-the-secret") as client:
        started = time.monotonic()
        with pytest.raises(ringlock.AuthenticationError) as raised:
            await client.lock("alpha/wrong", lease=10, wait=1).acquire()
        assert_refused_secret(raised.value, server.address, time.monotonic() - started)
        assert client.authenticated_name is None


@scenario("auth-forbidden-key")
async def test_auth_forbidden_key(auth_server: tuple[Server, AuthFile]) -> None:
    server, _ = auth_server
    async with ringlock.aio.Client(server.address, secret=ALPHA_SECRET) as client:
        with pytest.raises(ringlock.ForbiddenError) as raised:
            await client.lock("beta/theirs", lease=10, wait=1).acquire()
        assert raised.value.code == "forbidden" and raised.value.key == "beta/theirs"
        await cycle(client, "alpha/mine")
        assert client.usable_connection_count == 2, "the forbidden key broke no connection"


@scenario("auth-revoked-on-reload")
async def test_auth_revoked_on_reload(auth_server: tuple[Server, AuthFile]) -> None:
    server, auth = auth_server
    async with (
        ringlock.aio.Client(server.address, secret=ALPHA_SECRET) as alpha,
        ringlock.aio.Client(server.address, secret=BETA_SECRET) as beta,
    ):
        await cycle(alpha, "alpha/before")
        await cycle(beta, "beta/before")
        await until(lambda: alpha.usable_connection_count == 2, "both of alpha's connections up")
        auth.write({"beta": BETA_SECRET})
        server.signal(signal.SIGHUP)
        # The server closes alpha's connections; the client reconnects, and
        # its secret is refused from then on.
        await until(lambda: alpha.usable_connection_count == 0, "alpha's connections revoked")
        started = time.monotonic()
        with pytest.raises(ringlock.AuthenticationError) as raised:
            await alpha.lock("alpha/after", lease=10, wait=1).acquire()
        assert_refused_secret(raised.value, server.address, time.monotonic() - started)
        await cycle(beta, "beta/after")


@scenario("auth-reconnect")
async def test_auth_reconnect(auth_server: tuple[Server, AuthFile]) -> None:
    server, _ = auth_server
    async with ringlock.aio.Client(server.address, secret=ALPHA_SECRET) as client:
        await cycle(client, "alpha/before")
        server.kill()
        await until(lambda: client.usable_connection_count == 0, "the client to see its connections broken")
        await asyncio.to_thread(server.restart)
        # Granted only if the new connections authenticated: the server
        # answers auth-required to anything else.
        lock = client.lock("alpha/after", lease=10, wait=5)
        assert await lock.acquire()
        assert await lock.release() is True


@scenario("tls-connect")
async def test_tls_connect(tls_server: Server, certs: Certs, key: Callable[[str], str]) -> None:
    async with ringlock.aio.Client(tls_server.address, tls_ca=certs.path("ca.pem")) as client:
        lock = client.lock(key("tls"), lease=10, wait=5)
        assert await lock.acquire()
        await lock.extend(20)
        assert await lock.release() is True

        async def one(index: int) -> bool:
            lock = client.lock(key(f"tls-{index}"), lease=10, wait=5)
            return await lock.acquire() and await lock.release()

        assert all(await asyncio.gather(*(one(index) for index in range(64))))


@scenario("tls-mtls")
async def test_tls_mtls(mtls_server: Server, certs: Certs) -> None:
    async with ringlock.aio.Client(
        mtls_server.address,
        tls_ca=certs.path("ca.pem"),
        tls_cert=certs.path("client.pem"),
        tls_key=certs.path("client-key.pem"),
    ) as client:
        await cycle(client, "mtls/with-certificate")
    async with ringlock.aio.Client(mtls_server.address, tls_ca=certs.path("ca.pem")) as client:
        started = time.monotonic()
        with pytest.raises(ConnectionError) as raised:
            await client.lock("mtls/without", lease=10, wait=1).acquire()
        assert_tls_failure(raised.value, mtls_server.address, time.monotonic() - started, "certificate required")


@scenario("tls-wrong-ca")
async def test_tls_wrong_ca(tls_server: Server, certs: Certs) -> None:
    recorder = Recorder(tls_server.address)
    try:
        async with ringlock.aio.Client(recorder.address, tls_ca=certs.path("other-ca.pem")) as client:
            started = time.monotonic()
            with pytest.raises(ringlock.TLSError) as raised:
                await client.lock("tls/wrong-ca", lease=10, wait=1).acquire()
            assert_tls_failure(raised.value, recorder.address, time.monotonic() - started, "not trusted")
        assert_sent_only_tls(recorder, "tls/wrong-ca")
    finally:
        recorder.close()


@scenario("wait-forms")
async def test_wait_forms(server: Server, key: Callable[[str], str]) -> None:
    name = key("forms")
    async with ringlock.aio.Client(server.address) as holder_client, ringlock.aio.Client(server.address) as client:
        holder = holder_client.lock(name, lease=30)
        assert await holder.acquire()
        # Each returns while the holder holds the key (one queued behind it
        # would not): never queued.
        for wait in (ringlock.TRY_ONCE, 0):
            tried = client.lock(name, lease=30, wait=wait).acquire()
            assert await asyncio.wait_for(tried, 20) is False, f"wait={wait!r} while held"
        assert await asyncio.wait_for(client.lock(name, lease=30).acquire(blocking=False), 20) is False
        assert (await client.inspect(name)).waiters == 0, "no try left queued behind the holder"
        assert await client.lock(name, lease=30, wait=0.2).acquire() is False, "the wait ran out"
        for wait in (-1, 86_401, float("inf"), float("nan")):
            with pytest.raises(ValueError, match=r"TRY_ONCE \(0\), 0\.001 to 86400 seconds, or NO_LIMIT \(None\)"):
                client.lock(name, lease=30, wait=wait)
        queued = client.lock(name, lease=30, wait=ringlock.NO_LIMIT)
        granted = asyncio.create_task(queued.acquire())
        deadline = time.monotonic() + 20
        while (await client.inspect(name)).waiters != 1:
            assert time.monotonic() < deadline, "the NO_LIMIT acquire did not queue"
            await asyncio.sleep(0.01)
        assert holder.token is not None
        holder_token = holder.token
        assert await holder.release()
        assert await asyncio.wait_for(granted, 20) is True
        assert queued.token is not None and queued.token > holder_token
        assert await queued.release()
        free = client.lock(name, lease=30, wait=ringlock.TRY_ONCE)
        assert await free.acquire() is True, "a free key is taken at once"
        assert await free.release()


@scenario("held-asks-server")
async def test_held_asks_server(fresh_server: Server, key: Callable[[str], str]) -> None:
    async with ringlock.aio.Client(fresh_server.address) as client:
        lock = client.lock(key("asked"), lease=30)
        assert await lock.held() is False, "not acquired"
        assert await lock.acquire()
        assert await lock.held() is True
        reply = await asyncio.to_thread(raw_line, fresh_server.address, f"R {key('asked')} {lock.token}")
        assert reply == f"R {key('asked')}"
        assert await lock.held() is False, "released elsewhere with its token"
        assert lock.locked() is True, "the local view cannot know"
        other = client.lock(key("asked"), lease=30)
        assert await other.acquire()
        assert await lock.held() is False, "another grant's token holds the key"
        assert await other.release()

        forgotten = client.lock(key("restart"), lease=30)
        assert await forgotten.acquire() and await forgotten.held()
        await asyncio.to_thread(fresh_server.kill)
        await asyncio.to_thread(fresh_server.restart)
        assert await forgotten.held() is False, "the restarted server holds no grant of it"
        assert forgotten.locked() is True, "the local view cannot know"

        short = client.lock(key("short"), lease=0.1)
        assert await short.acquire() and short.locked()
        await until(lambda: not short.locked(), "the lease to run out locally")
        assert short.lost is None, "not auto-extended: run out, not declared lost"
        deadline = time.monotonic() + 20
        while await short.held():
            assert time.monotonic() < deadline, "the server did not expire it"
            await asyncio.sleep(0.01)


@scenario("lock-from-key-and-token")
async def test_lock_from_key_and_token(server: Server, key: Callable[[str], str]) -> None:
    name = key("cli")
    token = await asyncio.to_thread(cli_acquire, server.address, name)
    async with ringlock.aio.Client(server.address) as client:
        wrong = client.lock_from(name, token + 1)
        assert await wrong.held() is False, "a wrong token"
        assert await wrong.release() is False, "a wrong token releases nothing"
        lock = client.lock_from(name, token)
        assert lock.token == token and lock.locked() and await lock.held()
        await lock.extend(20)
        assert await lock.release() is True
        assert (await client.inspect(name)).token is None, "released from Python"
        with pytest.raises(ValueError, match="u64"):
            client.lock_from(name, -1)
        with pytest.raises(ValueError):
            client.lock_from("two words", 1)
        with pytest.raises(ValueError):
            client.lock_from(name, token, lease=0)


@scenario("single-node-restart-reports-lost")
async def test_single_node_restart_reports_lost(fresh_server: Server, key: Callable[[str], str]) -> None:
    seen: list[ringlock.aio.Lock] = []

    def on_lost(lock: ringlock.aio.Lock, error: ringlock.LockLostError) -> None:
        seen.append(lock)

    async with ringlock.aio.Client(fresh_server.address) as client:
        locks = [client.lock(key(f"restart-{index}"), lease=3, auto_extend=True, on_lost=on_lost) for index in range(4)]
        for lock in locks:
            assert await lock.acquire()
        await asyncio.to_thread(fresh_server.kill)
        await asyncio.to_thread(fresh_server.restart)
        for lock in locks:
            await asyncio.wait_for(lock.lost_event.wait(), 20)
            assert isinstance(lock.lost, ringlock.LockLostError)
            assert not lock.locked()
            assert await lock.held() is False
        assert sorted(map(id, seen)) == sorted(map(id, locks)), "each callback once"


@scenario("error-kinds")
async def test_error_kinds(key: Callable[[str], str]) -> None:
    name = key("errors")
    server = Server("--max-lease", "60")
    try:
        await error_kinds(server.address, name)
    finally:
        server.stop()


async def error_kinds(address: str, name: str) -> None:
    async with ringlock.aio.Client(address) as client:
        # Bad arguments, refused before sending, naming the range.
        with pytest.raises(ValueError, match=r"0\.001 seconds up to the server's --max-lease"):
            client.lock(name, lease=0)
        with pytest.raises(ValueError, match=r"0\.001 to 86400 seconds"):
            client.lock(name, lease=30, wait=-1)
        # A lease above the server's limit: its bad-lease, naming the limit.
        with pytest.raises(ringlock.RinglockError, match="--max-lease") as refused:
            await client.lock(name, lease=120).acquire()
        assert refused.value.code == "bad-lease"
        # Timeout: no grant.
        holder = client.lock(name, lease=30)
        assert await holder.acquire()
        assert await client.lock(name, lease=30, wait=0.05).acquire() is False
        with pytest.raises(ringlock.LockTimeoutError):
            async with client.lock(name, lease=30, wait=0.05):
                pytest.fail("the body ran without the lock")
        # Not holder, once the grant is gone.
        assert holder.token is not None
        stale = client.lock_from(name, holder.token)
        assert await holder.release() is True
        with pytest.raises(ringlock.LockLostError) as lost:
            await stale.extend(10)
        assert lost.value.code == "not-holder"
        assert await stale.release() is False, "nothing left to release"
    # No connection: a ConnectionError with the address and the OS error.
    sock, address = refusing_address()
    with sock:
        async with ringlock.aio.Client(address, connect_limit=0.3) as unreachable:
            with pytest.raises(ConnectionError) as raised:
                await unreachable.ping()
    error = raised.value
    assert isinstance(error, ringlock.NoConnectionError)
    assert error.address == address and error.errno == errno.ECONNREFUSED
    assert f"{address} (connection refused)" in str(error)


@scenario("failover-keeps-auto-extended-lock")
async def test_failover_keeps_auto_extended_lock(cluster: Cluster) -> None:
    lease = 3.0
    lost: list[ringlock.LockLostError] = []
    active = await asyncio.to_thread(cluster.wait_single_active, "an active node")
    async with ringlock.aio.Client(cluster.addresses) as holder_client, ringlock.aio.Client(cluster.addresses) as rival:
        _, since = await asyncio.to_thread(cluster.table, active)
        lock = holder_client.lock(
            "failover/kept", lease=lease, auto_extend=True, on_lost=lambda lock, error: lost.append(error)
        )
        assert await lock.acquire()
        token = lock.token
        await asyncio.to_thread(cluster.wait_replicated, active, since)
        await asyncio.to_thread(cluster.kill, active)
        assert await asyncio.to_thread(cluster.wait_single_active, "a standby to take over") != active
        # Longer than the lease: granted unless the extends reach the new active.
        taken = rival.lock("failover/kept", lease=30, wait=lease * 1.5)
        assert await taken.acquire() is False, f"the key stayed held through the failover\n{cluster.logs()}"
        assert lost == [] and lock.lost is None and not lock.lost_event.is_set(), "not reported lost"
        assert lock.locked()
        assert await lock.held() is True, "held on the new active"
        await lock.extend(lease)
        assert lock.token == token
        assert await lock.release() is True, "the old token releases it"
        after = rival.lock("failover/kept", lease=30, wait=ringlock.TRY_ONCE)
        assert await after.acquire() is True
        assert token is not None and after.token is not None and after.token > token, "the new active's epoch"
        assert await after.release()


async def until(condition: Callable[[], bool], what: str) -> None:
    """Polls ``condition`` while the loop keeps serving the client's connections."""
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)
