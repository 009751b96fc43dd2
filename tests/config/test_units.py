"""Unit tests of ``fairlane.config.units``: sizes as people write them, read as bytes.

Pure: no server.
"""

from __future__ import annotations

import ast
import inspect

import pytest

from fairlane.config import units
from fairlane.config.units import parse_size

MiB = 1 << 20


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("2147483648", 2 << 30),
        (" 4096 ", 4096),
        ("10b", 10),
        ("512MiB", 512 * MiB),
        ("512m", 512 * MiB),  # Docker's one-letter units are binary
        ("1.5g", 3 << 29),
        ("2 GiB", 2 << 30),
        ("2GB", 2 * 10**9),
        ("3kb", 3000),
        ("1T", 1 << 40),
    ],
)
def test_sizes_in_the_usual_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "lots", "-1", "0", "0.0001b", "5 parsecs", "MiB", "1.2.3m"])
def test_what_is_not_a_size(bad: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


def test_the_units_module_imports_nothing_of_the_project() -> None:
    tree = ast.parse(inspect.getsource(units))
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported if name.startswith("fairlane")}
