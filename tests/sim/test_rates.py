"""Rate keys in the simulator: the window bound, tenant-fair shares of a key's tokens,
refunds and debts, pushback, the ``upstream-429`` comparison, and the fast path
(``fairlane.sim.rates.FairRateKeys``) against the naive model of the rules in
``tests/sim/naive_rates.py``.

Every bound comes from the key's own parameters (``limit``, ``per``, ``burst``) or the
rate contract's guarantee, never from an earlier run; counts, not wall time. Each run
is on the virtual clock, so "in any window of ``per``" is checked on every take the
key made (its ledger of ``(ms, tokens, tenant)``, refunds negative).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairlane.config.settings import ConfigError
from fairlane.policy.rates import MAX_PUSHBACKS, Adaptive, Rate
from fairlane.sim import find_scenario, parse_scenario, run
from fairlane.sim.engine import simulate
from fairlane.sim.metrics import Raw, VariantResult
from fairlane.sim.rates import FairRateKeys
from fairlane.sim.variants import parse_variant, resolve
from fairlane.sim.world import UNLIMITED
from tests.sim.naive_rates import NaiveRates, RJob


def _raw(data: dict[str, Any], variant: str = "fair") -> Raw:
    scenario = parse_scenario(data)
    return simulate(scenario, resolve(parse_variant(variant), scenario))


def _keys(raw: Raw) -> FairRateKeys:
    assert raw.rate_keys is not None
    return raw.rate_keys


def _key(raw: Raw, name: str) -> int:
    return raw.world.key_names.index(name)


def _most_in_window(ledger: list[tuple[int, float, int]], per_ms: int) -> float:
    """The most tokens, net of refunds, in any closed window of ``per_ms`` ms."""
    best, total, lo = 0.0, 0.0, 0
    for at, tokens, _ in ledger:  # the ledger is in time order
        total += tokens
        while ledger[lo][0] < at - per_ms:
            total -= ledger[lo][1]
            lo += 1
        best = max(best, total)
    return best


def _flood(name: str, jobs: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "bursts": [[0, jobs, 0]], "size": 0.01, "keys": ["model:x"]} | extra


def test_a_key_admits_at_most_limit_plus_burst_in_any_window_and_its_rate_long_run() -> None:
    limit, per, burst = 50, 1.0, 10
    data = {
        "seed": 3,
        "lanes": {"x": {"slots": 64}},
        "keys": [{"name": "model:x", "rate": {"limit": limit, "per": per, "burst": burst}}],
        "tenants": [_flood("a", 3000), _flood("b", 3000, size=0.2)],
    }
    raw = _raw(data)
    ledger = _keys(raw).ledger[_key(raw, "model:x")]
    assert len(ledger) == 6000 and sum(raw.completed) == 6000
    assert _most_in_window(ledger, int(per * 1000)) <= limit + burst
    # backlogged from 0: the last take is due at (6000 - burst) / limit seconds
    last = ledger[-1][0] / 1000
    assert last == pytest.approx((6000 - burst) / (limit / per), rel=0.02)


def test_the_window_bound_holds_net_of_refunds_and_debts() -> None:
    """A units key whose jobs use less or more than they declare: the takes net of the
    refunds in any window stay within ``limit + burst``."""
    limit, burst = 2000, 1000
    data = {
        "seed": 4,
        "lanes": {"x": {"slots": 32}},
        "keys": [{"name": "model:x",
                  "rate": {"limit": limit, "per": 1, "burst": burst, "cost": "units"}}],
        "tenants": [
            _flood("small", 2000, units=100, used={"dist": "exponential", "mean": 60}),
            _flood("large", 2000, units=100, used={"dist": "exponential", "mean": 160}),
        ],
    }  # fmt: skip
    raw = _raw(data)
    keys = _keys(raw)
    k = _key(raw, "model:x")
    assert keys.refunded[k] > 0 and keys.debt[k] > 0
    assert any(tokens < 0 for _, tokens, _ in keys.ledger[k])
    assert _most_in_window(keys.ledger[k], 1000) <= limit + burst + 1e-6


@pytest.mark.parametrize(("weights", "cost"), [((1, 1, 1), "jobs"), ((2, 1, 1), "units")])
def test_tenants_backlogged_on_a_key_share_its_tokens_by_weight(
    weights: tuple[int, int, int], cost: str
) -> None:
    """Three tenants backlogged on one rate key (the lane wide enough for all): each gets
    ``w / sum(w)`` of the key's tokens within 2 points, whatever each job costs."""
    units = (1.0, 1.0, 1.0) if cost == "jobs" else (3.0, 1.0, 2.0)
    data = {
        "seed": 9,
        "lanes": {"x": {"slots": 64}},
        "keys": [{"name": "model:x", "rate": {"limit": 30, "per": 1, "burst": 5, "cost": cost}}],
        "tenants": [
            _flood(f"t{i}", 3000, weight=w, units=u)
            for i, (w, u) in enumerate(zip(weights, units, strict=True))
        ],
    }
    raw = _raw(data)
    ledger = _keys(raw).ledger[_key(raw, "model:x")]
    window = [(tokens, t) for at, tokens, t in ledger if 1000 <= at < 40_000]
    total = sum(tokens for tokens, _ in window)
    for t, w in enumerate(weights):
        share = sum(tokens for tokens, u in window if u == t) / total
        assert share == pytest.approx(w / sum(weights), abs=0.02)


def _liar(units: float, used: float) -> dict[str, Any]:
    return {
        "seed": 2,
        "sim": {"until": 20},
        "lanes": {"x": {"slots": 8}},
        "keys": [{"name": "model:x", "limit": 1,
                  "rate": {"limit": 1000, "per": 1, "burst": 1000, "cost": "units"}}],
        "tenants": [_flood("t", 5000, units=units, used=used)],
    }  # fmt: skip


def test_a_tenant_declaring_tiny_estimates_is_held_to_what_its_jobs_used() -> None:
    """Declaring 100 units for jobs that use 1,000 on a key of 1,000 a second: each ended
    job leaves a debt of 900 that the key pays back before it admits more, so in 20 s
    it completes what 1,000 a second buys of 1,000-unit jobs (not 10x that)."""
    raw = _raw(_liar(100, 1000))
    done = sum(raw.completed)
    assert (1000 * 20 - 1000) / 1000 <= done <= (1000 + 1000 * 20) / 1000 + 1
    keys = _keys(raw)
    k = _key(raw, "model:x")
    assert keys.debt[k] == pytest.approx(900 * done)
    assert keys.refunded[k] == 0


def test_a_tenant_declaring_too_much_gets_the_difference_back() -> None:
    """Declaring 1,000 units for jobs that use 100: each ended job refunds 900, so the
    key admits about what 1,000 a second buys of 100-unit jobs."""
    raw = _raw(_liar(1000, 100))
    done = sum(raw.completed)
    assert done >= 0.9 * 1000 * 20 / 100
    keys = _keys(raw)
    assert keys.refunded[_key(raw, "model:x")] > 0.9 * 900 * done
    assert keys.debt[_key(raw, "model:x")] == 0


def _pushback(variant: str) -> Raw:
    """A key whose rate (20 a second) is 4x its upstream's capacity, one attempt each."""
    data = {
        "seed": 5,
        "lanes": {"x": {"slots": 16}},
        "retry": {"max_attempts": 1, "base_seconds": 1, "max_seconds": 2},
        "keys": [{"name": "model:x", "rate": {"limit": 20, "per": 1, "burst": 5},
                  "upstream": {"rps": 5, "rps_burst": 5, "retry_step": 0.5}}],
        "tenants": [{"name": "t", "rate": 4, "stop": 30, "size": 0.2, "keys": ["model:x"]}],
    }  # fmt: skip
    return _raw(data, variant)


def test_a_pushback_pauses_the_key_for_everyone_and_costs_no_attempt() -> None:
    raw = _pushback("fair")
    keys = _keys(raw)
    k = _key(raw, "model:x")
    assert sum(raw.pushed) > 0 and keys.pushbacks[k] == sum(raw.pushed)
    # one attempt each, and none spent on a 429: every job completed
    assert sum(raw.failed) == 0 and sum(raw.retried) == 0
    assert sum(raw.completed) == sum(raw.submitted) and raw.unfinished == 0
    # while paused the key took nothing, for any tenant
    takes = [at for at, tokens, _ in keys.ledger[k] if tokens > 0]
    for start, until in keys.pauses[k]:
        assert until > start
        assert not [at for at in takes if start < at < until]
    # the same arrivals without the rate key: each 429 spends the only attempt
    bare = _pushback("rate=none")
    assert bare.rate_keys is None
    assert sum(bare.failed) > 0
    assert sum(bare.failed) + sum(bare.completed) == sum(bare.submitted)


def test_past_max_pushbacks_a_pushback_is_a_failed_attempt() -> None:
    """An upstream that only admits a call every 60 s: a job pushed back more than
    ``MAX_PUSHBACKS`` times spends its (single) attempt on the next 429."""
    data = {
        "seed": 1,
        "lanes": {"x": {"slots": 64}},
        "retry": {"max_attempts": 1},
        "keys": [{"name": "model:x", "rate": {"limit": 100, "per": 1, "burst": 50},
                  "upstream": {"rps": 1 / 60, "rps_burst": 1, "retry_step": 0}}],
        "tenants": [_flood("t", 30)],
    }  # fmt: skip
    raw = _raw(data)
    assert sum(raw.failed) > 0
    assert sum(raw.pushed) <= MAX_PUSHBACKS * sum(raw.submitted)
    assert sum(raw.failed) + sum(raw.completed) == 30


def test_adaptive_limit_is_cut_on_pushback_and_stays_within_its_bounds() -> None:
    data = {
        "seed": 6,
        "sim": {"window": [0, 60]},
        "lanes": {"x": {"slots": 64}},
        "keys": [{"name": "model:x", "adaptive": {"max": 60, "min": 2},
                  "upstream": {"rps": 10, "rps_burst": 10}}],
        "tenants": [{"name": "t", "rate": 15, "stop": 60, "size": 1.0, "keys": ["model:x"]}],
    }  # fmt: skip
    raw = _raw(data)
    keys = _keys(raw)
    k = _key(raw, "model:x")
    assert keys.cuts[k] > 0
    assert 2 <= keys.low[k] < 60
    assert keys.cuts[k] <= len(keys.pauses[k])  # at most one cut per pause episode


def _upstream(results: tuple[VariantResult, ...], label: str) -> Any:
    return next(r for r in results if r.label == label).upstreams[0]


def test_upstream_429_static_rate_sees_fewer_429s_than_no_rate_key() -> None:
    scenario = find_scenario("upstream-429")
    results = run(scenario, ["rate=none", "rate=static", "rate=adaptive"], scale=0.5).results
    none, static = _upstream(results, "rate=none"), _upstream(results, "rate=static")
    adaptive = _upstream(results, "rate=adaptive")
    assert none.calls > 0 and static.calls > 0
    assert static.throttled < none.throttled
    assert adaptive.throttled < none.throttled
    assert static.throttled <= 0.01 * static.calls
    assert static.failed == 0 and none.retried > 0
    assert static.jain is not None and static.jain >= 0.99
    submitted = {r.label: r.submitted for r in results}
    assert len(set(submitted.values())) == 1  # the same arrivals


@pytest.mark.parametrize(
    ("key", "where", "message"),
    [
        (
            {"name": "m", "rate": {"limit": 10, "burst": 5, "cost": "units"}},
            "tenants[0].keys[0]",
            "could never fit",
        ),
        ({"name": "m", "limit": 2, "adaptive": {"max": 4}}, "keys[0].adaptive", "not both"),
        ({"name": "m", "limit": 2, "upstream": {"retry_step": 1}}, "keys[0].upstream", "needs rps"),
        ({"name": "m", "rate": {"limit": 0}}, "keys[0].rate.limit", "> 0"),
        ({"name": "m", "rate": {"limit": 5, "cost": "tokens"}}, "keys[0].rate.cost", "jobs or"),
    ],
)
def test_bad_rate_keys_name_the_file_and_key(key: dict[str, Any], where: str, message: str) -> None:
    data = {
        "lanes": {"x": {"slots": 2}},
        "keys": [key],
        "tenants": [{"name": "t", "bursts": [[0, 1, 0]], "units": 6, "keys": ["m"]}],
    }
    with pytest.raises(ConfigError, match=message) as info:
        parse_scenario(data, source="s.toml")
    assert f"s.toml: {where}:" in str(info.value)


def test_rate_variants_are_checked_against_the_scenario() -> None:
    scenario = find_scenario("shared-key")
    with pytest.raises(ValueError, match="no \\[\\[keys\\]\\] has a rate"):
        resolve(parse_variant("rate=static"), scenario)
    rated = find_scenario("upstream-429")
    with pytest.raises(ValueError, match="tenant-fair only"):
        resolve(parse_variant("waiters=fifo"), rated)
    assert resolve(parse_variant("waiters=fifo+rate=none"), rated).rate == "none"
    with pytest.raises(ValueError, match="rate must be one of"):
        parse_variant("rate=fast")


# -- the fast path against the naive model of the rules ---------------------------------

_NAMES = ["api:z", "db:y", "model:x", "tenant:a"]
_TENANTS = ("a", "b", "c", "d")
_OF = {"a": ("tenant:a",), "b": ("model:x",), "c": ("db:y", "model:x"),
       "d": ("api:z", "model:x")}  # fmt: skip
_WEIGHT = {"a": 1.0, "b": 2.0, "c": 1.0, "d": 1.0}
_UNITS = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 1.0}
_CHARGE = {"a": 1.0, "b": 0.5, "c": 2.0, "d": 1.0}

rate_ops = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.integers(0, 60), st.integers(0, 4)),
        st.tuples(st.just("dispatch"), st.integers(0, 60), st.just(0)),
        st.tuples(st.just("end"), st.integers(0, 60), st.integers(0, 2)),
        st.tuples(st.just("tick"), st.integers(1, 25), st.just(0)),
    ),
    max_size=90,
)


@settings(max_examples=300, deadline=None)
@given(ops=rate_ops, high=st.integers(1, 4), burst=st.sampled_from([3.0, 4.0, 8.0]))
def test_rate_keys_agree_with_the_rules(
    ops: list[tuple[str, int, int]], high: int, burst: float
) -> None:
    """FairRateKeys against the naive model: the same admissions, wakes in the same order,
    the same slots, offers, limits, buckets, dues and adaptive values after every
    operation -- arrivals, woken jobs dispatched, attempts ending (used more or less
    than declared, failed, or pushed back on one of their keys) and time passing."""
    _agree(ops, high, burst)


def test_rate_keys_agree_with_the_rules_on_many_seeded_cases() -> None:
    """The same on long uniform random runs, which reach deep states (offers lost to a
    cut, pauses over pauses, several tenants' groups on one key) more often."""
    rng = random.Random(17)
    for _ in range(400):
        ops: list[tuple[str, int, int]] = []
        for _ in range(rng.randint(20, 120)):
            op = rng.choice(["arrive", "arrive", "dispatch", "end", "tick"])
            x = rng.randint(1, 25) if op == "tick" else rng.randint(0, 60)
            y = rng.randint(0, 4) if op == "arrive" else rng.randint(0, 2) if op == "end" else 0
            ops.append((op, x, y))
        _agree(ops, rng.randint(1, 4), rng.choice([3.0, 4.0, 8.0]))


def _agree(ops: list[tuple[str, int, int]], high: int, burst: float) -> None:  # noqa: C901, PLR0912, PLR0915 -- one driver of both models, op by op
    index = {k: i for i, k in enumerate(_NAMES)}
    rates = {
        "api:z": Rate(2, per=0.01),
        "db:y": Rate(1, per=0.005),
        "model:x": Rate(10, per=0.01, burst=burst, cost="units"),
    }
    adaptive = {"model:x": Adaptive(high, 1)}
    limits = {"api:z": UNLIMITED, "db:y": 1, "model:x": high, "tenant:a": 0}
    keys_of = [tuple(index[k] for k in _OF[t]) for t in _TENANTS]
    fast = FairRateKeys(
        [limits[k] for k in _NAMES], keys_of, [[] for _ in _TENANTS], names=_TENANTS,
        key_names=_NAMES, weights=[_WEIGHT[t] for t in _TENANTS],
        cost_of=lambda job: _CHARGE[_TENANTS[job[1]]],
        rates=[rates.get(k) for k in _NAMES], adaptive=[adaptive.get(k) for k in _NAMES],
        units=[_UNITS[t] for t in _TENANTS],
    )  # fmt: skip
    naive = NaiveRates(limits, rates, adaptive)
    jobs: dict[int, tuple[list[Any], RJob]] = {}
    held: list[int] = []
    woken: list[int] = []
    out: list[Any] = []
    now = 0

    def woke(got: list[RJob]) -> None:
        assert [j[0] for j in out] == [j.id for j in got]
        woken.extend(j[0] for j in out)
        out.clear()

    for seq, (op, x, y) in enumerate(ops):
        fast.at(now)
        naive.now = now
        if op == "tick":
            now += x
            while True:
                due = fast.next_due()
                fired = naive.fire(now)
                assert (due if due is not None and due <= now else None) == (
                    fired[0] if fired else None
                )
                if fired is None:
                    break
                fast.at(fired[0])
                assert fast.fire(out) == fired[0]
                woke(fired[1])
        elif op == "end":
            if not held:
                continue
            i = held.pop(x % len(held))
            job, rjob = jobs[i]
            push, until = -1, 0
            if y == 2:
                push, until = index[rjob.keys[x % len(rjob.keys)]], now + 1 + x % 30
            used = None if y else _UNITS[rjob.tenant] * (0.5 if x % 2 else 2.0)
            cut = fast.end(job, out, used=used, succeeded=y == 0, push=push, until=until)
            expected = naive.end(rjob, used=used, succeeded=y == 0,
                                 push=_NAMES[push] if push >= 0 else None, until=until)  # fmt: skip
            assert cut == expected[0]
            woke(expected[1])
        else:
            if op == "dispatch":
                if not woken:
                    continue
                i = woken.pop(x % len(woken))
            else:
                t = _TENANTS[x % 4]
                i = seq
                jobs[i] = ([i, x % 4, 0.0, 1.0, -1.0, 0, 0.0, 0, None],
                           RJob(i, t, i, _OF[t], _WEIGHT[t], _CHARGE[t], _UNITS[t]))  # fmt: skip
                if t == "a":  # a's own key: its limit comes with each dispatch
                    fast.set_limit(index["tenant:a"], y, out)
                    woke(naive.set_limit("tenant:a", y))
            admitted = fast.take(jobs[i][0], out)
            got, others = naive.take(jobs[i][1])
            assert admitted == got
            woke(others)
            if admitted:
                held.append(i)
        for k, name in enumerate(_NAMES):
            assert fast.in_use[k] == naive.in_use[name]
            assert fast.offers[k] == naive.offers[name]
            assert fast.limit[k] == naive.limits[name]
            assert fast.bucket[k] == naive.bucket[name]
            assert fast.due[k] == naive.due.get(name)
            assert fast.waiting(k) == len(naive.waiting[name])
        assert fast.value[index["model:x"]] == naive.value["model:x"]
