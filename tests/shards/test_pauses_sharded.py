"""Pauses in an app of three shards: a task's or a lane's pause is in every shard's
dispatch step, a tenant's in its own shard's; a quarantine refuses the tenant's
submissions in its shard. Marked ``contract``: it also runs on the local 3-master
cluster, where the shards sit on different primaries."""

from __future__ import annotations

import asyncio

import pytest

from fairlane.app.admission import Rejected
from tests.e2e.helpers import WAIT, running_worker
from tests.shards.test_sharding import sharded_app, tenants_of

pytestmark = [pytest.mark.anyio, pytest.mark.contract]


async def test_a_task_pause_holds_in_every_shard(redis_url: str, namespace: str) -> None:
    app = sharded_app(namespace, redis_url, 3)
    started: list[tuple[str, str]] = []
    counts = {10: asyncio.Event(), 30: asyncio.Event()}

    def note(start: tuple[str, str]) -> None:
        started.append(start)
        if len(started) in counts:
            counts[len(started)].set()

    @app.task
    async def bad(who: str) -> None:
        note(("bad", who))

    @app.task
    async def good(who: str) -> None:
        note(("good", who))

    tenants = [names[0] for names in tenants_of(app, range(3)).values()]
    async with app:
        await app.pauses.pause(app.pauses.scope(task=bad.name), reason="bad release")
        for tenant in tenants:
            await bad.enqueue_many([(tenant,)] * 5, tenant=tenant)
            await good.enqueue_many([(tenant,)] * 5, tenant=tenant)
        await app.tenants.pause(tenants[0])
        async with running_worker(app, concurrency=8):
            want = [("good", t) for t in tenants[1:] for _ in range(5)]
            async with asyncio.timeout(WAIT):
                await counts[10].wait()
            await asyncio.sleep(0.2)  # time for a start that should not come
            assert sorted(started) == sorted(want)
            parked = {e.scope.task: e.parked for e in await app.pauses.list() if e.scope.task}
            assert parked == {bad.name: 10}  # the paused tenant's are not at a head yet
            await app.pauses.resume(app.pauses.scope(task=bad.name))
            await app.tenants.resume(tenants[0])
            async with asyncio.timeout(WAIT):
                await counts[30].wait()
        assert await app.pauses.list() == []


async def test_a_quarantine_refuses_in_the_tenants_shard(redis_url: str, namespace: str) -> None:
    app = sharded_app(namespace, redis_url, 3)

    @app.task
    async def hello(n: int) -> int:
        return n

    names = tenants_of(app, range(3))
    async with app:
        for shard, (tenant, *_) in names.items():
            await hello.enqueue(shard, tenant=tenant)
            await app.tenants.quarantine(tenant, reason="flood", for_=60)
            with pytest.raises(Rejected):
                await hello.enqueue(shard, tenant=tenant)
        listed = await app.pauses.list()
        assert {e.scope.tenant for e in listed} == {n[0] for n in names.values()}
