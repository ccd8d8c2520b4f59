"""The README's examples: every ```python block of ``clients/python/README.md``
runs, as a program of its own, against a real server, with the address the
examples use (127.0.0.1:7700) replaced by the server's. A block fails its
test if it raises (or prints a traceback, say from a callback on a client
thread) or runs for over a minute.

A block that cannot run alone is skipped only if the README marks it, with
``<!-- not run: reason -->`` as the last non-blank line before its fence;
keep such marks rare, and rather make the example runnable.

A block marked ``<!-- run with: tls-auth -->`` runs against a server with
TLS, mutual TLS and an auth file instead: its working directory holds
``ca.pem``, ``client.pem`` and ``client-key.pem`` from ``ringlock-testkit
certs``, and ``RINGLOCK_SECRET`` is the secret of the name ``alpha``, who
may lock ``alpha/*``. A block marked ``<!-- run with: two-clusters -->``
runs against two servers, a cluster each: the second one's address
replaces 127.0.0.1:7701."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness import ALPHA_SECRET, AuthFile, Certs, Server

README = Path(__file__).resolve().parents[1] / "README.md"
EXAMPLE_ADDRESS = "127.0.0.1:7700"
"""The address the examples connect to."""
NOT_RUN = re.compile(r"^<!--\s*not run\s*:\s*(.*?)\s*-->$")
RUN_WITH = re.compile(r"^<!--\s*run with\s*:\s*(tls-auth|two-clusters)\s*-->$")
SECOND_ADDRESS = "127.0.0.1:7701"
"""The address of the second cluster in ``two-clusters`` examples."""
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([^`\s]*)")
PYTHON = {"python", "python3", "py"}
TIMEOUT = 60.0


@dataclass(frozen=True)
class Block:
    line: int
    """The line of its opening fence (from 1)."""
    code: str
    not_run: str | None
    """The reason of its ``<!-- not run: ... -->`` mark, ``None`` if unmarked."""
    run_with: str | None = None
    """The server of its ``<!-- run with: ... -->`` mark, ``None`` for a plain one."""


def python_blocks(text: str) -> tuple[list[Block], list[int]]:
    """The Python blocks of a Markdown text, and the lines of the
    ``not run`` marks that precede no Python block."""
    lines = text.splitlines()
    blocks: list[Block] = []
    marks: dict[int, str] = {}  # line index -> reason
    servers: dict[int, str] = {}  # line index -> server kind
    previous: int | None = None  # index of the last non-blank line outside blocks
    index = 0
    while index < len(lines):
        stripped = lines[index].strip()
        fence = FENCE.match(stripped)
        if fence is None:
            mark = NOT_RUN.match(stripped)
            if mark is not None:
                marks[index] = mark.group(1)
            server = RUN_WITH.match(stripped)
            if server is not None:
                servers[index] = server.group(1)
            if stripped:
                previous = index
            index += 1
            continue
        marker, info = fence.groups()
        opening = index
        index += 1
        body: list[str] = []
        # A closing fence: the same character, at least as many, nothing else.
        while index < len(lines):
            closing = lines[index].strip()
            if closing.startswith(marker) and not closing.strip(marker[0]):
                break
            body.append(lines[index])
            index += 1
        index += 1
        if info.lower() in PYTHON:
            reason = marks.pop(previous) if previous is not None and previous in marks else None
            server = servers.pop(previous) if previous is not None and previous in servers else None
            blocks.append(Block(opening + 1, textwrap.dedent("\n".join(body)) + "\n", reason, server))
        previous = opening
    return blocks, [line + 1 for line in sorted(marks | servers)]


BLOCKS, STRAY_MARKS = python_blocks(README.read_text(encoding="utf-8"))


def program(block: Block, address: str, second: str | None = None) -> str:
    """The block as a program for the server at ``address`` (and the second
    one at ``second``): an ``async def main`` that the block does not run
    itself is run with ``asyncio.run``."""
    code = block.code.replace(EXAMPLE_ADDRESS, address)
    if second is not None:
        code = code.replace(SECOND_ADDRESS, second)
    defines_main = re.search(r"^async def main\(", code, re.MULTILINE)
    calls_main = re.search(r"(?<!def )\bmain\(", code)
    if defines_main and not calls_main:
        code += "\nimport asyncio\n\nasyncio.run(main())\n"
    return code


def test_the_readme_has_python_examples() -> None:
    assert len(BLOCKS) >= 3, f"found {len(BLOCKS)} ```python blocks in {README}"


def test_not_run_marks_are_rare_and_explained() -> None:
    assert not STRAY_MARKS, f"`not run` marks on lines {STRAY_MARKS} of {README} precede no ```python block"
    unexplained = [block.line for block in BLOCKS if block.not_run == ""]
    assert not unexplained, f"`not run` marks without a reason before the blocks on lines {unexplained}"
    skipped = [block.line for block in BLOCKS if block.not_run is not None]
    assert len(skipped) * 2 < len(BLOCKS), f"most examples are not run: {skipped}"


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(
            block,
            id=f"line-{block.line}",
            marks=[pytest.mark.skip(reason=f"README: not run: {block.not_run}")] if block.not_run is not None else [],
        )
        for block in BLOCKS
    ],
)
def test_readme_example_runs(block: Block, tmp_path: Path) -> None:
    environment = dict(os.environ)
    environment.pop("RINGLOCK_SECRET", None)
    cleanups = []
    second: Server | None = None
    if block.run_with == "two-clusters":
        second = Server()
        cleanups.append(second.stop)
    if block.run_with == "tls-auth":
        certs = Certs()
        auth = AuthFile({"alpha": ALPHA_SECRET})
        cleanups += [certs.cleanup, auth.cleanup]
        for name in ("ca.pem", "client.pem", "client-key.pem"):
            shutil.copy(certs.path(name), tmp_path / name)
        server = Server(*certs.server_args(), "--tls-client-ca", certs.path("ca.pem"), "--auth-file", auth.path)
        environment["RINGLOCK_SECRET"] = ALPHA_SECRET
    else:
        server = Server()
    try:
        run_block(block, server, tmp_path, environment, None if second is None else second.address)
    finally:
        server.stop()
        for cleanup in cleanups:
            cleanup()


def run_block(
    block: Block, fresh_server: Server, tmp_path: Path, environment: dict[str, str], second: str | None = None
) -> None:
    if "Client(" in block.code:
        assert EXAMPLE_ADDRESS in block.code, (
            f"the block on line {block.line} makes a client but not for {EXAMPLE_ADDRESS}, the address"
            " this test replaces with its server's (or mark it `<!-- not run: reason -->`)"
        )
    source = tmp_path / f"readme_line_{block.line}.py"
    source.write_text(program(block, fresh_server.address, second), encoding="utf-8")
    try:
        ran = subprocess.run(
            [sys.executable, str(source)],
            check=False,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            env=environment,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired as expired:
        stderr = expired.stderr.decode(errors="replace") if isinstance(expired.stderr, bytes) else expired.stderr
        pytest.fail(f"the block on line {block.line} of {README} ran for over {TIMEOUT:.0f} s:\nstderr:\n{stderr}")
    report = f"the block on line {block.line} of {README}:\nstdout:\n{ran.stdout}\nstderr:\n{ran.stderr}"
    if ran.returncode != 0:
        pytest.fail(f"exit status {ran.returncode}, {report}")
    if "Traceback" in ran.stderr:
        pytest.fail(f"a traceback, {report}")
