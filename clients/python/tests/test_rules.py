"""The pure parts, without a server: request lines, reply fields, pairing,
and the rules of docs/protocol.md §4 as the request state machine applies them."""

from __future__ import annotations

import errno
import pickle
from typing import Any

import pytest

from ringlock import (
    AuthenticationError,
    ConnectionFailure,
    ForbiddenError,
    KeyState,
    LockLostError,
    NoActiveNodeError,
    NoConnectionError,
    Pong,
    ProtocolError,
    RinglockError,
    ShuttingDownError,
)
from ringlock._backoff import Reconnects, reconnect_delay
from ringlock._connection import CLOSED, CONNECTING, DOWN, UP, ConnectionCore, auth_outcome
from ringlock._liveness import CUT, PROBE, QUIET, SEND_PING, probe
from ringlock._operation import (
    ACQUIRE,
    CUT_IO,
    DONE,
    EXTEND,
    INSPECT,
    NO_CONNECTION,
    PING,
    REDIRECT,
    RELEASE,
    RESEND,
    RETRY_AT,
    UNSENT_ACTIVE_UNREACHABLE,
    UNSENT_FULL,
    UNSENT_NO_CONNECTION,
    Operation,
    Policy,
)
from ringlock._pairing import Pairing
from ringlock._protocol import (
    auth_answer,
    auth_line,
    key_bytes,
    lease_ms,
    seconds_field,
    secret_bytes,
    split_reply,
    wait_ms,
)
from ringlock._settings import SECRET_ENV, Settings
from ringlock._router import check_addresses, split_address
from ringlock.errors import error_for

POLICY = Policy(retry_interval=0.2, retry_for=5.0, redirect_limit=2, connect_limit=10.0)


def operation(kind: int = ACQUIRE, tries: int = 1, now: float = 100.0, **fields: Any) -> Operation:
    fields.setdefault("lease_ms", 30_000) if kind in (ACQUIRE, EXTEND) else None
    return Operation(kind, b"k", now, tries, POLICY, None, **fields)


def reply(line: bytes) -> list[bytes]:
    return split_reply(line)[2]


def test_request_lines() -> None:
    assert operation(wait_ms=2_000).encode(100.0) == b"A k 30 2\n"
    assert operation(RELEASE, token=5).encode(100.0) == b"R k 5\n"
    assert operation(EXTEND, token=5, lease_ms=1_500).encode(100.0) == b"X k 5 1.5\n"
    assert Operation(PING, b"", 0.0, 1, POLICY, None).encode(0.0) == b"P\n"
    assert operation(INSPECT).encode(100.0) == b"I k\n"
    assert [seconds_field(ms) for ms in (1, 10, 100, 2_125, 86_400_000)] == [
        b"0.001",
        b"0.01",
        b"0.1",
        b"2.125",
        b"86400",
    ]


def test_a_resent_acquire_asks_for_the_wait_it_has_left() -> None:
    acquire = operation(wait_ms=2_000, now=100.0)
    assert acquire.encode(100.75) == b"A k 30 1.25\n"
    assert not acquire.expired(101.99)
    assert acquire.expired(102.0)
    forever = operation(wait_ms=0)
    assert not forever.expired(1e9)
    assert forever.encode(200.0) == b"A k 30 0\n"


def test_arguments_are_checked_before_sending() -> None:
    for bad in ("", "two words", "tab\there", "x" * 251, "-", "nul\0"):
        with pytest.raises(ValueError):
            key_bytes(bad)
    assert key_bytes("ключ") == "ключ".encode()
    assert lease_ms(0.0001) == 1 and lease_ms(30) == 30_000
    for bad_lease in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            lease_ms(bad_lease)
    assert wait_ms(None) == 0 and wait_ms(0) == 1 and wait_ms(0.2) == 200
    with pytest.raises(ValueError):
        wait_ms(86_401)
    assert split_address("[::1]:7700") == ("::1", 7700)
    for bad_address in ("nohost", "host:", "host:0", "host:99999"):
        with pytest.raises(ValueError):
            split_address(bad_address)
    with pytest.raises(ValueError):
        check_addresses([])


def test_replies_split_into_the_op_and_key_they_answer() -> None:
    assert split_reply(b"A k 7")[:2] == (b"A", b"k")
    assert split_reply(b"T k")[:2] == (b"A", b"k")
    assert split_reply(b"E X k not-holder")[:2] == (b"X", b"k")
    assert split_reply(b"M R k 10.0.0.2:7700")[:2] == (b"R", b"k")
    assert split_reply(b"P active 3 127.0.0.1:7700")[:2] == (b"P", b"")
    assert split_reply(b'S {"role":"active"}')[:2] == (b"S", b"")
    assert split_reply(b"E - - bad-op")[:2] == (b"-", b"-")
    assert split_reply(b"I k - 0 0")[:2] == (b"I", b"k")
    assert split_reply(b"E I k bad-request")[:2] == (b"I", b"k")
    assert split_reply(b"M I k 10.0.0.2:7700")[:2] == (b"I", b"k")
    for malformed in (b"", b"A k", b"Q k", b"T", b"E A k", b"S", b"AA k 1", b"I k", b"I k 1 2", b"I k 1 2 3 4"):
        with pytest.raises(ValueError):
            split_reply(malformed)


def test_same_op_and_key_pair_in_send_order() -> None:
    table: Pairing[int] = Pairing()
    for op, key, serial in ((b"A", b"k", 1), (b"R", b"k", 2), (b"A", b"k", 3), (b"A", b"j", 4)):
        table.push(op, key, serial)
    assert len(table) == 4
    assert table.take(b"A", b"k") == 1
    assert table.take(b"A", b"j") == 4
    assert table.take(b"A", b"k") == 3
    assert table.take(b"A", b"k") is None
    assert table.take(b"X", b"k") is None
    assert table.drain() == [2]
    assert len(table) == 0


def test_replies_end_requests() -> None:
    assert operation().on_reply(reply(b"A k 9"), POLICY, 100.0) == (DONE, 9)
    assert operation().on_reply(reply(b"T k"), POLICY, 100.0) == (DONE, None)
    assert operation(RELEASE, token=9).on_reply(reply(b"R k"), POLICY, 100.0) == (DONE, True)
    # Nothing left to release is what the caller wanted: not an error.
    assert operation(RELEASE, token=9).on_reply(reply(b"E R k not-holder"), POLICY, 100.0) == (DONE, False)
    assert operation(EXTEND, token=9).on_reply(reply(b"X k 9"), POLICY, 100.0) == (DONE, True)
    what, lost = operation(EXTEND, token=9).on_reply(reply(b"E X k not-holder"), POLICY, 100.0)
    assert what == DONE and isinstance(lost, LockLostError) and lost.key == "k"
    what, wrong = operation(EXTEND, token=9).on_reply(reply(b"X k 8"), POLICY, 100.0)
    assert isinstance(wrong, ProtocolError)
    pong = Operation(PING, b"", 0.0, 1, POLICY, None).on_reply(reply(b"P standby 0 -"), POLICY, 0.0)
    assert pong == (DONE, Pong("standby", 0, None))
    with pytest.raises(ValueError):
        operation().on_reply(reply(b"A k 18446744073709551616"), POLICY, 100.0)


def test_inspect_replies() -> None:
    assert operation(INSPECT).on_reply(reply(b"I k - 0 0"), POLICY, 100.0) == (DONE, KeyState(b"k", None, 0.0, 0))
    # A free key may have acquires waiting for tokens.
    assert operation(INSPECT).on_reply(reply(b"I k - 0 2"), POLICY, 100.0) == (DONE, KeyState(b"k", None, 0.0, 2))
    held = operation(INSPECT).on_reply(reply(b"I k 42 1500 3"), POLICY, 100.0)
    assert held == (DONE, KeyState(b"k", 42, 1.5, 3))
    what, error = operation(INSPECT).on_reply(reply(b"E I k bad-request"), POLICY, 100.0)
    assert what == DONE and type(error) is RinglockError
    assert (error.code, error.op, error.key) == ("bad-request", "I", "k")
    assert operation(INSPECT).on_reply(reply(b"M I k 10.0.0.2:7700"), POLICY, 100.0) == (REDIRECT, None)
    assert operation(INSPECT).on_reply(reply(b"M I k -"), POLICY, 100.0)[0] == RETRY_AT
    for malformed in (b"I k x 0 0", b"I k 1 -5 0", b"I k - 0 -", b"I k 1 1 18446744073709551616"):
        with pytest.raises(ValueError):
            operation(INSPECT).on_reply(reply(malformed), POLICY, 100.0)
    # Cut like a ping: moved on to the next connection.
    assert operation(INSPECT, tries=2).on_cut(CUT_IO, 100.0, POLICY) == (RESEND, None)


def test_an_acquire_moves_on_until_it_was_cut_on_every_connection_then_waits_for_one() -> None:
    acquire = operation(tries=3, wait_ms=2_000)
    assert acquire.on_cut(CUT_IO, 100.0, POLICY) == (RESEND, None)
    assert acquire.on_cut(CUT_IO, 100.0, POLICY) == (RESEND, None)
    assert acquire.on_cut(CUT_IO, 100.0, POLICY)[0] == RETRY_AT
    assert acquire.waiting_since == 100.0
    assert acquire.on_cut(CUT_IO, 102.0, POLICY) == (NO_CONNECTION, pytest.approx(2.0))
    refused = operation(tries=1)
    what, error = refused.on_cut(RinglockError("too-many-connections"), 100.0, POLICY)
    assert what == DONE and error.code == "too-many-connections"  # type: ignore[attr-defined]


def test_going_out_on_connections_closed_before_answering_does_not_start_the_wait_over() -> None:
    ping = operation(PING, tries=2)
    now = 100.0
    step = ping.on_unsent(UNSENT_NO_CONNECTION, now, POLICY)
    while step[0] != NO_CONNECTION:
        assert step[0] in (RETRY_AT, RESEND), step
        if step[0] == RETRY_AT:
            now = step[1]  # type: ignore[assignment]
        # A connection comes up, takes it and closes at once.
        ping.go_out(now)
        now += 0.001
        step = ping.on_cut(CUT_IO, now, POLICY)
    assert step[1] >= POLICY.connect_limit - 1 and now - 100.0 < 2 * POLICY.connect_limit, (step, now)

    # Cut from a connection that had answered: a new wait, with the whole limit.
    inspect = operation(INSPECT)
    assert inspect.on_unsent(UNSENT_NO_CONNECTION, 100.0, POLICY)[0] == RETRY_AT
    inspect.go_out(109.0)
    inspect.connection_answered()
    assert inspect.on_cut(CUT_IO, 109.0, POLICY)[0] == RETRY_AT
    assert inspect.on_unsent(UNSENT_NO_CONNECTION, 118.0, POLICY)[0] == RETRY_AT


def test_an_acquire_that_tries_once_never_runs_out_of_its_wait_off_the_wire() -> None:
    once = operation(wait_ms=1, try_once=True, now=100.0)
    assert not once.expired(105.0), "it waits for a connection within the connect limit"
    assert once.encode(105.0) == b"A k 30 0.001\n", "and tries once whenever it goes out"


def test_a_bounded_acquire_whose_wait_ran_out_after_a_cut_waits_as_for_a_connection() -> None:
    acquire = operation(tries=2, wait_ms=2_000, now=100.0)
    assert acquire.on_cut(CUT_IO, 101.5, POLICY) == (RESEND, None)
    assert acquire.expired(102.0) and acquire.waiting_since == 101.5


def wait_out(operation: Operation, start: float) -> float:
    """Drives ``operation`` through "no connection" events at each retry
    instant from ``start``; the seconds it waited when it gave up."""
    now = start
    while True:
        what, value = operation.on_unsent(UNSENT_NO_CONNECTION, now, POLICY)
        if what == NO_CONNECTION:
            assert value == pytest.approx(now - start)
            return value  # type: ignore[return-value]
        assert what == RETRY_AT and now < value <= now + POLICY.retry_interval + 1e-9, "polled every interval at most"
        now = value  # type: ignore[assignment]


def test_a_request_with_no_connection_waits_within_its_own_limit() -> None:
    assert wait_out(operation(wait_ms=2_000), 100.0) == pytest.approx(2.0), "the acquire's wait"
    assert wait_out(operation(wait_ms=0), 100.0) == pytest.approx(10.0), "no wait: the connect limit"
    assert wait_out(operation(wait_ms=1, try_once=True), 100.0) == pytest.approx(10.0), "try once: the connect limit"
    assert wait_out(operation(INSPECT), 100.0) == pytest.approx(10.0)
    extend = operation(EXTEND, token=5, connection_deadline=100.7)
    assert wait_out(extend, 100.0) == pytest.approx(0.7), "the extend's lease left"
    assert wait_out(operation(wait_ms=2_000), 100.5) == pytest.approx(1.5), "from the acquire's start"
    what, error = operation(tries=2).on_unsent(UNSENT_FULL, 100.0, POLICY)
    assert what == DONE and error.code == "too-many-in-flight"  # type: ignore[attr-defined]


def test_a_release_is_retried_every_interval_for_the_retry_period() -> None:
    start = 100.0
    release = operation(RELEASE, token=5, now=start)
    assert release.on_cut(CUT_IO, start, POLICY) == (RESEND, None)
    now, retries = start, 0
    while True:
        what, value = release.on_unsent(UNSENT_NO_CONNECTION, now, POLICY)
        if what == NO_CONNECTION:
            break
        assert what == RETRY_AT and value == pytest.approx(now + 0.2)
        now = value  # type: ignore[assignment]
        retries += 1
    assert retries == 25, "5 s every 200 ms"
    assert release.on_cut(CUT_IO, now + 0.001, POLICY)[0] == NO_CONNECTION


def test_shutting_down_is_retried_within_the_limit_except_by_a_try_once_acquire() -> None:
    start = 100.0
    acquire = operation(wait_ms=5_000, tries=2, now=start)
    what, at = acquire.on_reply(reply(b"E A k shutting-down"), POLICY, start)
    assert what == RETRY_AT and at == pytest.approx(start + 0.2)
    assert acquire.encode(start + 2.0) == b"A k 30 3\n", "sent again with the wait it has left"
    assert acquire.on_unsent(UNSENT_NO_CONNECTION, start + 5.0, POLICY)[0] == NO_CONNECTION
    assert acquire.shutting_down
    error = NoConnectionError(waited=5.0, shutting_down=True)
    assert str(error) == "no usable connection after 5.0 s (the server was shutting down)"
    copy = pickle.loads(pickle.dumps(error))
    assert copy.shutting_down and str(copy) == str(error)
    try_once = operation(wait_ms=1, try_once=True, now=start)
    what, value = try_once.on_reply(reply(b"E A k shutting-down"), POLICY, start)
    assert what == DONE and isinstance(value, ShuttingDownError)
    release = operation(RELEASE, token=5, now=start)
    assert release.on_reply(reply(b"E R k shutting-down"), POLICY, start)[0] == RETRY_AT
    assert release.on_unsent(UNSENT_NO_CONNECTION, start + 5.0, POLICY)[0] == NO_CONNECTION
    refused = operation(wait_ms=5_000, now=start)
    assert refused.on_cut(error_for("shutting-down"), start, POLICY)[0] == RETRY_AT
    assert refused.shutting_down


def test_the_reconnect_schedule_goes_at_once_then_doubles_up_to_the_cap() -> None:
    assert reconnect_delay(0, 0.05, 3.0, 0.0) == 0.0
    assert reconnect_delay(0, 0.05, 3.0, 0.99) == 0.0
    ceiling = 0.05
    for attempt in range(1, 7):
        assert reconnect_delay(attempt, 0.05, 3.0, 0.0) == pytest.approx(ceiling / 2), attempt
        assert reconnect_delay(attempt, 0.05, 3.0, 1.0) == pytest.approx(ceiling), attempt
        assert ceiling / 2 < reconnect_delay(attempt, 0.05, 3.0, 0.5) < ceiling
        ceiling *= 2
    for attempt in (7, 8, 40, 10**6):
        assert reconnect_delay(attempt, 0.05, 3.0, 1.0) == 3.0, "capped"
        assert reconnect_delay(attempt, 0.05, 3.0, 0.0) == 1.5
    assert reconnect_delay(1, 0.05, 3.0, 7.0) == pytest.approx(0.05), "a draw out of range stays in the delay"
    assert reconnect_delay(1, 0.05, 3.0, float("nan")) == pytest.approx(0.025)


def test_a_connection_error_names_each_address_with_its_os_error() -> None:
    refused = ConnectionFailure.from_os_error("127.0.0.1:7700", ConnectionRefusedError(errno.ECONNREFUSED, "refused"))
    timed_out = ConnectionFailure.from_os_error("127.0.0.1:7701", TimeoutError("timed out"))
    closed = ConnectionFailure("127.0.0.1:7702", "closed by the server")
    error = NoConnectionError(op="A", key="k", waited=10.04, failures=[refused, timed_out, closed])
    assert str(error) == (
        "no usable connection after 10.0 s: 127.0.0.1:7700 (connection refused), "
        "127.0.0.1:7701 (timed out), 127.0.0.1:7702 (closed by the server)"
    )
    assert (error.op, error.key) == ("A", "k"), "the request is on attributes, not in the message"
    assert isinstance(error, ConnectionError) and isinstance(error, OSError)
    assert isinstance(error, NoActiveNodeError) and isinstance(error, RinglockError)
    assert error.code == "no-connection" and error.errno == errno.ECONNREFUSED
    assert error.addresses == ["127.0.0.1:7700", "127.0.0.1:7701", "127.0.0.1:7702"]
    assert [failure.errno for failure in error.failures] == [errno.ECONNREFUSED, errno.ETIMEDOUT, None]
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is NoConnectionError and str(copy) == str(error) and copy.errno == error.errno
    assert NoConnectionError(waited=1.0).errno is None


def test_redirects_are_followed_up_to_the_limit() -> None:
    acquire = operation()
    moved = reply(b"M A k 10.0.0.2:7700")
    assert acquire.on_reply(moved, POLICY, 100.0) == (REDIRECT, None)
    assert acquire.on_reply(moved, POLICY, 100.0) == (REDIRECT, None)
    what, error = acquire.on_reply(moved, POLICY, 100.0)
    assert what == DONE and error.code == "no-active"  # type: ignore[attr-defined]


def test_no_active_known_is_retried_for_the_retry_period() -> None:
    acquire = operation(wait_ms=0, now=100.0)
    nobody = reply(b"M A k -")
    assert acquire.on_reply(nobody, POLICY, 100.0)[0] == RETRY_AT
    what, error = acquire.on_reply(nobody, POLICY, 105.0)
    assert what == DONE and isinstance(error, NoActiveNodeError) and error.code == "no-active"
    assert operation().on_unsent(UNSENT_ACTIVE_UNREACHABLE, 100.0, POLICY)[0] == RETRY_AT


def test_docstring_examples() -> None:
    import doctest

    from ringlock import _backoff, _common, _connection, _pairing, _protocol, _router, errors

    for module in (_protocol, _pairing, _router, errors, _backoff, _common, _connection):
        failed, _ = doctest.testmod(module)
        assert failed == 0, module.__name__


def test_the_answer_to_u_is_a_name_or_a_code() -> None:
    assert auth_line(b"s3cret") == b"U s3cret\n"
    assert auth_answer(b"U billing") == ("billing", "")
    assert auth_answer(b"E U - auth-failed") == (None, "auth-failed")
    assert auth_answer(b"E U - auth-disabled") == (None, "auth-disabled")
    assert auth_answer(b"E - - too-many-connections") == (None, "too-many-connections")
    assert auth_answer(b"A k 1") == (None, "protocol")
    for bad in ("", "two words", "tab\there", "x" * 1023):
        with pytest.raises(ValueError) as raised:
            secret_bytes(bad)
        assert bad not in str(raised.value) or not bad, "the message never holds the secret"


def build_settings(secret: str | None) -> Settings:
    return Settings.build("127.0.0.1:7700", None, 0.05, 3.0, 10.0, 1.0, 0.2, 5.0, 16, 65536, secret)


def test_the_secret_comes_from_the_environment_unless_given_and_is_never_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    assert build_settings(None).secret is None
    monkeypatch.setenv(SECRET_ENV, "from-the-environment")
    from_environment = build_settings(None).secret
    assert from_environment is not None and from_environment.value == b"from-the-environment"
    given = build_settings("given-secret").secret
    assert given is not None and given.value == b"given-secret"
    assert "given-secret" not in repr(build_settings("given-secret"))
    monkeypatch.setenv(SECRET_ENV, "")
    assert build_settings(None).secret is None, "an empty variable is no secret"


def test_auth_codes_have_their_own_errors() -> None:
    refused = error_for("auth-failed", "A", "k")
    assert isinstance(refused, AuthenticationError) and isinstance(refused, RinglockError)
    assert isinstance(error_for("forbidden", "A", "k"), ForbiddenError)
    error = AuthenticationError("auth-failed", "A", "k", address="127.0.0.1:7700")
    assert str(error) == "127.0.0.1:7700 refused the client's secret: auth-failed (A k)"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is AuthenticationError and copy.address == error.address and str(copy) == str(error)
    failure = ConnectionFailure.secret_refused("127.0.0.1:7700", "auth-failed")
    assert failure.auth == "auth-failed" and str(failure) == "127.0.0.1:7700 (secret refused: auth-failed)"


def test_a_tls_error_names_its_tls_failure_and_survives_pickling() -> None:
    from ringlock import TLSError

    refused = ConnectionFailure.from_os_error("127.0.0.1:7700", ConnectionRefusedError(111, "Connection refused"))
    untrusted = ConnectionFailure("127.0.0.1:7701", "TLS: not trusted", tls="the server's certificate is not trusted")
    error = TLSError(waited=1.0, failures=[refused, untrusted])
    # The address is the one TLS failed on, not the first with an errno.
    assert (error.address, error.reason) == ("127.0.0.1:7701", "the server's certificate is not trusted")
    assert isinstance(error, ConnectionError) and error.errno == 111
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is TLSError and str(copy) == str(error) and copy.address == error.address
    plain = pickle.loads(pickle.dumps(NoConnectionError(waited=2.0, failures=[refused])))
    assert type(plain) is NoConnectionError and plain.address == "127.0.0.1:7700"


def core(in_flight_max: int = 65536) -> ConnectionCore:
    settings = Settings.build("127.0.0.1:7700", None, 0.05, 3.0, 10.0, 1.0, 0.2, 5.0, 16, in_flight_max)
    return ConnectionCore("127.0.0.1:7700", 0, settings)


def test_the_connection_core_pairs_replies_split_across_reads_with_their_requests() -> None:
    connection = core()
    first, second, release = operation(ACQUIRE), operation(ACQUIRE), operation(RELEASE, token=7)
    for request in (first, second, release):
        assert connection.admit(request, 100.0) == 0
    assert connection.read(b"R k\nA k ", 100.1) == ([(release, (DONE, True), None)], None)
    replies, stop = connection.read(b"5\r\nT k\n", 100.2)
    assert stop is None and replies == [(first, (DONE, 5), None), (second, (DONE, None), None)]
    assert connection.replied and len(connection.pairing) == 0


def test_the_connection_core_names_the_active_of_an_m_reply() -> None:
    connection = core()
    acquire = operation(ACQUIRE)
    connection.admit(acquire, 100.0)
    ((paired, step, moved),), stop = connection.read(b"M A k 127.0.0.1:7701\n", 100.1)
    assert paired is acquire and step[0] == REDIRECT and moved == b"127.0.0.1:7701" and stop is None


def test_the_connection_core_drops_a_connection_whose_server_breaks_the_protocol() -> None:
    connection = core()
    connection.admit(operation(ACQUIRE), 100.0)
    assert connection.read(b"A other 5\n", 100.1)[1].code == "protocol", "a reply nobody asked for"
    kept = core()
    acquire = operation(ACQUIRE)
    kept.admit(acquire, 100.0)
    replies, stop = kept.read(b"A k notanumber\nA k 5\n", 100.1)
    assert replies == [] and stop is not None and stop.code == "protocol"
    assert kept.take_down() == [acquire], "a request whose reply was malformed stays in flight, for the cut"
    assert core().read(b"x" * 70_001, 100.0)[1].code == "protocol", "a reply line too long"
    assert core().read(b"E - - too-many-connections\n", 100.0)[1].code == "too-many-connections"
    revoked = core()
    assert revoked.read(b"E - - auth-revoked\n", 100.0)[1] is CUT_IO
    assert "revoked" in revoked.ended(CUT_IO).message


def test_the_connection_core_takes_requests_only_while_it_may() -> None:
    connection = core(in_flight_max=1)
    assert connection.phase == CONNECTING and not connection.usable
    assert connection.admit(operation(ACQUIRE), 100.0) == 0, "queued during the first connect"
    assert connection.admit(operation(ACQUIRE), 100.0) != 0, "one in flight at most"
    connection.phase = UP
    assert connection.usable
    assert len(connection.take_down()) == 1 and connection.phase == DOWN
    assert connection.admit(operation(ACQUIRE), 100.0) != 0, "broken: left out"
    connection.phase = CLOSED
    assert connection.take_down() == [] and connection.phase == CLOSED


def test_the_connection_core_pings_a_silent_connection_then_cuts_it() -> None:
    connection = core()
    connection.phase = UP
    connection.opened(100.0)
    assert connection.tick(101.5) == QUIET, "nothing in flight: silence is fine"
    connection.admit(operation(ACQUIRE), 102.0)
    assert connection.tick(102.5) == QUIET
    assert connection.tick(103.0) == SEND_PING, "1 s without a reply"
    connection.admit(probe(103.0, POLICY), 103.0)
    assert connection.tick(104.0) == CUT, "the ping went unanswered for 1 s"
    assert connection.ended(CUT_IO).message == "timed out" and connection.ended(CUT_IO).errno == errno.ETIMEDOUT
    assert all(request.waiter is not PROBE for request in connection.take_down()), "its own ping goes nowhere"


def test_the_answer_to_u_decides_the_connection() -> None:
    assert auth_outcome("a:1", b"U billing") == ("billing", None)
    name, failure = auth_outcome("a:1", b"E U - auth-disabled")
    assert name is None and failure is not None and failure.auth == "auth-disabled"
    assert "unexpected answer" in auth_outcome("a:1", b"P active 1 -")[1].message  # type: ignore[union-attr]
    assert "refused the connection: too-many-connections" in (
        auth_outcome("a:1", b"E - - too-many-connections")[1].message  # type: ignore[union-attr]
    )


def test_the_reconnect_schedule_starts_over_only_once_a_connection_worked() -> None:
    schedule = Reconnects(0.05, 3.0)
    assert [schedule.pause(1.0) for _ in range(4)] == [0.0, 0.05, 0.1, 0.2]
    schedule.session_ended(replied=False, open_for=0.1)
    assert schedule.pause(1.0) == 0.4, "closed at once: not reset"
    schedule.session_ended(replied=False, open_for=3.0)
    assert schedule.pause(0.0) == 0.0, "open for the longest pause: reset"
    schedule.pause(0.0)
    schedule.session_ended(replied=True, open_for=0.0)
    assert schedule.pause(0.0) == 0.0, "answered: reset"


def test_the_set_up_of_a_connection_is_data_both_clients_follow() -> None:
    import ssl

    from ringlock._connection import SetUp

    plain = SetUp.of("db.example:7700", Settings.build("db.example:7700", None, 0.05, 3.0, 10.0, 1.5, 0.2, 5.0, 16, 64))
    assert (plain.host, plain.port, plain.connect_timeout, plain.tls_context, plain.hello) == (
        "db.example",
        7700,
        1.5,
        None,
        None,
    )
    context = ssl.create_default_context()
    tls = Settings.build("[::1]:7700", None, 0.05, 3.0, 10.0, 1.0, 0.2, 5.0, 16, 64, ssl_context=context)
    assert SetUp.of("[::1]:7700", tls).tls_context is context
    assert SetUp.of("[::1]:7700", tls).server_name == "::1", "the host of the address by default"
    named = Settings.build(
        "[::1]:7700", None, 0.05, 3.0, 10.0, 1.0, 0.2, 5.0, 16, 64, "s", ssl_context=context, tls_server_name="lock"
    )
    setup = SetUp.of("[::1]:7700", named)
    assert (setup.server_name, setup.hello, setup.hello_timeout) == ("lock", b"U s\n", 2.0)


def test_a_socket_that_answered_starts_the_reconnect_schedule_over_and_a_failed_attempt_does_not() -> None:
    connection = core()
    refused = ConnectionFailure.secret_refused("127.0.0.1:7700", "auth-failed")
    assert connection.attempt_failed(refused, 100.0) == (CUT_IO, False)
    assert connection.last_failure == (100.0, refused)
    assert [connection.reconnects.pause(1.0) for _ in range(3)] == [0.0, 0.05, 0.1]
    connection.opened(101.0)
    assert connection.socket_ended(CUT_IO, 101.5) == (CUT_IO, False), "answered nothing"
    assert connection.last_failure == (101.5, ConnectionFailure("127.0.0.1:7700", "closed by the server"))
    assert connection.reconnects.pause(1.0) == 0.2, "closed at once: the schedule goes on"
    connection.opened(102.0)
    acquire = operation(ACQUIRE)
    connection.admit(acquire, 102.0)
    connection.read(b"A k 9\n", 102.1)
    assert connection.socket_ended(CUT_IO, 102.2) == (CUT_IO, True)
    assert connection.reconnects.pause(1.0) == 0.0, "it answered: the schedule starts over"
