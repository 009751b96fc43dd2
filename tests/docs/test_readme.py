"""README.md's examples work as written: every Python block runs against a private server.

The blocks are read out of README.md itself (``tests/docs/readme.py`` says how, and
what the hidden ``readme-test`` notes before some blocks do), so an example that stops
working fails here. Each ``##`` or ``###`` section runs in a fresh working directory, with
``FAIRLANE_REDIS_URL`` naming the session's private server, as a reader's shell would
with that variable set; the apps it made have their keys deleted afterwards.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from fairlane import load_config, load_lanes
from fairlane.config.settings import explain_settings
from fairlane.store.connection import create_sync_client
from tests.docs.readme import Block, Section, run_section, sections, statements

pytestmark = [pytest.mark.anyio, pytest.mark.embedded_only]

SECTIONS = sections()
RUNNABLE = [section for section in SECTIONS if section.python]


def _delete_app_keys(redis_url: str, names: set[str]) -> None:
    client = create_sync_client(redis_url, socket_timeout=10, socket_connect_timeout=10)
    try:
        for name in names:
            for pattern in (f"*{{fl:{name}}}*", f"*{{fl:{name}:*"):
                keys = list(client.scan_iter(match=pattern, count=500))
                if keys:
                    client.delete(*keys)
    finally:
        client.close()


def test_the_readme_blocks_are_read_and_parse() -> None:
    blocks = [block for section in SECTIONS for block in section.blocks]
    python = [block for block in blocks if block.lang == "python"]
    # the sections with Python examples: a block lost to a parsing slip would shrink this
    assert len(RUNNABLE) >= 7, [section.title for section in RUNNABLE]
    assert len(python) >= 7
    for block in python:
        statements(block.code, block.line)  # a SyntaxError names the README's line
    for block in blocks:
        if block.lang == "toml":
            try:
                tomllib.loads(block.code)
            except tomllib.TOMLDecodeError as exc:
                raise AssertionError(f"README.md:{block.line}: {exc}") from exc
    noted = {name for block in blocks for name in block.files}
    assert "pools.toml" in noted  # the admission example's pools file
    # the settings file is read by every app started beside it: no example may write it
    assert "fairlane.toml" not in noted


FILES = [block for section in SECTIONS for block in section.blocks if block.files]


def _leaves(table: Mapping[str, Any], prefix: str) -> Iterator[str]:
    for key, value in table.items():
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield prefix + key


def _load(block: Block, directory: Path) -> object:
    """What Fairlane reads of a README file example, by the file's name."""
    (name,) = block.files
    (directory / name).write_text(block.code, encoding="utf-8")
    if name == "pools.toml":
        return load_config(directory / name).pools
    if name == "lanes.toml":
        return load_lanes(directory / name)
    if name == "pyproject.toml":
        # every setting the example sets is a setting, read from that file
        given = set(_leaves(tomllib.loads(block.code)["tool"]["fairlane"], ""))
        origins = explain_settings(project_dir=directory, environ={})
        read = {row.key for row in origins if row.source == "pyproject.toml [tool.fairlane]"}
        assert given <= read, given - read
        return read
    raise AssertionError(f"README.md:{block.line}: no reader for {name!r} in this test")


@pytest.mark.parametrize("block", FILES, ids=[f"{b.files[0]}:{b.line}" for b in FILES])
def test_readme_file_example_is_read_by_fairlane(block: Block, tmp_path: Path) -> None:
    """A TOML example the README names a file for is one Fairlane reads, with no error."""
    assert _load(block, tmp_path)


@pytest.mark.parametrize("section", RUNNABLE, ids=[section.title for section in RUNNABLE])
async def test_readme_section_runs(
    section: Section, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAIRLANE_REDIS_URL", redis_url)
    for block in section.blocks:
        for name in block.files:
            (tmp_path / name).write_text(block.code, encoding="utf-8")
    names: set[str] = {"agents"}
    try:
        names |= await run_section(section)
    finally:
        _delete_app_keys(redis_url, names)
