"""What the sync and asyncio clients share above the request machinery:
the connection-set properties of a client, and a lock's state and its
read-only view. Each client adds its own way of waiting (threads or the
event loop).
"""

from __future__ import annotations

import dataclasses
import math
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from ._protocol import KeyState, key_bytes, lease_ms, wait_ms
from ._router import Router
from ._settings import Settings
from .errors import LockLostError, LockNotOwnedError, LockTimeoutError

NO_LIMIT: Final = None
"""The wait of an acquire that waits in the key's queue for as long as it
takes (``wait=None``); the same form in every official client
(clients/README.md)."""

TRY_ONCE: Final = 0
"""The wait of an acquire that takes the key only if it is free now: it asks
the server for the shortest wait the protocol can say (1 ms), so it is never
queued behind the holder longer than the server's timer tick. A bare ``0``
is this form, as in every official client; any other number of seconds is a
bounded wait (``0.001`` waits up to 1 ms, it does not "try once")."""

_TRY_WAIT_MS = 1
"""The wait a try-once acquire asks for: the shortest the protocol can say."""

AUTO_EXTEND_FRACTION = 1 / 3
"""With ``auto_extend``, a lock extends its lease when this share of it has
passed since the grant or the last confirmed extend."""


def wait_form(wait: float | None) -> tuple[int, bool]:
    """A wait as the wire's milliseconds and whether it is the try-once form.

    Example::

        >>> wait_form(NO_LIMIT), wait_form(TRY_ONCE), wait_form(0.001), wait_form(2)
        ((0, False), (1, True), (1, False), (2000, False))
    """
    if wait is not None and not isinstance(wait, bool) and wait == 0:
        return _TRY_WAIT_MS, True
    return wait_ms(wait), False


def key_text(key: str | bytes) -> str:
    """A key as errors name it: as given if text, else decoded leniently.

    Example::

        >>> key_text("orders/42"), key_text(b"jobs/7")
        ('orders/42', 'jobs/7')
    """
    return key if isinstance(key, str) else key.decode(errors="replace")


def check_token(token: int) -> int:
    """A token given by the caller (``lock_from``), checked: a decimal ``u64``."""
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < 1 << 64:
        raise ValueError(f"a token is a decimal u64: {token!r}")
    return token


class ClientBase:
    """What both clients share of a client: their settings (one signature,
    checked once) and the properties of their connection set. Each front
    adds its I/O in :meth:`_set_up`."""

    _router: Router | None

    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        connections_per_node: int | None = None,
        reconnect_delay_first: float = 0.05,
        reconnect_delay_max: float = 3.0,
        connect_limit: float = 10.0,
        connect_timeout: float = 1.0,
        release_retry_interval: float = 0.2,
        release_retry_for: float = 5.0,
        redirect_limit: int = 16,
        in_flight_per_connection_max: int = 65536,
        secret: str | bytes | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_server_name: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        suspect_after: float = 1.0,
        ping_timeout: float = 1.0,
    ) -> None:
        self.settings = Settings.build(
            addresses,
            connections_per_node,
            reconnect_delay_first,
            reconnect_delay_max,
            connect_limit,
            connect_timeout,
            release_retry_interval,
            release_retry_for,
            redirect_limit,
            in_flight_per_connection_max,
            secret,
            tls_ca,
            tls_cert,
            tls_key,
            tls_server_name,
            ssl_context,
            suspect_after,
            ping_timeout,
        )
        self._set_up()

    def _set_up(self) -> None:
        """Makes the front's runtime (threads, or nothing until the loop runs)."""
        raise NotImplementedError

    @property
    def connection_count(self) -> int:
        """Connections the client has, usable or not (an asyncio client has
        none before its first use).

        Example::

            assert ringlock.Client("127.0.0.1:7700").connection_count == 2
        """
        return 0 if self._router is None else len(self._router.connections)

    @property
    def usable_connection_count(self) -> int:
        """Connections that are up now.

        Example::

            if client.usable_connection_count == 0:
                alert("ringlock unreachable")
        """
        if self._router is None:
            return 0
        return sum(1 for connection in self._router.connections if connection.usable)

    @property
    def authenticated_name(self) -> str | None:
        """The name the server gave the client's secret when a connection
        last authenticated; ``None`` without a secret or before any
        connection authenticated.

        Example::

            client = ringlock.Client("127.0.0.1:7700", secret=os.environ["MY_SECRET"])
            client.ping()
            print("authenticated as", client.authenticated_name)
        """
        return None if self._router is None else self._router.authenticated_name

    @property
    def active_node(self) -> str | None:
        """The address an ``M`` reply last named as active, if any.

        Example::

            print(client.active_node or "no redirect seen")
        """
        router = self._router
        if router is None or router.active is None:
            return None
        return router.addresses[router.active]


def inspected(state: KeyState, key: str | bytes) -> KeyState:
    """An ``inspect`` answer naming the key as the caller gave it."""
    return dataclasses.replace(state, key=key)


class LockBase:
    """A lock's settings and grant, checked and kept as both clients do."""

    _KIND = "ringlock.Lock"
    """How :func:`repr` names the class."""

    def __init__(
        self,
        client: Any,
        key: str | bytes,
        lease: float,
        wait: float | None,
        auto_extend: bool,
        on_lost: Callable[[Any, LockLostError], None] | None,
    ) -> None:
        self._client = client
        self._key = key
        self._key_bytes = key_bytes(key)
        self.lease = lease
        """The lease each grant asks for, in seconds."""
        self._lease_ms = lease_ms(lease)
        self.wait = wait
        """The default wait of ``acquire``, in seconds: ``NO_LIMIT`` (``None``),
        ``TRY_ONCE`` (``0``) or up to a day."""
        self._wait_ms, self._try_once = wait_form(wait)
        # When the current grant's lease ends at the latest, counted from
        # when the acquire or the last confirmed extend was sent; an extend
        # waits for a usable connection until then.
        # math.inf for a lock made from a token, whose lease is not known.
        self._lease_ends = 0.0
        self.auto_extend = auto_extend
        self.on_lost = on_lost
        self._token: int | None = None
        self._lost: LockLostError | None = None
        self._lost_event: Any = None
        # Tells apart the grants of this lock, so that an extension
        # scheduled for one grant does nothing to the next.
        self._grant = 0

    _EVENT: Any = None
    """The event class of :attr:`lost_event` (``threading.Event`` or ``asyncio.Event``)."""

    def _acquire_wait(self, blocking: bool, timeout: float | None) -> tuple[int, bool]:
        """The wait of one ``acquire``: try once when not ``blocking``,
        ``timeout`` if given (``TRY_ONCE`` or seconds; negative: the lock's
        wait), else the lock's wait."""
        if not blocking:
            return _TRY_WAIT_MS, True
        if timeout is not None and timeout >= 0:
            return wait_form(timeout)
        return self._wait_ms, self._try_once

    def _connection_deadline(self) -> float | None:
        """How long an extend may wait for a usable connection: until the
        lease this client knows of ends; the connect limit if not known."""
        return None if math.isinf(self._lease_ends) else self._lease_ends

    def _held_by(self, state: KeyState, token: int | None) -> bool:
        return token is not None and state.token == token

    def _mark_lost(self, token: int | None, error: LockLostError) -> None:
        """Records that the grant of ``token`` is gone and tells the holder
        at once: :attr:`lost`, :attr:`lost_event`, ``on_lost``."""
        if self._token != token or self._lost is not None:
            return
        self._lost = error
        if self._lost_event is not None:
            self._lost_event.set()
        if self.on_lost is not None:
            self.on_lost(self, error)

    @property
    def _extend_period(self) -> float:
        """Auto-extend's pause from a grant, or a confirmed extend, to the next extend."""
        return self.lease * AUTO_EXTEND_FRACTION

    def _auto_extended(self, token: int, sent_at: float) -> float:
        """Auto-extend's extend of ``token``'s grant, sent at ``sent_at``,
        was confirmed; returns when the lease now ends."""
        lease_ends = sent_at + self.lease
        if self._token == token:
            self._lease_ends = lease_ends
        return lease_ends

    def _auto_extend_retry(self, token: int, error: object, lease_ends: float) -> float | None:
        """Auto-extend's rule after an extend of ``token``'s grant failed
        with ``error``: the pause before trying again (another connection
        may carry it), or ``None`` if the lock is lost, and marked so: the
        server answered ``not-holder``, or the lease (ending at
        ``lease_ends``) runs out before the next try."""
        retry_interval: float = self._client.settings.release_retry_interval
        if isinstance(error, LockLostError):
            self._mark_lost(token, error)
            return None
        if time.monotonic() + retry_interval < lease_ends:
            return retry_interval
        self._mark_lost(
            token,
            LockLostError("lost", "X", key_text(self._key), f"the lease ran out without a confirmed extend: {error}"),
        )
        return None

    def _lease_ran_out(self, token: int) -> None:
        """Auto-extend's watch at the end of the lease it knew of: if no
        extend of ``token``'s grant was confirmed meanwhile (one may still
        wait for an answer), the lock is lost."""
        if self._token == token and time.monotonic() >= self._lease_ends:
            error = LockLostError("lost", "X", key_text(self._key), "the lease ran out without a confirmed extend")
            self._mark_lost(token, error)

    @property
    def lost_event(self) -> Any:
        """An event set once the current grant is lost (as :attr:`lost`);
        a ``threading.Event`` for the sync client, an ``asyncio.Event`` for
        the asyncio one. A new grant clears it.

        Example::

            lock = client.lock("jobs/7", lease=10, auto_extend=True)
            lock.acquire()
            while not lock.lost_event.is_set():
                do_a_step()
        """
        if self._lost_event is None:
            self._lost_event = self._EVENT()
            if self._lost is not None:
                self._lost_event.set()
        return self._lost_event

    def _granted(self, token: int, lease_ends: float) -> None:
        """Records a new grant."""
        self._grant += 1
        self._lost = None
        if self._lost_event is not None:
            self._lost_event.clear()
        self._token = token
        self._lease_ends = lease_ends

    # The steps of each call, around the one request a front sends and
    # waits for (with threads or awaited): what to send, and what the
    # answer means for the lock.

    def _acquire_fields(self, blocking: bool, timeout: float | None) -> dict[str, Any]:
        """The fields of an acquire; :class:`RuntimeError` if this lock
        holds its key already (locks are not re-entrant)."""
        if self._token is not None:
            raise RuntimeError(f"this Lock already holds {self._key!r}; locks are not re-entrant")
        wait, try_once = self._acquire_wait(blocking, timeout)
        return {"lease_ms": self._lease_ms, "wait_ms": wait, "try_once": try_once}

    def _acquired(self, token: int) -> float:
        """Records the grant of ``token``; returns when its lease ends. The
        lease is counted from the grant's arrival (the acquire may have
        waited in the key's queue, or for a connection, longer than the
        lease); an extend waits for a usable connection until it ends."""
        lease_ends = time.monotonic() + self.lease
        self._granted(token, lease_ends)
        return lease_ends

    def _adopted(self, token: int) -> None:
        """Records the grant of ``token``, taken elsewhere (``lock_from``):
        its lease end is not known."""
        self._granted(check_token(token), math.inf)

    def _release_token(self) -> int:
        """The token a release gives back, which this lock holds no more;
        :class:`~ringlock.LockNotOwnedError` if it holds nothing."""
        token = self._token
        if token is None:
            raise LockNotOwnedError("not-owned", "R", key_text(self._key), f"this Lock does not hold {self._key!r}")
        self._token = None
        return token

    def _extend_fields(self, lease: float) -> dict[str, Any]:
        """The fields of an extend to ``lease`` seconds;
        :class:`~ringlock.LockNotOwnedError` if this lock holds nothing."""
        token = self._token
        if token is None:
            raise LockNotOwnedError("not-owned", "X", key_text(self._key), f"this Lock does not hold {self._key!r}")
        return {"token": token, "lease_ms": lease_ms(lease), "connection_deadline": self._connection_deadline()}

    def _extended(self, token: int, sent_at: float, lease: float) -> None:
        """An extend of ``token``'s grant sent at ``sent_at`` was confirmed."""
        if self._token == token:
            self._lease_ends = sent_at + lease

    def _auto_extend_fields(self, token: int, lease_ends: float) -> dict[str, Any]:
        """The fields of auto-extend's extend of ``token``'s grant, whose
        lease ends at ``lease_ends`` (it may wait for a connection until then)."""
        deadline = None if math.isinf(lease_ends) else lease_ends
        return {"token": token, "lease_ms": self._lease_ms, "connection_deadline": deadline}

    def _not_granted(self) -> LockTimeoutError:
        """The error of a ``with`` block whose acquire was not granted."""
        return LockTimeoutError("timeout", "A", key_text(self._key), f"{self._key!r} was not granted within the wait")

    def _block_error(self, released: bool | None) -> LockLostError | None:
        """What the end of a ``with`` block raises (unless the block is
        failing already): the grant was lost, or the release at its end
        (``released``, ``None`` if nothing was held) found nothing left."""
        if self._lost is None and released is False:
            return LockLostError(
                "lost", "R", key_text(self._key), f"{self._key!r} was no longer held at the end of the block"
            )
        return self._lost

    @property
    def key(self) -> str | bytes:
        """The key, as given.

        Example::

            assert client.lock("orders/42").key == "orders/42"
        """
        return self._key

    @property
    def token(self) -> int | None:
        """The current grant's fencing token; ``None`` while not held. For
        one key, every grant's token is greater than every earlier one's.

        Example::

            with client.lock("k") as lock:
                storage.write(data, fencing_token=lock.token)
        """
        return self._token

    @property
    def lost(self) -> LockLostError | None:
        """Why the grant was lost, if an extend (automatic or not) found it
        gone, or the lease ran out while ``auto_extend`` could not extend it.

        Example::

            if lock.lost:
                stop_writing()
        """
        return self._lost

    def locked(self) -> bool:
        """Whether this lock holds its key as far as the client knows,
        without asking the server: false once released or lost, and once
        the lease has run out without a confirmed extend. ``held()`` asks
        the server.

        Example::

            lock.acquire()
            assert lock.locked()
        """
        return self._token is not None and self._lost is None and time.monotonic() < self._lease_ends

    def __repr__(self) -> str:
        return f"<{self._KIND} key={self._key!r} token={self._token}>"
