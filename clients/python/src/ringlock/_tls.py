"""TLS for both clients (stdlib :mod:`ssl`): the settings and the context
they make, and one connection's TLS state for the sync client.

The asyncio client hands the context to the event loop, which runs TLS
itself. The sync client keeps TLS as a layer over memory buffers
(:class:`TlsSession`: ciphertext in, plaintext out, and back), so that its
threads keep owning the socket: the reader reads ciphertext and opens it,
and whoever sends seals a whole batch of queued requests at once, into one
record per 16 KiB.
"""

from __future__ import annotations

import re
import socket
import ssl
import time
from dataclasses import dataclass

TLS_VERSION_MIN = ssl.TLSVersion.TLSv1_2
"""The oldest TLS version the client offers (the server speaks 1.3, and 1.2
with AEAD suites)."""

_UNTRUSTED_CODES = frozenset({2, 18, 19, 20, 21})
"""OpenSSL verify codes that mean the chain does not reach a trusted CA
(unable to get the issuer, self-signed, self-signed in the chain, unable to
get the local issuer, unable to verify the first certificate)."""

_READ_BYTES = 64 * 1024


@dataclass(frozen=True)
class TlsSettings:
    """TLS on: the context every connection uses, and the name a server's
    certificate must hold (``None``: the host of the address)."""

    context: ssl.SSLContext
    server_name: str | None

    def server_name_for(self, host: str) -> str:
        """The name to check the certificate of the server at ``host`` against."""
        return self.server_name or host

    def session(self, host: str) -> TlsSession:
        """A fresh TLS state for a connection to ``host``."""
        return TlsSession(self.context, self.server_name_for(host))


def tls_settings(
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    tls_server_name: str | None,
    ssl_context: ssl.SSLContext | None,
) -> TlsSettings | None:
    """The TLS settings the options ask for, checked, with the files read
    now (so that a missing file fails the client's construction, not every
    connect); ``None`` for plain TCP.

    Example::

        >>> tls_settings(None, None, None, None, None) is None
        True
    """
    if ssl_context is not None:
        if tls_ca is not None or tls_cert is not None or tls_key is not None:
            raise ValueError("give either ssl_context or tls_ca/tls_cert/tls_key, not both")
        if not isinstance(ssl_context, ssl.SSLContext):
            raise ValueError("ssl_context must be an ssl.SSLContext")
        return TlsSettings(ssl_context, tls_server_name)
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("tls_cert and tls_key go together: the client certificate and its private key")
    if tls_ca is None:
        if tls_cert is not None or tls_server_name is not None:
            raise ValueError("tls_cert, tls_key and tls_server_name need tls_ca (or ssl_context), which turns TLS on")
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the certificate and the name
    context.minimum_version = TLS_VERSION_MIN
    try:
        context.load_verify_locations(cafile=tls_ca)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"tls_ca {tls_ca!r}: {_reason(error)}") from error
    if tls_cert is not None:
        try:
            context.load_cert_chain(tls_cert, tls_key)
        except (OSError, ssl.SSLError) as error:
            raise ValueError(f"tls_cert {tls_cert!r} / tls_key {tls_key!r}: {_reason(error)}") from error
    return TlsSettings(context, tls_server_name)


def tls_reason(error: ssl.SSLError) -> str:
    """What went wrong in a TLS handshake or record, in words: whether the
    server's certificate was not trusted, expired or for another name, or
    the alert or failure OpenSSL reported.

    Example::

        >>> text = "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required (_ssl.c:2580)"
        >>> tls_reason(ssl.SSLError(1, text))
        'tlsv13 alert certificate required'
    """
    if isinstance(error, ssl.SSLCertVerificationError):
        if error.verify_code in _UNTRUSTED_CODES:
            return f"the server's certificate is not trusted: {error.verify_message}"
        return f"the server's certificate was refused: {error.verify_message}"
    return _reason(error)


def _reason(error: BaseException) -> str:
    """An ssl error's text without OpenSSL's library tag and source line."""
    text = getattr(error, "strerror", None) or str(error)
    text = re.sub(r"^\[[A-Z0-9_]+: [A-Z0-9_]+\] ", "", str(text))
    return re.sub(r" \(_ssl\.c:\d+\)$", "", text)


class TlsSession:
    """One connection's TLS state over memory buffers. Not thread-safe:
    the sync client calls it under the connection's mutex (once the
    handshake is done), so that records leave in the order they were made.
    """

    __slots__ = ("_incoming", "_object", "_outgoing")

    def __init__(self, context: ssl.SSLContext, server_name: str) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._object = context.wrap_bio(self._incoming, self._outgoing, server_side=False, server_hostname=server_name)

    def handshake(self, sock: socket.socket, deadline: float) -> None:
        """Runs the handshake on a fresh socket until ``deadline``
        (monotonic); raises :class:`ssl.SSLError` if it fails,
        :class:`TimeoutError` past the deadline, :class:`OSError` if the
        socket breaks."""
        while True:
            try:
                self._object.do_handshake()
            except ssl.SSLWantReadError:
                self._flush(sock)
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                data = sock.recv(_READ_BYTES)
                if not data:
                    raise ConnectionResetError("closed by the server during the TLS handshake") from None
                self._incoming.write(data)
            else:
                self._flush(sock)
                return

    def _flush(self, sock: socket.socket) -> None:
        if self._outgoing.pending:
            sock.sendall(self._outgoing.read())

    def seal(self, plaintext: bytes | bytearray) -> bytes:
        """``plaintext`` as records to send."""
        self._object.write(plaintext)
        return self._outgoing.read()

    def open(self, ciphertext: bytes) -> bytes | None:
        """The plaintext the records in ``ciphertext`` carry (empty if they
        complete none); ``None`` once the server said it is done
        (close_notify). Raises :class:`ssl.SSLError` for a bad record or an
        alert."""
        self._incoming.write(ciphertext)
        plaintext = b""
        while True:
            try:
                plaintext += self._object.read(_READ_BYTES)
            except ssl.SSLWantReadError:
                return plaintext
            except ssl.SSLZeroReturnError:
                return plaintext or None

    def output(self) -> bytes:
        """Records TLS itself made while reading (an answer to a key
        update), to send after whatever was sealed before."""
        return self._outgoing.read() if self._outgoing.pending else b""

    def close_notify(self) -> bytes:
        """The alert that says the client sends nothing more; replies can
        still be read after it."""
        try:
            self._object.unwrap()
        except (ssl.SSLWantReadError, ssl.SSLError):
            pass
        return self._outgoing.read()
