"""The client's settings, shared by the sync and asyncio clients."""

from __future__ import annotations

import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

from ._operation import Policy
from ._protocol import secret_bytes
from ._router import check_addresses
from ._tls import TlsSettings, tls_settings

SECRET_ENV = "RINGLOCK_SECRET"
"""The environment variable a client takes its secret from when it is given
none, so that the secret need not appear in code, on a command line or in
shell history."""


class Secret:
    """The client's secret, whose ``repr`` and ``str`` never show it, so that
    printing or logging a client's settings does not leak it.

    Example::

        >>> Secret(b"s3cret")
        <redacted>
    """

    __slots__ = ("value",)

    def __init__(self, value: bytes) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<redacted>"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)


def secret_setting(secret: str | bytes | None) -> Secret | None:
    """The secret given, else ``RINGLOCK_SECRET`` if set and not empty, checked."""
    if secret is None:
        secret = os.environ.get(SECRET_ENV) or None
    return None if secret is None else Secret(secret_bytes(secret))


@dataclass(frozen=True)
class Settings:
    """Every setting, checked.

    The defaults are those of docs/protocol.md §4: two connections when given one address (one
    per address otherwise), reconnection at once then after doubling pauses
    from 50 ms up to 3 s, a connect limit of 10 s for requests with no limit
    of their own, releases retried every 200 ms for 5 s, a connection with
    requests in flight pinged after 1 s of silence and cut if the ping is
    not answered within 1 s.
    """

    addresses: list[str]
    connections_per_node: int
    reconnect_delay_first: float
    reconnect_delay_max: float
    connect_limit: float
    connect_timeout: float
    release_retry_interval: float
    release_retry_for: float
    redirect_limit: int
    in_flight_per_connection_max: int
    secret: Secret | None = None
    tls: TlsSettings | None = None
    suspect_after: float = 1.0
    ping_timeout: float = 1.0

    @staticmethod
    def build(
        addresses: str | Sequence[str],
        connections_per_node: int | None,
        reconnect_delay_first: float,
        reconnect_delay_max: float,
        connect_limit: float,
        connect_timeout: float,
        release_retry_interval: float,
        release_retry_for: float,
        redirect_limit: int,
        in_flight_per_connection_max: int,
        secret: str | bytes | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_server_name: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        suspect_after: float = 1.0,
        ping_timeout: float = 1.0,
    ) -> Settings:
        checked = check_addresses(addresses)
        if connections_per_node is None:
            connections_per_node = 2 if len(checked) == 1 else 1
        if not 1 <= connections_per_node <= 64:
            raise ValueError("connections_per_node must be 1 to 64")
        for name, value in (
            ("reconnect_delay_first", reconnect_delay_first),
            ("connect_timeout", connect_timeout),
            ("release_retry_interval", release_retry_interval),
            ("suspect_after", suspect_after),
            ("ping_timeout", ping_timeout),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be > 0 seconds")
        if not reconnect_delay_max >= reconnect_delay_first:
            raise ValueError("reconnect_delay_max must be >= reconnect_delay_first")
        if not connect_limit >= 0:
            raise ValueError("connect_limit must be >= 0 seconds")
        if not release_retry_for >= 0:
            raise ValueError("release_retry_for must be >= 0 seconds")
        if redirect_limit < 0:
            raise ValueError("redirect_limit must be >= 0")
        if in_flight_per_connection_max < 1:
            raise ValueError("in_flight_per_connection_max must be >= 1")
        return Settings(
            checked,
            connections_per_node,
            reconnect_delay_first,
            reconnect_delay_max,
            connect_limit,
            connect_timeout,
            release_retry_interval,
            release_retry_for,
            redirect_limit,
            in_flight_per_connection_max,
            secret_setting(secret),
            tls_settings(tls_ca, tls_cert, tls_key, tls_server_name, ssl_context),
            suspect_after,
            ping_timeout,
        )

    @property
    def policy(self) -> Policy:
        return Policy(self.release_retry_interval, self.release_retry_for, self.redirect_limit, self.connect_limit)
