"""The worker's calls' write-behind views (``lua/writeback.lua``) against the hashes
themselves.

One script runs a random sequence of hash operations (HGET, HMGET, HSET, HDEL, HINCRBY
read back, counters added, PEXPIRE with and without GT, EXISTS) on two hashes, every
operation's answer collected. Run once with each command sent at once and once inside
``writeback.behind`` (the view read once and written back at the end), on fresh copies
of the same starting hashes, both must give the same answers and leave the same
fields, values and expiry.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.store.harness import CORE_CHUNKED, DRIVER_RUNS, lua_modules

_DRIVER = """
local ops = cjson.decode(ARGV[1])
local function drive()
  local out = {}
  for _, op in ipairs(ops) do
    local kind, h, f = op[1], KEYS[op[2]], op[3]
    local r
    if kind == 'get' then
      r = writeback.get(KEYS, h, f)
    elseif kind == 'mget' then
      r = writeback.mget(KEYS, h, {f, op[4]})
    elseif kind == 'set' then
      writeback.set(KEYS, h, f, op[4], op[5], op[6])
    elseif kind == 'del' then
      writeback.del(KEYS, h, f, op[4])
    elseif kind == 'incr' then
      r = writeback.incr(KEYS, h, f, op[4])
    elseif kind == 'add' then
      writeback.add(KEYS, h, f, op[4])
    elseif kind == 'addf' then
      writeback.addf(KEYS, h, f, op[4])
    elseif kind == 'pexpire' then
      -- (only of a hash the call has written, as its callers do)
      writeback.set(KEYS, h, 'kept', 'p')
      writeback.pexpire(KEYS, h, op[4], op[5])
    else
      r = writeback.exists(KEYS, h)
    end
    if type(r) == 'number' then
      r = string.format('%.17g', r) -- (cjson writes 14 digits)
    elseif type(r) == 'table' then
      for i, x in ipairs(r) do
        r[i] = type(x) == 'number' and string.format('%.17g', x) or x
      end
    end
    out[#out + 1] = cjson.encode({r == nil and cjson.null or r})
  end
  return out
end
"""


#: fields read back (`c` only ever a whole number, counted up and down); `n1` and `n2`
#: counters nothing reads, summed as floats and as whole numbers
READ = ("a", "b", "c")
WRITTEN = ("a", "b")
COUNTERS = ("n1", "n2")
VALUES = st.one_of(
    st.sampled_from(["x", "", "7"]),
    st.integers(-5, 5),
    st.sampled_from([0.5, 1 / 3, 2.25, 1e-3]),
)


def _script(mode: str) -> str:
    return (
        lua_modules("local core = {}\n" + CORE_CHUNKED, "writeback.lua")
        + _DRIVER
        + DRIVER_RUNS[mode]
    )


@pytest.fixture(scope="module")
def scripts(redis_url: str) -> Iterator[tuple[redis.Redis, dict[str, Any]]]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client, {mode: client.register_script(_script(mode)) for mode in DRIVER_RUNS}
    finally:
        client.close()


hashes = st.sampled_from([1, 2])
operation = st.one_of(
    st.tuples(st.just("get"), hashes, st.sampled_from(READ)),
    st.tuples(st.just("mget"), hashes, st.sampled_from(READ), st.sampled_from(READ)),
    st.tuples(
        st.just("set"), hashes, st.sampled_from(WRITTEN), VALUES, st.sampled_from(WRITTEN), VALUES
    ),
    st.tuples(st.just("del"), hashes, st.sampled_from(READ), st.sampled_from(READ)),
    st.tuples(st.just("incr"), hashes, st.just("c"), st.integers(-3, 3)),
    st.tuples(st.just("add"), hashes, st.just("n2"), st.integers(-3, 3)),
    st.tuples(st.just("addf"), hashes, st.just("n1"), st.sampled_from([0.5, 1.25, 3.0])),
    st.tuples(st.just("pexpire"), hashes, st.just(""), st.integers(10_000, 90_000), st.booleans()),
    st.tuples(st.just("exists"), hashes, st.just("")),
)

#: the starting fields of a hash; `c` holds a whole number, as HINCRBY needs
START = st.fixed_dictionaries(
    {},
    optional={
        "a": st.sampled_from(["1", "y"]),
        "b": st.sampled_from(["2.5", "z"]),
        "c": st.sampled_from(["0", "4"]),
        "n1": st.sampled_from(["1", "1.5"]),
    },
)


def _seed(client: Any, keys: list[str], start: list[dict[str, str]], ttl: list[int]) -> None:
    for key, fields, ms in zip(keys, start, ttl, strict=True):
        if fields:
            # a field no operation deletes: a hash that expires is never emptied in a call
            # (the server would drop it and its expiry at once; a view keeps the expiry)
            client.hset(key, mapping={**fields, "kept": "1"})
            if ms:
                client.pexpire(key, ms)


def _number(text: str) -> Any:
    """A field's value, numbers as floats: servers write a number that is not whole each
    in its own way, and HINCRBYFLOAT's text of a sum is the server's too."""
    try:
        return float(text)
    except ValueError:
        return text


def _left(client: Any, keys: list[str]) -> list[tuple[dict[str, Any], int]]:
    """Each hash's fields and its expiry to the second."""
    out = []
    for key in keys:
        raw = client.hgetall(key)
        fields = {f: _number(v) for f, v in raw.items()}
        ttl = client.pttl(key)
        out.append((fields, -1 if ttl < 0 else round(ttl / 1000)))
    return out


def _read(answers: list[str]) -> list[Any]:
    """The answers as a caller reads them: a number written in the call may come back as
    that number rather than as the server's text of it (either reads as the same float)."""

    def one(value: Any) -> Any:
        with contextlib.suppress(TypeError, ValueError):
            return float(value)
        return value

    out = []
    for raw in answers:
        value = json.loads(raw)[0]
        out.append([one(v) for v in value] if isinstance(value, list) else one(value))
    return out


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(operation, min_size=1, max_size=25),
    start=st.lists(START, min_size=2, max_size=2),
    ttl=st.lists(st.sampled_from([0, 50_000]), min_size=2, max_size=2),
)
def test_a_call_through_views_does_what_the_commands_do(
    scripts: tuple[redis.Redis, dict[str, Any]],
    ops: list[tuple[Any, ...]],
    start: list[dict[str, str]],
    ttl: list[int],
) -> None:
    client, by_mode = scripts
    answers, left = {}, {}
    for mode, script in by_mode.items():
        tag = "{wb" + secrets.token_hex(4) + "}"
        keys = [f"{tag}:one", f"{tag}:two"]
        try:
            _seed(client, keys, start, ttl)
            answers[mode] = script(keys=keys, args=[json.dumps(ops)])
            left[mode] = _left(client, keys)
        finally:
            client.delete(*keys)
    assert _read(answers["behind"]) == _read(answers["direct"])
    assert left["behind"] == left["direct"]
