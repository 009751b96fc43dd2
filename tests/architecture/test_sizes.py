"""The sizes of ``src/fairlane``: modules, classes and function bodies within their limits.

Sizes are code lines: docstrings, comments and blank lines do not count, so that a proof
kept beside its code costs nothing, and a module, a class or a function that does several
things shows. The counter is ``scripts/sizes.py``'s, which also prints the table of the
largest, so that the test and the table cannot disagree.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _sizes() -> ModuleType:
    """``scripts/sizes.py``, whose counter this test and the size table share."""
    path = ROOT / "scripts" / "sizes.py"
    spec = importlib.util.spec_from_file_location("fairlane_sizes", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses looks its module up by name while it builds the class
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


sizes = _sizes()

SAMPLE = '''"""A module docstring
over two lines."""

# a comment
import os


class Box:
    """A class docstring."""

    size = 1  # a trailing comment counts as the code it follows

    def area(self) -> str:
        """A method docstring."""

        text = """a string that is not a docstring
        spans three lines
        and counts on each"""
        return text + os.sep
'''


def test_the_counter_leaves_out_docstrings_comments_and_blank_lines() -> None:
    assert sorted(sizes.code_lines(SAMPLE)) == [5, 8, 11, 13, 16, 17, 18, 19]
    measured = {(s.kind, s.name): s.lines for s in sizes.measure_source(SAMPLE, "m.py")}
    assert measured == {
        ("module", "m.py"): 8,
        ("class", "m.py:Box"): 7,
        ("function", "m.py:Box.area"): 4,
    }


def test_a_nested_function_counts_in_its_holder_and_on_its_own() -> None:
    source = (
        "def outer():\n    if True:\n        def inner():\n            return 1\n    return 2\n"
    )
    measured = {(s.kind, s.name): s.lines for s in sizes.measure_source(source, "m.py")}
    assert measured[("function", "m.py:outer")] == 4
    assert measured[("function", "m.py:outer.inner")] == 1


def test_an_offender_is_named_with_its_count_and_its_limit() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(61))
    [offender] = sizes.offenders(sizes.measure_source(f"def f():\n{body}", "m.py"))
    assert str(offender) == "function m.py:f: 61 code lines (limit 60)"


def test_no_module_class_or_function_of_fairlane_passes_its_limit() -> None:
    found = sizes.offenders(sizes.measure_tree(ROOT / "src" / "fairlane"))
    limits = ", ".join(f"{kind} {limit}" for kind, limit in sizes.LIMITS.items())
    assert not found, f"over the size limits ({limits} code lines):\n" + "\n".join(
        f"  {s}" for s in found
    )
