"""ringlock: the Python client of the ringlock lock server.

``ringlock.Client`` is the sync client (background threads do the I/O, so
many threads share one client); ``ringlock.aio.Client`` is the asyncio
client, with the same names. Both follow docs/protocol.md §4: persistent connections
(two for a single address) reconnected at once and then with growing
pauses, round-robin, pipelining, acquires moved off cut connections, calls
that wait for a connection within their own limit, releases retried, ``M``
redirects followed.

Example::

    import ringlock

    with ringlock.Client("127.0.0.1:7700") as client:
        with client.lock("orders/42", lease=30, wait=5) as lock:
            print("holding orders/42 with token", lock.token)

Waits come in three forms, the same in every official client: ``wait=5``
(up to 5 s), ``wait=ringlock.NO_LIMIT`` (``None``: no limit) and
``wait=ringlock.TRY_ONCE`` (``0``: only if the key is free now).

# Layout

- ``client``: the sync :class:`Client`, :class:`Lock` and :class:`Clusters`.
- ``aio``: the asyncio ``Client`` and ``Lock``, and its connections (I/O only).
- ``errors``: the exceptions.
- ``_protocol``: request lines and reply fields (docs/protocol.md §3).
- ``_pairing``: replies paired with requests by (op, key).
- ``_operation``: one request's life and the rules of docs/protocol.md §4, without I/O.
- ``_router``: round-robin, redirects, what happens after each step.
- ``_connection``: one connection's state and rules without its I/O (taking
  requests, pairing the replies read, the silence check, the answer to ``U``).
- ``_backoff``: the reconnect schedule, pure.
- ``_clusters``: which cluster a key goes to (``cluster_for``), pure.
- ``_common``: the settings' signature, and each lock call's bookkeeping.
- ``_threaded``: the sync client's connection and timer threads (I/O only).
- ``_liveness``: the silence check of a connection, pure.
- ``_settings``: the settings both clients take.
- ``_tls``: TLS settings, and the sync client's TLS layer over memory buffers.
"""

from ._clusters import cluster_for
from ._common import NO_LIMIT, TRY_ONCE
from ._protocol import KeyState, Pong
from .client import Client, Clusters, Lock
from .errors import (
    AuthenticationError,
    CapacityError,
    ConnectionFailure,
    ForbiddenError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    NoActiveNodeError,
    NoConnectionError,
    ProtocolError,
    RinglockError,
    ShuttingDownError,
    TLSError,
)

__all__ = [
    "NO_LIMIT",
    "TRY_ONCE",
    "AuthenticationError",
    "CapacityError",
    "Client",
    "Clusters",
    "ConnectionFailure",
    "ForbiddenError",
    "KeyState",
    "Lock",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "NoActiveNodeError",
    "NoConnectionError",
    "Pong",
    "ProtocolError",
    "RinglockError",
    "ShuttingDownError",
    "TLSError",
    "cluster_for",
]

__version__ = "0.1.0"
