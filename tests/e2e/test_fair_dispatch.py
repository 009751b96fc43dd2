"""Fair dispatch with a real worker: a quiet tenant behind another tenant's flood.

Order-based, not timing-based: tasks record the order in which they start, and the
test counts how many of the flood's jobs start between the quiet tenant's arrival and
its last job's start. The same run under one shared tenant (plain FIFO) is the
contrast, and shows the test can fail.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.e2e.helpers import WAIT, make_app, running_worker

pytestmark = pytest.mark.anyio

FLOOD, QUIET, CONCURRENCY = 200, 10, 10


async def _flood_starts_before_quiet_done(redis_url: str, namespace: str, *, fair: bool) -> int:
    app = make_app(namespace, redis_url)
    started: list[str] = []
    in_full_swing = asyncio.Event()

    @app.task
    async def work(owner: str, seconds: float) -> None:
        started.append(owner)
        if len(started) >= 3 * CONCURRENCY:
            in_full_swing.set()
        await asyncio.sleep(seconds)

    flood_tenant, quiet_tenant = ("flood", "quiet") if fair else ("shared", "shared")
    async with app:
        flood = await work.enqueue_many([("flood", 0.02)] * FLOOD, tenant=flood_tenant)
        async with running_worker(app, concurrency=CONCURRENCY):
            async with asyncio.timeout(WAIT):
                await in_full_swing.wait()
                arrival = len(started)
                quiet = await work.enqueue_many([("quiet", 0.005)] * QUIET, tenant=quiet_tenant)
                for job in [*quiet, *flood]:
                    await job.result()
    last_quiet = max(i for i, owner in enumerate(started) if owner == "quiet")
    between = started[arrival:last_quiet].count("flood")
    print(f"fair={fair}: {between} flood starts between the quiet arrival and its last start")
    return between


async def test_a_quiet_tenant_is_not_stuck_behind_a_flood(redis_url: str, namespace: str) -> None:
    between = await _flood_starts_before_quiet_done(redis_url, namespace, fair=True)
    # the newcomer starts level with the flood's *finished* work: its jobs take the next
    # free slots; at most a few flood jobs already being leased slip in between
    assert between <= 5, between


async def test_fifo_contrast_makes_the_quiet_tenant_wait(redis_url: str, namespace: str) -> None:
    between = await _flood_starts_before_quiet_done(redis_url, namespace, fair=False)
    # one shared tenant is plain FIFO: the quiet jobs wait for most of the flood
    assert between >= FLOOD - 4 * CONCURRENCY, between
