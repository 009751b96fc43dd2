"""Global keys (``fairlane.policy.globalkeys``): never over the limit, fair by weight.

The safety run drives shards that start and end jobs against their parts while
balancers run passes step by step, interleaved at random with everything else; a
balancer may die at any step (its remaining orders are never sent, or are sent late)
and a new one starts with the next epoch, and workers die (their jobs' slots are freed
later by a sweep). After every operation: the jobs running on the key in all shards
together are at most its limit, and the parts held sum to at most 1.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairlane.policy.globalkeys import (
    EPSILON,
    KeyReport,
    ShardParts,
    held,
    is_tenant_key,
    raises,
    slots_of,
    targets,
)


def test_tenant_keys_stay_local() -> None:
    assert is_tenant_key("tenant:acme")
    assert is_tenant_key("lane:heavy:tenant:acme")
    assert not is_tenant_key("model:big")
    assert not is_tenant_key("lane:heavy")
    assert not is_tenant_key("lane:a:b:tenant:x")
    assert not is_tenant_key("user:tenant:x")


def _pass(shards: list[ShardParts], epoch: int, rng: random.Random) -> Iterator[None]:
    """One balancer pass, a step per yield (each step one call to one shard): a pass
    left unfinished is a balancer that died, one resumed late a balancer that stalled
    with its orders computed and not yet sent."""
    reports: list[KeyReport] = []
    for s in shards:
        r = s.report(epoch)
        if r is None:
            return
        # the waiters a shard would report: demand that varies with the run
        reports.append(KeyReport(r.part, r.used, r.limit, rng.choice([0, 0, 1, 5]), 1.0, True))
        yield
    wanted = targets(reports)
    holding = [held(r) for r in reports]
    for i, s in enumerate(shards):
        if wanted[i] < reports[i].part - EPSILON:
            answer = s.order(epoch, wanted[i])
            if answer is None:
                return
            holding[i] = answer
            yield
    up = {i: wanted[i] for i in range(len(shards)) if wanted[i] > holding[i] + EPSILON}
    for i, part in raises(up, holding).items():
        if shards[i].order(epoch, part) is None:
            return
        yield


def _run(seed: int, steps: int) -> tuple[int, int]:
    rng = random.Random(seed)
    limit = rng.randint(1, 12)
    shards = [ShardParts(limit) for _ in range(rng.randint(2, 5))]
    epoch = 0
    balancers: list[Iterator[None]] = []
    starts = 0
    peak = 0
    for _ in range(steps):
        roll = rng.random()
        shard = rng.randrange(len(shards))
        if roll < 0.35:
            starts += shards[shard].start()
        elif roll < 0.6:
            if shards[shard].used > 0:
                shards[shard].end()
        elif roll < 0.63 or not balancers:
            epoch += 1
            balancers.append(_pass(shards, epoch, rng))
        elif roll < 0.64:
            balancers.pop(rng.randrange(len(balancers)))  # a balancer dies
        else:
            b = balancers[rng.randrange(len(balancers))]
            if next(b, StopIteration) is StopIteration:
                balancers.remove(b)
        running = sum(s.used for s in shards)
        assert running <= limit, (seed, running, limit)
        assert sum(max(s.part, s.used / limit) for s in shards) <= 1 + EPSILON
        peak = max(peak, running)
    return starts, peak


def test_a_million_operations_never_run_over_the_limit() -> None:
    starts = 0
    for seed in range(20):
        got, _ = _run(seed, 50_000)
        starts += got
    # the run did dispatch: a protocol that never raised a part would pass vacuously
    assert starts > 100_000


def test_a_late_raise_of_an_older_epoch_is_refused() -> None:
    shard = ShardParts(4)
    assert shard.report(2) is not None
    assert shard.order(1, 1.0) is None
    assert shard.part == 0.0
    assert shard.order(2, 0.5) == 0.5


@given(
    st.lists(
        st.tuples(st.integers(0, 10), st.integers(0, 30), st.floats(0.1, 5.0), st.booleans()),
        min_size=1,
        max_size=6,
    ),
    st.integers(1, 40),
)
@settings(max_examples=300, deadline=None)
def test_slot_targets_fit_the_limit_and_serve_the_waiting(
    shards: list[tuple[int, int, float, bool]], limit: int
) -> None:
    reports = [
        KeyReport(0.0, min(used, limit), limit, waiting, weight, active)
        for used, waiting, weight, active in shards
    ]
    parts = targets(reports)
    slots = [slots_of(p, limit) for p in parts]
    assert sum(slots) <= limit
    demand = sum(r.used + r.waiting for r in reports)
    # no capacity idles while someone waits for it
    assert sum(slots) >= min(limit, demand)
    for r, s in zip(reports, slots, strict=True):
        if r.waiting == 0 and not r.active and r.used == 0:
            assert s == 0


@pytest.mark.parametrize(
    ("weights", "expected"),
    [((1.0, 4.0), (0.2, 0.8)), ((5.0, 3.0, 2.0), (0.5, 0.3, 0.2))],
)
def test_backlogged_shards_share_by_waiting_weight(
    weights: tuple[float, ...], expected: tuple[float, ...]
) -> None:
    limit = 100
    reports = [KeyReport(0.0, 0, limit, 1000, w, True) for w in weights]
    parts = targets(reports)
    for got, want in zip(parts, expected, strict=True):
        assert abs(got - want) <= 1 / limit
    rate_parts = targets([KeyReport(0.0, 0, None, 10, w, True) for w in weights])
    for got, want in zip(rate_parts, expected, strict=True):
        assert abs(got - want) <= EPSILON


def test_demand_on_one_shard_takes_the_whole_key() -> None:
    limit = 4
    parts = targets(
        [
            KeyReport(0.0, 0, limit, 50, 1.0, True),
            KeyReport(0.5, 0, limit, 0, 0.0, False),
            KeyReport(0.5, 0, limit, 0, 0.0, False),
        ]
    )
    assert [slots_of(p, limit) for p in parts] == [4, 0, 0]


def test_raises_stay_within_what_is_free() -> None:
    assert raises({1: 0.7, 2: 0.5}, [0.5, 0.0, 0.0]) == {1: 0.5}
    assert raises({0: 0.3}, [0.0, 0.6, 0.2]) == pytest.approx({0: 0.2})
