"""A pool's part and its scaled bounds (``fairlane.policy.globalkeys``): absent parts
sum to the whole pool, and bounds scaled to parts that sum to at most 1 sum to at most
the pool's."""

from __future__ import annotations

import random

import pytest

from fairlane.policy.globalkeys import is_pool_key, pool_key, pool_part, pool_scaled


def test_absent_parts_share_the_pool_equally() -> None:
    for shards in range(2, 9):
        assert sum(pool_part(None, shards) for _ in range(shards)) == pytest.approx(1.0)
    assert pool_part(0.0, 3) == 0.0
    assert pool_part(0.75, 3) == 0.75


def test_scaled_bounds_never_sum_above_the_pools() -> None:
    rng = random.Random(3)
    for _ in range(5000):
        shards = rng.randint(2, 6)
        cuts = sorted(rng.random() for _ in range(shards - 1))
        parts = [b - a for a, b in zip([0.0, *cuts], [*cuts, 1.0], strict=True)]
        if rng.random() < 0.3:
            parts = [pool_part(None, shards)] * shards
        value = rng.choice([1, 3, 5, 1000, 4000, 12345])
        assert sum(pool_scaled(value, p) for p in parts) <= value
    assert pool_scaled(4000, 1 / 3) == 1333
    assert pool_scaled(4000, 0.75) == 3000


def test_a_pools_key_names_its_lane() -> None:
    assert pool_key("default") == "pool:default"
    assert is_pool_key("pool:default") and not is_pool_key("model:big")
