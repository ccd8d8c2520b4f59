"""The sync client's I/O: background threads that own the connections.

What a connection knows and decides is its
:class:`~ringlock._connection.ConnectionCore`, shared with the asyncio
client; the threads here only carry bytes and wait. Each connection has a
**reader** thread that connects (the steps of its
:class:`~ringlock._connection.SetUp`), reads and hands what it read to the
core, which pairs the replies, carries out their steps (completing the
callers' requests), and on a cut hands every request in flight back to the
router and connects again: at once, then after the growing pauses of
``_backoff``. Callers write their own request lines, under the connection's mutex
and without blocking (``MSG_DONTWAIT``), so that a request costs no thread
switch on the way out; the table's order for an (op, key) is then the
wire's order. Only what the socket did not take at once goes to the
connection's **writer** thread, which sends it in order (a stalled server
cannot block a caller). One **timer** thread runs retries and lock
extensions, and every connection's silence check (``_liveness``): a
connection with requests in flight that has read nothing for
``suspect_after`` is sent ``P``, and cut if nothing comes for
``ping_timeout`` after.

With TLS, the reader does the handshake right after the connect, and the
connection's :class:`~ringlock._tls.TlsSession` sits between the socket and
the lines: the reader opens what it reads, and whoever sends seals the
whole queued batch at once, under the mutex, so that records leave in the
order they were made.
"""

from __future__ import annotations

import heapq
import itertools
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable

from ._connection import CLOSED, UP, ConnectionCore, CoreConnection, SetUp, auth_outcome, deliver
from ._liveness import CUT, QUIET, SEND_PING, probe, tune_socket
from ._operation import CUT_IO, Operation
from ._protocol import REPLY_LINE_LEN_MAX
from ._router import Router
from ._settings import Settings
from ._tls import TlsSession
from .errors import ConnectionFailure, RinglockError

_READ_BYTES = 32 * 1024
_CLOSE_LINGER_S = 1.0
"""How long a closing connection waits for the answers to what it sent."""


class ThreadRuntime:
    """Connections on threads, and the retry timer (see :class:`~ringlock._router.Runtime`)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.closed = threading.Event()
        self.connections: list[ThreadConnection] = []
        self._timer = Timer()

    def connect(self, router: Router, address: str, node: int) -> ThreadConnection:
        connection = ThreadConnection(router, self, address, node)
        self.connections.append(connection)
        connection.start()
        return connection

    def call_at(self, at: float, callback: Callable[[], None]) -> bool:
        return self._timer.call_at(at, callback)

    def close(self, join_timeout: float) -> None:
        """Stops the timer, and waits up to ``join_timeout`` for every
        connection's threads to end (the router closed them)."""
        self.closed.set()
        for callback in self._timer.close():
            callback()
        deadline = time.monotonic() + join_timeout
        for connection in list(self.connections):
            connection.join(max(0.0, deadline - time.monotonic()))


class Timer:
    """Runs callbacks at monotonic instants, on one thread started on first use."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def call_at(self, at: float, callback: Callable[[], None]) -> bool:
        with self._wake:
            if self._closed:
                return False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ringlock-timer", daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, (at, next(self._order), callback))
            self._wake.notify()
        return True

    def close(self) -> list[Callable[[], None]]:
        """Stops the thread; returns the callbacks that will not run, so
        that the caller can end what they were for."""
        with self._wake:
            self._closed = True
            self._wake.notify()
            pending = [callback for _, _, callback in self._heap]
            self._heap.clear()
        return pending

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    self._wake.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                if self._closed:
                    return
                _, _, callback = heapq.heappop(self._heap)
            callback()


class ThreadConnection(CoreConnection):
    """One persistent connection to one node, and its two threads."""

    def __init__(self, router: Router, runtime: ThreadRuntime, address: str, node: int) -> None:
        self.address = address
        self.node = node
        self._setup = SetUp.of(address, runtime.settings)
        self._router = router
        self._runtime = runtime
        self._mutex = threading.Lock()
        self._writer_wake = threading.Condition(self._mutex)
        self._core = ConnectionCore(address, node, runtime.settings)
        self._sock: socket.socket | None = None
        # The socket's TLS state, with it; None for plain TCP.
        self._tls: TlsSession | None = None
        # Bytes the socket did not take at once, for the writer, in order
        # (with TLS: plaintext not sealed yet).
        self._backlog = bytearray()
        # With TLS: records made but not sent yet, in order; they go before
        # whatever is sealed next.
        self._sealed = bytearray()
        self._writing = False
        self._reader_done = threading.Event()
        self._ticking = False
        self._reader = threading.Thread(target=self._run_reader, name=f"ringlock-read {address}", daemon=True)
        self._writer = threading.Thread(target=self._run_writer, name=f"ringlock-write {address}", daemon=True)

    def start(self) -> None:
        self._reader.start()
        self._writer.start()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in (self._reader, self._writer):
            thread.join(max(0.0, deadline - time.monotonic()))

    def try_send(self, operation: Operation, now: float) -> int:
        line = operation.encode(now)
        mutex = self._mutex
        with mutex:
            refusal = self._core.admit(operation, now)
            if refusal:
                return refusal
            sock = self._sock
            if sock is None or self._writing:
                # Whoever is sending takes it next, in order; before the
                # connect, the writer does once connected.
                self._backlog += line
                return 0
            # This caller sends, outside the mutex so that the reader can
            # pair replies meanwhile (on loopback the reply can arrive
            # before the send call returns); whatever other callers queue
            # meanwhile it sends too, in order.
            self._writing = True
            if self._tls is not None:
                self._backlog += line
                line = self._take_sealed()
        data = line
        while True:
            try:
                sent = sock.send(data, socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            except OSError:
                # The reader sees the socket fail and takes the requests back.
                _shutdown(sock, socket.SHUT_RDWR)
                sent = len(data)
            with mutex:
                if sent < len(data) and self._sock is sock:
                    # The socket is full: the writer thread waits for room,
                    # so that no caller blocks on a stalled server.
                    if self._tls is None:
                        self._backlog[:0] = data[sent:]
                    else:
                        self._sealed[:0] = data[sent:]
                    self._writing = False
                    self._writer_wake.notify()
                    return 0
                if self._sock is not sock:
                    # Cut meanwhile: the reader took the requests back and
                    # a new socket has its own sender.
                    return 0
                if not self._backlog and not self._sealed:
                    self._writing = False
                    return 0
                if self._tls is None:
                    data = bytes(self._backlog)
                    self._backlog.clear()
                else:
                    data = self._take_sealed()

    def _take_sealed(self) -> bytes:
        """With TLS, under the mutex: the records to send now, in order,
        the queued requests sealed together after those made earlier."""
        assert self._tls is not None
        if self._backlog:
            try:
                self._sealed += self._tls.seal(self._backlog)
            except ssl.SSLError:
                # The session ended under us (the server closed it, say
                # after refusing our certificate once the handshake looked
                # done): nothing more can be sent on it. The connection
                # fails like a broken socket, and the reader takes the
                # requests back; the error must not reach whichever
                # thread was sending (the timer thread, a caller).
                self._backlog.clear()
                self._sealed.clear()
                if self._sock is not None:
                    _shutdown(self._sock, socket.SHUT_RDWR)
                return b""
            self._backlog.clear()
        data = bytes(self._sealed)
        self._sealed.clear()
        return data

    def close(self) -> None:
        """Starts closing: the writer flushes what is queued, then the
        socket is closed once the answers are in (or after a linger)."""
        with self._mutex:
            self._core.phase = CLOSED
            self._writer_wake.notify()

    def _install(self, sock: socket.socket, tls: TlsSession | None, carried: bytes) -> bool:
        """Makes a fresh socket the connection's; false if the client closed
        with nothing queued. Requests queued while the first connect was
        under way (the release of a grant nobody waits for, say) still go
        out on it before the writer closes it."""
        core = self._core
        with self._mutex:
            if core.phase == CLOSED:
                if not self._backlog:
                    return False
            else:
                core.phase = UP
            self._sock = sock
            self._tls = tls
            core.opened(time.monotonic(), carried)
            # Requests queued while the first connect was under way go out now.
            self._writer_wake.notify()
            start_ticking = not self._ticking
            self._ticking = True
        if start_ticking:
            self._runtime.call_at(time.monotonic() + core.liveness.tick, self._tick)
        return True

    def _tick(self) -> None:
        """The periodic silence check (see ``_liveness``): pings a
        connection whose replies are overdue, cuts one whose ping went
        unanswered; its reader then hands its requests back."""
        now = time.monotonic()
        core = self._core
        with self._mutex:
            if core.phase == CLOSED:
                self._ticking = False
                return
            sock = self._sock
            action = core.tick(now) if sock is not None else QUIET
        if sock is not None and action == SEND_PING:
            self.try_send(probe(now, self._router.policy), now)
        elif sock is not None and action == CUT:
            _shutdown(sock, socket.SHUT_RDWR)
        if not self._runtime.call_at(now + core.liveness.tick, self._tick):
            with self._mutex:
                self._ticking = False

    def _queued(self) -> bool:
        """Whether requests wait for a socket (only during the first connect)."""
        with self._mutex:
            return bool(self._backlog)

    def _take_down(self) -> list[Operation]:
        """Marks the connection broken; takes back every request in flight."""
        with self._mutex:
            self._sock = None
            self._tls = None
            self._backlog.clear()
            self._sealed.clear()
            self._writing = False
            # A closing writer waiting for the first connect's outcome may go.
            self._writer_wake.notify()
            return self._core.take_down()

    def _run_reader(self) -> None:
        router = self._router
        runtime = self._runtime
        settings = runtime.settings
        core = self._core
        setup = self._setup
        try:
            # A client closed before this first connect still makes it if
            # requests were queued for it (see _install).
            while not runtime.closed.is_set() or self._queued():
                started = time.monotonic()
                try:
                    sock = socket.create_connection((setup.host, setup.port), timeout=setup.connect_timeout)
                except OSError as failure:
                    failed = ConnectionFailure.from_os_error(self.address, failure)
                    how = core.attempt_failed(failed, time.monotonic())
                    router.cut(self._take_down(), *how)
                else:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    tune_socket(sock, settings.suspect_after, settings.ping_timeout)
                    tls, carried, refused = self._open(sock, started)
                    if refused is not None:
                        # A failed handshake or a refused secret fails the
                        # connection like a failed connect.
                        sock.close()
                        how = core.attempt_failed(refused, time.monotonic())
                        router.cut(self._take_down(), *how)
                    else:
                        sock.settimeout(None)
                        if not self._install(sock, tls, carried):
                            sock.close()
                            break
                        router.connection_up()
                        error = self._read(sock, tls)
                        _shutdown(sock, socket.SHUT_RDWR)
                        how = core.socket_ended(error, time.monotonic())
                        router.cut(self._take_down(), *how)
                        sock.close()
                if runtime.closed.wait(core.reconnects.pause(random.random())):
                    break
        finally:
            self._reader_done.set()
            router.abort(self._take_down())

    def _open(self, sock: socket.socket, started: float) -> tuple[TlsSession | None, bytes, ConnectionFailure | None]:
        """Makes a fresh socket ready for requests: the TLS handshake within
        the connect timeout counted from ``started``, then ``U <secret>``.
        Returns the TLS state, the plaintext read past the answer to ``U``,
        and why the connection cannot be used (``None`` if it can)."""
        setup = self._setup
        tls = None
        if setup.tls_context is not None:
            tls = TlsSession(setup.tls_context, setup.server_name)
            try:
                tls.handshake(sock, started + setup.connect_timeout)
            except OSError as failure:  # ssl.SSLError among them
                return None, b"", ConnectionFailure.from_os_error(self.address, failure)
        if setup.hello is None:
            return tls, b"", None
        refused, carried = self._authenticate(sock, tls, setup.hello)
        return tls, carried, refused

    def _authenticate(
        self, sock: socket.socket, tls: TlsSession | None, hello: bytes
    ) -> tuple[ConnectionFailure | None, bytes]:
        """Sends ``U <secret>`` on a fresh socket, before any request, and
        reads the answer; ``None`` once authenticated, else why the
        connection cannot be used, and the plaintext read past the answer.
        Nothing else is in flight yet, so the answer is the first line and
        is read here rather than paired (``U`` replies carry no key)."""
        sock.settimeout(self._setup.hello_timeout)
        line = b""
        carried = b""
        try:
            if tls is None:
                sock.sendall(hello)
                # Byte by byte, so that nothing after the answer is taken
                # from the reader; this happens once per connection.
                while not line.endswith(b"\n"):
                    if len(line) > REPLY_LINE_LEN_MAX:
                        return ConnectionFailure(self.address, "dropped: reply line too long"), b""
                    byte = sock.recv(1)
                    if not byte:
                        return ConnectionFailure(self.address, "closed by the server"), b""
                    line += byte
            else:
                # Records cannot be read byte by byte: what comes after the
                # answer is carried to the reader.
                sock.sendall(tls.seal(hello))
                while b"\n" not in line:
                    if len(line) > REPLY_LINE_LEN_MAX:
                        return ConnectionFailure(self.address, "dropped: reply line too long"), b""
                    data = sock.recv(_READ_BYTES)
                    opened = tls.open(data) if data else None
                    if opened is None:
                        return ConnectionFailure(self.address, "closed by the server"), b""
                    line += opened
                    output = tls.output()
                    if output:
                        sock.sendall(output)
                line, newline, carried = line.partition(b"\n")
                line += newline
        except OSError as failure:
            return ConnectionFailure.from_os_error(self.address, failure), b""
        return self._authenticated(line), carried

    def _authenticated(self, line: bytes) -> ConnectionFailure | None:
        """What the answer to ``U`` says: ``None`` once authenticated, else
        why the connection cannot be used."""
        name, failure = auth_outcome(self.address, line.rstrip(b"\r\n"))
        if name is not None:
            self._router.authenticated_name = name
        return failure

    def _read(self, sock: socket.socket, tls: TlsSession | None) -> RinglockError:
        """Reads replies until the socket breaks or the server breaks the
        protocol; returns why it stopped. The core pairs them under the
        mutex; their steps are carried out with it unlocked, as moving a
        request locks another connection."""
        router = self._router
        mutex = self._mutex
        core = self._core
        liveness = core.liveness
        while True:
            try:
                data = sock.recv(_READ_BYTES)
            except OSError as failure:
                if core.read_error is None:
                    core.read_error = failure
                return CUT_IO
            if not data:
                return CUT_IO
            now = time.monotonic()
            liveness.last_read = now
            if tls is not None:
                try:
                    with mutex:
                        opened = tls.open(data)
                        output = tls.output()
                        if output:
                            # Sent by whoever sends next, after the records
                            # made before it; the writer if nobody is.
                            self._sealed += output
                            self._writer_wake.notify()
                except ssl.SSLError as failure:
                    core.read_error = failure
                    return CUT_IO
                if opened is None:
                    return CUT_IO
                data = opened
                if not data:
                    continue
            with mutex:
                replies, stop = core.read(data, now)
            if replies:
                deliver(router, self.node, replies)
            if stop is not None:
                return stop

    def _run_writer(self) -> None:
        mutex = self._mutex
        wake = self._writer_wake
        with mutex:
            while True:
                while self._sock is None or not (self._backlog or self._sealed) or self._writing:
                    if self._reader_done.is_set():
                        break
                    # Closing with requests queued but no socket: the first
                    # connect is under way, and either installs one or takes
                    # the requests back.
                    if self._core.phase == CLOSED and (self._sock is not None or not self._backlog):
                        break
                    wake.wait()
                if self._sock is not None and (self._backlog or self._sealed) and not self._writing:
                    sock = self._sock
                    if self._tls is None:
                        data = bytes(self._backlog)
                        self._backlog.clear()
                    else:
                        data = self._take_sealed()
                    self._writing = True
                    mutex.release()
                    try:
                        sock.sendall(data)
                    except OSError:
                        _shutdown(sock, socket.SHUT_RDWR)
                    finally:
                        mutex.acquire()
                        if self._sock is sock:
                            self._writing = False
                    continue
                break
            sock = self._sock
            # With TLS, the close_notify alert says it: it goes after every
            # record made, and replies can still be read after it.
            # (Not while a caller is still sending records made before it.)
            goodbye = b""
            if self._tls is not None and sock is not None and not self._writing:
                goodbye = self._tls.close_notify()
        if sock is not None:
            # Say we are done, and give the server a moment to answer what
            # it was sent (releases, say) before the socket goes.
            if goodbye:
                try:
                    sock.sendall(goodbye)
                except OSError:
                    pass
            _shutdown(sock, socket.SHUT_WR)
            self._reader_done.wait(_CLOSE_LINGER_S)
            _shutdown(sock, socket.SHUT_RDWR)


def _shutdown(sock: socket.socket, how: int) -> None:
    try:
        sock.shutdown(how)
    except OSError:
        pass
