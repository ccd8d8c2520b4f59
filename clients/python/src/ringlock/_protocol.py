"""Wire protocol v1 (docs/protocol.md §3): checking arguments, writing request lines,
and splitting reply lines into the fields that pair them with requests.

Nothing here does I/O, so the sync and asyncio clients share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

KEY_LEN_MAX = 250
"""Longest key, in bytes."""
WAIT_MS_MAX = 86_400_000
"""Longest bounded wait the protocol accepts (a day)."""
REPLY_LINE_LEN_MAX = 70_000
"""Longest reply line the client reads; ``S`` lines stay under 64 KiB."""

_FORBIDDEN_KEY_BYTES = frozenset(b" \t\r\n\x00")

# Operation letters, as bytes (the wire) and as text (errors).
OP_ACQUIRE = b"A"
OP_RELEASE = b"R"
OP_EXTEND = b"X"
OP_PING = b"P"
OP_STATS = b"S"
OP_INSPECT = b"I"
OP_AUTHENTICATE = b"U"

SECRET_LEN_MAX = 1022
"""Longest secret: a ``U`` line must fit in the server's 1024 bytes."""
AUTH_REFUSED_CODES = frozenset({"auth-failed", "auth-disabled"})
"""The answers to ``U`` that mean the secret cannot be used on this server."""


class Pong(NamedTuple):
    """A node's answer to a ping: its role, epoch, and the active it names.

    Example::

        >>> Pong("active", 3, "127.0.0.1:7700").role
        'active'
    """

    role: str
    """``"active"`` or ``"standby"``."""
    epoch: int
    """The active's epoch (0 while a standby knows none)."""
    active: str | None
    """The address clients should use for the active, ``None`` if unknown."""


@dataclass(frozen=True)
class KeyState:
    """What the active node knows of a key now: who holds it, how long the
    holder's lease has left, and how many acquires wait for it. The answer
    to ``client.inspect(key)``; inspecting changes nothing on the server.

    Example::

        >>> state = KeyState("orders/42", 17, 1.5, 2)
        >>> state.held, state.token, state.lease_left, state.waiters
        (True, 17, 1.5, 2)
        >>> KeyState("orders/43", None, 0.0, 0).held
        False
    """

    key: str | bytes
    """The key, as given to ``inspect``."""
    token: int | None
    """The fencing token of the grant holding the key; ``None`` if it is free."""
    lease_left: float
    """Seconds the holder's lease has left (millisecond precision); 0 if free."""
    waiters: int
    """Acquires queued on the key. It may be above 0 on a free key, while
    acquires wait for tokens."""

    @property
    def held(self) -> bool:
        """Whether some grant holds the key."""
        return self.token is not None


def key_bytes(key: str | bytes) -> bytes:
    """The key as bytes, checked as the protocol wants it.

    Raises :class:`ValueError` for an empty key, one over 250 bytes, one
    holding a space, tab, CR, LF or NUL, and the key ``-``, which error
    replies use for "no key" and so could not be paired.

    Example::

        >>> key_bytes("orders/42")
        b'orders/42'
    """
    raw = key.encode() if isinstance(key, str) else bytes(key)
    if not 0 < len(raw) <= KEY_LEN_MAX or not _FORBIDDEN_KEY_BYTES.isdisjoint(raw):
        raise ValueError(f"a key is 1 to {KEY_LEN_MAX} bytes, none of them space, tab, CR, LF or NUL: {key!r}")
    if raw == b"-":
        raise ValueError('the key "-" is reserved: error replies use it for "no key"')
    return raw


def lease_ms(lease: float) -> int:
    """A lease in seconds as whole milliseconds, rounded up; at least 1 ms.

    Example::

        >>> lease_ms(0.0001), lease_ms(2.5)
        (1, 2500)
    """
    if isinstance(lease, bool) or not lease > 0 or math.isinf(lease):
        raise ValueError(f"the lease must be 0.001 seconds up to the server's --max-lease (default 86400 s): {lease!r}")
    return max(1, math.ceil(lease * 1000))


def wait_ms(wait: float | None) -> int:
    """A wait in seconds as the wire's milliseconds: 0 for ``None`` (no
    limit), else rounded up, at least 1 ms and at most a day.

    Example::

        >>> wait_ms(None), wait_ms(0), wait_ms(0.2)
        (0, 1, 200)
    """
    if wait is None:
        return 0
    if isinstance(wait, bool) or not 0 <= wait <= WAIT_MS_MAX / 1000:
        raise ValueError(f"the wait must be TRY_ONCE (0), 0.001 to 86400 seconds, or NO_LIMIT (None): {wait!r}")
    milliseconds = max(1, math.ceil(wait * 1000))
    return milliseconds


def seconds_field(milliseconds: int) -> bytes:
    """Milliseconds as the wire's decimal seconds (``30``, ``0.5``, ``2.125``).

    Example::

        >>> seconds_field(30_000), seconds_field(500), seconds_field(2_125)
        (b'30', b'0.5', b'2.125')
    """
    whole, fraction = divmod(milliseconds, 1000)
    if fraction == 0:
        return b"%d" % whole
    return (b"%d.%03d" % (whole, fraction)).rstrip(b"0")


def acquire_line(key: bytes, lease: int, wait: int) -> bytes:
    """``A <key> <lease> <wait>``, from milliseconds."""
    return b"A %s %s %s\n" % (key, seconds_field(lease), seconds_field(wait))


def release_line(key: bytes, token: int) -> bytes:
    """``R <key> <token>``."""
    return b"R %s %d\n" % (key, token)


def extend_line(key: bytes, token: int, lease: int) -> bytes:
    """``X <key> <token> <lease>``, the lease in milliseconds."""
    return b"X %s %d %s\n" % (key, token, seconds_field(lease))


def inspect_line(key: bytes) -> bytes:
    """``I <key>``."""
    return b"I %s\n" % key


def secret_bytes(secret: str | bytes) -> bytes:
    """The secret as bytes, checked as a ``U`` line needs it.

    Raises :class:`ValueError` (without the secret in its message) for an
    empty secret, one over 1022 bytes, or one holding a space, tab, CR, LF or
    NUL.

    Example::

        >>> secret_bytes("s3cret")
        b's3cret'
    """
    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    if not 0 < len(raw) <= SECRET_LEN_MAX or not _FORBIDDEN_KEY_BYTES.isdisjoint(raw):
        raise ValueError(f"the secret must be 1 to {SECRET_LEN_MAX} bytes, none of them space, tab, CR, LF or NUL")
    return raw


def auth_line(secret: bytes) -> bytes:
    """``U <secret>``, the first line of every connection of a client with a secret."""
    return b"U %s\n" % secret


def auth_answer(line: bytes) -> tuple[str | None, str]:
    """What the answer to ``U`` says: ``(name, "")`` when the connection is
    authenticated as ``name``, else ``(None, code)``: ``auth-failed`` or
    ``auth-disabled`` when the server refuses the secret, the code of an
    ``E - - <code>`` refusing the connection, or ``protocol`` for anything
    else. ``line`` has no line ending.

    Example::

        >>> auth_answer(b"U billing")
        ('billing', '')
        >>> auth_answer(b"E U - auth-failed")
        (None, 'auth-failed')
    """
    fields = line.split(b" ")
    if len(fields) == 2 and fields[0] == OP_AUTHENTICATE and fields[1]:
        return fields[1].decode(errors="replace"), ""
    if len(fields) == 4 and fields[0] == b"E" and fields[2] == b"-" and fields[1] in (OP_AUTHENTICATE, b"-"):
        return None, fields[3].decode(errors="replace")
    return None, "protocol"


def split_reply(line: bytes) -> tuple[bytes, bytes, list[bytes]]:
    """The (op, key) a reply line answers, and its fields.

    ``line`` has no line ending. For ``P`` and ``S`` the key is empty; for
    ``E - - <code>`` the op is ``-``. Raises :class:`ValueError` for a line
    that is no reply.

    Example::

        >>> split_reply(b"A k 17")
        (b'A', b'k', [b'A', b'k', b'17'])
        >>> split_reply(b"T k")[:2]
        (b'A', b'k')
        >>> split_reply(b"E R k not-holder")[:2]
        (b'R', b'k')
        >>> split_reply(b"I k 17 1500 2")[:2]
        (b'I', b'k')
    """
    if line[:2] == b"S ":
        return OP_STATS, b"", [OP_STATS, line[2:]]
    fields = line.split(b" ")
    kind = fields[0]
    count = len(fields)
    if kind == b"A" or kind == b"X":
        if count != 3:
            raise ValueError("wrong field count")
        return kind, fields[1], fields
    if kind == b"T" or kind == b"R":
        if count != 2:
            raise ValueError("wrong field count")
        # T answers an acquire.
        return (OP_ACQUIRE if kind == b"T" else kind), fields[1], fields
    if kind == b"E" or kind == b"M":
        if count != 4:
            raise ValueError("wrong field count")
        return fields[1], fields[2], fields
    if kind == b"I":
        if count != 5:
            raise ValueError("wrong field count")
        return kind, fields[1], fields
    if kind == b"P":
        if count != 4:
            raise ValueError("wrong field count")
        return OP_PING, b"", fields
    raise ValueError("unknown reply")
