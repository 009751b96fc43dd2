"""A throttle key shared by tenants, with real workers: fair waiting by tenant weight.

Order-based, not timing-based: tasks record the order in which they start, and the
tests count starts. Every job names ``model:big``; the worker has more slots than the
key, so the key is what the jobs wait for.

* Quiet tenants behind a flood: tenant ``flood`` parks 300 jobs on the key (limit 2),
  then ``quiet`` enqueues 5. Each quiet job starts within a few of the key's hand-offs
  of its arrival: the i-th starts with at most ``i + 2 * LIMIT`` flood starts after the
  quiet arrival (the flood's offers already out, then one flood wake between two quiet
  ones at equal weights). Under the old rule (one FIFO queue per key) the quiet jobs
  waited behind all 300.
* Weights 3:1 on a backlogged key (limit 4): over a window of 200 starts while both
  tenants have work parked, the heavy tenant has 75 % of the key's starts within 2
  points.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.helpers import WAIT, make_app, running_worker

pytestmark = pytest.mark.anyio

KEY = "model:big"


async def test_quiet_tenants_start_within_a_few_handoffs_of_their_arrival(
    redis_url: str, namespace: str
) -> None:
    limit, flood_n, quiet_n = 2, 300, 5
    app = make_app(namespace, redis_url)
    started: list[str] = []
    swing, quiet_done = asyncio.Event(), asyncio.Event()

    @app.task(limits={KEY: limit})
    async def work(owner: str) -> None:
        started.append(owner)
        if len(started) >= 3 * limit:
            swing.set()
        if started.count("quiet") == quiet_n:
            quiet_done.set()
        await asyncio.sleep(0.01)

    async with app:
        await work.enqueue_many([("flood",)] * flood_n, tenant="flood")
        async with running_worker(app, concurrency=10):
            async with asyncio.timeout(WAIT):
                await swing.wait()
                arrival = len(started)
                await work.enqueue_many([("quiet",)] * quiet_n, tenant="quiet")
                await quiet_done.wait()
    after = started[arrival:]
    flood_before = []
    for i, owner in enumerate(after):
        if owner == "quiet":
            flood_before.append(after[:i].count("flood"))
    print(f"flood starts before each quiet start: {flood_before}")
    assert len(flood_before) == quiet_n
    for i, n in enumerate(flood_before, start=1):
        assert n <= i + 2 * limit, flood_before


async def test_weights_share_a_backlogged_key(redis_url: str, namespace: str) -> None:
    limit, each, skip, window = 4, 400, 20, 200
    app = make_app(namespace, redis_url)
    started: list[str] = []
    enough = asyncio.Event()

    @app.task(limits={KEY: limit})
    async def work(owner: str) -> None:
        started.append(owner)
        if len(started) >= skip + window:
            enough.set()
        await asyncio.sleep(0.002)

    async with app:
        await app.tenants.configure("heavy", weight=3)
        await work.enqueue_many([("heavy",)] * each, tenant="heavy")
        await work.enqueue_many([("light",)] * each, tenant="light")
        async with running_worker(app, concurrency=12):
            async with asyncio.timeout(WAIT):
                await enough.wait()
    seen = started[skip : skip + window]
    # both stay backlogged through the window: neither ran out of parked work
    assert seen.count("heavy") < each and seen.count("light") < each
    share = seen.count("heavy") / window
    print(f"heavy's share of {window} key starts: {share:.3f}")
    assert abs(share - 0.75) <= 0.02, share
