"""Global keys on a private 3-primary cluster: one limit for an app of three shards.

Tenants of every shard share a concurrency key and a rate key; two workers of 16 slots
serve all three shards, and the balancer (``runtime/balancer.py``) moves the keys'
parts between shards. Each job records when it started and ended (one clock: the
workers run in this process), so the jobs running on a key at once are counted at
every start, not averaged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from fairlane import Adaptive, App, Rate, Throttled
from fairlane.app.task import Task
from fairlane.runtime.worker import Worker
from tests.e2e.helpers import WAIT, fast_settings, running_workers
from tests.shards.test_sharding import tenants_of

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.contract,
    pytest.mark.parametrize("redis_url", ["cluster"], indirect=True),
]

SHARDS = 3


def _app(namespace: str, redis_url: str) -> App:
    return App(namespace, redis_url=redis_url, settings=fast_settings(), shards=SHARDS)


async def drain_from_every_shard(app: App, task: Task[..., None], per_tenant: int) -> None:
    """``per_tenant`` jobs of ``task`` from one tenant of each shard, run to their end by
    two workers of 16 slots."""
    async with app:
        jobs = []
        for (tenant,) in tenants_of(app, range(SHARDS)).values():
            jobs += await task.enqueue_many([()] * per_tenant, tenant=tenant)
        async with running_workers(app, count=2, concurrency=16):
            await asyncio.gather(*(job.result(timeout=WAIT) for job in jobs))


def peak_overlap(spans: Sequence[tuple[float, float]]) -> int:
    """The most spans open at once, counted at every start."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    peak = running = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def running_at(spans: Sequence[tuple[float, float]], moment: float) -> int:
    return sum(1 for s, e in spans if s <= moment < e)


async def test_a_shared_limit_holds_across_shards(redis_url: str, namespace: str) -> None:
    app = _app(namespace, redis_url)
    spans: list[tuple[float, float]] = []

    @app.task(limits={"model:big": 4})
    async def call_model() -> None:
        start = time.monotonic()
        await asyncio.sleep(0.04)
        spans.append((start, time.monotonic()))

    tenants = tenants_of(app, range(SHARDS), per_shard=2)
    async with app:
        jobs = []
        for names in tenants.values():
            for tenant in names:
                jobs += await call_model.enqueue_many([()] * 20, tenant=tenant)
        async with running_workers(app, count=2, concurrency=16):
            await asyncio.gather(*(job.result(timeout=WAIT) for job in jobs))
    assert len(spans) == 120
    assert peak_overlap(spans) <= 4
    # the key was used, not starved: most of the time all four ran
    busy = spans[-1][1] - min(s for s, _ in spans)
    assert busy < 120 * 0.04 / 4 * 3, f"120 jobs of 40 ms on 4 slots took {busy:.2f} s"


async def test_demand_on_one_shard_then_another_gets_the_whole_key(
    redis_url: str, namespace: str
) -> None:
    """With the demand on one shard only, that shard runs the whole limit within a few
    balancer passes; when the demand moves to another shard, the same."""
    app = _app(namespace, redis_url)
    spans: dict[str, list[tuple[float, float]]] = {}

    @app.task(limits={"model:big": 4})
    async def call_model(who: str) -> None:
        start = time.monotonic()
        await asyncio.sleep(0.1)
        spans.setdefault(who, []).append((start, time.monotonic()))

    tenants = tenants_of(app, range(SHARDS))
    first, second = tenants[1][0], tenants[2][0]
    async with app, running_workers(app, count=2, concurrency=16) as workers:
        reached = []
        for tenant in (first, second):
            passes = _passes(workers)
            asked = time.monotonic()
            jobs = await call_model.enqueue_many([(tenant,)] * 60, tenant=tenant)
            done = [job.result(timeout=WAIT) for job in jobs]
            full = await _until_full(spans, tenant, 4)
            reached.append((full - asked, _passes(workers) - passes))
            await asyncio.gather(*done)
    for who in (first, second):
        assert peak_overlap(spans[who]) <= 4
    for seconds, passes in reached:
        # the balancer runs a pass every 0.2 s: a lower, then a raise
        assert passes <= 6, f"full after {seconds:.2f} s and {passes} passes"


def _passes(workers: Sequence[Worker]) -> int:
    return sum(w.balancer.passes for w in workers if w.balancer is not None)


async def _until_full(spans: dict[str, list[tuple[float, float]]], who: str, limit: int) -> float:
    """When ``limit`` of ``who``'s jobs first ran at once (polled on their records)."""
    async with asyncio.timeout(WAIT):
        while True:
            got = spans.get(who, [])
            ends = [e for _, e in got]
            if got and any(running_at(got, s) >= limit for s, _ in got):
                return min(s for s, _ in got if running_at(got, s) >= limit)
            if len(ends) >= 40:
                raise AssertionError(f"{who} never ran {limit} at once")
            await asyncio.sleep(0.05)


async def test_a_shared_rate_holds_across_shards(redis_url: str, namespace: str) -> None:
    app = _app(namespace, redis_url)
    starts: list[float] = []

    @app.task(rates={"model:rpm": Rate(20, per=1.0)})
    async def call_model() -> None:
        starts.append(time.monotonic())

    await drain_from_every_shard(app, call_model, 30)
    starts.sort()
    # limit + burst in any window of `per`
    worst = max(sum(1 for t in starts if s <= t < s + 1.0) for s in starts)
    assert worst <= 40, f"{worst} starts in one second"
    span = starts[-1] - starts[0]
    assert len(starts) / max(span, 1e-9) <= 20 * 1.25


async def test_a_pause_on_one_shard_stops_the_key_on_every_shard(
    redis_url: str, namespace: str
) -> None:
    """An upstream's pushback on one shard pauses the key there at once, and on the
    other shards by the balancer's next pass: after that, nothing starts on the key
    anywhere until the pause ends."""
    app = _app(namespace, redis_url)
    starts: list[tuple[float, str]] = []
    pushed: list[float] = []
    tenants = tenants_of(app, range(SHARDS))
    loud = tenants[0][0]

    @app.task(limits={"model:big": 6})
    async def call_model(who: str) -> None:
        now = time.monotonic()
        if who == loud and not pushed:
            pushed.append(now)
            raise Throttled("model:big", retry_after=2.0)
        starts.append((now, who))
        await asyncio.sleep(0.05)

    async with app, running_workers(app, count=2, concurrency=16):
        warm = await call_model.enqueue_many([("warm",)], tenant=tenants[1][0])
        await warm[0].result(timeout=WAIT)
        jobs = []
        for (tenant,) in tenants.values():
            jobs += await call_model.enqueue_many([(tenant,)] * 100, tenant=tenant)
        await asyncio.gather(*(job.result(timeout=WAIT) for job in jobs))
    assert pushed
    at = pushed[0]
    late = [(round(t - at, 2), who) for t, who in starts if at + PAUSE_BOUND <= t < at + 1.8]
    assert any(t > at + 2.0 for t, _ in starts), "the key was idle by the end of the pause"
    assert not late, f"started during the pause: {late[:5]}"


#: how long after a pushback another shard may still start a job on the paused key:
#: two balancer passes (0.2 s each) and the calls of a pass, with room for a slow machine
PAUSE_BOUND = 1.0


async def test_an_adaptive_limit_holds_across_shards(redis_url: str, namespace: str) -> None:
    app = _app(namespace, redis_url)
    spans: list[tuple[float, float]] = []

    @app.task(limits={"model:big": Adaptive(max=5, min=1)})
    async def call_model() -> None:
        start = time.monotonic()
        await asyncio.sleep(0.03)
        spans.append((start, time.monotonic()))

    await drain_from_every_shard(app, call_model, 30)
    assert peak_overlap(spans) <= 5


async def test_a_busy_key_is_shared_between_shards_by_their_waiting_weight(
    redis_url: str, namespace: str
) -> None:
    """One tenant alone in shard 0 against four in shard 1, equal weights, all waiting on
    one key: each tenant gets about a fifth of the key's starts, the lone one too
    (between shards by waiting weight, within a shard by weight)."""
    app = _app(namespace, redis_url)
    starts: list[tuple[float, str]] = []

    @app.task(limits={"model:big": 10})
    async def call_model(who: str) -> None:
        starts.append((time.monotonic(), who))
        await asyncio.sleep(0.04)

    tenants = tenants_of(app, range(2), per_shard=4)
    lone, crowd = tenants[0][0], tenants[1]
    async with app:
        jobs = await call_model.enqueue_many([(lone,)] * 150, tenant=lone)
        for tenant in crowd:
            jobs += await call_model.enqueue_many([(tenant,)] * 150, tenant=tenant)
        async with running_workers(app, count=2, concurrency=16):
            await asyncio.gather(*(job.result(timeout=WAIT) for job in jobs))
    # while every tenant was backlogged: up to the first tenant to run out
    order = [who for _, who in sorted(starts)]
    end = min(len(order) - order[::-1].index(t) for t in [lone, *crowd])
    window = order[len(order) // 10 : end]
    share = window.count(lone) / len(window)
    print(f"lone tenant's share of the key's starts: {share:.3f} (fair 0.200)")
    assert abs(share - 0.2) <= 0.03, f"lone tenant's share {share:.3f} (fair 0.200)"


async def test_a_burst_worker_runs_what_waits_for_a_part(redis_url: str, namespace: str) -> None:
    """Every job's first dispatch parks it (its shard has no part of the key yet): a
    burst worker does not take that for the end of the work."""
    app = _app(namespace, redis_url)

    @app.task(limits={"model:big": 100})
    async def call_model() -> None:
        return None

    tenants = tenants_of(app, range(SHARDS))
    async with app:
        jobs = []
        for (tenant,) in tenants.values():
            jobs += await call_model.enqueue_many([()] * 20, tenant=tenant)
        await app.run_worker(concurrency=8, burst=True)
        assert [await job.status() for job in jobs] == ["completed"] * len(jobs)
