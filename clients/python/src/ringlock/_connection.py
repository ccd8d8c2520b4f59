"""One connection's state and rules, without its I/O: shared by the sync
client's thread connections and the asyncio client's protocol connections.

:class:`ConnectionCore` keeps what a connection knows (where it is in its
life, the requests in flight paired by (op, key), its silence watch, the
bytes of a reply line not complete yet, how its last socket ended) and
decides: whether it takes a request, what the bytes read mean (which
request each reply answers and its next step, or why the connection must
be dropped), what its periodic tick asks, what failure a socket's end is.
It reads, writes, sleeps and waits for nothing: the fronts feed it bytes
and ``now`` under their own locking, and carry out what it returns
(:func:`deliver` hands the replies' steps to the router).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from ._backoff import Reconnects
from ._liveness import CUT, PROBE, Liveness
from ._operation import CUT_IO, Operation, Step, cut_protocol
from ._pairing import Pairing
from ._protocol import AUTH_REFUSED_CODES, REPLY_LINE_LEN_MAX, auth_answer, auth_line, split_reply
from ._router import REFUSED_FULL, REFUSED_UNUSABLE, Router, split_address
from ._settings import Settings
from .errors import ConnectionFailure, RinglockError, error_for

# Where a connection is in its life.
CONNECTING = 0
"""The first connect is under way: it takes requests, sent once up."""
UP = 1
DOWN = 2
"""Broken: left out until it is connected again."""
CLOSED = 3

AUTH_REPLY_MARGIN_S = 1.0
"""How long a connection waits for the answer to its ``U`` line beyond the
connect timeout: the server answers a wrong secret only after 200 ms."""

Reply = tuple[Operation, Step, bytes | None]
"""A paired reply: its request, the request's next step, and the active an
``M`` reply named (``None`` for any other reply)."""


@dataclass(frozen=True)
class SetUp:
    """What a fresh socket to one address goes through before it carries
    requests, as data: the connect within ``connect_timeout``; with TLS the
    handshake, within the same timeout, checking the certificate against
    ``server_name``; with a secret the ``hello`` line (``U <secret>``), whose
    answer (:func:`auth_outcome`) must come within ``hello_timeout``.

    Example::

        >>> from ringlock._settings import Settings
        >>> settings = Settings.build("[::1]:7700", None, 0.05, 3.0, 10.0, 1.0, 0.2, 5.0, 16, 64, secret="s3cret")
        >>> setup = SetUp.of("[::1]:7700", settings)
        >>> setup.host, setup.port, setup.tls_context, setup.hello, setup.hello_timeout
        ('::1', 7700, None, b'U s3cret\\n', 2.0)
    """

    host: str
    port: int
    connect_timeout: float
    tls_context: ssl.SSLContext | None
    """``None`` for plain TCP."""
    server_name: str
    """The name the server's certificate must hold, with TLS."""
    hello: bytes | None = None
    """The first line sent, before any request; ``None`` without a secret."""
    hello_timeout: float = 0.0

    @staticmethod
    def of(address: str, settings: Settings) -> SetUp:
        host, port = split_address(address)
        tls = settings.tls
        secret = settings.secret
        return SetUp(
            host,
            port,
            settings.connect_timeout,
            None if tls is None else tls.context,
            host if tls is None else tls.server_name_for(host),
            None if secret is None else auth_line(secret.value),
            settings.connect_timeout + AUTH_REPLY_MARGIN_S,
        )


class ConnectionCore:
    """One connection to one node, as data and rules (see the module)."""

    __slots__ = (
        "address",
        "in_flight_max",
        "last_failure",
        "liveness",
        "node",
        "opened_at",
        "pairing",
        "pending",
        "phase",
        "policy",
        "read_error",
        "reconnects",
        "replied",
    )

    def __init__(self, address: str, node: int, settings: Settings) -> None:
        self.address = address
        self.node = node
        self.phase = CONNECTING
        self.in_flight_max = settings.in_flight_per_connection_max
        self.policy = settings.policy
        self.pairing: Pairing[Operation] = Pairing()
        self.liveness = Liveness(settings.suspect_after, settings.ping_timeout)
        # The start of a reply line not read whole yet.
        self.pending = b""
        # While one socket is read: whether a reply was paired, and the OS
        # error (or the silence, or the revocation) that ended it, if one did.
        self.replied = False
        self.read_error: Exception | None = None
        self.last_failure: tuple[float, ConnectionFailure] | None = None
        """How the last connect failed or the last socket broke, and when (monotonic)."""
        self.reconnects = Reconnects(settings.reconnect_delay_first, settings.reconnect_delay_max)
        # When the current socket became the connection's.
        self.opened_at = 0.0

    @property
    def usable(self) -> bool:
        return self.phase == UP

    def admit(self, operation: Operation, now: float) -> int:
        """Records ``operation`` as in flight, sent after every request here;
        0 if taken, else why not (``REFUSED_*``): the connection is broken
        or closed, or has as many requests in flight as it may."""
        phase = self.phase
        if phase != UP and phase != CONNECTING:
            return REFUSED_UNUSABLE
        pairing = self.pairing
        if len(pairing) >= self.in_flight_max:
            return REFUSED_FULL
        if not pairing:
            self.liveness.busy_since = now
        pairing.push(operation.op, operation.key, operation)
        return 0

    def opened(self, now: float, carried: bytes = b"") -> None:
        """A fresh socket is the connection's; ``carried`` is what was read
        on it already, past the answer to ``U``."""
        self.liveness.reset(now)
        self.opened_at = now
        self.pending = carried
        self.replied = False
        self.read_error = None

    def attempt_failed(self, failure: ConnectionFailure, now: float) -> tuple[RinglockError, bool]:
        """A connect, a TLS handshake or the answer to ``U`` failed (a
        refused secret too): ``failure`` is this address's last. Returns how
        the router cuts the requests in flight (as on a broken connection
        that answered nothing). Called before the connection is taken down,
        so that a request that finds it down names this failure. The reconnect schedule is not reset, so a
        wrong CA or secret is retried with growing pauses."""
        self.last_failure = (now, failure)
        return CUT_IO, False

    def socket_ended(self, error: RinglockError, now: float) -> tuple[RinglockError, bool]:
        """The socket that was the connection's ended (``error`` says how);
        returns how the router cuts the requests in flight, and whether the
        socket answered anything. A socket that answered, or stayed open for
        the longest pause, starts the reconnect schedule over. Called before
        the connection is taken down, as :meth:`attempt_failed`."""
        self.last_failure = (now, self.ended(error))
        self.reconnects.session_ended(self.replied, now - self.opened_at)
        return error, self.replied

    def take_down(self) -> list[Operation]:
        """Marks the connection broken (unless closed); takes back every
        request in flight but its own pings, which go nowhere else."""
        if self.phase != CLOSED:
            self.phase = DOWN
        self.pending = b""
        return [operation for operation in self.pairing.drain() if operation.waiter is not PROBE]

    def tick(self, now: float) -> int:
        """The periodic silence check: ``QUIET``, ``SEND_PING`` (the front
        sends a probe) or ``CUT`` (the front drops the socket, whose
        failure is then the silence)."""
        action = self.liveness.check(now, bool(self.pairing))
        if action == CUT:
            self.read_error = self.liveness.silence(now)
        return action

    def read(self, data: bytes, now: float) -> tuple[list[Reply], RinglockError | None]:
        """Bytes read (plaintext): the replies they complete, each paired
        with its request and that request's next step, in the order read;
        and why the connection must be dropped, if it must (the server broke
        the protocol or refused the connection). Lines after a bad one are
        not taken: their requests stay in flight, for the cut to move on."""
        if self.pending:
            data = self.pending + data
        if b"\n" not in data:
            self.pending = data
            if len(data) > REPLY_LINE_LEN_MAX:
                return [], cut_protocol("reply line too long")
            return [], None
        lines = data.split(b"\n")
        self.pending = lines.pop()
        replies: list[Reply] = []
        pairing = self.pairing
        take = pairing.take
        policy = self.policy
        for line in lines:
            if line[-1:] == b"\r":
                line = line[:-1]
            try:
                op, key, fields = split_reply(line)
            except ValueError:
                return replies, cut_protocol(f"malformed reply {line[:100]!r}")
            if op == b"-":
                # E - - <code>: the server could not read a line, or
                # refuses the connection; it closes it.
                code = fields[3].decode(errors="replace")
                if code == "auth-revoked":
                    # A reload removed the secret's name: a broken connection
                    # like any other, reconnected with the secret (refused
                    # then, if it was removed).
                    self.read_error = ConnectionAbortedError("the server revoked the secret's name")
                    return replies, CUT_IO
                return replies, error_for(code, message=f"the server refused the connection: {code}")
            operation = take(op, key)
            if operation is None:
                return replies, cut_protocol(f"reply {line[:100]!r} answers no request in flight")
            try:
                step = operation.on_reply(fields, policy, now)
            except ValueError:
                pairing.push(operation.op, operation.key, operation)
                return replies, cut_protocol(f"malformed reply {line[:100]!r}")
            self.replied = True
            replies.append((operation, step, fields[3] if fields[0] == b"M" else None))
        return replies, None

    def ended(self, error: RinglockError) -> ConnectionFailure:
        """How the last socket's reading ended (``error``), as this address's failure."""
        if self.read_error is not None:
            return ConnectionFailure.from_os_error(self.address, self.read_error)
        if error.code == "no-connection":
            return ConnectionFailure(self.address, "closed by the server")
        return ConnectionFailure(self.address, f"dropped: {error}")


class CoreConnection:
    """What the router reads of a connection (see
    :class:`~ringlock._router.Connection`), from its core; the fronts'
    connections add their I/O."""

    node: int
    _core: ConnectionCore

    @property
    def usable(self) -> bool:
        return self._core.phase == UP

    @property
    def last_failure(self) -> tuple[float, ConnectionFailure] | None:
        """How the last connect failed or the last socket broke, and when (monotonic)."""
        return self._core.last_failure


def deliver(router: Router, node: int, replies: list[Reply]) -> None:
    """Carries out the replies' steps, in order, learning from ``M`` replies
    (read from ``node``) which node is active."""
    for operation, step, moved in replies:
        if moved is not None:
            router.note_moved(node, moved)
        router.handle(operation, step)


def auth_outcome(address: str, line: bytes) -> tuple[str | None, ConnectionFailure | None]:
    """What the answer to ``U`` (``line``, without its line ending) means
    for the connection to ``address``: ``(name, None)`` once authenticated,
    else ``(None, why it cannot be used)``.

    Example::

        >>> auth_outcome("127.0.0.1:7700", b"U billing")
        ('billing', None)
        >>> auth_outcome("127.0.0.1:7700", b"E U - auth-failed")[1].auth
        'auth-failed'
    """
    name, code = auth_answer(line)
    if name is not None:
        return name, None
    if code in AUTH_REFUSED_CODES:
        return None, ConnectionFailure.secret_refused(address, code)
    if code == "protocol":
        return None, ConnectionFailure(address, f"dropped: unexpected answer to U {line[:100]!r}")
    return None, ConnectionFailure(address, f"the server refused the connection: {code}")
