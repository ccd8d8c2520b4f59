"""What the sync and asyncio clients share above the request machinery:
the connection-set properties of a client, and a lock's state and its
read-only view. Each client adds its own way of waiting (threads or the
event loop).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._protocol import key_bytes, lease_ms, wait_ms
from ._router import Router
from .errors import LockLostError


class ClientBase:
    """The properties both clients show of their connection set."""

    _router: Router | None

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
        """The default wait of ``acquire``, in seconds; ``None`` for no limit."""
        self._wait_ms = wait_ms(wait)
        # When the current grant's lease ends at the latest, counted from
        # when the acquire or the last confirmed extend was sent; an extend
        # waits for a usable connection until then.
        self._lease_ends = 0.0
        self.auto_extend = auto_extend
        self.on_lost = on_lost
        self._token: int | None = None
        self._lost: LockLostError | None = None

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
        """Why the grant was lost, if automatic extension found it gone.

        Example::

            if lock.lost:
                stop_writing()
        """
        return self._lost

    def locked(self) -> bool:
        """Whether this lock holds its key (as far as the client knows: a
        lease that ran out without ``auto_extend`` is not noticed).

        Example::

            lock.acquire()
            assert lock.locked()
        """
        return self._token is not None

    def __repr__(self) -> str:
        return f"<{self._KIND} key={self._key!r} token={self._token}>"
