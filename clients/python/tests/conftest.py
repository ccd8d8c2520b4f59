"""Fixtures: a real server for the session, the test kit, and fresh servers
for tests that need one to themselves."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator

import pytest

from harness import SCENARIOS, Server, Testkit


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
