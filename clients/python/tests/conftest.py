"""Fixtures: a real server for the session, the test kit, and fresh servers
for tests that need one to themselves."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from harness import ALPHA_SECRET, BETA_SECRET, SCENARIOS, AuthFile, Certs, Cluster, Server, Testkit

_Test = TypeVar("_Test", bound=Callable[..., object])


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    started = Server()
    yield started
    started.stop()


@pytest.fixture
def fresh_server() -> Iterator[Server]:
    started = Server()
    yield started
    started.stop()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """Three nodes of a cluster of their own; every node is killed after the test."""
    started = Cluster(3)
    yield started
    started.stop()


@pytest.fixture
def auth_server() -> Iterator[tuple[Server, AuthFile]]:
    """A server of its own with an auth file: ``alpha`` may lock ``alpha/*``,
    ``beta`` ``beta/*``."""
    auth = AuthFile({"alpha": ALPHA_SECRET, "beta": BETA_SECRET})
    started = Server("--auth-file", auth.path)
    yield started, auth
    started.stop()
    auth.cleanup()


@pytest.fixture(scope="session")
def certs() -> Iterator[Certs]:
    """Test certificates made by ``ringlock-testkit certs`` for the session."""
    made = Certs()
    yield made
    made.cleanup()


@pytest.fixture(scope="session")
def tls_server(certs: Certs) -> Iterator[Server]:
    """A server whose client port speaks TLS, with the certificate for
    127.0.0.1 and localhost."""
    started = Server(*certs.server_args())
    yield started
    started.stop()


@pytest.fixture
def mtls_server(certs: Certs) -> Iterator[Server]:
    """A server of its own that requires client certificates of the test CA."""
    started = Server(*certs.server_args(), "--tls-client-ca", certs.path("ca.pem"))
    yield started
    started.stop()


@pytest.fixture(scope="session")
def testkit_process() -> Iterator[Testkit]:
    kit = Testkit()
    yield kit
    kit.stop()


@pytest.fixture
def kit(testkit_process: Testkit) -> Iterator[Testkit]:
    """The test kit; every proxy and fake a test made is closed after it."""
    made: list[str] = []
    original_proxy = testkit_process.proxy
    original_fake = testkit_process.fake

    def proxy(target: str) -> tuple[str, str]:
        ident, address = original_proxy(target)
        made.append(ident)
        return ident, address

    def fake(active: str) -> tuple[str, str]:
        ident, address = original_fake(active)
        made.append(ident)
        return ident, address

    testkit_process.proxy = proxy  # type: ignore[method-assign]
    testkit_process.fake = fake  # type: ignore[method-assign]
    try:
        yield testkit_process
    finally:
        testkit_process.proxy = original_proxy  # type: ignore[method-assign]
        testkit_process.fake = original_fake  # type: ignore[method-assign]
        for ident in made:
            testkit_process("close", ident)


@pytest.fixture
def key() -> Callable[[str], str]:
    """Keys no other test uses, so that tests can share one server."""
    prefix = uuid.uuid4().hex[:12]
    return lambda name="k": f"{name}-{prefix}"


def scenario_ids() -> list[str]:
    with open(SCENARIOS) as file:
        return [scenario["id"] for scenario in json.load(file)["scenarios"]]


class Scenarios:
    """The tests of one client for the shared scenario list: ``@scenarios(id)``
    marks a test as the one for ``id``, and :meth:`check_complete` fails if
    an id of the list has no test, or a test names an id not in it."""

    def __init__(self, client: str) -> None:
        self.client = client
        self.tests: dict[str, Callable[..., object]] = {}

    def __call__(self, ident: str) -> Callable[[_Test], _Test]:
        def register(test: _Test) -> _Test:
            assert ident not in self.tests, f"two tests for {ident}"
            self.tests[ident] = test
            return test

        return register

    def check_complete(self) -> None:
        ids = scenario_ids()
        assert ids, "the scenario list is empty"
        missing = sorted(set(ids) - set(self.tests))
        unknown = sorted(set(self.tests) - set(ids))
        assert not missing, f"scenarios without a {self.client} test: {missing}"
        assert not unknown, f"{self.client} tests for scenarios not in the list: {unknown}"
