"""Whether a connection still answers (docs/protocol.md §4, "Silent
connections"): sans-I/O, shared by the sync and asyncio clients.

A connection with requests in flight that has read nothing for
``suspect_after`` is suspected and sent ``P``; if it still reads nothing
for ``ping_timeout`` after that, it is cut, like a broken connection, so
that its requests move on or wait for a connection within their limits. A
host that vanished or a partition (no reset, no close) thus ends a request
within its own limit plus ``suspect_after + ping_timeout`` and a tick,
never when the link comes back. The check runs on one periodic tick per
connection, not a timer per request.
"""

from __future__ import annotations

import socket

from ._operation import PING, Operation, Policy

# What a tick asks of the connection.
QUIET = 0
SEND_PING = 1
CUT = 2

KEEPALIVE_IDLE_S = 5
"""Seconds a connection is idle before TCP keepalive probes start."""
KEEPALIVE_INTERVAL_S = 1
KEEPALIVE_PROBES = 3


class Liveness:
    """One connection's silence watch; the connection's lock guards it."""

    __slots__ = ("busy_since", "last_read", "pinged_at", "ping_timeout", "suspect_after")

    def __init__(self, suspect_after: float, ping_timeout: float) -> None:
        self.suspect_after = suspect_after
        self.ping_timeout = ping_timeout
        self.last_read = 0.0
        # When the connection last went from no request in flight to some.
        self.busy_since = 0.0
        self.pinged_at: float | None = None

    @property
    def tick(self) -> float:
        """How often the connection checks."""
        return min(self.suspect_after, self.ping_timeout) / 4

    def reset(self, now: float) -> None:
        """A fresh socket: nothing is overdue yet."""
        self.last_read = now
        self.busy_since = now
        self.pinged_at = None

    def check(self, now: float, busy: bool) -> int:
        """What to do at ``now``: ``QUIET``, ``SEND_PING`` (the caller sends
        ``P``) or ``CUT``; ``busy`` if requests are in flight."""
        if not busy:
            self.pinged_at = None
            return QUIET
        if self.pinged_at is not None:
            if self.last_read >= self.pinged_at:
                self.pinged_at = None
            elif now - self.pinged_at >= self.ping_timeout:
                return CUT
            else:
                return QUIET
        if now - max(self.last_read, self.busy_since) >= self.suspect_after:
            self.pinged_at = now
            return SEND_PING
        return QUIET

    def silence(self, now: float) -> TimeoutError:
        """The error of a connection cut for its silence."""
        quiet = now - max(self.last_read, self.busy_since)
        return TimeoutError(f"no answer for {quiet:.1f} s, not even to a ping")


def tune_socket(sock: socket.socket, suspect_after: float, ping_timeout: float) -> None:
    """TCP keepalive, and on Linux TCP_USER_TIMEOUT (unacknowledged data
    fails the socket after ``suspect_after + ping_timeout``); options the
    system lacks are skipped."""
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
        ("TCP_USER_TIMEOUT", max(1, int((suspect_after + ping_timeout) * 1000))),
    ):
        number = getattr(socket, name, None)
        if number is not None:
            options.append((socket.IPPROTO_TCP, number, value))
    for level, option, value in options:
        try:
            sock.setsockopt(level, option, value)
        except OSError:
            pass


class _Probe:
    """The waiter of a connection's own ``P``: nobody waits for it, and it
    is never sent again elsewhere."""

    def complete(self, value: object) -> bool:
        return True

    @property
    def abandoned(self) -> bool:
        return True


PROBE = _Probe()


def probe(now: float, policy: Policy) -> Operation:
    """The ``P`` a suspected connection is sent."""
    return Operation(PING, b"", now, 1, policy, PROBE)
