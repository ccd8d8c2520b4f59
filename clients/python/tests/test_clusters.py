"""Several clusters (docs/protocol.md §4, "Several clusters"): the choice of
a key's cluster against the shared vectors, and ``Clusters`` of both fronts
against two real single-node servers, one cluster each, with the drain
procedure."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import ringlock
import ringlock.aio
from harness import ROOT, Server, raw_line, wait_until
from ringlock._clusters import score

VECTORS = ROOT / "clients" / "cluster-hash-vectors.json"


def vectors() -> list[dict[str, Any]]:
    with open(VECTORS) as file:
        cases: list[dict[str, Any]] = json.load(file)["vectors"]
    return cases


def test_every_vector_gives_its_scores_and_its_cluster() -> None:
    cases = vectors()
    assert len(cases) >= 28, "the vectors file lost vectors"
    for case in cases:
        names, key = case["clusters"], bytes.fromhex(case["key_hex"])
        scores = [f"{score(name, key):016x}" for name in names]
        assert scores == case["scores_hex"], case
        assert ringlock.cluster_for(names, key) == case["chosen"], case
        assert ringlock.aio.cluster_for(list(reversed(names)), key) == case["chosen"], "the order given does not matter"
        text = key.decode(errors="ignore")
        if text.encode() == key:
            assert ringlock.cluster_for(names, text) == case["chosen"], "a str key is its UTF-8 bytes"


def test_a_tie_goes_to_the_name_first_in_byte_order(monkeypatch: pytest.MonkeyPatch) -> None:
    import ringlock._clusters as clusters

    monkeypatch.setattr(clusters, "_fmix64", lambda value: 7)
    assert ringlock.cluster_for(["b", "é", "a", "Z"], "k") == "Z"
    assert ringlock.cluster_for(["é", "b"], "k") == "b", "UTF-8 bytes, 0xC3 after b"


def test_adding_a_cluster_moves_only_the_keys_it_wins() -> None:
    keys = [f"key-{index}" for index in range(3000)]
    three, four = ["c1", "c2", "c3"], ["c1", "c2", "c3", "c4"]
    moved = [key for key in keys if ringlock.cluster_for(three, key) != ringlock.cluster_for(four, key)]
    assert all(ringlock.cluster_for(four, key) == "c4" for key in moved)
    assert 0.2 < len(moved) / len(keys) < 0.3, len(moved)


def test_bad_names_and_keys_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match="at least one cluster"):
        ringlock.cluster_for([], "k")
    with pytest.raises(ValueError, match="must not be empty"):
        ringlock.cluster_for(["a", ""], "k")
    with pytest.raises(ValueError, match="given twice"):
        ringlock.cluster_for(["a", "b", "a"], "k")
    with pytest.raises(ValueError, match="valid UTF-8"):
        ringlock.cluster_for(["a", "\udc80"], "k")
    with pytest.raises(TypeError, match="a cluster name is a str"):
        ringlock.cluster_for(["a", b"b"], "k")  # type: ignore[list-item]
    with pytest.raises(TypeError, match="list of str"):
        ringlock.cluster_for("ab", "k")
    with pytest.raises(TypeError, match="str or bytes"):
        ringlock.cluster_for(["a"], 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one cluster"):
        ringlock.Clusters({})
    with pytest.raises(TypeError, match="mapping"):
        ringlock.Clusters([("a", None)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a ringlock.Client"):
        ringlock.Clusters({"a": ringlock.aio.Client("127.0.0.1:7700")})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="not a ringlock.aio.Client"):
        ringlock.aio.Clusters({"a": object()})  # type: ignore[dict-item]


@pytest.fixture
def two_servers() -> Iterator[dict[str, Server]]:
    """Two single-node clusters, ``a`` and ``b``, each a server of its own."""
    servers: dict[str, Server] = {}
    try:
        for name in ("a", "b"):
            servers[name] = Server()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def keys_of(names: list[str], count: int) -> dict[str, list[str]]:
    """``count`` fresh keys that go to each cluster."""
    prefix = uuid.uuid4().hex[:12]
    chosen: dict[str, list[str]] = {name: [] for name in names}
    index = 0
    while any(len(keys) < count for keys in chosen.values()):
        key = f"{prefix}/{index}"
        keys = chosen[ringlock.cluster_for(names, key)]
        if len(keys) < count:
            keys.append(key)
        index += 1
    return chosen


def holder(server: Server, key: str) -> int | None:
    """The token holding ``key`` on ``server``, asked on a connection of its own."""
    reply = raw_line(server.address, f"I {key}").split(" ")
    assert reply[:2] == ["I", key], reply
    return None if reply[2] == "-" else int(reply[2])


def held_keys(server: Server) -> int:
    reply = raw_line(server.address, "S")
    assert reply.startswith("S "), reply
    return int(json.loads(reply[2:])["total"]["held_keys"])


def test_sync_keys_go_to_the_cluster_the_hash_names_and_a_drained_cluster_can_be_taken_out(
    two_servers: dict[str, Server],
) -> None:
    names = ["a", "b"]
    keys = keys_of(names, 3)
    clients = {name: ringlock.Client(server.address) for name, server in two_servers.items()}
    with ringlock.Clusters(clients) as clusters:
        assert clusters.names == names and clusters.clients == clients
        locks: dict[str, list[ringlock.Lock]] = {name: [] for name in names}
        for name in names:
            for key in keys[name]:
                assert clusters.name_for(key) == name and clusters.client_for(key) is clients[name]
                lock = clusters.lock(key, lease=30)
                assert lock.acquire(timeout=5)
                locks[name].append(lock)
                other = "b" if name == "a" else "a"
                assert holder(two_servers[name], key) == lock.token, "held on the cluster the hash names"
                assert holder(two_servers[other], key) is None, "and not on the other"
                assert clusters.inspect(key).token == lock.token
        for name in names:
            wait_until(lambda name=name: held_keys(two_servers[name]) == 3, f"3 keys held on {name}")  # type: ignore[misc]
        assert {name: stats["total"]["held_keys"] for name, stats in clusters.stats().items()} == {"a": 3, "b": 3}

        # Drain b: its holders release (through b's client, which their
        # locks belong to) until its S shows no held key.
        for lock in locks["b"]:
            assert lock.extend(30) is None and lock.held()
            assert lock.release() is True
        wait_until(lambda: held_keys(two_servers["b"]) == 0, "b drained")
        assert held_keys(two_servers["a"]) == 3, "a kept its holders"

        # Without b, b's keys go to a.
        with ringlock.Clusters({"a": ringlock.Client(two_servers["a"].address)}) as without_b:
            for key in keys["b"]:
                assert without_b.name_for(key) == "a"
                with without_b.lock(key, lease=30, wait=5) as lock:
                    assert holder(two_servers["a"], key) == lock.token
                    assert holder(two_servers["b"], key) is None
            for key in keys["a"]:
                assert without_b.name_for(key) == "a", "a's keys stay where they were"
        for lock in locks["a"]:
            assert lock.release() is True
    with pytest.raises(ringlock.NoConnectionError, match="closed"):
        clients["b"].ping()


async def test_aio_keys_go_to_the_cluster_the_hash_names_and_a_drained_cluster_can_be_taken_out(
    two_servers: dict[str, Server],
) -> None:
    names = ["a", "b"]
    keys = keys_of(names, 2)
    clients = {name: ringlock.aio.Client(server.address) for name, server in two_servers.items()}
    async with ringlock.aio.Clusters(clients) as clusters:
        locks: dict[str, list[ringlock.aio.Lock]] = {name: [] for name in names}
        for name in names:
            for key in keys[name]:
                assert clusters.client_for(key) is clients[name]
                lock = clusters.lock(key, lease=30)
                assert await lock.acquire(timeout=5)
                locks[name].append(lock)
                other = "b" if name == "a" else "a"
                assert await asyncio.to_thread(holder, two_servers[name], key) == lock.token
                assert await asyncio.to_thread(holder, two_servers[other], key) is None
                assert (await clusters.inspect(key)).token == lock.token

        async def held() -> dict[str, int]:
            return {name: stats["total"]["held_keys"] for name, stats in (await clusters.stats()).items()}

        while await held() != {"a": 2, "b": 2}:
            await asyncio.sleep(0.01)
        for lock in locks["b"]:
            await lock.extend(30)
            assert await lock.release() is True
        while (await held())["b"] != 0:
            await asyncio.sleep(0.01)
        async with ringlock.aio.Clusters({"a": ringlock.aio.Client(two_servers["a"].address)}) as without_b:
            for key in keys["b"]:
                async with without_b.lock(key, lease=30, wait=5) as lock:
                    assert await asyncio.to_thread(holder, two_servers["a"], key) == lock.token
        for lock in locks["a"]:
            assert await lock.release() is True
    with pytest.raises(ringlock.NoConnectionError):
        await clients["a"].ping()
