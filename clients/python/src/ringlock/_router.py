"""Which connection a request goes to, and what happens to it after each
step (docs/protocol.md §4): round-robin over the usable connections, the active node's
first once an ``M`` reply has named it.

The router is shared by the threaded and the asyncio client. They differ
only in their connections and in how they wait, which they give the router
as a small :class:`Runtime`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ._operation import (
    ACQUIRE,
    DONE,
    NO_CONNECTION,
    REDIRECT,
    RELEASE,
    RESEND,
    UNSENT_ACTIVE_UNREACHABLE,
    UNSENT_FULL,
    UNSENT_NO_CONNECTION,
    Operation,
    Policy,
    Step,
    Waiter,
)
from .errors import AuthenticationError, ConnectionFailure, NoConnectionError, RinglockError, TLSError, error_for

NODES_MAX = 16
"""Most nodes a client learns of (a cluster has at most 16)."""

# Why a connection did not take a request.
REFUSED_UNUSABLE = 1
REFUSED_FULL = 2


class Connection(Protocol):
    """What the router needs of a connection."""

    node: int

    @property
    def last_failure(self) -> tuple[float, ConnectionFailure] | None:
        """How the last connect failed or the last socket broke, and when (monotonic)."""
        ...

    @property
    def usable(self) -> bool: ...

    def try_send(self, operation: Operation, now: float) -> int:
        """Queues the request; 0 if taken, else why not (``REFUSED_*``)."""
        ...

    def close(self) -> None: ...


class Runtime(Protocol):
    """How the router's user makes connections and waits."""

    def connect(self, router: Router, address: str, node: int) -> Connection:
        """A new connection to ``address``, started in the background."""
        ...

    def call_at(self, at: float, callback: Callable[[], None]) -> bool:
        """Runs ``callback`` at the monotonic instant ``at``; false once closed."""
        ...


class Router:
    """The nodes, their connections, and the rules of docs/protocol.md §4."""

    def __init__(self, addresses: Sequence[str], connections_per_node: int, policy: Policy, runtime: Runtime) -> None:
        self.policy = policy
        self.connections_per_node = connections_per_node
        self._runtime = runtime
        # Nodes are only ever added (from M replies naming an address the
        # client was not given), so an index stays valid.
        self.addresses: list[str] = []
        self.node_connections: list[list[Connection]] = []
        self.connections: list[Connection] = []
        self._add_lock = threading.Lock()
        self._next = itertools.count()
        self.active: int | None = None
        """The node an ``M`` reply last named as active."""
        self.closed = False
        self.authenticated_name: str | None = None
        """The name the server gave the client's secret when a connection
        last authenticated."""
        # Requests waiting for a usable connection, each with a retry timer
        # too; whoever takes one out of here (its timer, or a connection
        # coming up) sends it.
        self._waiting: dict[Operation, None] = {}
        self._waiting_lock = threading.Lock()
        for address in addresses:
            self._add_node(address)

    def _add_node(self, address: str) -> int:
        index = len(self.addresses)
        connections = [self._runtime.connect(self, address, index) for _ in range(self.connections_per_node)]
        # Appended whole, so that readers on other threads see a node only
        # with its connections.
        self.node_connections.append(connections)
        self.addresses.append(address)
        self.connections = self.connections + connections
        return index

    def submit(self, kind: int, key: bytes, waiter: Waiter | None, **fields: Any) -> None:
        """Starts a request; its outcome goes to ``waiter``."""
        now = time.monotonic()
        operation = Operation(kind, key, now, len(self.connections), self.policy, waiter, **fields)
        self.send(operation, now)

    def handle(self, operation: Operation, step: Step) -> None:
        """Carries out ``step`` for ``operation``."""
        what, value = step
        if what == DONE:
            self.finish(operation, value)
        elif what == RESEND:
            self.send(operation, time.monotonic())
        elif what == REDIRECT:
            self.send_to_active(operation)
        elif what == NO_CONNECTION:
            self.finish(operation, self.no_connection(operation, value))  # type: ignore[arg-type]
        elif operation.waiting_since is not None:
            with self._waiting_lock:
                self._waiting[operation] = None
            if not self._runtime.call_at(value, lambda: self._send_waiting(operation)):  # type: ignore[arg-type]
                with self._waiting_lock:
                    self._waiting.pop(operation, None)
                self.finish(operation, operation.error("no-connection", "the client is closed"))
        elif not self._runtime.call_at(value, lambda: self.send(operation, time.monotonic())):  # type: ignore[arg-type]
            self.finish(operation, operation.error("no-connection", "the client is closed"))

    def _send_waiting(self, operation: Operation) -> None:
        """Sends a request that waits for a connection, unless a connection
        that came up meanwhile sent it already."""
        with self._waiting_lock:
            if operation not in self._waiting:
                return
            del self._waiting[operation]
        self.send(operation, time.monotonic())

    def connection_up(self) -> None:
        """A connection just came up: the requests waiting for one go now."""
        with self._waiting_lock:
            waiting = list(self._waiting)
            self._waiting.clear()
        now = time.monotonic()
        for operation in waiting:
            self.send(operation, now)

    def no_connection(self, operation: Operation, waited: float) -> NoConnectionError | AuthenticationError:
        """The error of a request that found no usable connection within
        its limit, naming every address and its last failure; the secret's
        refusal if every address refused it (the request could not have
        gone anywhere with that secret), a :class:`TLSError` if TLS failed
        on every address."""
        key = operation.key.decode(errors="replace") if operation.key else None
        op = operation.op.decode()
        failures = self.connection_failures()
        if failures and all(failure.auth is not None for failure in failures):
            first = failures[0]
            return AuthenticationError(first.auth or "auth-failed", op, key, address=first.address)
        if failures and all(failure.tls is not None for failure in failures):
            return TLSError(op=op, key=key, waited=waited, failures=failures)
        return NoConnectionError(
            op=op, key=key, waited=waited, failures=failures, shutting_down=operation.shutting_down
        )

    def connection_failures(self) -> list[ConnectionFailure]:
        """Every node's address with the failure of its last attempt (the
        latest among its connections), in the order the nodes were given."""
        failures = []
        for address, connections in zip(self.addresses, self.node_connections):
            known = [connection.last_failure for connection in connections if connection.last_failure is not None]
            if known:
                failures.append(max(known, key=lambda timed: timed[0])[1])
            else:
                failures.append(ConnectionFailure(address, "no attempt has ended yet"))
        return failures

    def send(self, operation: Operation, now: float) -> None:
        """Sends on the next usable connection, the active node's first;
        drops it if its caller gave up meanwhile."""
        if operation.abandoned():
            return None
        if operation.expired(now):
            return self._expire(operation)
        start = next(self._next)
        full = False
        active = self.active
        if active is not None:
            refusal = _offer(self.node_connections[active], start, operation, now)
            if not refusal:
                return
            full = refusal == REFUSED_FULL
        refusal = _offer(self.connections, start, operation, now)
        if not refusal:
            return
        full = full or refusal == REFUSED_FULL
        unsent = UNSENT_FULL if full else UNSENT_NO_CONNECTION
        self.handle(operation, operation.on_unsent(unsent, now, self.policy))

    def send_to_active(self, operation: Operation) -> None:
        """Sends on the active node's connections only, after an ``M``."""
        if operation.abandoned():
            return None
        now = time.monotonic()
        if operation.expired(now):
            return self._expire(operation)
        active = self.active
        refusal = REFUSED_UNUSABLE
        if active is not None:
            refusal = _offer(self.node_connections[active], next(self._next), operation, now)
            if not refusal:
                return
        unsent = UNSENT_FULL if refusal == REFUSED_FULL else UNSENT_ACTIVE_UNREACHABLE
        self.handle(operation, operation.on_unsent(unsent, now, self.policy))

    def _expire(self, operation: Operation) -> None:
        """Ends an acquire whose wait ran out before it could be (re)sent:
        as timed out, as the server would have, unless it was waiting for a
        usable connection or for some node to name an active, which is then
        the error to report."""
        if operation.waiting_since is not None:
            return self.finish(operation, self.no_connection(operation, operation.waited(time.monotonic())))
        if operation.retry_until is not None:
            return self.finish(operation, operation.error("no-active", "no active node was named within the wait"))
        self.finish(operation, None)

    def finish(self, operation: Operation, value: object) -> None:
        """Hands the outcome to whoever waits. A grant nobody waits for any
        more (the caller gave up) is released at once."""
        waiter = operation.waiter
        if waiter is None:
            return
        if not waiter.complete(value) and operation.kind == ACQUIRE and type(value) is int:
            self.submit(RELEASE, operation.key, None, token=value)

    def cut(self, operations: list[Operation], error: RinglockError, answered: bool) -> None:
        """Takes back the requests of a connection that was cut; ``answered``
        if it had answered anything."""
        if self.closed:
            return self.abort(operations)
        now = time.monotonic()
        for operation in operations:
            if answered:
                operation.connection_answered()
            self.handle(operation, operation.on_cut(error, now, self.policy))

    def abort(self, operations: list[Operation]) -> None:
        """Ends requests that can go nowhere because the client is closing."""
        for operation in operations:
            self.finish(operation, operation.error("no-connection", "the client is closed"))

    def note_moved(self, from_node: int, active: bytes) -> None:
        """Learns from an ``M`` reply received from node ``from_node``."""
        if active == b"-":
            # The node we preferred no longer knows an active: spread
            # requests again until some node names one.
            if self.active == from_node:
                self.active = None
            return
        address = active.decode(errors="replace")
        index = _find_node(self.addresses, address)
        if index is None:
            with self._add_lock:
                index = _find_node(self.addresses, address)
                if index is None and len(self.addresses) < NODES_MAX and not self.closed:
                    index = self._add_node(address)
        if index is not None:
            self.active = index

    def close(self) -> None:
        """Stops sending; connections flush what is queued and close."""
        self.closed = True
        for connection in self.connections:
            connection.close()


def _offer(connections: list[Connection], start: int, operation: Operation, now: float) -> int:
    """Offers ``operation`` round-robin from ``start``: 0 once one took it,
    else ``REFUSED_FULL`` if any refused only for being full."""
    worst = REFUSED_UNUSABLE
    count = len(connections)
    # Its wait paused before it is offered: once taken, a reader thread may
    # cut it and set it again at any moment.
    saved = operation.go_out(now)
    for offset in range(count):
        refusal = connections[(start + offset) % count].try_send(operation, now)
        if not refusal:
            return 0
        if refusal == REFUSED_FULL:
            worst = REFUSED_FULL
    operation.stay_back(saved)
    return worst


def _find_node(addresses: list[str], address: str) -> int | None:
    """The node with this address: the same text, or the same host and port
    once brackets and case are set aside."""
    if address in addresses:
        return addresses.index(address)
    wanted = normalize_address(address)
    for index, known in enumerate(addresses):
        if normalize_address(known) == wanted:
            return index
    return None


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as a (host, port) pair.

    Example::

        >>> split_address("[::1]:7700")
        ('::1', 7700)
    """
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not a server address (host:port)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def normalize_address(address: str) -> tuple[str, int] | str:
    try:
        host, port = split_address(address)
    except ValueError:
        return address
    return host.lower(), port


def check_addresses(addresses: str | Sequence[str]) -> list[str]:
    """The client's addresses as a list, each checked."""
    if isinstance(addresses, str):
        addresses = [addresses]
    checked = list(addresses)
    if not checked:
        raise ValueError("give the client at least one server address")
    if len(checked) > NODES_MAX:
        raise ValueError(f"give the client at most {NODES_MAX} addresses")
    for address in checked:
        split_address(address)
    return checked


def no_connection(message: str) -> RinglockError:
    return error_for("no-connection", message=message)
