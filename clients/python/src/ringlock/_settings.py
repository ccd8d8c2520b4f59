"""The client's settings, shared by the sync and asyncio clients."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ._operation import Policy
from ._router import check_addresses


@dataclass(frozen=True)
class Settings:
    """Every setting, checked.

    The defaults are those of docs/protocol.md §4: two connections when given one address (one
    per address otherwise), reconnection at once then after doubling pauses
    from 50 ms up to 3 s, a connect limit of 10 s for requests with no limit
    of their own, releases retried every 200 ms for 5 s.
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
        )

    @property
    def policy(self) -> Policy:
        return Policy(self.release_retry_interval, self.release_retry_for, self.redirect_limit, self.connect_limit)
