"""arq's driver: ``ArqRedis.enqueue_job`` and ``arq.worker.Worker``, with arq's defaults.

Run with the Python of arq's own environment (see ``_driver.py`` for the protocol).
The queue is a sorted set that the worker polls every ``poll_delay`` (arq's default,
0.5 s), taking up to ``queue_read_limit`` (default ``max(5 * max_jobs, 100)``) jobs per
poll. A job leaves the queue in the transaction that stores its result, so "drained"
is an empty queue. arq has no batch enqueue: a batch is ``asyncio.gather`` over
``enqueue_job``. Job ids are the run's namespace plus a counter (``_job_id``), so that
the run's keys can be found and deleted afterwards; arq's own ids are random.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from _driver import PAIR_TAG, Adapter, Params, dist_versions, main
from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import Worker


async def noop(ctx: dict[str, Any], n: int) -> int:
    return n


async def pair(ctx: dict[str, Any], n: int, tag: str) -> int:
    return n


async def stamp(ctx: dict[str, Any]) -> int:
    return time.time_ns()


async def work(ctx: dict[str, Any], seconds: float) -> int:
    started = time.time_ns()
    await asyncio.sleep(seconds)
    return started


class Arq(Adapter):
    batch_method = "gather"
    poll_commands = {"zcard": 1}  # noqa: RUF012

    def __init__(self, params: Params) -> None:
        super().__init__(params)
        self.ids = itertools.count()

    async def open(self) -> None:
        self.redis = await create_pool(RedisSettings.from_dsn(self.url), default_queue_name=self.ns)

    async def close(self) -> None:
        await self.redis.aclose()

    async def cleanup(self) -> None:
        keys = [k async for k in self.redis.scan_iter(match=f"*{self.ns}*", count=1000)]
        for i in range(0, len(keys), 1000):
            await self.redis.unlink(*keys[i : i + 1000])

    def _id(self) -> str:
        return f"{self.ns}:{next(self.ids)}"

    async def enqueue_noops(self, start: int, stop: int) -> None:
        await asyncio.gather(
            *(self.redis.enqueue_job("noop", i, _job_id=self._id()) for i in range(start, stop))
        )

    async def enqueue_pairs(self, start: int, stop: int) -> None:
        await asyncio.gather(
            *(
                self.redis.enqueue_job("pair", i, PAIR_TAG, _job_id=self._id())
                for i in range(start, stop)
            )
        )

    async def memory_info(self) -> dict[str, Any]:
        return dict(await self.redis.info("memory"))

    async def drained(self, total: int) -> bool:
        return int(await self.redis.zcard(self.ns)) == 0

    async def enqueue_stamp(self) -> Any:
        return await self.redis.enqueue_job("stamp", _job_id=self._id())

    async def enqueue_work(self, seconds: float, tenant: str) -> Any:
        return await self.redis.enqueue_job("work", seconds, _job_id=self._id())

    async def started_ns(self, handle: Any, timeout: float, *, fast: bool = False) -> int:
        # arq polls for results (default every 0.5 s); 2 ms keeps the wait short
        return int(await handle.result(timeout=timeout, poll_delay=0.002 if fast else 0.02))

    async def serve(self, concurrency: int) -> None:
        worker = Worker(
            functions=[noop, pair, stamp, work],
            redis_settings=RedisSettings.from_dsn(self.url),
            queue_name=self.ns,
            max_jobs=concurrency,
            handle_signals=False,  # SIGTERM cancels this coroutine (the harness's handler)
        )
        try:
            await worker.async_run()
        finally:
            await worker.close()

    def versions(self) -> dict[str, str | None]:
        return dist_versions("arq", "redis", "hiredis", "uvloop")


if __name__ == "__main__":
    main(Arq)
