"""Processes the tests run: the real ``ringlock`` server and
``ringlock-testkit``, each started on free loopback ports and stopped by
whoever started it."""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import os
import re
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
"""The repository's root."""
SCENARIOS = ROOT / "clients" / "scenarios.json"


def binary(name: str, variable: str) -> Path:
    """A binary of the workspace (``cargo build --release`` puts it in
    ``target/release``), or the one the environment variable names."""
    path = Path(os.environ.get(variable) or ROOT / "target" / "release" / name)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `cargo build --release -p {name}` first (or set {variable})")
    return path


class Server:
    """A ringlock server on a free loopback port, with its own data directory."""

    def __init__(self, *args: str) -> None:
        self._data = tempfile.TemporaryDirectory(prefix="ringlock-py-")
        self._args = args
        self.address: str = self._start("127.0.0.1:0")

    def signal(self, number: int) -> None:
        """Sends the process a signal (``signal.SIGHUP`` reloads the auth file)."""
        self.process.send_signal(number)

    def kill(self) -> None:
        """SIGKILL, and waits for the process to be gone; the data directory
        stays, for :meth:`restart`."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def terminate(self) -> int:
        """SIGTERM (a graceful stop: queued acquires are answered
        ``shutting-down``), and waits for the process to exit; its exit code.
        The data directory stays, for :meth:`restart`."""
        self.process.terminate()
        return self.process.wait(20)

    def restart(self) -> None:
        """Starts the server again on the same address and data directory;
        returns once it answers a real ``P`` round trip (a killed server's
        io_uring listener may accept, and drop, connections for a few ms)."""
        self._start(self.address)
        host, _, port = self.address.rpartition(":")
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection((host, int(port)), timeout=1) as probe:
                    probe.sendall(b"P\n")
                    if probe.makefile("rb").readline().startswith(b"P "):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the restarted server does not answer:\n" + "".join(self.log))
            time.sleep(0.001)

    def start_again(self) -> None:
        """Starts a killed server again on the same address and data
        directory, without :meth:`restart`'s plain ``P`` probe (a TLS server
        would drop it); callers wait within a request's own limit."""
        self._start(self.address)

    def _start(self, listen: str) -> str:
        """Starts the process listening on ``listen``; the address it names."""
        command = [
            str(binary("ringlock", "RINGLOCK_BIN")),
            "--listen",
            listen,
            "--shards",
            "1",
            "--no-pin",
            "--data-dir",
            self._data.name,
            *self._args,
        ]
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self.log: collections.deque[str] = collections.deque(maxlen=200)
        assert self.process.stderr is not None
        address = None
        for raw in self.process.stderr:
            line = raw.decode(errors="replace")
            self.log.append(line)
            found = re.search(r"listening on (\S+?);?\s", line)
            if found:
                address = found.group(1).rstrip(";")
                break
        if address is None:
            self.stop()
            raise RuntimeError("the server exited before listening:\n" + "".join(self.log))
        # Keep reading its log, so that a full pipe never stops the server.
        threading.Thread(target=self._drain, args=(self.process,), daemon=True).start()
        return address

    def _drain(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stderr is not None
        for raw in process.stderr:
            self.log.append(raw.decode(errors="replace"))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._data.cleanup()


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free loopback port: bound, read and released. Within this process a
    port is handed out once, since the kernel may offer a port it just
    released again and a cluster asks for several in a row."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def ping_line(address: str, timeout: float = 0.5) -> str | None:
    """The reply to ``P`` on a connection of its own, or ``None`` if the
    node does not answer in time."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as probe:
            probe.settimeout(timeout)
            probe.sendall(b"P\n")
            line = probe.makefile("rb").readline().decode()
    except OSError:
        return None
    return line.rstrip("\r\n") if line.endswith("\n") else None


class Cluster:
    """A cluster of real ringlock nodes on free loopback ports (docs/protocol.md
    section 5), each with its own data directory and a log file; node ``i``'s
    client address is ``addresses[i]``, in priority order. Heartbeats every
    50 ms and a failover timeout of 500 ms, as the workspace's cluster tests."""

    HEARTBEAT_MS = 50
    FAILOVER_MS = 500

    def __init__(self, nodes: int = 3) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="ringlock-py-cluster-")
        self.addresses = [f"127.0.0.1:{free_port()}" for _ in range(nodes)]
        peers = [f"127.0.0.1:{free_port()}" for _ in range(nodes)]
        members = ",".join(f"{client}@{peer}" for client, peer in zip(self.addresses, peers))
        self._commands = [
            [
                str(binary("ringlock", "RINGLOCK_BIN")),
                "--listen",
                self.addresses[index],
                "--peers",
                members,
                "--node",
                str(index),
                "--cluster-listen",
                peers[index],
                "--heartbeat-ms",
                str(self.HEARTBEAT_MS),
                "--failover-ms",
                str(self.FAILOVER_MS),
                "--shards",
                "1",
                "--no-pin",
                "--data-dir",
                os.path.join(self._dir.name, f"data-{index}"),
            ]
            for index in range(nodes)
        ]
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * nodes
        # All at once, so that no node decides alone long before the others start.
        for index in range(nodes):
            self._spawn(index)
        for index in range(nodes):
            wait_until(lambda index=index: ping_line(self.addresses[index]) is not None, f"node {index} to answer P")

    def _spawn(self, index: int) -> None:
        with open(os.path.join(self._dir.name, f"node-{index}.log"), "ab") as log:
            self.processes[index] = subprocess.Popen(
                self._commands[index], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log
            )

    def logs(self) -> str:
        """The tail of every node's log, for a failure message."""
        text = ""
        for index in range(len(self.addresses)):
            with open(os.path.join(self._dir.name, f"node-{index}.log"), errors="replace") as log:
                text += f"--- node {index} ({self.addresses[index]}):\n" + "".join(log.readlines()[-30:])
        return text

    def single_active(self) -> int | None:
        """The index of the only active, if every other running node is a
        standby that names it; else ``None``."""
        lines = [
            ping_line(address) if process is not None else None
            for address, process in zip(self.addresses, self.processes)
        ]
        actives = [index for index, line in enumerate(lines) if line is not None and line.startswith("P active ")]
        if len(actives) != 1:
            return None
        active = actives[0]
        for index, line in enumerate(lines):
            if index == active or self.processes[index] is None:
                continue
            if line is None or not (line.startswith("P standby ") and line.endswith(" " + self.addresses[active])):
                return None
        return active

    def wait_single_active(self, what: str) -> int:
        """Waits until exactly one node is active and the others follow it."""
        found: list[int] = []

        def one() -> bool:
            active = self.single_active()
            if active is not None:
                found.append(active)
            return active is not None

        try:
            wait_until(one, what, timeout=30)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.logs()}") from None
        return found[-1]

    def table(self, index: int) -> tuple[int, int]:
        """The (stream, version) of node ``index``'s lock table, from ``S``."""
        host, _, port = self.addresses[index].rpartition(":")
        with socket.create_connection((host, int(port)), timeout=5) as stream:
            stream.sendall(b"S\n")
            reply = stream.makefile("rb").readline().decode()
        table = json.loads(reply.removeprefix("S "))["table"]
        return int(table["stream"]), int(table["version"])

    def wait_replicated(self, active: int, since: int) -> None:
        """Waits until the active's table version has grown past ``since``
        (its version before the grant to wait for: the version counts a grant
        once the replication core took it, not when it was granted), then
        until every running standby has applied the active's table up to that
        version: the grant has reached them."""
        target: list[tuple[int, int]] = []

        def grown() -> bool:
            stream, version = self.table(active)
            target.append((stream, version))
            return version > since

        wait_until(grown, f"node {active}'s table version to grow past {since}")
        stream, version = target[-1]
        for index, process in enumerate(self.processes):
            if index == active or process is None:
                continue

            def applied(index: int = index) -> bool:
                applied_stream, applied_version = self.table(index)
                return applied_stream == stream and applied_version >= version

            wait_until(applied, f"node {index} to apply stream {stream} up to version {version}")

    def kill(self, index: int) -> None:
        """SIGKILL of node ``index``, and waits for it to be gone."""
        process = self.processes[index]
        if process is not None:
            process.kill()
            process.wait()
            self.processes[index] = None

    def stop(self) -> None:
        for index in range(len(self.processes)):
            self.kill(index)
        self._dir.cleanup()


ALPHA_SECRET = "alpha-5e0c1b7a9d2f4836"
BETA_SECRET = "beta-8a4d2c6e1f0b9357"
"""Secrets of the two names of the authentication scenarios; made for these
tests only."""


class AuthFile:
    """An auth file in a temporary directory of its own, for ``--auth-file``:
    each name may lock the keys ``<name>/*``."""

    def __init__(self, names: dict[str, str]) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="ringlock-py-auth-")
        self.path = os.path.join(self._dir.name, "auth")
        self.write(names)

    def write(self, names: dict[str, str]) -> None:
        """Replaces the file with ``names`` (name to secret), in one rename so
        that a reload never reads half a file."""
        text = "".join(
            f"{name} {hashlib.sha256(secret.encode()).hexdigest()} {name}/*\n" for name, secret in names.items()
        )
        draft = self.path + ".draft"
        with open(draft, "w") as file:
            file.write(text)
        os.replace(draft, self.path)

    def cleanup(self) -> None:
        self._dir.cleanup()


class TestkitError(RuntimeError):
    pass


class Testkit:
    """``ringlock-testkit`` and a control connection to it."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [str(binary("ringlock-testkit", "RINGLOCK_TESTKIT_BIN"))],
            stdin=subprocess.PIPE,  # the kit ends when this closes
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()
        found = re.match(r"ringlock-testkit control (\S+)", line)
        if not found:
            self.stop()
            raise RuntimeError(f"ringlock-testkit did not start: {line!r}")
        host, _, port = found.group(1).rpartition(":")
        self.control_address = (host, int(port))
        self._control = Control(self.control_address)

    def __call__(self, *words: object) -> list[str]:
        """Runs one control command; its reply's fields after ``ok``."""
        return self._control.command(*words)

    def control(self) -> Control:
        """Another control connection, for a command that waits while this
        one is used."""
        return Control(self.control_address)

    def proxy(self, target: str) -> tuple[str, str]:
        """A new proxy to ``target``: its id and address."""
        ident, address = self("proxy", target)
        return ident, address

    def fake(self, active: str) -> tuple[str, str]:
        """A new fake standby naming ``active``: its id and address."""
        ident, address = self("fake", active)
        return ident, address

    def count(self, what: str, ident: str) -> int:
        return int(self(what, ident)[0])

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Control:
    """One control connection: a command line out, one reply line back."""

    def __init__(self, address: tuple[str, int]) -> None:
        self._sock = socket.create_connection(address)
        self._reader = self._sock.makefile("rb")
        self._lock = threading.Lock()

    def command(self, *words: object) -> list[str]:
        with self._lock:
            self._sock.sendall((" ".join(str(word) for word in words) + "\n").encode())
            reply = self._reader.readline().decode().rstrip("\n")
        if reply == "ok" or reply.startswith("ok "):
            return reply.split(" ")[1:]
        raise TestkitError(f"{' '.join(map(str, words))!r}: {reply!r}")

    def close(self) -> None:
        self._reader.close()
        self._sock.close()


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Polls ``condition`` (for states that no event announces) until it
    holds; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class RawConnection:
    """A plain protocol connection of its own, kept open: a holder that is
    not one of the clients under test."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self._stream = socket.create_connection((host, int(port)), timeout=20)
        self._replies = self._stream.makefile("rb")

    def call(self, line: str) -> str:
        """Sends ``line``; the reply line."""
        self._stream.sendall(line.encode() + b"\n")
        return self._replies.readline().decode().rstrip("\r\n")

    def close(self) -> None:
        self._replies.close()
        self._stream.close()


def raw_line(address: str, line: str) -> str:
    """One request on a connection of its own; the reply line."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=20) as stream:
        stream.sendall(line.encode() + b"\n")
        return stream.makefile("rb").readline().decode().rstrip("\r\n")


def cli_acquire(address: str, key: str) -> int:
    """Takes ``key`` with ``ringlock-cli acquire`` (a process of its own);
    the token it printed."""
    cli = binary("ringlock", "RINGLOCK_BIN").with_name("ringlock-cli")
    done = subprocess.run(
        [str(cli), "acquire", "--servers", address, "--lease", "30", key],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(re.findall(r"\d+", done.stdout)[-1])


def refusing_address() -> tuple[socket.socket, str]:
    """A loopback address that refuses connections while the returned socket
    stays open: bound but not listening, so that no other server takes the
    port meanwhile."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock, f"127.0.0.1:{sock.getsockname()[1]}"


class InspectStandby:
    """A loopback stand-in for a cluster standby that knows ``I``: it answers
    every ``I <key>`` with ``M I <key> <active>`` and ``P`` as a standby, and
    counts the redirects. (``ringlock-testkit``'s fakes redirect ``A``, ``R``
    and ``X`` only.)"""

    def __init__(self, active: str) -> None:
        self.active = active
        self.redirected = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                stream, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(stream,), daemon=True).start()

    def _serve(self, stream: socket.socket) -> None:
        with stream, stream.makefile("rb") as lines:
            for raw in lines:
                fields = raw.decode().rstrip("\r\n").split(" ")
                if fields[0] == "I" and len(fields) == 2:
                    self.redirected += 1
                    reply = f"M I {fields[1]} {self.active}\n"
                elif fields[0] == "P":
                    reply = f"P standby 0 {self.active}\n"
                else:
                    reply = "E - - bad-op\n"
                try:
                    stream.sendall(reply.encode())
                except OSError:
                    return

    def close(self) -> None:
        self._closed = True
        self._listener.close()


def assert_backoff_shape(reply: list[str]) -> None:
    """Checks the connection attempts an ``attempts`` reply lists (a count,
    then milliseconds since the proxy started) against the reconnect
    schedule of the connect-backoff scenario (a cap of 1 s): loose bounds,
    on purpose, that only a wrong schedule breaks (a fixed interval, or no
    pause at all); the host is shared and noisy."""
    times = [float(field) / 1000 for field in reply[1:]]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)][:8]
    assert len(gaps) == 8, reply
    assert gaps[0] < 0.5, f"the first retry goes at once: {gaps}"
    assert sum(gaps[5:]) / 3 > 2 * sum(gaps[:3]) / 3, f"the gaps grow: {gaps}"
    assert max(gaps[5:]) >= 0.3, f"they grow to the cap's order: {gaps}"
    assert max(gaps) <= 2.5, f"none beyond the cap: {gaps}"


def assert_no_connection(error: BaseException, address: str, elapsed: float, wait: float) -> None:
    """Checks the error of a call that found no usable connection through a
    refusing proxy for its whole wait."""
    import ringlock

    assert isinstance(error, ringlock.NoConnectionError), repr(error)
    assert isinstance(error, ConnectionError) and isinstance(error, ringlock.NoActiveNodeError)
    assert error.code == "no-connection"
    # Generous bounds: only failing at once, or hanging, breaks them.
    assert elapsed >= wait * 0.9, f"it waited for a connection within its wait: {elapsed}"
    assert elapsed < wait + 9, f"not a hang: {elapsed}"
    assert error.waited <= elapsed + 0.01
    assert error.addresses == [address]
    text = str(error)
    assert text.startswith("no usable connection after "), text
    assert text.endswith(f": {address} (closed by the server)"), text


def assert_refused_secret(error: BaseException, address: str, elapsed: float) -> None:
    """Checks the error of a call whose client's secret the server refused."""
    import ringlock

    assert isinstance(error, ringlock.AuthenticationError) and isinstance(error, ringlock.RinglockError), repr(error)
    assert error.code == "auth-failed" and error.address == address
    assert elapsed < 10, f"not a hang: {elapsed}"
    text = str(error)
    assert address in text and "auth-failed" in text, text
    assert ALPHA_SECRET not in text and "not-the-secret" not in text, text


class Certs:
    """A fresh set of test certificates, made by ``ringlock-testkit certs``
    in a temporary directory of its own (testkit/README.md lists the files)."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="ringlock-py-certs-")
        subprocess.run(
            [str(binary("ringlock-testkit", "RINGLOCK_TESTKIT_BIN")), "certs", self._dir.name],
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def path(self, name: str) -> str:
        """The path of one file of the set, such as ``ca.pem``."""
        return os.path.join(self._dir.name, name)

    def server_args(self, certificate: str = "server") -> list[str]:
        """The server flags for TLS with ``<certificate>.pem`` and its key."""
        return ["--tls-cert", self.path(f"{certificate}.pem"), "--tls-key", self.path(f"{certificate}-key.pem")]

    def cleanup(self) -> None:
        self._dir.cleanup()


class Recorder:
    """A loopback forwarder to ``target`` that keeps, per connection, the
    bytes a client sent through it: to check what crossed the wire."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.sent: list[bytearray] = []
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            record = bytearray()
            with self._lock:
                self.sent.append(record)
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, record), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, None), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, record: bytearray | None) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            with self._lock:
                if record is not None:
                    record += data
            try:
                sink.sendall(data)
            except OSError:
                break
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def connections(self) -> list[bytes]:
        """What each connection's client sent so far, in accept order."""
        with self._lock:
            return [bytes(record) for record in self.sent]

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()


def assert_sent_only_tls(recorder: Recorder, key: str) -> None:
    """Checks that every connection through ``recorder`` carried TLS
    records only, from the first byte, and never ``key`` in clear."""
    connections = recorder.connections()
    assert connections, "the client connected"
    for sent in connections:
        if sent:
            # 0x16: a TLS handshake record (the ClientHello).
            assert sent[0] == 0x16, f"a connection began with {sent[:20]!r}, not a TLS record"
        assert key.encode() not in sent, "a request went out in clear"


def assert_tls_failure(error: BaseException, address: str, elapsed: float, words: str) -> None:
    """Checks the error of a call whose connections all failed in TLS:
    a ``TLSError`` (so a ``ConnectionError``) naming ``address`` and saying
    ``words`` (from the ``ssl`` module's reason)."""
    import ringlock

    assert isinstance(error, ringlock.TLSError), repr(error)
    assert isinstance(error, ringlock.NoConnectionError) and isinstance(error, ConnectionError)
    assert error.code == "tls-failed"
    assert elapsed < 10, f"not a hang: {elapsed}"
    assert error.address == address and error.addresses == [address]
    assert words in error.reason, error.reason
    text = str(error)
    assert text.startswith("TLS failed after "), text
    assert address in text and words in text, text
