"""Closing a client while a connection is still in its first connect: the
requests queued on it (the release of a grant nobody waits for any more,
say) go out once the connect completes, and end with ``no-connection`` if it
fails. Both clients, against a loopback listener, with the connect held
until the test lets it go."""

from __future__ import annotations

import asyncio
import queue
import socket
import threading
from collections.abc import Callable

import pytest

import ringlock
import ringlock.aio
from ringlock._operation import RELEASE
from ringlock._threaded import ThreadConnection

PATIENCE = 20.0
"""Bounds every wait, so that a broken test fails instead of hanging; never
what a test asserts."""


class HeldConnect:
    """Stands in for a connect: each one says it started, then waits until
    the test lets it go, and connects (or fails, if told to)."""

    def __init__(self, connect: Callable[..., object], fail: bool = False) -> None:
        self._connect = connect
        self._fail = fail
        self.started = threading.Event()
        self.go_on = threading.Event()

    def __call__(self, *args: object, **kwargs: object) -> object:
        self.started.set()
        assert self.go_on.wait(PATIENCE), "the test never let the connect go on"
        if self._fail:
            raise ConnectionRefusedError("refused by the test")
        return self._connect(*args, **kwargs)


def read_to_end(stream: socket.socket) -> bytes:
    stream.settimeout(PATIENCE)
    received = b""
    while chunk := stream.recv(4096):
        received += chunk
    return received


def test_sync_a_release_queued_during_the_first_connect_goes_out_though_the_client_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connect = HeldConnect(socket.create_connection)
    monkeypatch.setattr(socket, "create_connection", connect)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(PATIENCE)
        client = ringlock.Client(f"127.0.0.1:{listener.getsockname()[1]}", connections_per_node=1)
        assert connect.started.wait(PATIENCE)
        client._router.submit(RELEASE, b"k", None, token=7)
        closing = threading.Thread(target=client.close)
        closing.start()
        # Set once every connection is closing.
        assert client._runtime.closed.wait(PATIENCE)
        connect.go_on.set()
        stream, _ = listener.accept()
        with stream:
            received = read_to_end(stream)
        closing.join()
    assert received == b"R k 7\n"


def test_sync_a_release_queued_before_the_first_connect_starts_goes_out_though_the_client_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The reader thread is held before its first connect, until the client
    # has closed.
    reader_may_run = threading.Event()
    run_reader = ThreadConnection._run_reader

    def held_reader(connection: ThreadConnection) -> None:
        assert reader_may_run.wait(PATIENCE)
        run_reader(connection)

    monkeypatch.setattr(ThreadConnection, "_run_reader", held_reader)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = ringlock.Client(f"127.0.0.1:{listener.getsockname()[1]}", connections_per_node=1)
        client._router.submit(RELEASE, b"k", None, token=7)
        closing = threading.Thread(target=client.close)
        closing.start()
        assert client._runtime.closed.wait(PATIENCE)
        reader_may_run.set()
        closing.join()
        (connection,) = client._runtime.connections
        connection.join(PATIENCE)
        # The reader has ended: whatever it connected waits to be accepted.
        listener.setblocking(False)
        try:
            stream, _ = listener.accept()
        except BlockingIOError:
            pytest.fail("the client closed without connecting for the release queued on it")
        with stream:
            stream.setblocking(True)
            received = read_to_end(stream)
    assert received == b"R k 7\n"


def test_sync_a_first_connect_that_fails_after_close_ends_the_release_queued_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connect = HeldConnect(socket.create_connection, fail=True)
    monkeypatch.setattr(socket, "create_connection", connect)
    client = ringlock.Client("127.0.0.1:7700", connections_per_node=1)
    assert connect.started.wait(PATIENCE)
    outcomes: queue.Queue[object] = queue.Queue()
    client._background(RELEASE, b"k", outcomes.put, token=7)
    closing = threading.Thread(target=client.close, args=(PATIENCE,))
    closing.start()
    assert client._runtime.closed.wait(PATIENCE)
    connect.go_on.set()
    closing.join()
    error = outcomes.get(timeout=PATIENCE)
    assert isinstance(error, ringlock.NoActiveNodeError) and error.code == "no-connection"
    (connection,) = client._runtime.connections
    assert not connection._reader.is_alive() and not connection._writer.is_alive(), "a thread was left waiting"


async def serve_one(
    received: asyncio.Future[bytes], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Reads one connection to its end, then closes it."""
    try:
        received.set_result(await reader.read())
    finally:
        writer.close()


async def test_aio_a_release_queued_before_the_first_connect_starts_goes_out_though_the_client_closed() -> None:
    received: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    server = await asyncio.start_server(lambda r, w: serve_one(received, r, w), "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        client = ringlock.aio.Client(f"127.0.0.1:{port}", connections_per_node=1)
        # The connections' tasks start on the loop's next pass, after close.
        client._start().submit(RELEASE, b"k", None, token=7)
        await client.close()
        assert await asyncio.wait_for(received, PATIENCE) == b"R k 7\n"


async def test_aio_a_release_queued_during_the_first_connect_goes_out_though_the_client_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    started, go_on = asyncio.Event(), asyncio.Event()
    create_connection = loop.create_connection

    async def held_connect(*args: object, **kwargs: object) -> object:
        started.set()
        await go_on.wait()
        return await create_connection(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "create_connection", held_connect)
    received: asyncio.Future[bytes] = loop.create_future()
    server = await asyncio.start_server(lambda r, w: serve_one(received, r, w), "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        client = ringlock.aio.Client(f"127.0.0.1:{port}", connections_per_node=1, connect_timeout=PATIENCE)
        router = client._start()
        await asyncio.wait_for(started.wait(), PATIENCE)
        router.submit(RELEASE, b"k", None, token=7)
        closing = asyncio.create_task(client.close())
        # Set once every connection is closing.
        assert client._runtime is not None
        await asyncio.wait_for(client._runtime.closed.wait(), PATIENCE)
        go_on.set()
        assert await asyncio.wait_for(received, PATIENCE) == b"R k 7\n"
        await closing


async def test_aio_a_first_connect_that_fails_after_close_ends_the_release_queued_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    started, go_on = asyncio.Event(), asyncio.Event()

    async def refused_connect(*args: object, **kwargs: object) -> object:
        started.set()
        await go_on.wait()
        raise ConnectionRefusedError("refused by the test")

    monkeypatch.setattr(loop, "create_connection", refused_connect)
    client = ringlock.aio.Client("127.0.0.1:7700", connections_per_node=1, connect_timeout=PATIENCE)
    released = asyncio.create_task(client._request(RELEASE, b"k", token=7))
    await asyncio.wait_for(started.wait(), PATIENCE)
    closing = asyncio.create_task(client.close())
    assert client._runtime is not None
    await asyncio.wait_for(client._runtime.closed.wait(), PATIENCE)
    go_on.set()
    with pytest.raises(ringlock.NoActiveNodeError) as raised:
        await asyncio.wait_for(released, PATIENCE)
    assert raised.value.code == "no-connection"
    await asyncio.wait_for(closing, PATIENCE)
    (connection,) = client._runtime.connections
    assert connection.task is not None and connection.task.done()
