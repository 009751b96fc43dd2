"""An app split into scheduling shards (``App(shards=n)``), against a real server.

Each tenant's work lives in its shard, under that shard's hash tag; a job is found
from its id; one worker serves every shard within its own slots, sharing them by the
weight waiting in each shard, so that a flood in one shard leaves the others their
part. The tests marked
``contract`` also run on the local 3-master cluster, where the shards must land on
different primaries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

import pytest

from fairlane import App, Backoff, Context
from fairlane.store.connection import create_client, is_cluster
from tests.e2e.helpers import WAIT, fast_settings, running_worker

pytestmark = pytest.mark.anyio

NO_WAIT = Backoff(base=0.01, cap=0.01, jitter="none")


def sharded_app(namespace: str, redis_url: str, shards: int) -> App:
    return App(namespace, redis_url=redis_url, settings=fast_settings(), shards=shards)


def tenants_of(app: App, shards: Iterable[int], per_shard: int = 1) -> dict[int, list[str]]:
    """``per_shard`` tenant names for each of ``shards`` (found by trying names in turn)."""
    wanted = {shard: [] for shard in shards}  # type: dict[int, list[str]]
    i = 0
    while any(len(names) < per_shard for names in wanted.values()):
        name = f"tenant-{i}"
        names = wanted.get(app.shard_of(name))
        if names is not None and len(names) < per_shard:
            names.append(name)
        i += 1
    return wanted


async def shard_keys(redis_url: str, prefix: str) -> set[bytes]:
    client = create_client(redis_url)
    try:
        match = prefix.replace("{", "\\{").replace("}", "\\}") + "*"
        return {key async for key in client.scan_iter(match=match, count=1000)}
    finally:
        await client.aclose()


@pytest.mark.contract
async def test_each_tenants_jobs_live_in_its_shard(redis_url: str, namespace: str) -> None:
    app = sharded_app(namespace, redis_url, shards=3)

    @app.task
    async def double(n: int) -> int:
        return 2 * n

    tenants = tenants_of(app, range(3))
    async with app:
        jobs = {shard: await double.enqueue(shard + 1, tenant=t[0]) for shard, t in tenants.items()}
        for shard, job in jobs.items():
            assert job.id.startswith(f"s{shard}.")
            prefix = app.stores[shard].keys.prefix
            assert prefix.encode() + b"job:" + job.id.encode() in await shard_keys(
                redis_url, prefix
            )
            info = await job.info()
            assert (info.status, info.tenant) == ("queued", tenants[shard][0])
        async with running_worker(app, concurrency=4):
            results = {s: await job.result(timeout=WAIT) for s, job in jobs.items()}
        assert results == {0: 2, 1: 4, 2: 6}
        assert [await job.status() for job in jobs.values()] == ["completed"] * 3
        if is_cluster(app.store.client):
            nodes = {(await store.slot_node())["target_nodes"].name for store in app.stores}
            assert len(nodes) == 3, "each shard's tag should land on its own primary"


@pytest.mark.contract
async def test_idempotency_and_cancel_in_a_tenants_shard(redis_url: str, namespace: str) -> None:
    app = sharded_app(namespace, redis_url, shards=4)

    @app.task
    async def noop() -> None:
        return None

    tenant = tenants_of(app, [3])[3][0]
    async with app:
        first = await noop.enqueue(tenant=tenant, idempotency_key="order-17")
        again = await noop.enqueue(tenant=tenant, idempotency_key="order-17")
        assert again.id == first.id and first.created and not again.created
        assert await first.cancel() == "cancelled"
        assert await again.status() == "cancelled"


async def test_one_worker_serves_every_shard_within_its_slots(
    redis_url: str, namespace: str
) -> None:
    app = sharded_app(namespace, redis_url, shards=4)
    running = peak = 0

    @app.task
    async def hold(n: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return n

    tenants = tenants_of(app, range(4), per_shard=2)
    async with app:
        jobs = []
        for names in tenants.values():
            for name in names:
                jobs += await hold.enqueue_many([(i,) for i in range(15)], tenant=name)
        async with running_worker(app, concurrency=3):
            done = await asyncio.gather(*(job.result(timeout=WAIT) for job in jobs))
        assert len(done) == 120
        assert peak <= 3, f"the worker ran {peak} jobs at once on 3 slots"
        assert (await app.stats())["completed"] == 120


async def test_a_flood_in_one_shard_leaves_the_other_shard_its_part(
    redis_url: str, namespace: str
) -> None:
    """Both shards busy: the worker's slots go to them by the weight waiting in each (one
    tenant each, of equal weight), so each gets half of the starts, whatever the flood's
    backlog -- the computed fair share across shards."""
    app = sharded_app(namespace, redis_url, shards=2)
    starts: list[str] = []
    flood_running = asyncio.Event()

    @app.task
    async def work(who: str) -> None:
        starts.append(who)
        if len(starts) >= 20:
            flood_running.set()
        await asyncio.sleep(0.02)

    shards = tenants_of(app, [0, 1])
    flood, quiet = shards[0][0], shards[1][0]
    async with app:
        flooded = await work.enqueue_many([(flood,)] * 300, tenant=flood)
        async with running_worker(app, concurrency=4):
            async with asyncio.timeout(WAIT):
                await flood_running.wait()
            quiet_jobs = await work.enqueue_many([(quiet,)] * 40, tenant=quiet)
            await asyncio.gather(*(job.result(timeout=WAIT) for job in quiet_jobs))
            flood_done_then = sum([await job.status() == "completed" for job in flooded[:200]])
    first_quiet = starts.index(quiet)
    last_quiet = len(starts) - 1 - starts[::-1].index(quiet)
    overlap = starts[first_quiet : last_quiet + 1]
    share = overlap.count(quiet) / len(overlap)
    assert 0.35 <= share <= 0.65, f"quiet shard's share of the starts {share:.2f} (fair: 0.5)"
    assert flood_done_then < 200, "the quiet shard's jobs waited for the flood's backlog"


async def test_dead_letters_redrive_stats_and_purge_cover_every_shard(
    redis_url: str, namespace: str
) -> None:
    app = sharded_app(namespace, redis_url, shards=3)
    failing = True

    @app.task(attempts=1, backoff=NO_WAIT)
    async def flaky(n: int) -> int:
        if failing:
            raise RuntimeError("not yet")
        return n

    tenants = tenants_of(app, range(3))
    async with app:
        jobs = [await flaky.enqueue(s, tenant=t[0]) for s, t in tenants.items()]
        async with running_worker(app):
            deadline = time.monotonic() + WAIT
            while len(await app.dead_letters()) < 3:
                assert time.monotonic() < deadline, "not every shard's job was dead-lettered"
                await asyncio.sleep(0.05)
            dead = {job_id for job_id, _ in await app.dead_letters()}
            assert dead == {job.id for job in jobs}
            assert (await app.stats())["failed"] == 3
            failing = False
            assert sorted(await app.redrive()) == sorted(dead)
            assert [await job.result(timeout=WAIT) for job in jobs] == [0, 1, 2]
        assert await app.dead_letters() == []
        removed = await app.purge()
        assert removed > 0
        for store in app.stores:
            assert await shard_keys(redis_url, store.keys.prefix) == set()


async def test_tenant_settings_live_in_the_tenants_shard(redis_url: str, namespace: str) -> None:
    app = sharded_app(namespace, redis_url, shards=3)
    tenant = tenants_of(app, [2])[2][0]
    async with app:
        await app.tenants.configure(tenant, weight=3, max_concurrency=2)
        assert await app.tenants.weight(tenant) == 3
        limits = await app.tenants.limits(tenant)
        assert limits is not None and limits.max_concurrency == 2
        home, own = app.stores[0], app.stores[2]
        assert await own.client.hget(own.keys.weights, tenant) is not None
        assert await home.client.hget(home.keys.weights, tenant) is None


@pytest.mark.contract
async def test_a_workflow_its_children_and_signals_stay_in_its_shard(
    redis_url: str, namespace: str
) -> None:
    app = sharded_app(namespace, redis_url, shards=3)

    @app.task
    async def square(n: int) -> int:
        return n * n

    @app.workflow()
    async def flow(ctx: Context, n: int) -> int:
        squares = await ctx.gather(ctx.call(square, n), ctx.call(square, n + 1))
        bonus = await ctx.wait_for_signal("bonus", timeout=WAIT, type=int)
        return sum(squares) + (bonus or 0)

    tenant = tenants_of(app, [2])[2][0]
    async with app, running_worker(app, concurrency=4):
        run = await flow.enqueue(3, tenant=tenant)
        assert run.id.startswith("s2.")
        deadline = time.monotonic() + WAIT
        while (await run.info()).waiting_for != "signal:bonus":
            assert time.monotonic() < deadline, "the run never waited for its signal"
            await asyncio.sleep(0.05)
        assert await app.signal(run.id, "bonus", 100) == "delivered"
        assert await run.result(timeout=WAIT) == 9 + 16 + 100
