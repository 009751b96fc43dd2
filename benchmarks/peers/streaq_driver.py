"""streaq's driver: a ``streaq.Worker`` (Redis streams through coredis), with its defaults.

Run with the Python of streaq's own environment (see ``_driver.py`` for the protocol).
The producer uses the same ``Worker`` object, as streaq's documentation does
(``async with worker: await task.enqueue(...)``). A batch is streaq's own
``Worker.enqueue_many`` (one pipeline). A finished task's message is acknowledged and
deleted from the stream in the transaction that stores its result, so "drained" is an
empty stream (``XLEN``; no task here is delayed).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from _driver import PAIR_TAG, Adapter, dist_versions, main
from streaq import Worker


class Streaq(Adapter):
    batch_method = "enqueue_many"
    poll_commands = {"xlen": 1}  # noqa: RUF012

    def _make(self, concurrency: int = 16) -> Worker[Any]:
        worker: Worker[Any] = Worker(
            redis_url=self.url, queue_name=self.ns, concurrency=concurrency
        )

        @worker.task(name="bench.noop")
        async def noop(n: int) -> int:
            return n

        @worker.task(name="bench.pair")
        async def pair(n: int, tag: str) -> int:
            return n

        @worker.task(name="bench.stamp")
        async def stamp() -> int:
            return time.time_ns()

        @worker.task(name="bench.work")
        async def work(seconds: float) -> int:
            started = time.time_ns()
            await asyncio.sleep(seconds)
            return started

        self.noop, self.pair, self.stamp, self.work = noop, pair, stamp, work
        return worker

    async def open(self) -> None:
        self.worker = self._make()
        await self.worker.__aenter__()

    async def close(self) -> None:
        await self.worker.__aexit__(None, None, None)

    async def cleanup(self) -> None:
        redis = self.worker.redis
        keys = [k async for k in redis.scan_iter(match=f"streaq:{self.ns}*", count=1000)]
        for i in range(0, len(keys), 1000):
            await redis.unlink(keys[i : i + 1000])

    async def enqueue_noops(self, start: int, stop: int) -> None:
        await self.worker.enqueue_many([self.noop.enqueue(i) for i in range(start, stop)])

    async def enqueue_pairs(self, start: int, stop: int) -> None:
        await self.worker.enqueue_many([self.pair.enqueue(i, PAIR_TAG) for i in range(start, stop)])

    async def memory_info(self) -> dict[str, Any]:
        return dict(await self.worker.redis.info("memory"))

    async def drained(self, total: int) -> bool:
        # a finished task's message is deleted from the stream; nothing here is delayed
        return int(await self.worker.redis.xlen(self.worker.stream_key + "normal")) == 0

    async def enqueue_stamp(self) -> Any:
        return await self.stamp.enqueue()

    async def enqueue_work(self, seconds: float, tenant: str) -> Any:
        return await self.work.enqueue(seconds)

    async def enqueue_work_many(self, seconds: float, count: int, tenant: str) -> list[Any]:
        tasks = [self.work.enqueue(seconds) for _ in range(count)]
        await self.worker.enqueue_many(tasks)
        return tasks

    async def started_ns(self, handle: Any, timeout: float, *, fast: bool = False) -> int:
        result = await handle.result(timeout=int(timeout))  # waits on pub/sub, no polling
        return int(result.result)

    async def serve(self, concurrency: int) -> None:
        await self._make(concurrency).run_async()

    def versions(self) -> dict[str, str | None]:
        return dist_versions("streaq", "coredis", "anyio", "uvloop")


if __name__ == "__main__":
    main(Streaq)
