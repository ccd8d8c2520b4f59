"""clients/README.md's tables: the defaults the Python client has, and the
wait forms it names."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import ringlock
import ringlock.aio
from ringlock import _common

README = Path(__file__).resolve().parents[2] / "README.md"


def section_rows(title: str) -> list[list[str]]:
    """The rows (cells stripped) of the first table under ``## title``."""
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    rows = [line for line in text[start:end].splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def parse_default(text: str) -> float:
    """``50 ms``, ``3 s``, ``16`` or ``lease / 3`` (a share of the lease)."""
    if match := re.fullmatch(r"(\d+) (ms|s)", text):
        return int(match[1]) / (1000 if match[2] == "ms" else 1)
    if match := re.fullmatch(r"lease / (\d+)", text):
        return 1 / int(match[1])
    return float(int(text))


def test_the_defaults_table_matches_the_client() -> None:
    defaults = {row[0]: parse_default(row[1]) for row in section_rows("Defaults")}
    for client in (ringlock.Client, ringlock.aio.Client):
        keywords = inspect.signature(client.__init__).parameters
        ours = {
            setting: float(keywords[row[3].strip("`")].default)
            for setting, row in ((row[0], row) for row in section_rows("Defaults"))
            if row[3].strip("`") in keywords
        }
        assert len(ours) == 10, f"every keyword named in the table exists: {ours}"
        for setting, value in ours.items():
            assert value == defaults[setting], f"{client.__qualname__} {setting}: {value}, table {defaults[setting]}"
    assert defaults["try-once wait"] == _common._TRY_WAIT_MS / 1000
    assert defaults["auto-extend period"] == _common.AUTO_EXTEND_FRACTION


def test_the_wait_forms_table_names_the_python_forms() -> None:
    rows = {row[0].split(":")[0]: row[2] for row in section_rows("Wait forms and calls")}
    assert "ringlock.NO_LIMIT" in rows["no limit"] and ringlock.NO_LIMIT is None
    assert "ringlock.TRY_ONCE" in rows["try once"] and ringlock.TRY_ONCE == 0
