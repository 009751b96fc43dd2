"""The Lua class rules (``lua/classes.lua``) against ``fairlane.policy.classes.next_class``.

The state machine in ``test_model_vs_lua.py`` runs two fixed tables at small capacities;
here ``choose_class`` runs alone, as a script on the real server, over random tables
(shares, floors, reserves, borrowing caps, batch classes), capacities, in-flight slots,
head widths and demands, and must name the class ``next_class`` names.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from fairlane.policy.classes import ClassTable, ServiceClass, next_class
from fairlane.store.library import _LUA, encode_classes, fill_constants

_DRIVER = """
local tbl = cjson.decode(ARGV[1])
local cap = tonumber(ARGV[2])
local f, heads, d = cjson.decode(ARGV[3]), cjson.decode(ARGV[4]), cjson.decode(ARGV[5])
local w = {}
for i = 1, #tbl do
  if heads[i] > 0 then
    w[i] = heads[i]
  end
end
return choose_class(class_levels(tbl, cap), f, w, d) or 0
"""


def _script() -> str:
    source = _LUA.joinpath("classes.lua").read_text()
    return fill_constants(source) + _DRIVER


@pytest.fixture(scope="module")
def choose(redis_url: str) -> Iterator[redis.commands.core.Script]:
    client = redis.Redis.from_url(redis_url)
    try:
        yield client.register_script(_script())
    finally:
        client.close()


@st.composite
def tables(draw: st.DrawFn) -> ClassTable:
    n = draw(st.integers(1, 4))
    shares = draw(st.lists(st.integers(0, 10), min_size=n, max_size=n))
    total = max(10, sum(shares))
    classes = []
    for i, share in enumerate(shares):
        if draw(st.integers(0, 4)) == 0:
            classes.append(ServiceClass(f"c{i}", batch=True))
            continue
        borrow = draw(st.sampled_from([None, None, 0.0, 0.5, 1.0, 2.0]))
        classes.append(
            ServiceClass(
                f"c{i}",
                nominal_share=share / total,
                min_slots=draw(st.integers(0, 3)),
                lendable=draw(st.sampled_from([1.0, 1.0, 0.5, 0.0, 0.25])),
                borrowable=borrow,
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
