"""The import graph of ``src/fairlane``: no module reaches itself through its imports.

The floors' direction is ``lint-imports``' contract (``pyproject.toml``, run by the test
command); a cycle can also hide inside one floor, where the layers contract does not
look, so this test walks the whole graph. The graph is grimp's, which import-linter is
built on: every import counts, those under ``TYPE_CHECKING`` and inside functions too.
The cycle finder is the house report's (``scripts/house_report.py``), so the test and
the report cannot disagree.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import grimp


def _house_report() -> ModuleType:
    """``scripts/house_report.py``, whose cycle finder this test and the report share."""
    path = Path(__file__).resolve().parents[2] / "scripts" / "house_report.py"
    spec = importlib.util.spec_from_file_location("house_report", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_strongly_connected = _house_report().strongly_connected


def _graph() -> dict[str, set[str]]:
    graph = grimp.build_graph("fairlane", include_external_packages=False, cache_dir=None)
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def test_the_finder_sees_a_cycle_and_a_clean_graph() -> None:
    assert _strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ["a", "b", "c"]
    ]
    assert _strongly_connected({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_no_module_of_fairlane_imports_itself_through_others() -> None:
    cycles = _strongly_connected(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)
