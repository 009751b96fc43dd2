"""A worker's task, cancelled, ends: its cancellation is never lost on the way.

On Python 3.11 the Redis client's own ``asyncio.wait_for`` (around writing a command)
returns the result of a write that finished as its task was cancelled, dropping the
cancel; a shard loop would then outlive its worker's cancellation and whoever awaited
the worker would wait for ever (about one run in four of this scenario, before the
store re-raised the cancellation after each call). A worker of an app of three shards
on a cluster, busy with a backlog in two of them, is cancelled at a random moment,
again and again: every time its task must end.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from fairlane import App
from fairlane.config.settings import load_settings

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.cluster_only,
    pytest.mark.parametrize("redis_url", ["cluster"], indirect=True),
]

ROUNDS = 12
END_WITHIN = 10.0


async def test_a_cancelled_worker_task_always_ends(redis_url: str, namespace: str) -> None:
    rng = random.Random(7)
    for i in range(ROUNDS):
        settings = load_settings(worker={"idle_block": 0.5})
        app = App(f"{namespace}x{i}", redis_url=redis_url, settings=settings, shards=3)

        @app.task(name="cancel.sleep")
        async def nap() -> None:
            await asyncio.sleep(0.01)

        async with app:
            task = asyncio.create_task(app.run_worker(concurrency=4))
            await nap.enqueue_many([()] * 600, tenant=f"a{i}")
            await nap.enqueue_many([()] * 150, tenant=f"b{i}")
            await asyncio.sleep(rng.uniform(0.1, 1.5))
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=END_WITHIN)
            assert task in done, f"round {i}: the cancelled worker did not end"
            await app.purge()
