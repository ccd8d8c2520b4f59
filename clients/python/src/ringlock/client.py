"""The sync client: :class:`Client` and :class:`Lock`, and
:class:`Clusters` for several clusters.

Background threads own the connections (see ``_threaded``), so any number
of user threads can share one client and their requests are pipelined over
its connections.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from ._clusters import ClustersBase
from ._common import ClientBase, LockBase, inspected
from ._operation import ACQUIRE, EXTEND, INSPECT, PING, RELEASE, STATS
from ._protocol import KeyState, Pong, key_bytes
from ._router import Router
from ._threaded import ThreadRuntime
from .errors import LockLostError, RinglockError

__all__ = ["Client", "Clusters", "Lock"]


class _Waiter:
    """A blocked caller, woken by the thread that completes its request."""

    __slots__ = ("_lock", "abandoned", "done", "value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.value: object = None
        self.done = False
        self.abandoned = False

    def complete(self, value: object) -> bool:
        self.value = value
        self.done = True
        self._lock.release()
        return not self.abandoned

    def wait(self) -> object:
        try:
            self._lock.acquire()
        except BaseException:
            # Interrupted (KeyboardInterrupt, say). Whichever of this and
            # complete() looks second sees the other's flag, so a grant
            # that arrives anyway is released once (or twice, harmlessly:
            # the second finds nothing to release).
            self.abandoned = True
            raise
        return self.value


class _Callback:
    """Hands a request's outcome to a function, on the thread completing it."""

    __slots__ = ("_function",)

    def __init__(self, function: Callable[[object], None]) -> None:
        self._function = function

    def complete(self, value: object) -> bool:
        self._function(value)
        return True

    @property
    def abandoned(self) -> bool:
        return False


class Client(ClientBase):
    """A ringlock client: persistent background connections to the given
    nodes, shared by every thread that uses it.

    ``addresses`` is one ``"host:port"`` or a list of them (every node of a
    cluster, in any order). The client connects in the background and
    returns at once; requests made before a connection is up wait for it.

    The keyword settings are the defaults of docs/protocol.md §4 and rarely need changing:
    ``connections_per_node`` (2 with one address, else 1),
    ``reconnect_delay_first`` (0.05 s) and ``reconnect_delay_max`` (3 s): a
    broken connection is tried again at once, then after doubling pauses
    from the first to the longest, each drawn between half its length and
    all of it, starting over once a connection has answered or stayed open
    for the longest pause;
    ``connect_limit`` (10 s): how long a request with no limit of its own
    (an acquire with no wait or that tries once, a ping, an inspect) waits
    for a usable connection before it raises
    :class:`~ringlock.NoConnectionError`; an acquire waits within its wait,
    an extend within the lease it has left, a release within its retries;
    ``connect_timeout`` (1 s),
    ``release_retry_interval`` (0.2 s, also spaces "no active known"
    retries), ``release_retry_for`` (5 s, also bounds them),
    ``redirect_limit`` (16 ``M`` redirects per request),
    ``in_flight_per_connection_max`` (65536),
    ``suspect_after`` (1 s) and ``ping_timeout`` (1 s): a connection with
    requests in flight that has read nothing for ``suspect_after`` is sent
    ``P``, and cut if nothing comes within ``ping_timeout``, as a broken
    connection, so that a host that vanished or a partition (no reset, no
    close) ends or moves a request within its own limit plus
    ``suspect_after + ping_timeout`` and a tick (a quarter of the shorter),
    never only when the link comes back. Sockets use TCP keepalive and, on
    Linux, ``TCP_USER_TIMEOUT`` of ``suspect_after + ping_timeout``.

    ``secret``: for servers started with ``--auth-file``, the secret every
    connection (and every reconnect) sends as ``U <secret>`` before any
    request; the connection carries requests only once the server has
    answered with the name the secret belongs to
    (:attr:`authenticated_name`). Without it, the client takes the
    environment variable ``RINGLOCK_SECRET`` if it is set and not empty,
    which keeps the secret out of code and shell history. A refused secret
    fails the connection, which is retried with the usual pauses; requests
    waiting for a connection raise :class:`~ringlock.AuthenticationError`
    past their limit. The secret never appears in ``repr`` or in errors.

    TLS, for servers started with ``--tls-cert``: ``tls_ca`` (a PEM file of
    the CA that signed the server's certificate) turns it on;
    ``tls_cert`` and ``tls_key`` (PEM files) add a client certificate, for
    servers that require one (``--tls-client-ca``); ``tls_server_name`` is
    the name the server's certificate must hold (default: the host of each
    address, an IP address checked against the certificate's IP names).
    ``ssl_context`` instead of ``tls_ca``/``tls_cert``/``tls_key`` brings an
    :class:`ssl.SSLContext` of your own, used as it is. The client offers TLS
    1.2 and 1.3; every connect, and reconnect, does the handshake within
    ``connect_timeout`` before anything else (the ``U`` line included). A
    handshake that fails fails the connection like a refused connect: it is
    retried with the usual pauses, and requests waiting for a connection
    raise :class:`~ringlock.TLSError` (a :class:`ConnectionError`) past
    their limit, naming the address and what TLS said. Bad files raise
    :class:`ValueError` here.

    Example::

        import ringlock

        with ringlock.Client("127.0.0.1:7700") as client:
            with client.lock("orders/42", lease=30, wait=5) as lock:
                write_to_storage(lock.token)  # the storage refuses lower tokens

        mutual = {"tls_ca": "ca.pem", "tls_cert": "client.pem", "tls_key": "client-key.pem"}
        with ringlock.Client("127.0.0.1:7700", **mutual) as client:
            client.ping()  # over mutual TLS
    """

    _router: Router

    def _set_up(self) -> None:
        self._runtime = ThreadRuntime(self.settings)
        settings = self.settings
        self._router = Router(settings.addresses, settings.connections_per_node, settings.policy, self._runtime)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout: float = 2.0) -> None:
        """Closes the connections, after sending what is queued (the releases
        of locks still held, say) and waiting up to about a second for their
        answers; waits up to ``timeout`` for the threads to end. Requests
        still waiting end with :class:`~ringlock.NoActiveNodeError`.

        Example::

            client = ringlock.Client("127.0.0.1:7700")
            try:
                client.ping()
            finally:
                client.close()
        """
        if self._router.closed:
            return
        self._router.close()
        self._runtime.close(timeout)

    def lock(
        self,
        key: str | bytes,
        lease: float = 30.0,
        wait: float | None = None,
        *,
        auto_extend: bool = False,
        on_lost: Callable[[Lock, LockLostError], None] | None = None,
    ) -> Lock:
        """A :class:`Lock` on ``key``, not acquired yet.

        ``lease`` (seconds) bounds how long the server lets the key be held
        without a release or an extend; ``wait`` (seconds, ``None`` for no
        limit, ``ringlock.NO_LIMIT``; ``0``, ``ringlock.TRY_ONCE``, to take
        the key only if it is free) how long :meth:`Lock.acquire` waits in
        the key's FIFO queue.
        With ``auto_extend``, the lock extends its lease at about a third of
        it while held; if that fails for good, ``on_lost(lock, error)`` is
        called (from a client thread; keep it short), :attr:`Lock.lost` and
        :attr:`Lock.lost_event` are set, and the lock's ``with`` block
        raises :class:`~ringlock.LockLostError` at its end. The lock is
        declared lost only when the server answers ``not-holder`` (it
        restarted, or someone released the key with the token) or the lease
        ran out without a confirmed extend; a failed extend is retried on
        other connections every ``release_retry_interval`` while the lease
        lasts.

        Raises :class:`ValueError` for a key the protocol refuses (empty,
        over 250 bytes, with a space, tab, CR, LF or NUL, or ``"-"``), a
        lease that is not positive, or a wait that is negative or over a
        day; the message names the accepted range.

        Example::

            lock = client.lock("reports/daily", lease=60, wait=ringlock.TRY_ONCE)
            if lock.acquire():
                try:
                    build_report()
                finally:
                    lock.release()
        """
        return Lock(self, key, lease, wait, auto_extend, on_lost)

    def lock_from(
        self,
        key: str | bytes,
        token: int,
        lease: float = 30.0,
        *,
        auto_extend: bool = False,
        on_lost: Callable[[Lock, LockLostError], None] | None = None,
    ) -> Lock:
        """A :class:`Lock` holding the grant another process (or an earlier
        run) took, given its key and token (``ringlock-cli acquire`` prints
        both): it can be released, extended, asked :meth:`Lock.held` and
        kept with ``auto_extend``, whose extends ask for ``lease``. Nothing
        is sent: the lease it has left is not known, so :meth:`Lock.locked`
        is true until a release, an extend or the end of a lease this
        client confirmed says otherwise. With ``auto_extend``, until a first
        extend is confirmed only ``not-holder`` declares it lost (its lease
        end is not known).

        Raises :class:`ValueError` for a bad key (as :meth:`lock`), lease
        or token (a decimal ``u64``).

        Example::

            lock = client.lock_from("deploy", int(os.environ["DEPLOY_TOKEN"]))
            lock.release()
        """
        lock = Lock(self, key, lease, None, auto_extend, on_lost)
        lock._adopt(token)
        return lock

    def ping(self) -> Pong:
        """Asks a node its role, epoch and the active it names.

        Example::

            pong = client.ping()
            print(pong.role, pong.epoch, pong.active)
        """
        return self._request(PING, b"")  # type: ignore[return-value]

    def stats(self) -> dict[str, Any]:
        """A node's counters and gauges (its ``S`` reply's JSON).

        Example::

            print(client.stats()["role"])
        """
        return self._request(STATS, b"")  # type: ignore[return-value]

    def inspect(self, key: str | bytes) -> KeyState:
        """What the active node knows of ``key`` now (``I <key>``): the
        fencing token of the grant holding it (``None`` if it is free), the
        seconds its lease has left, and how many acquires wait for it. It
        changes nothing on the server; the answer may be stale as soon as it
        arrives, so use it to look, not to decide who may write.

        Raises :class:`ValueError` for a key the protocol refuses (as
        :meth:`lock`), before anything is sent; otherwise fails as
        :meth:`ping` does, and an error code from the server (such as
        ``bad-request``) raises :class:`~ringlock.RinglockError` with
        ``op == "I"``. A standby's ``M`` redirect is followed.

        Example::

            state = client.inspect("orders/42")
            if state.token is None:
                print("free,", state.waiters, "waiting")
            else:
                print(f"held by token {state.token} for {state.lease_left:.3f} s more")
        """
        raw = key_bytes(key)
        state: KeyState = self._request(INSPECT, raw)  # type: ignore[assignment]
        return inspected(state, key)

    def _request(self, kind: int, key: bytes, **fields: Any) -> object:
        waiter = _Waiter()
        self._router.submit(kind, key, waiter, **fields)
        try:
            value = waiter.wait()
        except BaseException:
            # Interrupted after the grant arrived: nobody will hold it.
            if waiter.done and kind == ACQUIRE and type(waiter.value) is int:
                self._router.submit(RELEASE, key, None, token=waiter.value)
            raise
        if isinstance(value, RinglockError):
            raise value
        return value

    def _background(self, kind: int, key: bytes, callback: Callable[[object], None], **fields: Any) -> None:
        self._router.submit(kind, key, _Callback(callback), **fields)

    def _call_at(self, at: float, callback: Callable[[], None]) -> bool:
        return self._runtime.call_at(at, callback)


class Lock(LockBase):
    """A named lock on a ringlock server, used like :class:`threading.Lock`.

    Made by :meth:`Client.lock`. While held it has the grant's fencing
    ``token``: pass it to the resource the lock protects, which should
    refuse any token lower than the highest it has seen. A lock object is
    one holder: share the :class:`Client` between threads, and give each
    thread its own ``Lock`` (they are cheap). Locks are not re-entrant.

    Example::

        lock = client.lock("jobs/7", lease=10, wait=2)
        if lock.acquire():
            try:
                run(lock.token)
                lock.extend(10)  # a long job: the lease now ends 10 s from now
            finally:
                lock.release()

        with client.lock("jobs/7", lease=10, wait=2) as lock:  # LockTimeoutError if not granted
            run(lock.token)
    """

    _EVENT = threading.Event

    def __init__(
        self,
        client: Client,
        key: str | bytes,
        lease: float,
        wait: float | None,
        auto_extend: bool,
        on_lost: Callable[[Lock, LockLostError], None] | None,
    ) -> None:
        super().__init__(client, key, lease, wait, auto_extend, on_lost)
        self._client: Client = client

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Acquires the key; ``True`` once granted, ``False`` if the wait ran
        out (nothing was granted then).

        The wait is ``timeout`` if given, else the lock's ``wait``; with
        ``blocking=False`` or a wait of ``TRY_ONCE`` (``0``) it is the
        shortest the protocol can say (1 ms), so only a free key is granted. The server enforces the wait, and
        queued requests are served in FIFO order.

        Raises :class:`RuntimeError` if this lock already holds its key, and
        a :class:`~ringlock.RinglockError` if the request failed (no
        connection, a full server, ...).

        Example::

            lock = client.lock("k", lease=5)
            if lock.acquire(timeout=0.5):
                lock.release()
            assert lock.acquire(blocking=False) in (True, False)
        """
        fields = self._acquire_fields(blocking, timeout)
        token = self._client._request(ACQUIRE, self._key_bytes, **fields)
        if token is None:
            return False
        lease_ends = self._acquired(token)  # type: ignore[arg-type]
        if self.auto_extend:
            self._schedule_extend(self._grant, lease_ends)
        return True

    def _adopt(self, token: int) -> None:
        """Holds the grant of ``token``, taken elsewhere (:meth:`Client.lock_from`)."""
        self._adopted(token)
        if self.auto_extend:
            self._schedule_extend(self._grant, math.inf)

    def held(self) -> bool:
        """Asks the server (``I <key>``) whether this lock's grant still
        holds the key; ``False`` if this lock holds nothing. It changes
        nothing: a grant found gone is not marked lost (only an extend's
        ``not-holder`` or a lease run out does that). Fails as
        :meth:`Client.inspect`.

        Example::

            if not lock.held():
                stop_writing()
        """
        token = self._token
        if token is None:
            return False
        state: KeyState = self._client._request(INSPECT, self._key_bytes)  # type: ignore[assignment]
        return self._held_by(state, token)

    def release(self) -> bool:
        """Releases the key and waits for the server's answer: ``True`` if
        released (handed to the next waiter, if any), ``False`` if nothing
        was left to release (the lease ran out, or the server forgot it).

        A release cut off by a broken connection is sent again at once on
        another connection, else every 200 ms for 5 s.

        Raises :class:`~ringlock.LockNotOwnedError` if this lock holds
        nothing.

        Example::

            lock.acquire()
            assert lock.release() is True
        """
        token = self._release_token()
        return self._client._request(RELEASE, self._key_bytes, token=token)  # type: ignore[return-value]

    def extend(self, lease: float) -> None:
        """Makes the lease end ``lease`` seconds from when the server reads
        the request, sooner or later than before.

        Raises :class:`~ringlock.LockNotOwnedError` if this lock holds
        nothing, and :class:`~ringlock.LockLostError` if the server no longer
        has the grant (its lease ran out): stop using the resource.

        Example::

            with client.lock("batch", lease=10) as lock:
                for chunk in chunks:
                    process(chunk)
                    lock.extend(10)
        """
        fields = self._extend_fields(lease)
        sent_at = time.monotonic()
        try:
            self._client._request(EXTEND, self._key_bytes, **fields)
        except LockLostError as error:
            self._mark_lost(fields["token"], error)
            raise
        self._extended(fields["token"], sent_at, lease)

    def __enter__(self) -> Lock:
        if not self.acquire():
            raise self._not_granted()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        released = self.release() if self._token is not None else None
        # Tell the caller the block ran without the lock for a while,
        # unless it is already failing.
        lost = self._block_error(released)
        if lost is not None and exc_type is None:
            raise lost

    def _schedule_extend(self, grant: int, lease_ends: float) -> None:
        """Extends the lease at a third of it, while this grant lasts, and
        watches for the lease to run out without a confirmed extend."""
        self._client._call_at(time.monotonic() + self._extend_period, lambda: self._extend_now(grant, lease_ends))
        token = self._token
        if token is not None and not math.isinf(lease_ends):
            self._client._call_at(lease_ends, lambda: grant == self._grant and self._lease_ran_out(token))

    def _extend_now(self, grant: int, lease_ends: float) -> None:
        token = self._token
        if grant != self._grant or token is None:
            return
        sent_at = time.monotonic()

        def done(value: object) -> None:
            if grant != self._grant or self._token is None:
                return
            if value is True:
                self._schedule_extend(grant, self._auto_extended(token, sent_at))
                return
            retry = self._auto_extend_retry(token, value, lease_ends)
            if retry is not None:
                # No connection for now: try again while the lease lasts.
                self._client._call_at(time.monotonic() + retry, lambda: self._extend_now(grant, lease_ends))

        self._client._background(EXTEND, self._key_bytes, done, **self._auto_extend_fields(token, lease_ends))


class Clusters(ClustersBase[Client, Lock]):
    """Several independent clusters, each a :class:`Client` under a name:
    every key goes to one of them, chosen by :func:`ringlock.cluster_for`
    (rendezvous hashing over the names, the same in every official client),
    so adding a cluster moves only about 1/N of the keys.

    ``clients`` maps each cluster's name (a non-empty ``str``, unique) to
    its client. The calls that take a key go to the chosen cluster's
    client, with the same arguments; a :class:`Lock` belongs to its
    cluster's client, so its release and extends go there. Tokens come from
    each key's own cluster: tokens of keys in different clusters are not
    comparable. To take a cluster out, drain it first (docs/protocol.md
    §4, "Several clusters").

    Raises :class:`ValueError` for no cluster or a bad name, and
    :class:`TypeError` if a value is not a :class:`Client`.

    Example::

        import ringlock

        with ringlock.Clusters({
            "a": ringlock.Client(["10.0.0.1:7700", "10.0.0.2:7700"]),
            "b": ringlock.Client(["10.0.1.1:7700", "10.0.1.2:7700"]),
        }) as clusters:
            with clusters.lock("orders/42", lease=30, wait=5) as lock:
                print(clusters.name_for("orders/42"), lock.token)
    """

    def __init__(self, clients: Mapping[str, Client]) -> None:
        super().__init__(clients, Client, "ringlock.Client")

    def __enter__(self) -> Clusters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def inspect(self, key: str | bytes) -> KeyState:
        """:meth:`Client.inspect` on the client of ``key``'s cluster.

        Example::

            print(clusters.inspect("orders/42").held)
        """
        return self.client_for(key).inspect(key)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Each cluster's ``S`` reply (:meth:`Client.stats`), by name: to
        see, say, that a cluster being drained holds no key any more.

        Example::

            print(clusters.stats()["b"]["total"]["held_keys"])
        """
        return {name: client.stats() for name, client in self._clients.items()}

    def close(self, timeout: float = 2.0) -> None:
        """Closes every cluster's client (:meth:`Client.close`).

        Example::

            clusters.close()
        """
        for client in self._clients.values():
            client.close(timeout)
