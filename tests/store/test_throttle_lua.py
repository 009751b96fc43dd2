"""The Lua throttle (``lua/throttle.lua``) against ``fairlane.policy.throttle.Throttles``.

The state machine in ``test_model_vs_lua.py`` reaches the throttle only through
dispatch, with three keys; here ``thr_acquire``, ``thr_release`` and ``thr_cancel`` run
alone, as a script on the real server, through random sequences of dispatches (new jobs
of three tenants naming up to three of five keys, limits 0-3 that change from job to
job, charges 0.5-2; woken jobs converting their offers), releases (current, stale and
repeated tokens), cancellations (waiters and woken jobs) and weight changes, and must
give the same admissions, tokens, wakes and parkings -- and leave the same keys, use,
offers, limits, references, tenant groups, start and finish tags and virtual times --
as the policy.
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

from fairlane.policy.throttle import Acquired, Throttles, Wake
from tests.store.harness import (
    CORE_CHUNKED,
    DRIVER_RUNS,
    GRANT_RECORDS,
    THROTTLE_MODULES,
    grant_records,
    lua_modules,
)

_DRIVER = """
local function drive()
local op, id = ARGV[1], ARGV[2]
if op == 'acquire' then
  local grant, wakes = thr_acquire(KEYS, id, cjson.decode(ARGV[3]), ARGV[4], ARGV[5], ARGV[6],
    tonumber(ARGV[7]))
  return {keep_grant(id, grant), wakes}
elseif op == 'release' then
  local grant = take_grant(id, ARGV[3])
  return {0, grant and (thr_release(KEYS, grant)) or {}}
end
local done, wakes = thr_cancel(KEYS, id)
return {done and 1 or 0, wakes}
end
"""


KEYS = ("a", "b", "c", "d", "e")
JOBS = [f"j{i}" for i in range(8)]
TENANTS = ("t1", "t2", "t3")


def _script(mode: str) -> str:
    # the keys' prefix is what the throttle hash's name holds before 'thr' (rate state)
    core = (
        "local core = {THR = 1, THRW = 2, WEIGHTS = 3, now_ms = function() return 0 end}\n"
        "function core.prefix(keys) return string.sub(keys[1], 1, #keys[1] - 3) end\n"
        "function core.memoised(f) return f end\n" + CORE_CHUNKED
    )
    expose = ("throttle.thr_acquire", "throttle.thr_release", "throttle.thr_cancel")
    return (
        lua_modules(core, *THROTTLE_MODULES, expose=expose)
        + GRANT_RECORDS
        + _DRIVER
        + DRIVER_RUNS[mode]
    )


@pytest.fixture(scope="module", params=sorted(DRIVER_RUNS))
def lua(redis_url: str, request: pytest.FixtureRequest) -> Iterator[tuple[redis.Redis, Any]]:
    client = redis.Redis.from_url(redis_url)
    try:
        yield client, client.register_script(_script(request.param))
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
            st.sampled_from(TENANTS),
            st.sampled_from([1.0, 1.0, 0.5, 2.0]),
        ),
        st.tuples(st.just("release"), st.sampled_from(JOBS), st.sampled_from([0, 0, 0, 1, 2])),
        st.tuples(st.just("cancel"), st.sampled_from(JOBS)),
        st.tuples(st.just("weight"), st.sampled_from(TENANTS), st.sampled_from([None, 2.0, 3.0])),
    ),
    min_size=10,
    max_size=60,
)


def _state(client: redis.Redis, keys: list[str]) -> dict[str, Any]:
    raw = {k.decode(): v.decode() for k, v in client.hgetall(keys[0]).items()}
    held, tokens = grant_records(
        {k.decode(): v.decode() for k, v in client.hgetall(keys[3]).items()}
    )
    groups: dict[str, dict[str, list[str]]] = {}
    for member in client.zrange(keys[1], 0, -1):
        key, tenant, _, job = member.decode().split("\0")
        groups.setdefault(key, {}).setdefault(tenant, []).append(job)
    live = sorted(f[2:] for f in raw if f.startswith("l:"))
    tags = {}
    for key in KEYS:
        for which in ("s", "f"):
            got = client.zrange(f"{keys[0]}:{which}:{key}", 0, -1, withscores=True)
            if got:
                tags[(key, which)] = {t.decode(): float(v) for t, v in got}
    return {
        "keys": {
            k: (int(raw.get(f"u:{k}", 0)), int(raw.get(f"o:{k}", 0)), int(raw[f"l:{k}"]))
            for k in live
        },
        "refs": {k: int(raw[f"r:{k}"]) for k in live},
        "vtime": {k: float(raw.get(f"v:{k}", 0)) for k in live},
        "groups": groups,
        "tags": tags,
        "held": {job: f"{token}\t{grant}" for job, (token, grant) in held.items()},
        "offered": {f[2:]: v for f, v in raw.items() if f.startswith("w:")},
        "parked": {
            f[2:]: tuple(v.split("\t")[i] for i in (0, 3))
            for f, v in raw.items()
            if f.startswith("p:")
        },
        "counters": (tokens, int(raw.get("wakes", 0)), int(raw.get("moves", 0))),
    }


def _model_state(thr: Throttles) -> dict[str, Any]:
    stats = thr.statistics()
    refs: Counter[str] = Counter()
    for job in JOBS:
        refs.update(thr.holds(job) or thr.wants(job) or thr.offered(job) or ())
    tags = {}
    for s in stats.keys:
        for which, got in (("s", thr.start_tags(s.key)), ("f", thr.finish_tags(s.key))):
            if got:
                tags[(s.key, which)] = got
    parked = {}
    for j in JOBS:
        waiter = thr.waiter(j)
        if waiter is not None:
            parked[j] = (waiter[0], waiter[3])
    return {
        "keys": {s.key: (s.in_use, s.offers, s.limit) for s in stats.keys},
        "refs": dict(refs),
        "vtime": {s.key: thr.vtime(s.key) for s in stats.keys},
        "groups": {
            s.key: {t: list(g) for t, g in thr.groups(s.key).items()}
            for s in stats.keys
            if s.waiters
        },
        "tags": tags,
        "held": {
            j: "\t".join([str(thr.token(j)), "", *(thr.holds(j) or ())])
            for j in JOBS
            if thr.holds(j) is not None
        },
        "offered": {j: "\t".join(thr.offered(j) or ()) for j in JOBS if thr.offered(j)},
        "parked": parked,
        "counters": (stats.acquired, stats.wakes, stats.moves),
    }


def _wakes(reply: list[Any]) -> list[tuple[str, str]]:
    return [(w[0].decode(), w[1].decode()) for w in reply]


class _Run:
    """One run's policy side: the model, its weights, the tokens and waiters' specs."""

    def __init__(self) -> None:
        self.weights: dict[str, float] = {}
        self.thr = Throttles(self.weights)
        self.seq = 0
        self.tokens: dict[str, list[int]] = {}  # job -> every token it was granted
        self.spec: dict[str, tuple[int, int, str, float]] = {}  # prio, seq, tenant, charge

    def acquire(self, script: Any, keys: list[str], op: tuple[Any, ...]) -> Any:
        _, job, limits, prio, tenant, charge = op
        thr = self.thr
        if thr.offered(job) is not None:
            prio, seq, tenant, charge = self.spec[job]  # a woken job keeps its own
        else:
            self.seq += 1
            seq = self.seq
            self.spec[job] = (prio, seq, tenant, charge)
        result = thr.try_acquire(job, limits, prio, seq, tenant=tenant, charge=charge)
        pairs = json.dumps([[k, v] for k, v in sorted(limits.items())])
        token, woken = script(keys=keys, args=["acquire", job, pairs, prio, seq, tenant, charge])
        want = result.token if isinstance(result, Acquired) else 0
        assert int(token) == want, (op, result)
        if want:
            self.tokens.setdefault(job, []).append(want)
        return woken, list(result.wakes)


@settings(max_examples=200, deadline=None)
@given(ops=operations)
def test_lua_throttle_agrees_with_policy(
    lua: tuple[redis.Redis, Any], ops: list[tuple[Any, ...]]
) -> None:
    client, script = lua
    tag = "{thr" + secrets.token_hex(4) + "}"
    keys = [f"{tag}:thr", f"{tag}:thr:wait", f"{tag}:weights", f"{tag}:records"]
    run = _Run()
    thr = run.thr
    try:
        for op in ops:
            expected: list[Wake] = []
            if op[0] == "acquire":
                if thr.holds(op[1]) is not None or thr.parked_on(op[1]) is not None:
                    continue  # a job is dispatched once at a time (the store guarantees it)
                woken, expected = run.acquire(script, keys, op)
            elif op[0] == "release":
                _, job, which = op
                granted = run.tokens.get(job, [])
                token = granted[-1 - which] if which < len(granted) else 0
                expected = thr.release(job, token)
                _, woken = script(keys=keys, args=["release", job, token])
            elif op[0] == "cancel":
                _, job = op
                waited = thr.parked_on(job) is not None or thr.offered(job) is not None
                done, woken = script(keys=keys, args=["cancel", job])
                expected = thr.cancel(job)
                assert int(done) == int(waited)
            else:
                _, tenant, weight = op
                if weight is None:
                    run.weights.pop(tenant, None)
                    client.hdel(keys[2], tenant)
                else:
                    run.weights[tenant] = weight
                    client.hset(keys[2], tenant, weight)
                continue
            assert _wakes(woken) == [(w.job_id, w.key) for w in expected], op
            assert _state(client, keys) == _model_state(thr), op
    finally:
        client.delete(*keys, *(f"{keys[0]}:{w}:{k}" for k in KEYS for w in ("s", "f")))
