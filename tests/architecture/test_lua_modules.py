"""The Lua library's shape: modules of one table each, few top-level locals, headers
that say what each file touches, calls and offers, and entry points short enough to read.

Lua allows a function (the library's main chunk is one) 200 active locals. Each file of
``lua/`` declares one top-level local, its module table; its helpers are locals of the
module's own ``do ... end`` block, gone from the count when the block closes. The header
of a file (its leading comment block) names the keys it touches (``-- Keys:``), the
modules it calls (``-- Calls:``) and its entry points (``-- Entry points:``); the last two
are checked against the code, so a header cannot drift from it.
"""

from __future__ import annotations

import re

import pytest

from fairlane.store.library import _INCLUDE, _LUA, LIBRARY_CODE
from tests.architecture.luasource import (
    declared_names,
    function_lengths,
    tokens,
    top_level_locals,
)

MAX_TOP_LEVEL_LOCALS = 100
MAX_FUNCTION_LINES = 80
_FIELD = re.compile(r"^\s*(?:function )?(\w+)\.(\w+)\s*[(=]", re.M)


def _included() -> list[str]:
    return _INCLUDE.findall(_LUA.joinpath("fairlane.lua").read_text())


def _header(source: str) -> dict[str, str]:
    """The labelled entries of a file's leading comment block (continuation lines start
    with ``--`` and two spaces or more)."""
    entries: dict[str, str] = {}
    label = None
    for line in source.splitlines():
        if not line.startswith("--"):
            break
        found = re.match(r"-- (Keys|Calls|Entry points): (.*)$", line)
        if found:
            label = found.group(1)
            entries[label] = found.group(2)
        elif label and line.startswith("--   "):
            entries[label] += " " + line[2:].strip()
        else:
            label = None
    return entries


def _modules() -> dict[str, str]:
    """Each included file's module table (the one top-level local it declares)."""
    out = {}
    for name in _included():
        declared = top_level_locals(_LUA.joinpath(name).read_text())
        if declared:
            out[name] = declared[0]
    return out


def test_the_assembled_library_holds_few_top_level_locals() -> None:
    names = top_level_locals(LIBRARY_CODE)
    assert len(names) <= MAX_TOP_LEVEL_LOCALS, (
        f"{len(names)} top-level locals in the library (Lua allows 200): {names}"
    )


def test_the_count_reads_every_name_of_a_declaration() -> None:
    source = "local a, b = 1, 2\nlocal function c() local d = 1 end\ndo local e = 1 end\n"
    assert top_level_locals(source) == ["a", "b", "c"]
    assert top_level_locals("local s = '[[' local t = [[\nend]] -- local u\n") == ["s", "t"]


@pytest.mark.parametrize("name", _included())
def test_each_file_is_one_module_table(name: str) -> None:
    declared = top_level_locals(_LUA.joinpath(name).read_text())
    assert len(declared) <= 1, f"lua/{name} declares {declared} at its top level"


@pytest.mark.parametrize("name", _included())
def test_each_file_has_a_header_the_code_bears_out(name: str) -> None:
    source = _LUA.joinpath(name).read_text()
    header = _header(source)
    assert sorted(header) == ["Calls", "Entry points", "Keys"], (
        f"lua/{name} lacks a header line (Keys:, Calls:, Entry points:): it has {sorted(header)}"
    )
    modules = _modules()
    own = modules.get(name)
    toks = list(tokens(source))
    called = {
        t.text
        for k, t in enumerate(toks[:-1])
        if t.text in modules.values()
        and t.text != own
        and toks[k + 1].text == "."
        and (k == 0 or toks[k - 1].text not in {".", ":"})
    }
    named = {m.strip() for m in header["Calls"].split(",")} - {"none"}
    assert named == called, f"lua/{name}: its header's Calls: {named}, its code calls {called}"
    if own is not None:
        defined = {f for m, f in _FIELD.findall(source) if m == own}
        listed = re.fullmatch(rf"{own}\.\{{(.*)\}}", header["Entry points"])
        assert listed is not None, f"lua/{name}: Entry points as {own}.{{a, b, ..}}"
        entries = {e.strip() for e in listed.group(1).split(",")}
        assert entries == defined, (
            f"lua/{name}: header lists {sorted(entries - defined)} it does not define and "
            f"omits {sorted(defined - entries)}"
        )


def test_no_local_takes_a_module_tables_name() -> None:
    # a parameter `acks` hides the module `acks` from its function: forbidden outright
    modules = set(top_level_locals(LIBRARY_CODE))
    again = [(n, line) for n, line in declared_names(LIBRARY_CODE) if n in modules]
    assert sorted(n for n, _ in again) == sorted(modules), f"module names declared again: {again}"


def test_functions_stay_short() -> None:
    long = [(n, k) for n, k in function_lengths(LIBRARY_CODE) if k > MAX_FUNCTION_LINES]
    assert long == [], f"Lua functions over {MAX_FUNCTION_LINES} lines: {long}"
