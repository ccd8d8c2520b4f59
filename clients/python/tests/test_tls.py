"""TLS in both clients beyond the shared scenarios: server certificates
that expired or name another host, the server-name option, a context of
the caller's own, a secret over TLS, and options refused before anything
is sent. Against the real server, with certificates from
``ringlock-testkit certs``."""

from __future__ import annotations

import hashlib
import ssl
import time
from collections.abc import Iterator

import pytest

import ringlock
import ringlock.aio
from ringlock._operation import ACQUIRE
from harness import ALPHA_SECRET, AuthFile, Certs, Server, assert_tls_failure

pytestmark = pytest.mark.testkit


@pytest.fixture(scope="module")
def expired_server(certs: Certs) -> Iterator[Server]:
    started = Server(*certs.server_args("expired"))
    yield started
    started.stop()


@pytest.fixture(scope="module")
def wrong_name_server(certs: Certs) -> Iterator[Server]:
    started = Server(*certs.server_args("wrong-name"))
    yield started
    started.stop()


def test_an_expired_certificate_is_refused(expired_server: Server, certs: Certs) -> None:
    with ringlock.Client(expired_server.address, tls_ca=certs.path("ca.pem")) as client:
        started = time.monotonic()
        with pytest.raises(ringlock.TLSError) as raised:
            client.lock("tls/expired", lease=10, wait=1).acquire()
        assert_tls_failure(raised.value, expired_server.address, time.monotonic() - started, "expired")


async def test_an_expired_certificate_is_refused_asyncio(expired_server: Server, certs: Certs) -> None:
    async with ringlock.aio.Client(expired_server.address, tls_ca=certs.path("ca.pem")) as client:
        started = time.monotonic()
        with pytest.raises(ringlock.TLSError) as raised:
            await client.lock("tls/expired", lease=10, wait=1).acquire()
        assert_tls_failure(raised.value, expired_server.address, time.monotonic() - started, "expired")


def test_a_certificate_for_another_name_is_refused_unless_that_name_is_asked_for(
    wrong_name_server: Server, certs: Certs
) -> None:
    with ringlock.Client(wrong_name_server.address, tls_ca=certs.path("ca.pem"), connect_limit=1) as client:
        started = time.monotonic()
        with pytest.raises(ringlock.TLSError) as raised:
            client.ping()
        assert_tls_failure(raised.value, wrong_name_server.address, time.monotonic() - started, "mismatch")
        assert "127.0.0.1" in raised.value.reason, raised.value.reason
    with ringlock.Client(
        wrong_name_server.address, tls_ca=certs.path("ca.pem"), tls_server_name="elsewhere.invalid"
    ) as client:
        assert client.ping().role == "active"


async def test_a_certificate_for_another_name_is_refused_unless_that_name_is_asked_for_asyncio(
    wrong_name_server: Server, certs: Certs
) -> None:
    async with ringlock.aio.Client(wrong_name_server.address, tls_ca=certs.path("ca.pem"), connect_limit=1) as client:
        started = time.monotonic()
        with pytest.raises(ringlock.TLSError) as raised:
            await client.ping()
        assert_tls_failure(raised.value, wrong_name_server.address, time.monotonic() - started, "mismatch")
    async with ringlock.aio.Client(
        wrong_name_server.address, tls_ca=certs.path("ca.pem"), tls_server_name="elsewhere.invalid"
    ) as client:
        assert (await client.ping()).role == "active"


def test_a_context_of_ones_own_is_used_as_given(tls_server: Server, certs: Certs) -> None:
    context = ssl.create_default_context(cafile=certs.path("ca.pem"))
    with ringlock.Client(tls_server.address, ssl_context=context) as client:
        lock = client.lock("tls/own-context", lease=10, wait=5)
        assert lock.acquire() and lock.release()
    strange = ssl.create_default_context(cafile=certs.path("other-ca.pem"))
    with ringlock.Client(tls_server.address, ssl_context=strange, connect_limit=1) as client:
        with pytest.raises(ringlock.TLSError):
            client.ping()


@pytest.fixture
def tls_auth_server(certs: Certs) -> Iterator[Server]:
    auth = AuthFile({"alpha": ALPHA_SECRET})
    started = Server(*certs.server_args(), "--auth-file", auth.path)
    yield started
    started.stop()
    auth.cleanup()


def test_a_secret_goes_over_tls_and_reconnects_do_both(tls_auth_server: Server, certs: Certs) -> None:
    with ringlock.Client(tls_auth_server.address, tls_ca=certs.path("ca.pem"), secret=ALPHA_SECRET) as client:
        lock = client.lock("alpha/tls", lease=10, wait=5)
        assert lock.acquire() and lock.release()
        assert client.authenticated_name == "alpha"
        tls_auth_server.kill()
        deadline = time.monotonic() + 20
        while client.usable_connection_count:
            assert time.monotonic() < deadline, "the client saw its connections broken"
            time.sleep(0.01)
        tls_auth_server.start_again()
        lock = client.lock("alpha/tls-again", lease=10, wait=10)
        assert lock.acquire() and lock.release()


async def test_a_secret_goes_over_tls_asyncio(tls_auth_server: Server, certs: Certs) -> None:
    async with ringlock.aio.Client(
        tls_auth_server.address, tls_ca=certs.path("ca.pem"), secret=ALPHA_SECRET
    ) as client:
        lock = client.lock("alpha/tls", lease=10, wait=5)
        assert await lock.acquire() and await lock.release()
        assert client.authenticated_name == "alpha"


def test_requests_queued_before_the_handshake_go_out_sealed_together(tls_server: Server, certs: Certs) -> None:
    # Queued faster than they go out, first while the connection does its
    # connect and handshake: the writer and the callers seal what is queued
    # in batches (thousands of bytes each) and send them in order, and
    # every reply pairs.
    with ringlock.Client(tls_server.address, tls_ca=certs.path("ca.pem"), connections_per_node=1) as client:
        prefix = hashlib.sha256(str(time.monotonic()).encode()).hexdigest()[:40]
        locks = [client.lock(f"{prefix}/{index}", lease=10, wait=5) for index in range(3000)]
        done: list[object] = []
        for lock in locks:
            client._background(
                ACQUIRE, lock._key_bytes, done.append, lease_ms=lock._lease_ms, wait_ms=lock._wait_ms, try_once=False
            )
        deadline = time.monotonic() + 20
        while len(done) < len(locks):
            assert time.monotonic() < deadline, f"{len(done)} of {len(locks)} answered"
            time.sleep(0.01)
        refused = [value for value in done if not isinstance(value, int)]
        assert not refused, refused[:3]


def test_tls_options_are_checked_before_anything_is_sent(certs: Certs, tmp_path: object) -> None:
    address = "127.0.0.1:1"
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        ringlock.Client(address, tls_ca=certs.path("ca.pem"), tls_cert=certs.path("client.pem"))
    with pytest.raises(ValueError, match="need tls_ca"):
        ringlock.Client(address, tls_server_name="localhost")
    with pytest.raises(ValueError, match="tls_ca"):
        ringlock.Client(address, tls_ca=certs.path("no-such.pem"))
    with pytest.raises(ValueError, match="tls_cert"):
        ringlock.Client(
            address,
            tls_ca=certs.path("ca.pem"),
            tls_cert=certs.path("client.pem"),
            tls_key=certs.path("server-key.pem"),
        )
    with pytest.raises(ValueError, match="either ssl_context"):
        ringlock.aio.Client(address, tls_ca=certs.path("ca.pem"), ssl_context=ssl.create_default_context())
    # Plain TCP stays plain.
    assert ringlock.aio.Client(address).settings.tls is None

