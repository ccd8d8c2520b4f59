"""The asyncio client: ``ringlock.aio.Client``, ``ringlock.aio.Lock`` and
``ringlock.aio.Clusters``, with the names of the sync client, their calls
awaited.

Everything runs on the event loop: each connection is an
:class:`asyncio.Protocol` whose reconnect loop is a task; what it knows
and decides is the :class:`~ringlock._connection.ConnectionCore` the sync
client uses too. The requests queued in one pass of the loop go out in one
write (with TLS, the loop's own TLS transport seals each write into one
record per 16 KiB). Use a client from the loop it was first used on.

Example::

    import asyncio
    import ringlock.aio

    async def main() -> None:
        async with ringlock.aio.Client("127.0.0.1:7700") as client:
            async with client.lock("orders/42", lease=30, wait=5) as lock:
                print("holding orders/42 with token", lock.token)

    asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from ._clusters import ClustersBase, cluster_for
from ._common import ClientBase, LockBase, inspected
from ._connection import CLOSED, UP, ConnectionCore, CoreConnection, SetUp, auth_outcome, deliver
from ._liveness import CUT, SEND_PING, probe, tune_socket
from ._operation import ACQUIRE, CUT_IO, EXTEND, INSPECT, PING, RELEASE, STATS, Operation
from ._protocol import REPLY_LINE_LEN_MAX, KeyState, Pong, key_bytes
from ._router import Router
from ._settings import Settings
from .errors import ConnectionFailure, LockLostError, RinglockError

__all__ = ["Client", "Clusters", "Lock", "cluster_for"]

_CLOSE_LINGER_S = 1.0


class _FutureWaiter:
    """A task awaiting a request's outcome."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[object]) -> None:
        self.future = future

    def complete(self, value: object) -> bool:
        if self.future.done():  # the awaiting task was cancelled
            return False
        self.future.set_result(value)
        return True

    @property
    def abandoned(self) -> bool:
        # Completed only once, by complete(), which ends the request: done
        # before that means cancelled.
        return self.future.done()


class _Runtime:
    """Connections as protocols on the loop, and timers (see
    :class:`~ringlock._router.Runtime`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, settings: Settings) -> None:
        self.loop = loop
        self.settings = settings
        self.closed = asyncio.Event()
        self.connections: list[_Connection] = []
        self._timers: dict[asyncio.TimerHandle, Callable[[], None]] = {}

    def connect(self, router: Router, address: str, node: int) -> _Connection:
        connection = _Connection(router, self, address, node)
        self.connections.append(connection)
        return connection

    def call_at(self, at: float, callback: Callable[[], None]) -> bool:
        if self.closed.is_set():
            return False
        handle: asyncio.TimerHandle

        def run() -> None:
            del self._timers[handle]
            callback()

        handle = self.loop.call_later(max(0.0, at - time.monotonic()), run)
        self._timers[handle] = callback
        return True

    async def sleep(self, seconds: float) -> bool:
        """Sleeps, or less if the client closes; true if it closed."""
        try:
            await asyncio.wait_for(self.closed.wait(), seconds)
        except asyncio.TimeoutError:
            return False
        return True

    async def close(self) -> None:
        self.closed.set()
        # Timers that will not run now: their requests fail as closed.
        pending = list(self._timers.items())
        self._timers.clear()
        for handle, callback in pending:
            handle.cancel()
            callback()
        tasks = [connection.task for connection in self.connections if connection.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=_CLOSE_LINGER_S + 0.5)
            for connection in self.connections:
                connection.abort()
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)


class _Connection(CoreConnection, asyncio.Protocol):
    """One persistent connection to one node, reconnected by its task."""

    def __init__(self, router: Router, runtime: _Runtime, address: str, node: int) -> None:
        self.address = address
        self.node = node
        self._setup = SetUp.of(address, runtime.settings)
        self._router = router
        self._runtime = runtime
        self._loop = runtime.loop
        self._core = ConnectionCore(address, node, runtime.settings)
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._lost: asyncio.Future[RinglockError] | None = None
        # While the answer to U is awaited: the socket, not yet the
        # connection's (requests wait), and the future the answer line (or
        # None, if the socket closed first) goes to.
        self._handshake: asyncio.Transport | None = None
        self._auth_reply: asyncio.Future[bytes | None] | None = None
        # A closing TLS connection, whose transport cannot half-close,
        # closes once every request in flight is answered.
        self._close_when_answered = False
        # The silence check (see _liveness), on one periodic tick while up.
        self._tick_handle: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = self._loop.create_task(self._run())

    def try_send(self, operation: Operation, now: float) -> int:
        refusal = self._core.admit(operation, now)
        if refusal:
            return refusal
        self._out.append(operation.encode(now))
        # Everything queued in this pass of the loop goes out in one write.
        if self._transport is not None and not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return 0

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._transport is not None and self._out:
            self._transport.write(b"".join(self._out))
            self._out.clear()

    def close(self) -> None:
        """Starts closing: sends what is queued and says it is done; the
        server answers what it was sent and closes."""
        self._core.phase = CLOSED
        transport = self._transport
        if transport is not None:
            self._flush()
            if transport.can_write_eof():
                transport.write_eof()
            elif len(self._core.pairing) == 0:
                # TLS: close() sends close_notify, after which the loop's
                # TLS transport reads nothing more; so only once the
                # answers are in.
                transport.close()
            else:
                self._close_when_answered = True

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _take_down(self) -> list[Operation]:
        self._transport = None
        self._out.clear()
        self._close_when_answered = False
        return self._core.take_down()

    def _go_up(self, transport: asyncio.Transport) -> None:
        """A socket, connected (and authenticated), becomes the
        connection's: the requests queued meanwhile go out. If the client
        closed meanwhile with requests queued (the release of a grant
        nobody waits for, say), they go out on it, and it closes as
        close() closes a live one."""
        self._transport = transport
        if self._core.phase == CLOSED:
            self.close()
            return
        self._core.phase = UP
        # Its silence check starts.
        self._core.opened(time.monotonic(), self._core.pending)
        if self._tick_handle is None:
            self._tick_handle = self._loop.call_later(self._core.liveness.tick, self._tick)
        self._flush()

    def _tick(self) -> None:
        """Pings the connection if its replies are overdue, cuts it if its
        ping went unanswered; runs while a socket is up."""
        self._tick_handle = None
        if self._transport is None or self._core.phase != UP:
            return
        now = time.monotonic()
        action = self._core.tick(now)
        if action == SEND_PING:
            self.try_send(probe(now, self._router.policy), now)
        elif action == CUT:
            return self._stop(CUT_IO)
        self._tick_handle = self._loop.call_later(self._core.liveness.tick, self._tick)

    async def _run(self) -> None:
        router = self._router
        runtime = self._runtime
        settings = runtime.settings
        core = self._core
        try:
            # A client closed before this first connect still makes it if
            # requests were queued for it (see connection_made).
            while not runtime.closed.is_set() or self._out:
                self._lost = self._loop.create_future()
                core.replied = False
                core.read_error = None
                try:
                    # With TLS, the handshake is part of the connect, within
                    # the same timeout.
                    await asyncio.wait_for(self._connect(), settings.connect_timeout)
                except (OSError, asyncio.TimeoutError) as failure:
                    failed = ConnectionFailure.from_os_error(self.address, failure)
                    how = core.attempt_failed(failed, time.monotonic())
                    router.cut(self._take_down(), *how)
                else:
                    refused = await self._authenticate() if self._setup.hello is not None else None
                    if refused is not None:
                        # A refused secret fails the connection like a failed
                        # connect. The socket's connection_lost comes first,
                        # so that it cannot resolve the next socket's future.
                        await self._lost
                        how = core.attempt_failed(refused, time.monotonic())
                        router.cut(self._take_down(), *how)
                    else:
                        router.connection_up()
                        error = await self._lost
                        how = core.socket_ended(error, time.monotonic())
                        router.cut(self._take_down(), *how)
                if await runtime.sleep(core.reconnects.pause(random.random())):
                    break
        finally:
            router.abort(self._take_down())

    async def _connect(self) -> None:
        setup = self._setup
        if setup.tls_context is None:
            await self._loop.create_connection(lambda: self, setup.host, setup.port)
            return
        await self._loop.create_connection(
            lambda: self,
            setup.host,
            setup.port,
            ssl=setup.tls_context,
            server_hostname=setup.server_name,
            ssl_handshake_timeout=setup.connect_timeout,
        )

    async def _authenticate(self) -> ConnectionFailure | None:
        """Awaits the answer to the ``U`` line ``connection_made`` sent;
        ``None`` once authenticated (the connection then takes requests),
        else why the connection cannot be used (the socket is closed)."""
        transport, reply = self._handshake, self._auth_reply
        assert transport is not None and reply is not None
        try:
            line = await asyncio.wait_for(asyncio.shield(reply), self._setup.hello_timeout)
        except asyncio.TimeoutError:
            line = None
            failure: ConnectionFailure | None = ConnectionFailure.from_os_error(self.address, TimeoutError())
        else:
            failure = ConnectionFailure(self.address, "closed by the server")
        self._handshake = None
        self._auth_reply = None
        if line is not None:
            name, failure = auth_outcome(self.address, line)
            if name is not None:
                self._router.authenticated_name = name
                self._go_up(transport)
                return None
        transport.abort()
        return failure

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if self._core.phase == CLOSED and not self._out:
            transport.abort()
            return
        sock = transport.get_extra_info("socket")
        settings = self._runtime.settings
        if sock is not None:
            tune_socket(sock, settings.suspect_after, settings.ping_timeout)
        if self._setup.hello is not None:
            # Requests wait until the server has answered U (_authenticate).
            self._handshake = transport
            self._auth_reply = self._loop.create_future()
            transport.write(self._setup.hello)
            return
        self._go_up(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._auth_reply is not None and not self._auth_reply.done():
            self._auth_reply.set_result(None)
        if self._lost is not None and not self._lost.done():
            self._core.read_error = exc
            self._lost.set_result(CUT_IO)

    def _stop(self, error: RinglockError) -> None:
        """Drops the connection: the server broke the protocol or refused it."""
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(error)
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        core = self._core
        now = time.monotonic()
        core.liveness.last_read = now
        if self._handshake is not None:
            # The answer to U: the first line, before any request was sent.
            if core.pending:
                data = core.pending + data
            line, newline, rest = data.partition(b"\n")
            if not newline:
                if len(data) > REPLY_LINE_LEN_MAX:
                    self._handshake.abort()
                core.pending = data
                return
            core.pending = rest
            if self._auth_reply is not None and not self._auth_reply.done():
                self._auth_reply.set_result(line.rstrip(b"\r"))
            return
        replies, stop = core.read(data, now)
        if replies:
            deliver(self._router, self.node, replies)
        if stop is not None:
            return self._stop(stop)
        if self._close_when_answered and len(core.pairing) == 0 and self._transport is not None:
            self._transport.close()


class Client(ClientBase):
    """The asyncio ringlock client; the settings are those of
    :class:`ringlock.Client`.

    Connections start on first use (or on ``async with``), on the running
    loop, and are shared by every task using the client.

    Example::

        async with ringlock.aio.Client(["10.0.0.1:7700", "10.0.0.2:7700"]) as client:
            lock = client.lock("orders/42", lease=30)
            if await lock.acquire(timeout=5):
                try:
                    await write_to_storage(lock.token)
                finally:
                    await lock.release()
    """

    def _set_up(self) -> None:
        # The loop is known only once the client is used (_start).
        self._runtime: _Runtime | None = None
        self._router: Router | None = None
        self._closed = False

    async def __aenter__(self) -> Client:
        self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _start(self) -> Router:
        if self._router is None:
            if self._closed:
                raise RuntimeError("the client is closed")
            self._runtime = _Runtime(asyncio.get_running_loop(), self.settings)
            settings = self.settings
            self._router = Router(settings.addresses, settings.connections_per_node, settings.policy, self._runtime)
        return self._router

    async def close(self) -> None:
        """Closes the connections after sending what is queued and waiting
        up to about a second for the answers. Requests still waiting end
        with :class:`~ringlock.NoActiveNodeError`.

        Example::

            client = ringlock.aio.Client("127.0.0.1:7700")
            try:
                await client.ping()
            finally:
                await client.close()
        """
        if self._closed:
            return
        self._closed = True
        if self._router is not None and self._runtime is not None:
            self._router.close()
            await self._runtime.close()

    def lock(
        self,
        key: str | bytes,
        lease: float = 30.0,
        wait: float | None = None,
        *,
        auto_extend: bool = False,
        on_lost: Callable[[Lock, LockLostError], None] | None = None,
    ) -> Lock:
        """A :class:`Lock` on ``key``, not acquired yet; the arguments are
        those of :meth:`ringlock.Client.lock` (``on_lost`` is called on the
        loop).

        Example::

            async with client.lock("reports/daily", lease=60, wait=0) as lock:
                await build_report(lock.token)
        """
        return Lock(self, key, lease, wait, auto_extend, on_lost)

    def lock_from(
        self,
        key: str | bytes,
        token: int,
        lease: float = 30.0,
        *,
        auto_extend: bool = False,
        on_lost: Callable[[Lock, LockLostError], None] | None = None,
    ) -> Lock:
        """A :class:`Lock` holding the grant another process took, given its
        key and token, as :meth:`ringlock.Client.lock_from`. With
        ``auto_extend`` it must be called on the running loop.

        Example::

            lock = client.lock_from("deploy", token)
            await lock.release()
        """
        lock = Lock(self, key, lease, None, auto_extend, on_lost)
        lock._adopt(token)
        return lock

    async def ping(self) -> Pong:
        """Asks a node its role, epoch and the active it names.

        Example::

            pong = await client.ping()
            assert pong.role in ("active", "standby")
        """
        return await self._request(PING, b"")  # type: ignore[no-any-return]

    async def stats(self) -> dict[str, Any]:
        """A node's counters and gauges (its ``S`` reply's JSON).

        Example::

            print((await client.stats())["role"])
        """
        return await self._request(STATS, b"")  # type: ignore[no-any-return]

    async def inspect(self, key: str | bytes) -> KeyState:
        """What the active node knows of ``key`` now: as
        :meth:`ringlock.Client.inspect`, awaited. A bad key raises
        :class:`ValueError` before anything is sent.

        Example::

            state = await client.inspect("orders/42")
            if state.held:
                print(f"token {state.token}, {state.lease_left:.3f} s left, {state.waiters} waiting")
        """
        raw = key_bytes(key)
        state: KeyState = await self._request(INSPECT, raw)
        return inspected(state, key)

    async def _request(self, kind: int, key: bytes, **fields: Any) -> Any:
        router = self._start()
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        router.submit(kind, key, _FutureWaiter(future), **fields)
        value = await future
        if isinstance(value, RinglockError):
            raise value
        return value


class Lock(LockBase):
    """A named lock, as :class:`ringlock.Lock` with its calls awaited.

    Example::

        lock = client.lock("jobs/7", lease=10, wait=2)
        if await lock.acquire():
            try:
                await run(lock.token)
                await lock.extend(10)
            finally:
                await lock.release()

        async with client.lock("jobs/7", lease=10, wait=2) as lock:  # LockTimeoutError if not granted
            await run(lock.token)
    """

    _KIND = "ringlock.aio.Lock"
    _EVENT = asyncio.Event

    def __init__(
        self,
        client: Client,
        key: str | bytes,
        lease: float,
        wait: float | None,
        auto_extend: bool,
        on_lost: Callable[[Lock, LockLostError], None] | None,
    ) -> None:
        super().__init__(client, key, lease, wait, auto_extend, on_lost)
        self._client: Client = client
        self._extender: asyncio.Task[None] | None = None

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Acquires the key; ``True`` once granted, ``False`` if the wait ran
        out. The wait is ``timeout`` if given, else the lock's ``wait``; 1 ms
        (try once) with ``blocking=False`` or a wait of ``TRY_ONCE`` (``0``). Cancelling the awaiting task abandons the
        request, and a grant that arrives anyway is released.

        Example::

            lock = client.lock("k", lease=5)
            if await lock.acquire(timeout=0.5):
                await lock.release()
        """
        fields = self._acquire_fields(blocking, timeout)
        token = await self._client._request(ACQUIRE, self._key_bytes, **fields)
        if token is None:
            return False
        lease_ends = self._acquired(token)
        if self.auto_extend:
            self._extender = asyncio.get_running_loop().create_task(self._extend_in_background(token, lease_ends))
        return True

    def _adopt(self, token: int) -> None:
        """Holds the grant of ``token``, taken elsewhere (:meth:`Client.lock_from`)."""
        self._adopted(token)
        if self.auto_extend:
            self._extender = asyncio.get_running_loop().create_task(self._extend_in_background(token, math.inf))

    async def held(self) -> bool:
        """Asks the server (``I <key>``) whether this lock's grant still
        holds the key, as :meth:`ringlock.Lock.held`.

        Example::

            if not await lock.held():
                stop_writing()
        """
        token = self._token
        if token is None:
            return False
        state: KeyState = await self._client._request(INSPECT, self._key_bytes)
        return self._held_by(state, token)

    async def release(self) -> bool:
        """Releases the key: ``True`` if released, ``False`` if nothing was
        left to release. Retried like the sync client's.

        Raises :class:`~ringlock.LockNotOwnedError` if this lock holds nothing.

        Example::

            await lock.acquire()
            assert await lock.release()
        """
        token = self._release_token()
        self._stop_extender()
        return await self._client._request(RELEASE, self._key_bytes, token=token)  # type: ignore[no-any-return]

    async def extend(self, lease: float) -> None:
        """Makes the lease end ``lease`` seconds from now.

        Raises :class:`~ringlock.LockNotOwnedError` if this lock holds
        nothing, :class:`~ringlock.LockLostError` if the server no longer has
        the grant.

        Example::

            async with client.lock("batch", lease=10) as lock:
                for chunk in chunks:
                    await process(chunk)
                    await lock.extend(10)
        """
        fields = self._extend_fields(lease)
        sent_at = time.monotonic()
        try:
            await self._client._request(EXTEND, self._key_bytes, **fields)
        except LockLostError as error:
            self._mark_lost(fields["token"], error)
            raise
        self._extended(fields["token"], sent_at, lease)

    async def __aenter__(self) -> Lock:
        if not await self.acquire():
            raise self._not_granted()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        released = await self.release() if self._token is not None else None
        lost = self._block_error(released)
        if lost is not None and exc_type is None:
            raise lost

    def _stop_extender(self) -> None:
        if self._extender is not None and self._extender is not asyncio.current_task():
            self._extender.cancel()
        self._extender = None

    async def _extend_in_background(self, token: int, lease_ends: float) -> None:
        """Extends the lease at a third of it while ``token`` is held."""
        delay = self._extend_period
        while True:
            await asyncio.sleep(delay)
            if self._token != token:
                return
            sent_at = time.monotonic()
            try:
                fields = self._auto_extend_fields(token, lease_ends)
                request = self._client._request(EXTEND, self._key_bytes, **fields)
                # No answer is worth waiting for once the lease has ended.
                deadline = fields["connection_deadline"]
                await asyncio.wait_for(request, None if deadline is None else max(0.0, deadline - time.monotonic()))
            except (RinglockError, asyncio.TimeoutError) as error:
                retry = self._auto_extend_retry(token, error, lease_ends)
                if retry is None:
                    return
                delay = retry
                continue
            lease_ends = self._auto_extended(token, sent_at)
            delay = self._extend_period


class Clusters(ClustersBase[Client, Lock]):
    """Several clusters, each a :class:`Client` (asyncio) under a name, as
    :class:`ringlock.Clusters`: every key goes to the cluster
    :func:`ringlock.cluster_for` names, and its calls to that cluster's
    client, awaited where the client's are.

    Example::

        import ringlock.aio

        async with ringlock.aio.Clusters({
            "a": ringlock.aio.Client("10.0.0.1:7700"),
            "b": ringlock.aio.Client("10.0.1.1:7700"),
        }) as clusters:
            async with clusters.lock("orders/42", lease=30, wait=5) as lock:
                print(clusters.name_for("orders/42"), lock.token)
    """

    def __init__(self, clients: Mapping[str, Client]) -> None:
        super().__init__(clients, Client, "ringlock.aio.Client")

    async def __aenter__(self) -> Clusters:
        for client in self._clients.values():
            client._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def inspect(self, key: str | bytes) -> KeyState:
        """:meth:`Client.inspect` on the client of ``key``'s cluster.

        Example::

            print((await clusters.inspect("orders/42")).held)
        """
        return await self.client_for(key).inspect(key)

    async def stats(self) -> dict[str, dict[str, Any]]:
        """Each cluster's ``S`` reply, by name, asked of all at once.

        Example::

            print((await clusters.stats())["b"]["total"]["held_keys"])
        """
        names = list(self._clients)
        replies = await asyncio.gather(*(self._clients[name].stats() for name in names))
        return dict(zip(names, replies))

    async def close(self) -> None:
        """Closes every cluster's client, all at once.

        Example::

            await clusters.close()
        """
        await asyncio.gather(*(client.close() for client in self._clients.values()))
