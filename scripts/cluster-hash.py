#!/usr/bin/env python3
"""The reference of how a client that is given several clusters picks the
cluster of a key (docs/protocol.md, "Several clusters"), and the maker of
the test vectors every client checks itself against
(clients/cluster-hash-vectors.json).

    score(name, key) = fmix64(fnv1a64(name ++ [0xFF] ++ key))

fnv1a64 is 64-bit FNV-1a (offset basis 0xcbf29ce484222325, prime
0x100000001b3) over the bytes of the cluster's name (UTF-8), one byte
0xFF, then the key's bytes; fmix64 is MurmurHash3's 64-bit finalizer. The
key goes to the cluster with the highest score (compared as unsigned 64-bit
numbers); on a tie, the cluster
whose name is first in byte order.

Usage: scripts/cluster-hash.py            # writes clients/cluster-hash-vectors.json
       scripts/cluster-hash.py --check    # checks the spread of 20,000 keys over 3, then 4 clusters
       scripts/cluster-hash.py NAME... -- KEY   # prints each score and the choice
"""
import json
import os
import sys

MASK = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & MASK
    return value


def fmix64(value: int) -> int:
    value ^= value >> 33
    value = (value * 0xFF51AFD7ED558CCD) & MASK
    value ^= value >> 33
    value = (value * 0xC4CEB9FE1A85EC53) & MASK
    value ^= value >> 33
    return value


def score(name: str, key: bytes) -> int:
    return fmix64(fnv1a64(name.encode() + b"\xff" + key))


def choose(names: list[str], key: bytes) -> str:
    return max(sorted(names, key=str.encode), key=lambda name: score(name, key))


def vectors() -> dict:
    sets = [["only"], ["a", "b"], ["east", "west", "north"], ["c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8"]]
    keys = [b"", b"k", b"invoice-42", b"orders/2026/12/06", b"\xff\xfe\x80", "ключ".encode(), b"x" * 250]
    cases = []
    for names in sets:
        for key in keys:
            cases.append({
                "clusters": names,
                "key_hex": key.hex(),
                "scores_hex": [f"{score(name, key):016x}" for name in names],
                "chosen": choose(names, key),
            })
    return {
        "about": "Test vectors of the cluster choice of docs/protocol.md section 4 (Several clusters): "
        "score(name, key) = fmix64(fnv1a64(name ++ 0xFF ++ key)), the highest score wins, a tie goes to the "
        "name first in byte order (scores compared as unsigned 64-bit numbers). A client that takes several clusters "
        "checks its choice and scores against these. "
        "Made by scripts/cluster-hash.py; do not edit by hand.",
        "vectors": cases,
    }


def check_spread() -> None:
    """Adding a fourth cluster to three moves about a quarter of the keys,
    each to the new cluster, and the four get about as many keys each."""
    keys = [f"key-{index}".encode() for index in range(20_000)]
    three, four = ["c1", "c2", "c3"], ["c1", "c2", "c3", "c4"]
    moved = [key for key in keys if choose(three, key) != choose(four, key)]
    assert all(choose(four, key) == "c4" for key in moved), "a key moved between old clusters"
    assert 0.22 < len(moved) / len(keys) < 0.28, len(moved)
    for name in four:
        share = sum(1 for key in keys if choose(four, key) == name) / len(keys)
        assert 0.23 < share < 0.27, (name, share)
    print(f"spread: {len(moved)} of {len(keys)} keys moved, all to the new cluster")


def main() -> None:
    if sys.argv[1:] == ["--check"]:
        check_spread()
        return
    if "--" in sys.argv:
        at = sys.argv.index("--")
        names, key = sys.argv[1:at], sys.argv[at + 1].encode()
        for name in names:
            print(f"{name}: {score(name, key):016x}")
        print("chosen:", choose(names, key))
        return
    path = os.path.join(os.path.dirname(__file__), "..", "clients", "cluster-hash-vectors.json")
    with open(path, "w") as out:
        json.dump(vectors(), out, indent=1)
        out.write("\n")


if __name__ == "__main__":
    main()
