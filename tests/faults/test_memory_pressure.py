"""A worker near its memory limit takes no new work until its memory falls again.

The worker runs in this process with a memory limit a little above what the process
uses now. One job really allocates 256 MiB and holds it: the worker goes over its hard
threshold, so the jobs enqueued meanwhile stay queued in the store (none starts, none
is leased), while the big job keeps running. When the big job lets go of its memory
the worker takes the queued jobs and runs them.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from fairlane.app.worker import Worker
from fairlane.runtime.pressure import MemoryLimit, MemorySensor, PressureConfig
from tests.e2e.helpers import eventually, make_app

pytestmark = [pytest.mark.anyio, pytest.mark.embedded_only, pytest.mark.slow]

MiB = 1 << 20
HOG = 256 * MiB
# above what the process uses now, so it starts well under the soft threshold (0.8)
# for any process under 640 MiB, and the hog takes it past the hard one (0.9)
MARGIN = 160 * MiB


async def test_a_worker_near_its_memory_limit_fetches_nothing_new(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(namespace, redis_url)
    allocated, release = asyncio.Event(), asyncio.Event()
    ran: list[int] = []

    @app.task()
    async def hog() -> int:
        block = bytearray(b"\x01") * HOG  # written, so resident
        allocated.set()
        await release.wait()
        size = len(block)
        del block
        return size

    @app.task()
    async def small(n: int) -> int:
        ran.append(n)
        return n

    baseline = MemorySensor(MemoryLimit(1 << 50, "setting")).used()
    config = PressureConfig(memory_limit=baseline + MARGIN, interval=0.1)
    caplog.set_level(logging.INFO, logger="fairlane.worker")
    async with app:
        worker = Worker(app, lanes=[app.settings.default_lane], concurrency=4, pressure=config)
        assert worker.pressure is not None
        async with asyncio.TaskGroup() as group:
            group.create_task(worker.run())
            try:
                big = await hog.enqueue()
                await asyncio.wait_for(allocated.wait(), 10)

                async def holding() -> bool:
                    return worker.pressure is not None and worker.pressure.holding

                await eventually(holding, timeout=5)
                queued = await small.enqueue_many([(n,) for n in range(3)])
                await asyncio.sleep(1.0)  # ten samples, two idle-block lengths
                assert ran == []
                assert [await job.status() for job in queued] == ["queued"] * 3
                assert await big.status() == "running"
                assert worker.statistics().fetched == 1
                readings = {r.name: r.value for r in worker.pressure.readings}
                assert readings["memory"] >= 0.9, readings

                release.set()
                assert await big.result(timeout=10) == HOG
                assert [await job.result(timeout=10) for job in queued] == [0, 1, 2]
                assert not worker.pressure.holding
            finally:
                release.set()
                worker.stop()
    messages = [r.getMessage() for r in caplog.records]
    held = [m for m in messages if "takes no new work" in m]
    assert len(held) == 1 and "memory " in held[0] and "hard 0.9" in held[0], held
    assert sum("takes new work again" in m for m in messages) == 1
