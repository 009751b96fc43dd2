"""The twins written down: ``docs/contracts/twins.md`` against the library and the tests.

The table pairs every file of the Lua library with its Python twin, the simulator's
fast path and the tests that hold them to each other. These tests keep it true: every
file the library includes has a row and every row a file, every name in it imports,
every test it names exists, and every row with a twin is checked by a test that
imports that twin -- so a new script cannot land without an agreement test, and a
renamed test or module cannot leave the table behind.

They also hold the keys every script receives first to ``AppKeys.common()``: the
header of ``lua/fairlane.lua`` (index, Lua constant, key name), the constants that
index ``KEYS`` and the list the store passes, in the same order. And the prefix the
scripts derive from ``KEYS[1]`` is the app's, whatever the fence key is called.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import redis

import fairlane.policy
from fairlane.store.keys import AppKeys
from fairlane.store.library import _INCLUDE, _LUA
from tests.store.harness import lua_parts

ROOT = Path(__file__).resolve().parents[2]
TWINS = ROOT / "docs" / "contracts" / "twins.md"
_CODE = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Row:
    """One row of a table: its first cell and the code spans of every cell."""

    key: str
    cells: tuple[tuple[str, ...], ...]
    text: tuple[str, ...]


def _rows(first: str) -> Iterator[Row]:
    """The rows of ``twins.md``'s tables whose first cell is code matching ``first``."""
    for line in TWINS.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        spans = tuple(tuple(_CODE.findall(c)) for c in cells)
        if spans[0] and re.fullmatch(first, spans[0][0]):
            yield Row(spans[0][0], spans, tuple(cells))


def lua_rows() -> dict[str, Row]:
    rows: dict[str, Row] = {}
    for row in _rows(r"[\w]+\.lua"):
        assert row.key not in rows, f"{row.key} has two rows in twins.md"
        assert len(row.cells) == 5, f"{row.key}: a row has five columns in twins.md"
        rows[row.key] = row
    return rows


def untwinned_rows() -> dict[str, Row]:
    return {row.key: row for row in _rows(r"fairlane\.policy\.[\w.]+")}


def included() -> list[str]:
    """``fairlane.lua`` and every file it includes, as the library assembles them."""
    return ["fairlane.lua", *_INCLUDE.findall(_LUA.joinpath("fairlane.lua").read_text())]


def resolve(dotted: str) -> object:
    """The module or object a dotted name names (the longest importable prefix, then
    attributes)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def modules_of(dotted: str) -> set[str]:
    """The module a dotted name is imported from, and the one that defines its object."""
    obj = resolve(dotted)
    out = {getattr(obj, "__name__", "")} if isinstance(obj, ModuleType) else set()
    out.add(getattr(obj, "__module__", "") or "")
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        if ".".join(parts[:cut]) in sys.modules:
            out.add(".".join(parts[:cut]))
            break
    return out - {""}


def ref_path(ref: str) -> tuple[Path, str | None]:
    """A test reference ``path`` or ``path::name``: the file, and the name in it."""
    path, _, name = ref.partition("::")
    return ROOT / path, name or None


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, and ``package.name`` for each ``from package
    import name``, so that a module imported by its package counts too."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def twins_of(row: Row) -> tuple[str, ...]:
    return tuple(name for name in row.cells[2] if name.startswith("fairlane."))


def fast_paths_of(row: Row) -> tuple[str, ...]:
    return tuple(name for name in row.cells[3] if name.startswith("fairlane."))


def named_tests(row: Row) -> tuple[str, ...]:
    return row.cells[4]


# -- the table against the library and the tests ------------------------------------------


def test_every_included_lua_file_has_a_row_and_every_row_a_file() -> None:
    rows, files = lua_rows(), included()
    assert sorted(set(files) - set(rows)) == [], "Lua files with no row in twins.md"
    assert sorted(set(rows) - set(files)) == [], "rows of twins.md for files not included"
    on_disk = {p.name for p in _LUA.iterdir() if p.name.endswith(".lua")}
    assert sorted(on_disk - set(files)) == [], "Lua files the library never includes"


def test_every_lua_file_names_tests_that_exist() -> None:
    for key, row in lua_rows().items():
        refs = named_tests(row)
        assert refs, f"{key}: no test in twins.md"
        for ref in refs:
            path, name = ref_path(ref)
            assert path.is_file(), f"{key}: {ref} does not exist"
            if name is not None:
                tree = ast.parse(path.read_text())
                defined = {
                    n.name
                    for n in tree.body
                    if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                }
                assert name in defined, f"{key}: {path.name} defines no {name}"


def test_every_twin_and_fast_path_named_exists() -> None:
    for key, row in lua_rows().items():
        twins = twins_of(row)
        assert twins or row.text[2] == "none", f"{key}: name its Python twin, or say none"
        for dotted in (*twins, *fast_paths_of(row)):
            resolve(dotted)  # raises if it does not import
        for dotted in fast_paths_of(row):
            assert dotted.startswith("fairlane.sim."), f"{key}: {dotted} is no simulator path"


def test_a_twinned_lua_file_is_checked_by_a_test_that_imports_its_twin() -> None:
    for key, row in lua_rows().items():
        twins = twins_of(row)
        if not twins:
            continue
        wanted = set().union(*(modules_of(t) for t in twins))
        imports: set[str] = set()
        for ref in named_tests(row):
            imports |= imported_modules(ref_path(ref)[0])
        assert wanted & imports, f"{key}: no test of its row imports any of {sorted(wanted)}"


def test_every_policy_module_is_in_one_of_the_tables() -> None:
    named: set[str] = set()
    for row in lua_rows().values():
        for twin in twins_of(row):
            named |= modules_of(twin)
    for key, row in untwinned_rows().items():
        named |= modules_of(key)
        for ref in row.cells[2]:
            assert ref_path(ref)[0].is_file(), f"{key}: {ref} does not exist"
    modules = {
        m.name
        for m in pkgutil.walk_packages(fairlane.policy.__path__, "fairlane.policy.")
        if not m.ispkg
    }
    # the modules of a package inside the core count as one: a twin names the package's
    # object, and the helpers beside it (checks, units) have no rule of their own
    packages = {n.rpartition(".")[0] for n in named} - {"fairlane.policy"}
    missing = {m for m in modules if m not in named and m.rpartition(".")[0] not in packages}
    assert sorted(missing) == [], "policy modules in neither table of twins.md"


# -- the keys every script receives ---------------------------------------------------------

_HEADER_KEY = re.compile(r"^  KEYS\[(\d+)\] +([A-Z]+) +(\S+) ", re.M)
_CONSTANTS = re.compile(r"^ *local ([A-Z, ]+) = ([\d, ]+)$", re.M)


def _code(name: str) -> str:
    """``lua/<name>`` without its comments."""
    source = re.sub(r"--\[\[.*?--\]\]", "", _LUA.joinpath(name).read_text(), flags=re.S)
    return re.sub(r"--[^\n]*", "", source)


def test_keys_follow_app_keys_common() -> None:
    source = _LUA.joinpath("fairlane.lua").read_text()
    header = source[: source.index("--]]")]
    rows = [(int(i), const, name) for i, const, name in _HEADER_KEY.findall(header)]
    keys = AppKeys.for_app("x")
    common = [k.removeprefix(keys.prefix) for k in keys.common()]
    assert [i for i, _, _ in rows] == list(range(1, len(common) + 1)), "KEYS[n] in order"
    assert [name for _, _, name in rows] == common, "the header's keys are AppKeys.common()"
    header_constants = {const: i for i, const, _ in rows}
    assigned: dict[str, int] = {}
    for name in included():
        for names, values in _CONSTANTS.findall(_code(name)):
            split = zip(names.split(","), values.split(","), strict=True)
            pairs = [(n.strip(), int(v)) for n, v in split]
            if any(n in header_constants for n, _ in pairs):
                assert all(n in header_constants for n, _ in pairs), f"lua/{name}: {names}"
                for n, v in pairs:
                    assert n not in assigned, f"lua/{name} assigns {n} again"
                    assigned[n] = v
    assert assigned == header_constants, "the constants that index KEYS follow the header"


def test_scripts_index_the_fixed_keys_only_by_their_constants() -> None:
    for name in included():
        for n, line in enumerate(_code(name).splitlines(), 1):
            assert not re.search(r"\bkeys\[\d", line, re.I), (
                f"lua/{name}:{n} indexes KEYS by number: {line.strip()}"
            )


_PREFIX_DRIVER = "return prefix(KEYS)\n"


@pytest.fixture(scope="module")
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    try:
        yield c
    finally:
        c.close()


@pytest.mark.parametrize("fence", ["fence", "f", "fencing-token-counter"])
def test_the_prefix_is_the_apps_whatever_the_fence_key_is_called(
    client: redis.Redis, fence: str
) -> None:
    script = "local FENCE = 1\n" + lua_parts("core.lua", "FENCE_NAME", "prefix")
    script = script.replace("local FENCE_NAME = 'fence'", f"local FENCE_NAME = '{fence}'")
    run = client.register_script(script + _PREFIX_DRIVER)
    for keys in (AppKeys.for_app("x"), AppKeys.for_shard("x", 2, 3), AppKeys.for_app("a-b_c")):
        common = keys.common()
        got = run(keys=[keys.prefix + fence, *common[1:]])
        assert got.decode() == keys.prefix
