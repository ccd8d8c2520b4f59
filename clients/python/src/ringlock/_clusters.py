"""Several clusters (docs/protocol.md §4, "Several clusters"): which
cluster a key goes to, and the name-to-client table both fronts' ``Clusters``
keep. Pure: no I/O.

A key goes to the cluster with the highest score, ``fmix64(fnv1a64(name ++
0xFF ++ key))`` compared as unsigned 64-bit numbers; a tie goes to the name
first in byte order. Every official client chooses the same cluster for the
same key and names (``clients/cluster-hash-vectors.json``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, Protocol, TypeVar, cast

from .errors import LockLostError

_MASK = (1 << 64) - 1
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_SEPARATOR = 0xFF
"""The byte between name and key: never in UTF-8, so no two (name, key)
pairs hash the same bytes."""

L = TypeVar("L")
"""A front's lock class."""


class _LockMaker(Protocol):
    """What ``Clusters`` asks of a front's client."""

    def lock(
        self,
        key: str | bytes,
        lease: float = ...,
        wait: float | None = ...,
        *,
        auto_extend: bool = ...,
        on_lost: Any = ...,
    ) -> Any: ...

    def lock_from(
        self, key: str | bytes, token: int, lease: float = ..., *, auto_extend: bool = ..., on_lost: Any = ...
    ) -> Any: ...


C = TypeVar("C", bound=_LockMaker)
"""A front's client class."""


def _fnv1a64(value: int, data: bytes) -> int:
    for byte in data:
        value = ((value ^ byte) * _FNV_PRIME) & _MASK
    return value


def _fmix64(value: int) -> int:
    value ^= value >> 33
    value = (value * 0xFF51AFD7ED558CCD) & _MASK
    value ^= value >> 33
    value = (value * 0xC4CEB9FE1A85EC53) & _MASK
    value ^= value >> 33
    return value


def _name_state(name: bytes) -> int:
    """FNV-1a's state after the name and the separator: the part of every
    score of this name that does not depend on the key."""
    return ((_fnv1a64(_FNV_OFFSET, name) ^ _SEPARATOR) * _FNV_PRIME) & _MASK


def score(name: str, key: str | bytes) -> int:
    """The score of cluster ``name`` for ``key`` (text keys as UTF-8), an
    unsigned 64-bit number.

    Example::

        >>> f"{score('only', b'k'):016x}"
        '96bd08868e60ed08'
    """
    return _fmix64(_fnv1a64(_name_state(_name_bytes(name)), _key_bytes(key)))


def cluster_names(names: Iterable[str]) -> list[str]:
    """The names, checked: at least one, each a non-empty ``str`` that is
    valid UTF-8, no two the same.

    Example::

        >>> cluster_names(["east", "west"])
        ['east', 'west']
    """
    if isinstance(names, (str, bytes)):
        raise TypeError("give the cluster names as a list of str, not one string")
    checked = list(names)
    if not checked:
        raise ValueError("give at least one cluster")
    seen: set[str] = set()
    for name in checked:
        _name_bytes(name)
        if name in seen:
            raise ValueError(f"the cluster name {name!r} is given twice; names must be unique")
        seen.add(name)
    return checked


def cluster_for(names: Iterable[str], key: str | bytes) -> str:
    """The name of the cluster ``key`` goes to among ``names``: the highest
    score, a tie to the name first in byte order. The same in every official
    client, for any key (text keys as UTF-8); adding a cluster to N moves
    only the keys the new one wins, about 1/(N+1) of them.

    Raises :class:`ValueError` for no name, an empty or duplicate name, or
    a name that is not valid UTF-8, and :class:`TypeError` for a name that
    is not a ``str`` or a key that is neither ``str`` nor ``bytes``.

    Example::

        >>> cluster_for(["east", "west", "north"], "orders/2026/12/06")
        'north'
    """
    return _Chooser(cluster_names(names)).choose(_key_bytes(key))


class _Chooser:
    """The choice among fixed names, with each name's part of its scores
    computed once."""

    __slots__ = ("_names",)

    def __init__(self, names: list[str]) -> None:
        # Sorted by their bytes, so that the first of equal scores is the
        # one first in byte order.
        encoded = sorted((_name_bytes(name), name) for name in names)
        self._names = [(_name_state(raw), name) for raw, name in encoded]

    def choose(self, key: bytes) -> str:
        best_score = -1
        best = ""
        for state, name in self._names:
            value = _fmix64(_fnv1a64(state, key))
            if value > best_score:
                best_score = value
                best = name
        return best


def _name_bytes(name: str) -> bytes:
    if not isinstance(name, str):
        raise TypeError(f"a cluster name is a str: {name!r}")
    if not name:
        raise ValueError("a cluster name must not be empty")
    try:
        return name.encode()
    except UnicodeEncodeError:
        raise ValueError(f"a cluster name must be valid UTF-8 text: {name!r}") from None


def _key_bytes(key: str | bytes) -> bytes:
    if isinstance(key, str):
        try:
            return key.encode()
        except UnicodeEncodeError:
            raise ValueError(f"a key must be valid UTF-8 text or bytes: {key!r}") from None
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise TypeError(f"a key is str or bytes: {key!r}")


class ClustersBase(Generic[C, L]):
    """The clients of several clusters by name, the choice of one for a
    key, and the calls that make locks (the same in both fronts); each
    front's ``Clusters`` adds the calls that talk to the servers."""

    def __init__(self, clients: Mapping[str, C], client_type: type, front: str) -> None:
        if not isinstance(clients, Mapping):
            raise TypeError("give Clusters a mapping of cluster name to client, such as a dict")
        names = cluster_names(clients)
        for name in names:
            if not isinstance(clients[name], client_type):
                raise TypeError(f"the client of cluster {name!r} is not a {front}: {clients[name]!r}")
        self._clients: dict[str, C] = {name: clients[name] for name in names}
        self._chooser = _Chooser(names)

    @property
    def names(self) -> list[str]:
        """The clusters' names, in the order given.

        Example::

            assert clusters.names == ["a", "b"]
        """
        return list(self._clients)

    @property
    def clients(self) -> dict[str, C]:
        """The clients by cluster name (a copy).

        Example::

            for name, client in clusters.clients.items():
                print(name, client.usable_connection_count)
        """
        return dict(self._clients)

    def name_for(self, key: str | bytes) -> str:
        """The name of the cluster ``key`` goes to (:func:`cluster_for`).

        Example::

            print("orders/42 lives on", clusters.name_for("orders/42"))
        """
        return self._chooser.choose(_key_bytes(key))

    def client_for(self, key: str | bytes) -> C:
        """The client of the cluster ``key`` goes to.

        Example::

            client = clusters.client_for("orders/42")
        """
        return self._clients[self._chooser.choose(_key_bytes(key))]

    def lock(
        self,
        key: str | bytes,
        lease: float = 30.0,
        wait: float | None = None,
        *,
        auto_extend: bool = False,
        on_lost: Callable[[L, LockLostError], None] | None = None,
    ) -> L:
        """The client's ``lock`` on the client of ``key``'s cluster, with
        the same arguments: a lock of that client, so that its acquire,
        release, extends and ``held`` go there.

        Example::

            lock = clusters.lock("jobs/7", lease=10)
            if lock.acquire(timeout=0.5):  # awaited with ringlock.aio
                lock.release()
        """
        return cast(L, self.client_for(key).lock(key, lease, wait, auto_extend=auto_extend, on_lost=on_lost))

    def lock_from(
        self,
        key: str | bytes,
        token: int,
        lease: float = 30.0,
        *,
        auto_extend: bool = False,
        on_lost: Callable[[L, LockLostError], None] | None = None,
    ) -> L:
        """The client's ``lock_from`` on the client of ``key``'s cluster.

        Example::

            clusters.lock_from("deploy", token).release()  # awaited with ringlock.aio
        """
        return cast(L, self.client_for(key).lock_from(key, token, lease, auto_extend=auto_extend, on_lost=on_lost))

    def __repr__(self) -> str:
        return f"<{type(self).__module__}.Clusters {self.names!r}>"
