"""Tenants to shards (``fairlane.policy.shards``) and the shards' key tags and job ids
(``fairlane.store.keys``)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from fairlane.policy.shards import MAX_SHARDS, check_shard_count, shard_of_tenant
from fairlane.store.keys import job_shard, namespace, shard_job_id, shard_namespace

tenants = st.text(min_size=1, max_size=40)
counts = st.integers(min_value=1, max_value=64)


@given(tenants, counts)
def test_a_tenant_maps_to_one_shard_of_the_count(tenant: str, count: int) -> None:
    shard = shard_of_tenant(tenant, count)
    assert 0 <= shard < count
    assert shard_of_tenant(tenant, count) == shard


@given(tenants, st.integers(min_value=1, max_value=63))
def test_growing_by_one_shard_moves_tenants_only_to_the_new_shard(tenant: str, n: int) -> None:
    before, after = shard_of_tenant(tenant, n), shard_of_tenant(tenant, n + 1)
    assert after in (before, n)


def test_the_mapping_is_stable_across_processes_and_releases() -> None:
    # fixed answers: a changed hash would silently move every tenant's queued work
    assert [shard_of_tenant(f"tenant-{i}", 8) for i in range(12)] == [
        shard_of_tenant(f"tenant-{i}", 8) for i in range(12)
    ]
    assert shard_of_tenant("acme", 1) == 0
    pinned = {name: shard_of_tenant(name, 16) for name in ("acme", "globex", "initech", "")}
    assert pinned == {"acme": 8, "globex": 15, "initech": 8, "": 5}


def test_tenants_spread_evenly_over_the_shards() -> None:
    count, n = 8, 40_000
    spread = Counter(shard_of_tenant(f"t{i}", count) for i in range(n))
    expected = n / count
    # chi-squared with 7 degrees of freedom: 24.3 is its 0.999 quantile
    chi2 = sum((spread[s] - expected) ** 2 / expected for s in range(count))
    assert chi2 < 24.3, spread
    assert math.isclose(sum(spread.values()), n)


@pytest.mark.parametrize("bad", [0, -1, MAX_SHARDS + 1, 2.0, True, "3"])
def test_a_bad_shard_count_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="shards must be an integer"):
        check_shard_count(bad)  # type: ignore[arg-type]


def test_one_shard_keeps_the_app_tag() -> None:
    assert shard_namespace("billing", 0, 1) == namespace("billing") == "{fl:billing}:"


@pytest.mark.parametrize("count", [2, 3, 5, 16, 100])
def test_each_shard_tag_lies_in_its_own_slot_range(count: int) -> None:
    prefixes = [shard_namespace("billing", shard, count) for shard in range(count)]
    assert len(set(prefixes)) == count
    for shard, prefix in enumerate(prefixes):
        slot = key_slot((prefix + "job:1").encode())
        low = shard * REDIS_CLUSTER_HASH_SLOTS // count
        high = (shard + 1) * REDIS_CLUSTER_HASH_SLOTS // count
        assert low <= slot < high, (shard, prefix, slot)
        assert prefix.startswith(f"{{fl:billing:{shard}:")


def test_a_shard_outside_the_count_is_refused() -> None:
    with pytest.raises(ValueError, match="not one of the app's 3 shards"):
        shard_namespace("billing", 3, 3)


@given(st.integers(min_value=0, max_value=63), st.integers(min_value=1, max_value=64))
def test_a_job_id_names_its_shard(shard: int, count: int) -> None:
    shard %= count
    job_id = shard_job_id("0189abcdef", shard, count)
    assert job_shard(job_id, count) == shard
    # a workflow child's id extends its run's: the same shard
    assert job_shard(f"{job_id}.3.0", count) == shard


@pytest.mark.parametrize(
    "job_id", ["", "s", "s.", "sx.1", "s99.1", "s1", "0189abc", "s-1.2", "s00001.1"]
)
def test_an_id_naming_no_shard_is_looked_up_in_the_home_shard(job_id: str) -> None:
    assert job_shard(job_id, 4) == 0
