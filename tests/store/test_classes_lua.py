"""The Lua class rules (``lua/classes.lua``) against ``fairlane.policy.classes.next_class``.

The state machine in ``test_model_vs_lua.py`` runs two fixed tables at small capacities;
here ``choose_class`` runs alone, as a script on the real server, over random tables
(shares, floors, reserves, borrowing caps, batch classes, ``max_wait``), capacities,
in-flight slots, head widths, demands and heads' ages, and must name the class
``next_class`` names: without ages (as the admission gate and older callers ask) and
with them (aging, rules A1-A3). A table stored before ``max_wait`` existed (six fields
a class) still reads, and nothing in it ages.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from fairlane.policy.classes import ClassTable, ServiceClass, next_class
from fairlane.store.library import encode_classes
from tests.store.harness import lua_modules

_DRIVER = """
local tbl = cjson.decode(ARGV[1])
local cap = tonumber(ARGV[2])
local f, heads, d = cjson.decode(ARGV[3]), cjson.decode(ARGV[4]), cjson.decode(ARGV[5])
local ages = ARGV[6] and cjson.decode(ARGV[6]) or nil
local w = {}
for i = 1, #tbl do
  if heads[i] > 0 then
    w[i] = heads[i]
  end
end
return choose_class(class_levels(tbl, cap), f, w, d, ages) or 0
"""
MAX_WAITS = [None, 0.001, 0.005, 0.02, 1.0]  # seconds; ages are drawn in ms around them
AGES = [0, 1, 2, 5, 6, 20, 21, 999, 1000, 1001, 5000]


def _script() -> str:
    expose = ("classes.choose_class", "classes.class_levels")
    return (
        lua_modules(
            "local core = {class_table = cjson.decode, memoised = function(f) return f end}\n",
            "classes.lua",
            expose=expose,
        )
        + _DRIVER
    )


@pytest.fixture(scope="module")
def choose(redis_url: str) -> Iterator[redis.commands.core.Script]:
    client = redis.Redis.from_url(redis_url)
    try:
        yield client.register_script(_script())
    finally:
        client.close()


@st.composite
def tables(draw: st.DrawFn, *, aging: bool = False) -> ClassTable:
    """Random tables, most classes but the first declaring max_wait; with ``aging``, of
    two classes or more (a lone class has nothing to age into)."""
    n = draw(st.integers(2 if aging else 1, 4))
    shares = draw(st.lists(st.integers(0, 10), min_size=n, max_size=n))
    total = max(10, sum(shares))
    classes = []
    for i, share in enumerate(shares):
        # the first class has no class above it to age into
        max_wait = draw(st.sampled_from(MAX_WAITS)) if i else None
        if draw(st.integers(0, 4)) == 0:
            classes.append(ServiceClass(f"c{i}", batch=True, max_wait=max_wait))
            continue
        borrow = draw(st.sampled_from([None, None, 0.0, 0.5, 1.0, 2.0]))
        classes.append(
            ServiceClass(
                f"c{i}",
                nominal_share=share / total,
                min_slots=draw(st.integers(0, 3)),
                lendable=draw(st.sampled_from([1.0, 1.0, 0.5, 0.0, 0.25])),
                borrowable=borrow,
                max_wait=max_wait,
            )
        )
    return ClassTable(classes)


@settings(max_examples=600, deadline=None)
@given(table=tables(), cap=st.integers(0, 24), data=st.data())
def test_lua_chooses_as_next_class(
    choose: redis.commands.core.Script, table: ClassTable, cap: int, data: st.DataObject
) -> None:
    n = len(table)
    f = data.draw(st.lists(st.integers(0, max(cap, 1)), min_size=n, max_size=n), label="f")
    heads = data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n), label="w")
    extra = data.draw(st.lists(st.integers(0, 6), min_size=n, max_size=n), label="d")
    d = [w + x if w else 0 for w, x in zip(heads, extra, strict=True)]
    _assert_chooses_as_next_class(choose, table, cap, f, heads, d)


def _assert_chooses_as_next_class(  # noqa: PLR0917 - the state the rules read
    choose: redis.commands.core.Script,
    table: ClassTable,
    cap: int,
    f: list[int],
    heads: list[int],
    d: list[int],
) -> None:
    names = table.names
    expected = next_class(
        table,
        cap,
        dict(zip(names, f, strict=True)),
        {c: (w or None) for c, w in zip(names, heads, strict=True)},
        demand=dict(zip(names, d, strict=True)),
    )
    args = [encode_classes(table), cap, json.dumps(f), json.dumps(heads), json.dumps(d)]
    got = int(choose(keys=[], args=args))
    assert (names[got - 1] if got else None) == expected


@given(table=tables(), cap=st.integers(0, 24), data=st.data())
def test_lua_chooses_as_next_class_when_one_class_waits(
    choose: redis.commands.core.Script, table: ClassTable, cap: int, data: st.DataObject
) -> None:
    """One head only: the script judges that class alone (choose_lone), by the same rule."""
    n = len(table)
    alone = data.draw(st.integers(0, n - 1), label="alone")
    f = data.draw(st.lists(st.integers(0, max(cap, 1)), min_size=n, max_size=n), label="f")
    width = data.draw(st.integers(1, 5), label="w")
    heads = [width if i == alone else 0 for i in range(n)]
    d = [0] * n
    d[alone] = width + data.draw(st.integers(0, 6), label="d")
    _assert_chooses_as_next_class(choose, table, cap, f, heads, d)


@settings(max_examples=600, deadline=None)
@given(table=tables(aging=True), cap=st.integers(1, 24), data=st.data())
def test_lua_ages_heads_as_next_class(
    choose: redis.commands.core.Script, table: ClassTable, cap: int, data: st.DataObject
) -> None:
    n = len(table)
    # lanes with room to start something, so that where an aged head goes shows
    f = data.draw(st.lists(st.integers(0, cap // 2), min_size=n, max_size=n), label="f")
    heads = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n), label="w")
    extra = data.draw(st.lists(st.integers(0, 6), min_size=n, max_size=n), label="d")
    # ages around the max_waits drawn, ties included
    ages = data.draw(
        st.lists(st.sampled_from(AGES), min_size=n, max_size=n),
        label="ages",
    )
    d = [w + x if w else 0 for w, x in zip(heads, extra, strict=True)]
    names = table.names
    expected = next_class(
        table,
        cap,
        dict(zip(names, f, strict=True)),
        {c: (w or None) for c, w in zip(names, heads, strict=True)},
        demand=dict(zip(names, d, strict=True)),
        waited_ms=dict(zip(names, ages, strict=True)),
    )
    args = [
        encode_classes(table),
        cap,
        json.dumps(f),
        json.dumps(heads),
        json.dumps(d),
        json.dumps(ages),
    ]
    got = int(choose(keys=[], args=args))
    assert (names[got - 1] if got else None) == expected


def test_a_table_stored_before_max_wait_reads_and_nothing_ages(
    choose: redis.commands.core.Script,
) -> None:
    table = ClassTable(
        [ServiceClass("standard", nominal_share=1.0), ServiceClass("batch", batch=True)]
    )
    old = json.dumps([row[:6] for row in json.loads(encode_classes(table))])
    aged = ClassTable(
        [
            ServiceClass("standard", nominal_share=1.0),
            ServiceClass("batch", batch=True, max_wait="1s"),
        ]
    )
    # a full standard share with its next job waiting, and a batch head waiting 5 s
    state = [4, json.dumps([3, 0]), json.dumps([1, 1]), json.dumps([1, 1]), json.dumps([10, 5000])]
    assert int(choose(keys=[], args=[old, *state])) == 1  # standard: batch never ages
    assert int(choose(keys=[], args=[encode_classes(aged), *state])) == 2  # batch, aged
    assert int(choose(keys=[], args=[encode_classes(aged), *state[:4]])) == 1  # no ages given
