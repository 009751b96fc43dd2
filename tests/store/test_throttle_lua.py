"""The Lua throttle (``lua/throttle.lua``) against ``fairlane.policy.throttle.Throttles``.

The state machine in ``test_model_vs_lua.py`` reaches the throttle only through
dispatch, with three keys; here ``thr_acquire``, ``thr_release`` and
``thr_cancel_waiter`` run alone, as a script on the real server, through random
sequences of arrivals (up to three of five keys, limits 0-3 that change from job to
job), releases (current, stale and repeated tokens) and cancellations, and must give
the same admissions, tokens, hand-offs and parkings -- and leave the same keys, use,
limits, references and waiter queues -- as the policy.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from fairlane.policy.throttle import Acquired, Handoff, Throttles
from fairlane.store.library import _LUA, fill_constants

_DRIVER = """
local op, id = ARGV[1], ARGV[2]
if op == 'acquire' then
  local token, handoffs = thr_acquire(KEYS, id, cjson.decode(ARGV[3]), ARGV[4], ARGV[5])
  return {token or 0, handoffs}
elseif op == 'release' then
  return {0, thr_release(KEYS, id, ARGV[3])}
end
return {thr_cancel_waiter(KEYS, id) and 1 or 0, {}}
"""

KEYS = ("a", "b", "c", "d", "e")
JOBS = [f"j{i}" for i in range(8)]


def _script() -> str:
    source = "local THR, THRW = 1, 2\n"
    for name in ("classes.lua", "throttle.lua"):
        source += _LUA.joinpath(name).read_text()
    return fill_constants(source) + _DRIVER


@pytest.fixture(scope="module")
def lua(redis_url: str) -> Iterator[tuple[redis.Redis, Any]]:
    client = redis.Redis.from_url(redis_url)
    try:
        yield client, client.register_script(_script())
    finally:
        client.close()


operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("acquire"),
            st.sampled_from(JOBS),
            st.dictionaries(
                st.sampled_from(KEYS),
                st.sampled_from([0, 1, 1, 1, 2, 2, 3]),
                min_size=1,
                max_size=3,
            ),
            st.integers(-1, 1),
        ),
        st.tuples(st.just("release"), st.sampled_from(JOBS), st.sampled_from([0, 0, 0, 1, 2])),
        st.tuples(st.just("cancel"), st.sampled_from(JOBS)),
    ),
    min_size=10,
    max_size=60,
)


def _state(client: redis.Redis, keys: list[str]) -> dict[str, Any]:
    raw = {k.decode(): v.decode() for k, v in client.hgetall(keys[0]).items()}
    waiters: dict[str, list[str]] = {}
    for member in client.zrange(keys[1], 0, -1):
        key, _, job = member.decode().split("\0")
        waiters.setdefault(key, []).append(job)
    live = sorted(f[2:] for f in raw if f.startswith("l:"))
    return {
        "keys": {k: (int(raw.get(f"u:{k}", 0)), int(raw[f"l:{k}"])) for k in live},
        "refs": {k: int(raw[f"r:{k}"]) for k in live},
        "waiters": waiters,
        "held": {f[2:]: v for f, v in raw.items() if f.startswith("h:")},
        "parked": {f[2:]: v.split("\t")[0] for f, v in raw.items() if f.startswith("p:")},
    }


def _model_state(thr: Throttles) -> dict[str, Any]:
    stats = thr.statistics()
    refs: Counter[str] = Counter()
    for job in JOBS:
        refs.update(thr.holds(job) or thr.wants(job) or ())
    return {
        "keys": {s.key: (s.in_use, s.limit) for s in stats.keys},
        "refs": dict(refs),
        "waiters": {s.key: list(thr.waiters(s.key)) for s in stats.keys if s.waiters},
        "held": {
            j: "\t".join([str(thr.token(j)), *(thr.holds(j) or ())])
            for j in JOBS
            if thr.holds(j) is not None
        },
        "parked": {j: thr.parked_on(j) for j in JOBS if thr.parked_on(j) is not None},
    }


def _handoffs(reply: list[Any]) -> list[tuple[str, int]]:
    return [(h[0].decode(), int(h[1])) for h in reply]


@settings(max_examples=200, deadline=None)
@given(ops=operations)
def test_lua_throttle_agrees_with_policy(
    lua: tuple[redis.Redis, Any], ops: list[tuple[Any, ...]]
) -> None:
    client, script = lua
    tag = "{thr" + secrets.token_hex(4) + "}"
    keys = [f"{tag}:thr", f"{tag}:thr:wait"]
    thr = Throttles()
    seq = 0
    tokens: dict[str, list[int]] = {}  # job -> every token it was granted
    try:
        for op in ops:
            if op[0] == "acquire":
                _, job, limits, prio = op
                if thr.holds(job) is not None or thr.parked_on(job) is not None:
                    continue  # a job acquires once at a time (the store guarantees it)
                seq += 1
                result = thr.try_acquire(job, limits, prio, seq)
                pairs = json.dumps([[k, v] for k, v in sorted(limits.items())])
                token, handed = script(keys=keys, args=["acquire", job, pairs, prio, seq])
                want = result.token if isinstance(result, Acquired) else 0
                assert int(token) == want, (op, result)
                if want:
                    tokens.setdefault(job, []).append(want)
                expected: list[Handoff] = list(result.handoffs)
            elif op[0] == "release":
                _, job, which = op
                granted = tokens.get(job, [])
                token = granted[-1 - which] if which < len(granted) else 0
                expected = thr.release(job, token)
                _, handed = script(keys=keys, args=["release", job, token])
            else:
                _, job = op
                done, handed = script(keys=keys, args=["cancel", job])
                assert int(done) == int(thr.cancel_waiter(job))
                expected = []
            for h in expected:
                tokens.setdefault(h.job_id, []).append(h.token)
            assert _handoffs(handed) == [(h.job_id, h.token) for h in expected], op
            assert _state(client, keys) == _model_state(thr), op
    finally:
        client.delete(*keys)
