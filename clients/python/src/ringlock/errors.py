"""The exceptions the client raises.

Every error is a :class:`RinglockError` carrying the protocol's error code
(``code``), and when known the operation (``op``: ``"A"``, ``"R"``, ``"X"``,
``"P"``, ``"S"`` or ``"I"``) and the key it was about. Subclasses group the codes a
caller usually handles differently.

Codes are the server's (README, "Error codes") plus the client's own:

- ``no-connection``: no usable connection within the request's limit
  (:class:`NoConnectionError`, also a :class:`NoActiveNodeError` and a
  :class:`ConnectionError`).
- ``no-active``: no node would serve the request (:class:`NoActiveNodeError`).
- ``timeout``: the wait ran out (:class:`LockTimeoutError`).
- ``not-owned``: this :class:`~ringlock.Lock` holds nothing (:class:`LockNotOwnedError`).
- ``lost``: the grant was taken back by the server (:class:`LockLostError`,
  whose code is ``not-holder`` when the server said so).
- ``too-many-in-flight``: every connection carries as many requests as it may
  (:class:`CapacityError`).
- ``protocol``: the server broke the protocol (:class:`ProtocolError`).

With TLS, ``tls-failed``: every address failed its TLS handshake (or had
its connection ended by a TLS alert) for as long as the request could wait
(:class:`TLSError`, also a :class:`NoConnectionError`).

With client authentication, ``auth-failed`` and ``auth-disabled`` (the
server refused the secret) are :class:`AuthenticationError`, and
``forbidden`` (a key outside the name's scope) is :class:`ForbiddenError`.

Example::

    import ringlock

    try:
        with client.lock("orders/42", lease=30, wait=5):
            ...
    except ringlock.LockTimeoutError:
        print("someone else holds orders/42")
    except ringlock.NoConnectionError as error:
        print("no server reachable:", error)  # names each address and its OS error
"""

from __future__ import annotations

import errno as errno_codes
import os
import ssl
from dataclasses import dataclass

from ._tls import tls_reason


class RinglockError(Exception):
    """Base of every error the client raises.

    Attributes:
        code: the protocol's error code, or one of the client's own (see the
            module's documentation).
        op: the operation letter of the request, if known.
        key: the request's key as text, if it had one.

    Example::

        try:
            client.ping()
        except ringlock.RinglockError as error:
            print(error.code, error.op, error.key)
    """

    def __init__(self, code: str, op: str | None = None, key: str | None = None, message: str | None = None) -> None:
        self.code = code
        self.op = op
        self.key = key
        if message is None:
            message = code if key is None else f"{code} ({op} {key})"
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.code, self.op, self.key, str(self)))


class LockTimeoutError(RinglockError, TimeoutError):
    """The wait ran out before the key was granted; nothing was granted.

    Raised by ``with client.lock(...)`` (``acquire`` answers ``False``
    instead). It is also a :class:`TimeoutError`.

    Example::

        try:
            with client.lock("k", wait=0.5):
                ...
        except TimeoutError:
            ...
    """


class LockNotOwnedError(RinglockError, RuntimeError):
    """The :class:`~ringlock.Lock` does not hold its key: it was never
    acquired, or was already released. Like releasing an unlocked
    :class:`threading.Lock`, it is also a :class:`RuntimeError`.

    Example::

        lock = client.lock("k")
        try:
            lock.release()
        except ringlock.LockNotOwnedError:
            pass
    """


class LockLostError(RinglockError):
    """The grant is gone although this client did not release it: its lease
    ran out, another node took over without it, or an extend was refused
    with ``not-holder``. Stop using the protected resource; the fencing token
    protects it from writes that still arrive.

    Example::

        try:
            lock.extend(30)
        except ringlock.LockLostError:
            abort_the_job()
    """


class CapacityError(RinglockError):
    """A limit was hit: ``too-many-waiters``, ``too-many-keys``,
    ``too-many-connections`` (server), or ``too-many-in-flight`` (client).
    The request had no effect; try again later.

    Example::

        try:
            lock.acquire()
        except ringlock.CapacityError as error:
            print("busy:", error.code)
    """


class ShuttingDownError(RinglockError):
    """The server is stopping and answered ``shutting-down``.

    Example::

        try:
            lock.acquire()
        except ringlock.ShuttingDownError:
            retry_later()
    """


class NoActiveNodeError(RinglockError):
    """No node could serve the request: no usable connection was left
    (``code == "no-connection"``), or no active node was known for the
    retry period or the redirect limit was hit (``code == "no-active"``).

    The client keeps reconnecting in the background, so a later request may
    succeed.

    Example::

        try:
            client.ping()
        except ringlock.NoActiveNodeError as error:
            print("unreachable:", error.code)
    """


@dataclass(frozen=True)
class ConnectionFailure:
    """How the last attempt to use one address failed: a connect that
    failed, or a connection that broke.

    Example::

        >>> failure = ConnectionFailure.from_os_error("127.0.0.1:7700", ConnectionRefusedError(111, "Connection refused"))
        >>> str(failure), failure.errno
        ('127.0.0.1:7700 (connection refused)', 111)
    """

    address: str
    """The address as the client was given it (or learned it from ``M``)."""
    message: str
    """What went wrong, in words."""
    errno: int | None = None
    """The OS error number (``errno.ECONNREFUSED``, say), if the OS gave one."""
    auth: str | None = None
    """The server's answer to the client's secret when the connection failed
    on it (``auth-failed`` or ``auth-disabled``), else ``None``."""

    tls: str | None = None
    """What went wrong in TLS when the connection failed on it (the
    server's certificate not trusted, expired or for another name, an alert
    from the server), else ``None``."""

    @staticmethod
    def secret_refused(address: str, code: str) -> ConnectionFailure:
        """The failure of ``address``, whose server refused the secret with ``code``."""
        return ConnectionFailure(address, f"secret refused: {code}", None, code)

    @staticmethod
    def from_os_error(address: str, error: BaseException) -> ConnectionFailure:
        """The failure of ``address`` with ``error`` (an :class:`OSError`,
        :class:`ssl.SSLError` among them, or a timeout)."""
        if isinstance(error, ssl.SSLError):
            reason = tls_reason(error)
            return ConnectionFailure(address, f"TLS: {reason}", None, None, reason)
        number = getattr(error, "errno", None)
        if isinstance(number, int) and number > 0:
            message = os.strerror(number)
        elif isinstance(error, TimeoutError):
            number = errno_codes.ETIMEDOUT
            message = "timed out"
        else:
            number = None
            message = str(error) or type(error).__name__
        return ConnectionFailure(address, message[:1].lower() + message[1:], number)

    def __str__(self) -> str:
        return f"{self.address} ({self.message})"


class NoConnectionError(NoActiveNodeError, ConnectionError):
    """No usable connection within the request's limit (code
    ``no-connection``): every connection stayed broken for as long as the
    request could wait (an acquire its wait, an extend the lease it has
    left, a release its retry period, else the client's ``connect_limit``),
    or the request was cut off on every connection until then.

    It is a :class:`ConnectionError` (so an :class:`OSError`) as well as a
    :class:`NoActiveNodeError`. Its message says how long the request waited
    and names every address with the failure of its last attempt; the same
    is in its attributes:

    - ``op`` and ``key``: the request (``key`` is ``None`` for a ping or
      stats);
    - ``waited``: the seconds the request waited for a connection;
    - ``failures``: a :class:`ConnectionFailure` per address, in the order
      the client was given them;
    - ``addresses``: the addresses alone;
    - ``errno``: the first OS error number among the failures (``None`` if
      none came from the OS, as for a connection the server closed);
    - ``address``: the address that ``errno`` is of (else the first address);
    - ``shutting_down``: a server answered the request ``shutting-down`` (it
      was stopping; the request had no effect) and no server took it again
      within its limit; the message then says so.

    Example::

        try:
            client.ping()
        except ConnectionError as error:  # a ringlock.NoConnectionError
            print(error)  # no usable connection after 10.0 s: 127.0.0.1:7700 (connection refused)
            print(error.address, error.errno, error.addresses)
    """

    def __init__(
        self,
        code: str = "no-connection",
        op: str | None = None,
        key: str | None = None,
        message: str | None = None,
        *,
        waited: float = 0.0,
        failures: tuple[ConnectionFailure, ...] | list[ConnectionFailure] = (),
        shutting_down: bool = False,
    ) -> None:
        self.waited = waited
        self.failures = list(failures)
        self.addresses = [failure.address for failure in self.failures]
        self.shutting_down = shutting_down
        if message is None:
            message = f"no usable connection after {waited:.1f} s"
            if shutting_down:
                message += " (the server was shutting down)"
            if self.failures:
                message += ": " + ", ".join(str(failure) for failure in self.failures)
            # The request is in ``op`` and ``key``, not in the message, which
            # reads the same in every client.
        super().__init__(code, op, key, message)
        # OSError's own field, set after its constructor so that it does not
        # turn the message into "[Errno n] ...".
        self.errno = next((failure.errno for failure in self.failures if failure.errno is not None), None)
        self.address: str | None = next(
            (failure.address for failure in self.failures if failure.errno is not None),
            self.addresses[0] if self.addresses else None,
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild_no_connection,
            (
                type(self),
                self.code,
                self.op,
                self.key,
                str(self),
                self.waited,
                tuple(self.failures),
                self.shutting_down,
            ),
        )


def _rebuild_no_connection(
    cls: type[NoConnectionError],
    code: str,
    op: str | None,
    key: str | None,
    message: str,
    waited: float,
    failures: tuple[ConnectionFailure, ...],
    shutting_down: bool = False,
) -> NoConnectionError:
    """Unpickles a :class:`NoConnectionError` or a subclass (:class:`TLSError`)."""
    error = cls(code, op, key, message, waited=waited, failures=failures)
    error.shutting_down = shutting_down
    return error


class TLSError(NoConnectionError):
    """TLS failed on every address the request could use, for as long as
    it could wait (code ``tls-failed``): the server's certificate was not
    trusted by the client's CA, had expired or was for another name, or the
    server refused the client (no or a wrong client certificate, for a
    server that requires one). No request was sent in clear.

    It is a :class:`NoConnectionError` (so a :class:`ConnectionError`),
    with its attributes, and also:

    - ``address``: the first address that failed so;
    - ``reason``: what went wrong there, in words (from :mod:`ssl`).

    The client keeps reconnecting with its usual pauses.

    Example::

        try:
            client.ping()
        except ringlock.TLSError as error:
            print(error)  # TLS failed after 1.0 s: 127.0.0.1:7700 (TLS: the server's certificate is not trusted: ...)
            print(error.address, error.reason)
    """

    def __init__(
        self,
        code: str = "tls-failed",
        op: str | None = None,
        key: str | None = None,
        message: str | None = None,
        *,
        waited: float = 0.0,
        failures: tuple[ConnectionFailure, ...] | list[ConnectionFailure] = (),
    ) -> None:
        failures = list(failures)
        if message is None:
            message = f"TLS failed after {waited:.1f} s: " + ", ".join(str(failure) for failure in failures)
        super().__init__(code, op, key, message, waited=waited, failures=failures)
        # The address and reason of the first TLS failure, set after the base
        # class, which would otherwise name the first address with an errno.
        first = next((failure for failure in failures if failure.tls is not None), None)
        self.address = first.address if first is not None else ""
        self.reason = first.tls if first is not None and first.tls is not None else ""


class AuthenticationError(RinglockError):
    """The server refused the client's secret, on every address the request
    could use, for as long as the request could wait: ``code`` is
    ``auth-failed`` (no name of the server's auth file has this secret, or a
    reload removed it) or ``auth-disabled`` (the server has no auth file),
    and ``address`` the address that answered so (the first, if several
    did). The secret is never in the message.

    The client keeps reconnecting with its usual pauses, so a secret added
    to the server's auth file later is taken.

    Example::

        try:
            client.ping()
        except ringlock.AuthenticationError as error:
            print(error)  # 127.0.0.1:7700 refused the client's secret: auth-failed
            print(error.address, error.code)
    """

    def __init__(
        self,
        code: str = "auth-failed",
        op: str | None = None,
        key: str | None = None,
        message: str | None = None,
        *,
        address: str = "",
    ) -> None:
        self.address = address
        if message is None:
            message = f"{address} refused the client's secret: {code}"
            if key is not None:
                message += f" ({op} {key})"
        super().__init__(code, op, key, message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_authentication, (self.code, self.op, self.key, str(self), self.address))


def _rebuild_authentication(
    code: str, op: str | None, key: str | None, message: str, address: str
) -> AuthenticationError:
    return AuthenticationError(code, op, key, message, address=address)


class ForbiddenError(RinglockError):
    """The server answered ``forbidden``: the key is outside the scope of
    the name the client's secret belongs to (or ``stats`` was asked without
    the ``stats`` right). An error of that request only: it had no effect,
    is not retried, and the connection stays up.

    Example::

        try:
            client.lock("billing/1").acquire()
        except ringlock.ForbiddenError as error:
            print("not ours:", error.key)
    """


class ProtocolError(RinglockError):
    """The server broke the protocol (a malformed or unsolicited reply); the
    client dropped that connection.

    Example::

        except ringlock.ProtocolError as error:
            log.error("ringlock protocol violation: %s", error)
    """


_CAPACITY_CODES = frozenset({"too-many-waiters", "too-many-keys", "too-many-connections", "too-many-in-flight"})


def error_for(code: str, op: str | None = None, key: str | None = None, message: str | None = None) -> RinglockError:
    """The exception for an error code, of the subclass that groups it.

    Example::

        >>> type(error_for("too-many-keys", "A", "k")).__name__
        'CapacityError'
    """
    cls: type[RinglockError]
    if code in _CAPACITY_CODES:
        cls = CapacityError
    elif code == "shutting-down":
        cls = ShuttingDownError
    elif code == "no-connection":
        cls = NoConnectionError
    elif code == "no-active":
        cls = NoActiveNodeError
    elif code == "protocol":
        cls = ProtocolError
    elif code == "forbidden":
        cls = ForbiddenError
    elif code in ("auth-failed", "auth-disabled"):
        cls = AuthenticationError
    elif code == "timeout":
        cls = LockTimeoutError
    else:
        cls = RinglockError
    if message is None and code in _RANGES:
        message = f"{code} ({op} {key}): {_RANGES[code]}" if key is not None else f"{code}: {_RANGES[code]}"
    return cls(code, op, key, message)


_RANGES = {
    "bad-lease": "a lease is above 0 and at most the server's --max-lease (default 86400 s)",
    "bad-wait": "a wait is at most 86400 s",
}
"""The accepted range, named in the message of a server's range error."""
