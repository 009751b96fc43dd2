"""The import graph of ``src/fairlane``: no module reaches itself through its imports.

The floors' direction is ``lint-imports``' contract (``pyproject.toml``, run by the test
command); a cycle can also hide inside one floor, where the layers contract does not
look, so this test walks the whole graph. The graph is grimp's, which import-linter is
built on: every import counts, those under ``TYPE_CHECKING`` and inside functions too.
"""

from __future__ import annotations

import grimp


def _strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Groups of two or more modules that import each other, directly or not (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return groups


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
