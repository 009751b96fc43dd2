"""The worker's tenant sweep (``fairlane.runtime.tenant_sweep``), on a private server.

A turn runs passes from where the last one stopped until a cycle ends (or its pass
budget is spent) and returns what it removed; its loop runs a turn every interval until
stopped; and a real worker runs it beside its shard loops, so an idle tenant's learned
cost goes while the worker serves the app. Under an LFU maxmemory-policy, which keeps
no idle clock, learned costs stay and the sweeper warns once.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis

from fairlane.config.tenants import TenantSettings
from fairlane.runtime.tenant_sweep import TenantSweeper
from fairlane.store.api import Store
from fairlane.testing import RedisServer
from tests.e2e.helpers import eventually, make_app, running_worker

pytestmark = pytest.mark.anyio


def idle_state(redis_url: str, store: Store, tenants: int) -> redis.Redis:
    """Finish tags at V of ``tenants`` tenants and a learned cost each."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    vt = store.keys.class_key("default", "standard", "vt")
    client.hset(vt, mapping={"V": 3, **{f"f:t{i}": 3 for i in range(tenants)}})
    with client.pipeline(transaction=False) as pipe:
        for i in range(tenants):
            pipe.hset(f"{store.keys.prefix}cost:t{i}|task|", "mean", 7)
        pipe.execute()
    return client


async def test_a_turn_goes_on_from_its_cursor_until_a_cycle_ends(
    redis_url: str, store: Store
) -> None:
    client = idle_state(redis_url, store, 2000)
    try:
        await asyncio.sleep(2.1)  # the learned costs' idle clock (whole seconds) passes 1 s
        sweeper = TenantSweeper(store, TenantSettings(idle_ttl=1, sweep_batch=50))
        removed = await sweeper.turn()
        # 4,000 pieces at about 50 a pass need more than a turn's 20 passes
        assert 0 < removed < 4000
        assert sweeper.cursor != "0"
        assert sweeper.passes == 20
        while sweeper.cursor != "0" or sweeper.cycles == 0:
            removed += await sweeper.turn()
        assert removed == 4000 == sweeper.removed
        assert await sweeper.turn() == 0  # a whole cycle more, with nothing left
        assert sweeper.cycles >= 2
        assert client.hkeys(store.keys.class_key("default", "standard", "vt")) == ["V"]
    finally:
        client.close()


async def test_the_loop_turns_every_interval_until_stopped(redis_url: str, store: Store) -> None:
    client = idle_state(redis_url, store, 5)
    try:
        sweeper = TenantSweeper(store, TenantSettings(idle_ttl=0.5, sweep_interval=0.1))
        stop = asyncio.Event()
        task = asyncio.create_task(sweeper.run(stop))

        async def all_gone() -> bool:
            return sweeper.removed == 10

        await eventually(all_gone, timeout=10)
        turns = sweeper.passes
        await asyncio.sleep(0.5)
        assert sweeper.passes > turns  # it keeps turning
        stop.set()
        await asyncio.wait_for(task, 2)
    finally:
        client.close()


async def test_a_worker_runs_the_sweep_beside_its_shard_loops(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url, tenants={"idle_ttl": 0.5, "sweep_interval": 0.1})

    @app.task
    async def noop() -> None:
        return None

    async with app:
        store = app.sharded.store_for_tenant("t0")
        client = idle_state(redis_url, store, 3)
        try:
            async with running_worker(app):

                async def swept() -> bool:
                    return not client.keys(f"{store.keys.match_all()[:-1]}cost:*")

                await eventually(swept, timeout=10)
                await noop.enqueue(tenant="t0")  # the worker still serves the app
        finally:
            client.close()


async def test_without_an_idle_clock_learned_costs_stay_and_the_worker_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An LFU maxmemory-policy keeps no idle time of keys: costs stay, a warning says why."""
    with RedisServer() as server:
        store = Store.from_url(server.url, "lfu")
        await store.connect()
        client = idle_state(server.url, store, 2)
        try:
            client.config_set("maxmemory-policy", "allkeys-lfu")
            await asyncio.sleep(1.1)
            sweeper = TenantSweeper(store, TenantSettings(idle_ttl=0.5))
            with caplog.at_level(logging.WARNING, logger="fairlane.worker"):
                assert await sweeper.turn() == 2  # the finish tags at V still go
                await sweeper.turn()
            warned = [r for r in caplog.records if "keeps no idle times" in r.getMessage()]
            assert len(warned) == 1
            assert len(client.keys(f"{store.keys.match_all()[:-1]}cost:*")) == 2
        finally:
            client.close()
            await store.aclose()
