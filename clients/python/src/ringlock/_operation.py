"""One request from submission until its outcome is known: what to send,
and what to do next on each event (a reply, a cut connection, no usable
connection at all).

This is where the rules of docs/protocol.md §4 live (acquires move to the next connection,
releases are retried, ``M`` redirects are followed), as plain methods of the
request that take the event and ``now`` and return a step. There is no I/O
here: the router and the connections, threaded or asyncio, carry the steps
out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol

from ._protocol import (
    OP_ACQUIRE,
    OP_EXTEND,
    OP_INSPECT,
    OP_PING,
    OP_RELEASE,
    OP_STATS,
    KeyState,
    Pong,
    acquire_line,
    extend_line,
    inspect_line,
    release_line,
)
from .errors import LockLostError, ProtocolError, RinglockError, error_for

# What a request asks.
ACQUIRE = 0
RELEASE = 1
EXTEND = 2
PING = 3
STATS = 4
INSPECT = 5
_OPS = (OP_ACQUIRE, OP_RELEASE, OP_EXTEND, OP_PING, OP_STATS, OP_INSPECT)

# What the router does next with a request: steps are (what, value) pairs.
DONE = 0  # value: the result, or a RinglockError
RESEND = 1  # on the next usable connection
REDIRECT = 2  # to the active node an M reply named
RETRY_AT = 3  # value: the monotonic instant
NO_CONNECTION = 4  # done without a usable connection; value: the seconds waited for one

# Why no connection took a request.
UNSENT_NO_CONNECTION = 0
UNSENT_FULL = 1
UNSENT_ACTIVE_UNREACHABLE = 2

Step = tuple[int, object]
_RESEND: Step = (RESEND, None)
_REDIRECT: Step = (REDIRECT, None)


@dataclass(frozen=True)
class Policy:
    """The retry rules, from the client's settings."""

    retry_interval: float = 0.2
    """Seconds between two tries of a release, or of a request that found no active."""
    retry_for: float = 5.0
    """Seconds a release, or a request that finds no active, keeps being retried."""
    redirect_limit: int = 16
    """Most ``M`` redirects one request follows."""
    connect_limit: float = 10.0
    """Seconds a request with no limit of its own waits for a usable connection."""


class Waiter(Protocol):
    """Whoever waits for a request's outcome (a thread, or a future)."""

    def complete(self, value: object) -> bool:
        """Hands over the outcome; false if nobody waits for it any more."""
        ...

    @property
    def abandoned(self) -> bool:
        """Whether the caller gave up waiting (a cancelled task)."""
        ...


class Operation:
    """A request in flight, or waiting to be retried."""

    __slots__ = (
        "connection_deadline",
        "key",
        "kind",
        "lease_ms",
        "op",
        "redirects_left",
        "retry_until",
        "shutting_down",
        "started",
        "token",
        "tries_left",
        "try_once",
        "wait_ms",
        "waited_before",
        "waiter",
        "waiting_since",
    )

    def __init__(
        self,
        kind: int,
        key: bytes,
        now: float,
        tries: int,
        policy: Policy,
        waiter: Waiter | None,
        *,
        lease_ms: int = 0,
        wait_ms: int = 0,
        token: int = 0,
        try_once: bool = False,
        connection_deadline: float | None = None,
    ) -> None:
        self.kind = kind
        self.op = _OPS[kind]
        self.key = key
        self.lease_ms = lease_ms
        self.wait_ms = wait_ms
        self.token = token
        self.started = now
        self.tries_left = max(tries, 1)
        self.redirects_left = policy.redirect_limit
        # A release is retried from the start; other requests only once a
        # node says no active is known.
        self.retry_until: float | None = now + policy.retry_for if kind == RELEASE else None
        self.waiter = waiter
        # An acquire whose wait is only the shortest the wire carries (try
        # once) waits for a connection as long as one with no limit.
        self.try_once = try_once
        # The last instant the caller lets it wait for a usable connection,
        # when the caller sets one (an extend: the end of its lease).
        self.connection_deadline = connection_deadline
        # Since when it has waited for a usable connection; None while in
        # flight or waiting for something else.
        self.waiting_since: float | None = None
        # How long it waited for a usable connection before it last went
        # out. A connection that takes it and closes before answering
        # anything (a node that accepts then closes at once) does not start
        # its wait over, so the connect limit still ends the call; one that
        # has answered does (see connection_answered).
        self.waited_before = 0.0
        # A server answered it shutting-down (or refused a connection it
        # was on with that code): it had no effect and is sent again within
        # its limit, and if that runs out the error says the server was
        # stopping.
        self.shutting_down = False

    def abandoned(self) -> bool:
        """Whether nobody waits for it any more, so sending it again is
        pointless: an acquire would take a place in the server's queue for
        a grant nobody takes. A release still goes, to free the key."""
        return self.kind != RELEASE and self.waiter is not None and self.waiter.abandoned

    def waited(self, now: float) -> float:
        """How long it has waited for a usable connection at ``now``,
        counting its earlier waits since a connection last answered."""
        if self.waiting_since is None:
            return self.waited_before
        return self.waited_before + now - self.waiting_since

    def go_out(self, now: float) -> tuple[float | None, float]:
        """Pauses its wait for a connection, if any, as it is offered to
        the connections; gives back what :meth:`stay_back` needs to undo
        that if none takes it."""
        saved = (self.waiting_since, self.waited_before)
        if self.waiting_since is not None:
            self.waited_before = self.waited(now)
            self.waiting_since = None
        return saved

    def stay_back(self, saved: tuple[float | None, float]) -> None:
        """Undoes :meth:`go_out`: no connection took it."""
        self.waiting_since, self.waited_before = saved

    def connection_answered(self) -> None:
        """A connection that carried it was cut after answering something
        (to this request or another): a server was there, so a wait for a
        connection after this cut is a new one and gets the whole limit."""
        self.waited_before = 0.0

    def _wait_left_ms(self, now: float) -> int | None:
        """The wait left at ``now`` in ms: 0 for no limit, ``None`` once a
        bounded wait has run out. An acquire that tries once asks for its
        short wait whenever it goes out: it waits for a connection within
        the connect limit, not within that wait."""
        if self.kind != ACQUIRE or self.wait_ms == 0:
            return 0
        if self.try_once:
            return self.wait_ms
        left = self.wait_ms - int((now - self.started) * 1000)
        return left if left > 0 else None

    def expired(self, now: float) -> bool:
        """An acquire whose wait ran out before it could be (re)sent: it
        ends with no connection if it was off the wire for want of one (a
        broken connection took it back, or none was usable), else as timed
        out, as it would have on the server."""
        return self.kind == ACQUIRE and self.wait_ms != 0 and self._wait_left_ms(now) is None

    def encode(self, now: float) -> bytes:
        """The request line. A re-sent acquire asks only for the wait it has
        left, so moving it does not make it wait longer than asked."""
        kind = self.kind
        if kind == ACQUIRE:
            wait = self.wait_ms
            if wait and self.started != now:
                wait = self._wait_left_ms(now) or 1
            return acquire_line(self.key, self.lease_ms, wait)
        if kind == RELEASE:
            return release_line(self.key, self.token)
        if kind == EXTEND:
            return extend_line(self.key, self.token, self.lease_ms)
        if kind == INSPECT:
            return inspect_line(self.key)
        return b"P\n" if kind == PING else b"S\n"

    def error(self, code: str, message: str | None = None) -> RinglockError:
        """The exception for ``code``, naming this request."""
        key = self.key.decode(errors="replace") if self.key else None
        op = self.op.decode()
        if code == "not-holder" and self.kind == EXTEND:
            return LockLostError(code, op, key, message or f"the grant of {key} is gone (not-holder)")
        return error_for(code, op, key, message)

    def on_reply(self, fields: list[bytes], policy: Policy, now: float) -> Step:
        """The next step after the reply ``fields``, which the connection
        paired with this request by (op, key)."""
        kind = fields[0]
        if kind == OP_ACQUIRE and self.kind == ACQUIRE:
            return (DONE, _token(fields[2]))
        if kind == b"T" and self.kind == ACQUIRE:
            return (DONE, None)
        if kind == OP_RELEASE and self.kind == RELEASE:
            return (DONE, True)
        if kind == b"E":
            code = fields[3].decode(errors="replace")
            if code == "not-holder" and self.kind == RELEASE:
                # Already released, expired or handed on: nothing is left
                # to release, which is what the caller wanted.
                return (DONE, False)
            if code == "shutting-down" and self.retries_shutting_down():
                # A stopping server answers what it will not serve
                # shutting-down: the request had no effect, and the next
                # server (a restart, or a cluster's new active) is usually
                # there well within the request's limit, so it waits for a
                # connection as if this one had broken.
                self.shutting_down = True
                return self.wait_for_connection(now, policy)
            return (DONE, self.error(code))
        if kind == b"M":
            if fields[3] == b"-":
                return self.retry_later(now, policy, "no-active")
            if self.redirects_left == 0:
                return (DONE, self.error("no-active", "redirected too many times"))
            self.redirects_left -= 1
            return _REDIRECT
        if kind == OP_EXTEND and self.kind == EXTEND:
            received = _token(fields[2])
            if received != self.token:
                return (DONE, self.error("protocol", f"extend of token {self.token} answered with {received}"))
            return (DONE, True)
        if kind == OP_PING and self.kind == PING:
            role = fields[1].decode()
            if role not in ("active", "standby"):
                raise ValueError("bad role")
            active = None if fields[3] == b"-" else fields[3].decode(errors="replace")
            return (DONE, Pong(role, _token(fields[2]), active))
        if kind == OP_STATS and self.kind == STATS:
            return (DONE, json.loads(fields[1]))
        if kind == OP_INSPECT and self.kind == INSPECT:
            # I <key> <token|-> <lease-left-ms> <waiters>; the caller puts
            # back the key as it gave it.
            token = None if fields[2] == b"-" else _token(fields[2])
            lease_left = _token(fields[3]) / 1000
            return (DONE, KeyState(self.key, token, lease_left, _token(fields[4])))
        # Pairing by (op, key) leaves nothing else but a broken server.
        return (DONE, self.error("protocol", f"unexpected reply {b' '.join(fields)!r}"))

    def retries_shutting_down(self) -> bool:
        """Whether a ``shutting-down`` answer sends it again within its
        limit: every acquire, release and extend but an acquire that tries
        once, which has no wait to spend."""
        if self.kind == ACQUIRE:
            return not self.try_once
        return self.kind in (RELEASE, EXTEND)

    def on_cut(self, error: RinglockError, now: float, policy: Policy) -> Step:
        """The next step after the connection carrying this request was cut
        (``error`` says how). The server may or may not have seen it.

        A request cut off on as many connections as the client has stops
        moving from one to the next: a server that went away (a restart, a
        failover) takes every connection to it down at once, so the request
        waits for a connection to come back, within its limit."""
        broken = error.code == "no-connection"
        if error.code == "shutting-down":
            # A stopping server refused a connection it was on: like a
            # connection that broke, and it remembers why.
            self.shutting_down = broken = True
        if broken and self.waiting_since is None:
            # Off the wire for want of a connection from now on, until a
            # connection takes it again.
            self.waiting_since = now
        if self.kind == RELEASE:
            # Again at once on another connection; the router falls back
            # to retrying every interval while none is usable.
            if self.retry_until is not None and now > self.retry_until:
                return (NO_CONNECTION, now - self.started) if broken else (DONE, self._named(error))
            return _RESEND
        self.tries_left -= 1
        if self.tries_left > 0:
            return _RESEND
        if broken:
            return self.wait_for_connection(now, policy)
        return (DONE, self._named(error))

    def on_unsent(self, unsent: int, now: float, policy: Policy) -> Step:
        """The next step when no connection took the request."""
        if unsent == UNSENT_ACTIVE_UNREACHABLE:
            # During a failover the node an M named may be gone for a
            # moment: wait for the others to name the new active.
            return self.retry_later(now, policy, "no-active")
        if unsent == UNSENT_NO_CONNECTION:
            return self.wait_for_connection(now, policy)
        if self.kind == RELEASE:
            return self.retry_later(now, policy, "too-many-in-flight")
        return (DONE, self.error("too-many-in-flight"))

    def connection_deadline_from(self, since: float, policy: Policy) -> float:
        """The last instant this request may wait for a usable connection,
        if it started waiting at ``since``: a bounded acquire's wait, an
        extend's lease, a release's retry period, else the connect limit."""
        if self.connection_deadline is not None:
            return self.connection_deadline
        if self.kind == ACQUIRE and self.wait_ms and not self.try_once:
            return self.started + self.wait_ms / 1000
        if self.kind == RELEASE:
            return self.retry_until if self.retry_until is not None else since + policy.retry_for
        return since + policy.connect_limit - self.waited_before

    def wait_for_connection(self, now: float, policy: Policy) -> Step:
        """Waits for a usable connection within the request's limit: tried
        again after the retry interval, or at once when a connection comes up
        (the router hurries requests with ``waiting_since`` set); past the
        limit it ends with no connection."""
        if self.waiting_since is None:
            self.waiting_since = now
        deadline = self.connection_deadline_from(self.waiting_since, policy)
        if now >= deadline:
            return (NO_CONNECTION, self.waited(now))
        return (RETRY_AT, min(now + policy.retry_interval, deadline))

    def retry_later(self, now: float, policy: Policy, code: str) -> Step:
        """Retry after the interval while within the retry period, which
        starts now if it has not started yet; else fail with ``code``."""
        if self.retry_until is None:
            self.retry_until = now + policy.retry_for
        at = now + policy.retry_interval
        if at <= self.retry_until + 1e-9:  # float sums of the interval
            return (RETRY_AT, at)
        return (DONE, self.error(code))

    def _named(self, error: RinglockError) -> RinglockError:
        """The connection's error, naming this request."""
        key = self.key.decode(errors="replace") if self.key else "-"
        return self.error(error.code, f"{error.code} ({self.op.decode()} {key}): {error}")


def _token(field: bytes) -> int:
    """A decimal ``u64`` field: a token, or another count of the protocol."""
    # int() accepts signs, spaces and underscores; a token is plain digits.
    if not field.isdigit():
        raise ValueError("bad token")
    token = int(field)
    if token >= 1 << 64:
        raise ValueError("token out of range")
    return token


CUT_IO = error_for("no-connection", message="the connection was cut")


def cut_protocol(message: str) -> RinglockError:
    """The error of a connection dropped because the server broke the protocol."""
    return ProtocolError("protocol", message=message)
