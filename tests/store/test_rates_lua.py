"""Rate keys in Lua (``lua/rates.lua`` with ``lua/throttle.lua``) against ``Throttles``.

``thr_acquire``, ``thr_release``, ``thr_cancel``, ``rates.thr_push_back``,
``rates.thr_wake_due`` and ``rates.thr_next_due`` run alone, as a script on the real
server with the clock passed in (the driver's ``now_ms`` is that clock too), through
random sequences on a simulated clock: arrivals of three tenants naming rate keys
(counting jobs or units, two rates taking turns on one key), an adaptive key and a fixed
one, with random rate costs; woken jobs converting their offers; completions reporting
what they used (refunds and debts), with and without success; pushbacks; cancellations
of waiters and of woken jobs; and ``wake_due`` whenever a key is due, as fetch runs it.
After every operation both twins must agree on what it returned (grant tokens, parked
keys, wakes in order, whether a pushback applied) and on the state left: use, offers,
limits, references, rates and adaptive bounds in force, pauses, tenant groups and tags,
virtual times, buckets (tokens and stamps, bit for bit), adaptive values, rate costs,
due times and counters.

Not driven (known to differ, reported to the Lua's owner): a key named as adaptive by
one arrival and with a fixed limit by another; a rate whose burst is lowered under a
waiting job's cost.
"""

from __future__ import annotations

import json
import random
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from fairlane.policy.rates import Adaptive, Rate
from fairlane.policy.throttle import Acquired, Parked, Throttles, Wake
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
local op = ARGV[1]
CLOCK.now = tonumber(ARGV[2])
local now = CLOCK.now
if op == 'acquire' then
  local grant, wakes, blocker = thr_acquire(KEYS, ARGV[3], cjson.decode(ARGV[4]), ARGV[5],
    ARGV[6], ARGV[7], ARGV[8], cjson.decode(ARGV[9]), ARGV[10], now)
  return {keep_grant(ARGV[3], grant), wakes, blocker or ''}
elseif op == 'release' then
  local used = ARGV[5] ~= '' and ARGV[5] or nil
  local grant = take_grant(ARGV[3], ARGV[4])
  if not grant then
    return {0, {}, ''}
  end
  return {0, thr_release(KEYS, grant, now, used, ARGV[6] == '1'), ''}
elseif op == 'cancel' then
  local done, wakes = thr_cancel(KEYS, ARGV[3], now)
  return {done and 1 or 0, wakes, ''}
elseif op == 'push' then
  local grant = held_grant(ARGV[3], ARGV[4])
  local ok = grant and throttle.thr_push_back(KEYS, grant, ARGV[5], tonumber(ARGV[6]), now, 't')
  return {ok and 1 or 0, {}, ''}
elseif op == 'due' then
  return {0, throttle.thr_wake_due(KEYS, now), ''}
end
return {0, {}, tostring(throttle.thr_next_due(KEYS) or '')}
end
"""


TENANTS = ("x", "y", "z")
WEIGHTS = {"x": 2.0}
RATE_KEYS = ("a", "b", "u:x")
ALL_KEYS = (*RATE_KEYS, "c", "d")
A_RATES = (Rate(20, per=1.0, burst=40, cost="units"), Rate(30, per=0.5, burst=45, cost="units"))
B_RATE = Rate(5, per=0.2, burst=2)
U_RATE = Rate(8, per=0.5, burst=40, cost="units")
KEY_SETS = (("a",), ("b",), ("a", "b"), ("a", "u:x"), ("b", "c"), ("a", "d"), ("c",), ("d",))
COSTS = (0.0, 0.5, 1.0, 3.0, 12.0, 40.0)  # at most every units key's burst


def _script(mode: str) -> str:
    core = (
        "local core = {THR = 1, THRW = 2, WEIGHTS = 3}\n"
        "function core.memoised(f) return f end\n"
        "function core.prefix(keys) return string.sub(keys[1], 1, #keys[1] - 3) end\n"
        "local CLOCK = {now = 0}\n"
        "function core.now_ms() return CLOCK.now end\n" + CORE_CHUNKED
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
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client, client.register_script(_script(request.param))
    finally:
        client.close()


def _f(raw: str | None) -> float | None:
    return None if raw is None else float(raw)


class Twins:
    """One run: the policy, the script, and what the driver remembers of its jobs."""

    def __init__(self, client: Any, script: Any, seed: int) -> None:
        self.client: Any = client  # decoding replies to str
        self.script = script
        self.rng = random.Random(seed)
        tag = "{rt" + secrets.token_hex(4) + "}"
        self.keys = [f"{tag}:thr", f"{tag}:thr:wait", f"{tag}:weights", f"{tag}:records"]
        self.prefix = f"{tag}:"
        client.hset(self.keys[2], mapping=WEIGHTS)
        self.thr = Throttles(WEIGHTS)
        self.now = 0
        self.seq = 0
        self.jobs: dict[str, tuple[int, int, str, float, float]] = {}  # prio, seq, tenant..
        self.tokens: dict[str, int] = {}
        self.held: list[str] = []
        self.offered: list[str] = []
        self.log: list[tuple[Any, ...]] = []

    def call(self, *args: Any) -> list[Any]:
        reply: list[Any] = self.script(keys=self.keys, args=[args[0], self.now, *args[1:]])
        return reply

    def cleanup(self) -> None:
        c = self.client
        names = [*self.keys, f"{self.prefix}ratedue", f"{self.prefix}rates"]
        for key in ALL_KEYS:
            names += [f"{self.keys[0]}:s:{key}", f"{self.keys[0]}:f:{key}"]
            names.append(f"{self.prefix}rate:{key}")
        c.delete(*names)

    # -- operations -------------------------------------------------------------------

    def _wakes(self, reply: list[Any], expected: tuple[Wake, ...] | list[Wake]) -> None:
        got = [(w[0], w[1]) for w in reply]
        assert got == [(w.job_id, w.key) for w in expected], ("wakes", got, expected)
        self.offered.extend(w.job_id for w in expected)

    def _result(self, job: str, reply: list[Any], result: Acquired | Parked) -> None:
        if isinstance(result, Acquired):
            assert (int(reply[0]), reply[2]) == (result.token, ""), ("acquire", reply, result)
            self.tokens[job] = result.token
            self.held.append(job)
        else:
            assert (int(reply[0]), reply[2]) == (0, result.key), ("park", reply, result)
        self._wakes(reply[1], result.wakes)

    def arrive(self) -> None:
        rng = self.rng
        self.seq += 1
        job = f"j{self.seq}"
        names = rng.choice(KEY_SETS)
        limits: dict[str, int | Adaptive] = {}
        rates: dict[str, Rate] = {}
        for key in names:
            if key == "a":
                rates[key] = rng.choice(A_RATES)
            elif key == "b":
                rates[key] = B_RATE
            elif key == "u:x":
                rates[key] = U_RATE
            elif key == "c":
                limits[key] = Adaptive(rng.choice((4, 6)), rng.choice((1, 2)))
            else:
                limits[key] = rng.randint(1, 3)
        if "a" in names and rng.random() < 0.3:
            limits["a"] = rng.randint(1, 4)  # a key with a limit and a rate
        units = rng.choice(COSTS)
        prio, tenant = rng.randint(0, 2), rng.choice(TENANTS)
        charge = rng.choice((1.0, 0.5, 2.0))
        self.jobs[job] = (prio, self.seq, tenant, charge, units)
        self.log.append(("acquire", job, limits, rates, units, self.now))
        result = self.thr.try_acquire(
            job, limits, prio, self.seq, tenant=tenant, charge=charge, rates=rates,
            units=units, now=self.now,
        )  # fmt: skip
        lim = [
            [k, v.max, v.min] if isinstance(v, Adaptive) else [k, v]
            for k, v in sorted(limits.items())
        ]
        rl = [[k, r.limit, r.per_ms, r.capacity, int(r.units)] for k, r in sorted(rates.items())]
        reply = self.call("acquire", job, json.dumps(lim), prio, self.seq, tenant, charge,
                          json.dumps(rl), units)  # fmt: skip
        self._result(job, reply, result)

    def convert(self) -> None:
        job = self.offered.pop(self.rng.randrange(len(self.offered)))
        prio, seq, tenant, charge, units = self.jobs[job]
        self.log.append(("convert", job, self.now))
        result = self.thr.try_acquire(
            job, {}, prio, seq, tenant=tenant, charge=charge, units=units, now=self.now
        )
        reply = self.call("acquire", job, "[]", prio, seq, tenant, charge, "[]", units)
        self._result(job, reply, result)

    def complete(self) -> None:
        rng = self.rng
        job = self.held.pop(rng.randrange(len(self.held)))
        token = self.tokens[job]
        units = self.jobs[job][4]
        if rng.random() < 0.15:
            key = rng.choice([*(self.thr.holds(job) or ()), "zz"])
            until = self.now + rng.choice((0, 100, 2000))
            which = token if rng.random() < 0.9 else token + 1
            self.log.append(("push", job, key, until, self.now))
            applied = self.thr.holds(job) is not None and key in (self.thr.holds(job) or ())
            applied = applied and which == token
            self.thr.push_back(job, key, until, now=self.now, token=which)
            reply = self.call("push", job, which, key, until)
            assert int(reply[0]) == int(applied), ("push", reply)
        used = rng.choice((None, 0.0, units, units * 0.5, units * 3))
        ok = rng.random() < 0.7
        self.log.append(("release", job, used, ok, self.now))
        expected = self.thr.release(job, token, now=self.now, used=used, succeeded=ok)
        reply = self.call("release", job, token, "" if used is None else repr(used), int(ok))
        self._wakes(reply[1], expected)
        if rng.random() < 0.05:  # a late duplicate: fenced off in both
            assert self.thr.release(job, token, now=self.now) == []
            assert self.call("release", job, token, "", 0)[1] == []

    def cancel(self, job: str) -> None:
        self.log.append(("cancel", job, self.now))
        waited = self.thr.parked_on(job) is not None or self.thr.offered(job) is not None
        expected = self.thr.cancel(job, now=self.now)
        reply = self.call("cancel", job)
        assert int(reply[0]) == int(waited), ("cancel", reply)
        self._wakes(reply[1], expected)

    def step(self) -> None:
        rng = self.rng
        self.now += rng.choice((0, 0, 1, 3, 10, 40, 40, 250))
        due = self.thr.next_due()
        got = self.call("next")[2]
        assert (int(float(got)) if got else None) == due, ("next_due", got, due)
        if due is not None and due <= self.now:
            self.log.append(("wake_due", self.now))
            expected = self.thr.wake_due(self.now)
            self._wakes(self.call("due")[1], expected)
        roll = rng.random()
        if roll < 0.45:
            self.arrive()
        elif roll < 0.55 and self.offered:
            self.convert()
        elif roll < 0.8 and self.held:
            self.complete()
        elif roll < 0.87 and self.offered:
            self.cancel(self.offered.pop(rng.randrange(len(self.offered))))
        elif roll < 0.9:
            waiting = [j for k in ALL_KEYS for j in self.thr.waiters(k)]
            if waiting:
                self.cancel(rng.choice(waiting))

    # -- state ------------------------------------------------------------------------

    def lua_state(self) -> dict[str, Any]:
        c, thr_key = self.client, self.keys[0]
        raw = c.hgetall(thr_key)
        live = sorted(f[2:] for f in raw if f.startswith("l:"))
        groups: dict[str, dict[str, list[str]]] = {}
        for member in c.zrange(self.keys[1], 0, -1):
            key, tenant, _, job = member.split("\0")
            groups.setdefault(key, {}).setdefault(tenant, []).append(job)
        tags = {}
        for key in ALL_KEYS:
            for which in ("s", "f"):
                got = c.zrange(f"{thr_key}:{which}:{key}", 0, -1, withscores=True)
                if got:
                    tags[(key, which)] = dict(got)
        # a grant, as its job's record keeps it: rate cost (empty: none) and keys, and the
        # token the driver drew for it
        held, tokens = grant_records(c.hgetall(self.keys[3]))
        grants = {j: [token, *g.split("\t")] for j, (token, g) in held.items()}
        rated = {f[2:]: float(v) for f, v in raw.items() if f.startswith("c:")}
        assert not rated.keys() & grants.keys(), "a running job's rate cost left in the hash"
        rated.update({j: float(g[1]) for j, g in grants.items() if g[1]})
        buckets = {}
        for key in ALL_KEYS:
            h = c.hgetall(f"{self.prefix}rate:{key}")
            t, s = _f(h.get("t")), _f(h.get("s"))
            buckets[key] = (
                None if t is None or s is None else (t, int(s)),
                int(float(h.get("pu", 0))),
                _f(h.get("a")),
                tuple(round(float(h.get(f, 0)), 6) for f in ("ta", "tr", "td")),
                tuple(int(h.get(f, 0)) for f in ("pn", "wn", "wt")),
            )
        return {
            "keys": {
                k: tuple(int(raw.get(f"{f}:{k}", 0)) for f in ("l", "u", "o", "r")) for k in live
            },
            "rates": {k: raw[f"rp:{k}"] for k in live if f"rp:{k}" in raw},
            "adaptive": {k: raw[f"ad:{k}"] for k in live if f"ad:{k}" in raw},
            "vtime": {k: float(raw.get(f"v:{k}", 0)) for k in live},
            "groups": groups,
            "tags": tags,
            "held": {j: "\t".join([g[0], *g[2:]]) for j, g in grants.items()},
            "offered": {f[2:]: v for f, v in raw.items() if f.startswith("w:")},
            "parked": {
                f[2:]: tuple(v.split("\t")[i] for i in (0, 3))
                for f, v in raw.items()
                if f.startswith("p:")
            },
            "rated": rated,
            "buckets": buckets,
            "due": dict(c.zrange(f"{self.prefix}ratedue", 0, -1, withscores=True)),
            "counters": (tokens, *(int(raw.get(f, 0)) for f in ("wakes", "moves"))),
        }

    def model_state(self) -> dict[str, Any]:
        thr = self.thr
        stats = thr.statistics()
        live = [s.key for s in stats.keys]
        jobs = list(self.jobs)
        tags = {}
        for key in live:
            for which, got in (("s", thr.start_tags(key)), ("f", thr.finish_tags(key))):
                if got:
                    tags[(key, which)] = got
        buckets = {}
        for key in ALL_KEYS:
            b = thr.bucket(key)
            c = thr.rate_counters(key)
            buckets[key] = (
                None if b is None else (b.tokens, b.stamp),
                thr.paused_until(key),
                thr.adaptive_written(key),
                tuple(round(v, 6) for v in (c.taken, c.refunded, c.debts)),
                (c.pushbacks, c.woken, c.waited_ms),
            )
        rates = {}
        for key in live:
            r = thr.rate(key)
            if r is not None:
                rates[key] = f"{r.limit:.17g},{r.per_ms:.17g},{r.capacity:.17g},{int(r.units)}"
        adaptive = {}
        for key in live:
            spec = thr.adaptive_bounds(key)
            if spec is not None:
                adaptive[key] = f"{spec.max},{spec.min}"
        return {
            "keys": {s.key: (s.limit, s.in_use, s.offers, self._refs(s.key)) for s in stats.keys},
            "rates": rates,
            "adaptive": adaptive,
            "vtime": {k: thr.vtime(k) for k in live},
            "groups": {
                s.key: {t: list(g) for t, g in thr.groups(s.key).items()}
                for s in stats.keys
                if s.waiters
            },
            "tags": tags,
            "held": {
                j: "\t".join([str(thr.token(j)), *(thr.holds(j) or ())])
                for j in jobs
                if thr.holds(j) is not None
            },
            "offered": {j: "\t".join(thr.offered(j) or ()) for j in jobs if thr.offered(j)},
            "parked": {j: (w[0], w[3]) for j in jobs if (w := thr.waiter(j)) is not None},
            "rated": {j: thr.units(j) for j in jobs if thr.rated(j)},
            "buckets": buckets,
            "due": {k: float(d) for k in ALL_KEYS if (d := thr.due(k)) is not None},
            "counters": (stats.acquired, stats.wakes, stats.moves),
        }

    def _refs(self, key: str) -> int:
        thr = self.thr
        return sum(key in (thr.holds(j) or thr.wants(j) or thr.offered(j) or ()) for j in self.jobs)


@pytest.mark.parametrize("seed", range(8))
def test_lua_rates_agree_with_policy(lua: tuple[redis.Redis, Any], seed: int) -> None:
    client, script = lua
    run = Twins(client, script, seed)
    try:
        for i in range(400):
            run.step()
            lua_state, model = run.lua_state(), run.model_state()
            if lua_state != model:
                diff = {k: (lua_state[k], model[k]) for k in model if lua_state[k] != model[k]}
                pytest.fail(f"step {i}: lua != policy {diff}\nops: {run.log[-12:]}")
        stats = run.thr.statistics()
        assert stats.wakes > 20 and stats.parked > 50, stats
    finally:
        run.cleanup()
