"""An exchange tells the worker its lanes' waiting weight: the sum of the weights of the
tenants with jobs waiting (``policy/shardshare.py``), kept as tenants enter and leave a
class's fair set, never by a scan -- by a shard of an app of several shards, whose
workers share their slots by it; an app of one shard keeps none and pays nothing for it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from fairlane.store.api import Store
from fairlane.store.wire import NewJob

pytestmark = [pytest.mark.anyio, pytest.mark.contract]


@pytest.fixture
async def sharded(redis_url: str, namespace: str) -> AsyncIterator[Store]:
    """Shard 0 of an app of two shards."""
    store = Store.from_url(redis_url, namespace, shards=2)
    await store.connect()
    try:
        yield store
    finally:
        await store.aclose()


def _job(tenant: str, n: int, cls: str = "standard") -> NewJob:
    return NewJob(
        f"{tenant}-{n:03d}", tenant, 0, "w.job", "[]", 1, "", 0, "0,0", "0,0", service_class=cls
    )


async def test_the_reply_carries_the_weight_waiting(sharded: Store) -> None:
    store = sharded
    await store.configure_tenant("heavy", 3.0)
    await store.enqueue("a", [_job("heavy", n) for n in range(6)])
    await store.enqueue("a", [_job("light", n) for n in range(2)])
    await store.enqueue("b", [_job("other", n) for n in range(2)])
    got = await store.exchange("w", ["a"], 1, 60_000, slots=10)
    assert len(got.jobs) == 1 and got.waiting == 4.0
    got = await store.exchange("w", ["a", "b"], 1, 60_000, slots=10)
    assert got.waiting == 5.0  # both lanes, the second read as stored
    # light's last job goes (three of heavy's for one of light's): its weight with it
    got = await store.exchange("w", ["a"], 4, 60_000, slots=10)
    assert {j.tenant for j in got.jobs} == {"heavy", "light"}
    assert got.waiting == 3.0
    got = await store.exchange("w", ["a"], 10, 60_000, slots=10)
    assert got.waiting == 0.0
    # a tenant that comes back counts again; a cancelled last job takes it out
    await store.enqueue("a", [_job("light", 9)])
    assert (await store.exchange("w", ["a"], 0, 60_000, slots=10)).waiting is None  # no fetch
    await store.cancel("light-009")
    await store.enqueue("a", [_job("heavy", 9)])
    # lane b gives the one slot asked for; lane a's weight is read as stored
    got = await store.exchange("w", ["b", "a"], 1, 60_000, slots=10)
    assert [j.tenant for j in got.jobs] == ["other"] and got.waiting == 1.0 + 3.0


async def test_the_weight_read_back_from_the_store_follows_enqueues_and_cancels(
    sharded: Store,
) -> None:
    store = sharded
    await store.configure_tenant("heavy", 2.5)
    await store.enqueue("a", [_job("heavy", 0), _job("light", 0), _job("light", 1)])
    state = store.keys.lane("a").state
    assert float(await store.client.hget(state, "W:standard")) == 3.5
    await store.cancel("heavy-000")
    assert float(await store.client.hget(state, "W:standard")) == 1.0
    await store.cancel("light-000")
    await store.cancel("light-001")  # the set empties: the sum starts again from nought
    assert float(await store.client.hget(state, "W:standard")) == 0.0


async def test_an_app_of_one_shard_keeps_no_waiting_weight(store: Store) -> None:
    await store.configure_tenant("heavy", 2.5)
    await store.enqueue("a", [_job("heavy", 0), _job("light", 0)])
    state = await store.client.hgetall(store.keys.lane("a").state)
    assert not [f for f in state if f.startswith(b"W:")]
    got = await store.exchange("w", ["a", "b"], 1, 60_000, slots=10)
    assert len(got.jobs) == 1 and got.waiting == 0.0
