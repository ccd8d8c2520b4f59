"""Pairing replies with the requests in flight on one connection.

Replies may come back in any order, but each echoes its request's operation
and key, and replies for the same (op, key) on one connection come back in
the order the requests were sent (docs/protocol.md §3). So a connection keeps, for each
(op, key) in flight, a FIFO of requests, and a reply takes the oldest one.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class _Queue(deque):  # type: ignore[type-arg]
    """Several requests with one (op, key), oldest first. A subclass, so
    that it cannot be mistaken for a request stored alone."""

    __slots__ = ()


class Pairing(Generic[T]):
    """The requests in flight on one connection, by (op, key).

    Most keys have one request in flight, stored alone; a second one turns
    the entry into a queue.

    Example::

        >>> table = Pairing()
        >>> table.push(b"A", b"k", "first"); table.push(b"A", b"k", "second")
        >>> table.take(b"A", b"k"), table.take(b"A", b"k"), table.take(b"A", b"k")
        ('first', 'second', None)
    """

    __slots__ = ("_entries", "_len")

    def __init__(self) -> None:
        self._entries: dict[tuple[bytes, bytes], object] = {}
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def push(self, op: bytes, key: bytes, request: T) -> None:
        """Records ``request`` as sent after every request already here."""
        slot = (op, key)
        entries = self._entries
        existing = entries.get(slot)
        if existing is None:
            entries[slot] = request
        elif type(existing) is _Queue:
            existing.append(request)
        else:
            entries[slot] = _Queue((existing, request))
        self._len += 1

    def take(self, op: bytes, key: bytes) -> T | None:
        """Takes the oldest request with this (op, key); ``None`` if there
        is none (a reply nobody asked for)."""
        slot = (op, key)
        entries = self._entries
        existing = entries.get(slot)
        if existing is None:
            return None
        self._len -= 1
        if type(existing) is _Queue:
            request = existing.popleft()
            if not existing:
                del entries[slot]
            return request  # type: ignore[no-any-return]
        del entries[slot]
        return existing  # type: ignore[return-value]

    def drain(self) -> list[T]:
        """Takes every request, each (op, key) in the order sent."""
        requests: list[T] = []
        for entry in self._entries.values():
            if type(entry) is _Queue:
                requests.extend(entry)
            else:
                requests.append(entry)  # type: ignore[arg-type]
        self._entries.clear()
        self._len = 0
        return requests
