"""A worker's slots between its shards by waiting weight (fairlane.policy.shardshare)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from fairlane.policy.shardshare import ShardShare, cap, entitlements, turn_key


def shares(
    weights: list[float], used: list[int], idle: frozenset[int] = frozenset()
) -> dict[object, ShardShare]:
    return {
        i: ShardShare(w, u, i not in idle)
        for i, (w, u) in enumerate(zip(weights, used, strict=True))
    }


def serve(concurrency: int, weights: list[float], used: list[int]) -> None:
    """Turns until no loop may take a free slot: the lowest ``turn_key`` asks first, for
    what its cap and the free slots allow (every shard backlogged, jobs one slot wide)."""
    while (free := concurrency - sum(used)) > 0:
        now = shares(weights, used)
        for k in sorted(now, key=lambda k: (turn_key(now[k]), k)):
            limit = cap(concurrency, now, k)
            ask = free if limit is None else min(free, limit)
            if ask > 0:
                used[int(str(k))] += ask
                break
        else:
            return


def test_alone_a_shard_is_not_capped() -> None:
    assert cap(10, shares([1.0, 4.0], [0, 0], idle=frozenset({1})), 0) is None
    assert cap(10, shares([1.0, 0.0], [0, 3]), 0) is None


def test_parts_follow_the_waiting_weight() -> None:
    parts = entitlements(10, shares([1.0, 4.0], [0, 0]))
    assert parts == {0: 2.0, 1: 8.0}
    assert cap(10, shares([1.0, 4.0], [0, 0]), 0) == 2
    assert cap(10, shares([1.0, 4.0], [2, 5]), 0) == 0
    assert cap(10, shares([1.0, 4.0], [2, 5]), 1) == 3


def test_a_shard_with_nothing_waiting_leaves_its_part_at_once() -> None:
    # shard 2 is idle: its weight is not counted, and what it does not hold is shared
    parts = entitlements(10, shares([5.0, 3.0, 2.0], [0, 0, 2], idle=frozenset({2})))
    assert parts[2] == 0.0
    assert math.isclose(parts[0], 8 * 5 / 8) and math.isclose(parts[1], 8 * 3 / 8)


def test_a_shard_that_does_not_know_its_weight_probes_with_one_slot() -> None:
    assert cap(10, shares([0.0, 4.0], [0, 6]), 0) == 1
    assert cap(10, shares([0.0, 4.0], [1, 6]), 0) == 0
    assert turn_key(ShardShare(0.0, 0, True)) == 0.0
    assert turn_key(ShardShare(0.0, 1, True)) == math.inf


@settings(max_examples=200, deadline=None)
@given(
    concurrency=st.integers(1, 64),
    weights=st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0, 5.0, 7.5]), min_size=2, max_size=5),
    ends=st.lists(st.integers(0, 10_000), max_size=60),
)
def test_backlogged_shards_hold_their_part_within_one_slot(
    concurrency: int, weights: list[float], ends: list[int]
) -> None:
    """From empty, through any sequence of jobs ending, every shard holds floor(e_i) to
    ceil(e_i) slots whenever the turns are done, and no slot is left free."""
    used = [0] * len(weights)
    parts = entitlements(concurrency, shares(weights, used))
    total = sum(weights)
    for k, w in enumerate(weights):
        assert math.isclose(parts[k], concurrency * w / total)
    serve(concurrency, weights, used)
    for draw in [None, *ends]:
        if draw is not None:
            running = [k for k, u in enumerate(used) for _ in range(u)]
            used[running[draw % len(running)]] -= 1  # a job ends
            serve(concurrency, weights, used)
        assert sum(used) == concurrency
        for k in range(len(weights)):
            assert math.floor(parts[k] + 1e-9) <= used[k] <= math.ceil(parts[k] - 1e-9)


@settings(max_examples=100, deadline=None)
@given(
    concurrency=st.integers(1, 32),
    weights=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=6),
    used=st.lists(st.integers(0, 40), min_size=6, max_size=6),
    idle=st.frozensets(st.integers(0, 5)),
)
def test_parts_never_exceed_what_others_leave(
    concurrency: int, weights: list[float], used: list[int], idle: frozenset[int]
) -> None:
    now = shares(weights, used[: len(weights)], idle)
    parts = entitlements(concurrency, now)
    assert all(p >= 0 for p in parts.values())
    assert sum(parts.values()) <= concurrency + 1e-6
    for k, s in now.items():
        limit = cap(concurrency, now, k)
        assert limit is None or limit >= 0
        if not (s.contending and s.weight > 0):
            assert parts[k] == 0.0
