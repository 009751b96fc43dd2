"""SAQ's driver: a Redis ``saq.Queue`` and ``saq.Worker``, with SAQ's defaults.

Run with the Python of SAQ's own environment (see ``_driver.py`` for the protocol).
Each of the worker's ``concurrency`` tasks blocks on ``BLMOVE`` (queued -> active) on
a connection of its own; a job leaves the ``incomplete`` sorted set in the transaction
that stores its result, so "drained" is an empty ``incomplete`` set. SAQ has no batch
enqueue (``Queue.map`` gathers ``enqueue`` calls and then waits for the results): a
batch is ``asyncio.gather`` over ``enqueue``. Job keys are the run's namespace plus a
counter (``key=``), so that the run's keys can be found and deleted afterwards; SAQ's own
keys are random.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from _driver import PAIR_TAG, Adapter, Params, dist_versions, main
from saq import Queue, Status, Worker

DONE = (Status.COMPLETE, Status.FAILED, Status.ABORTED)


async def noop(ctx: dict[str, Any], *, n: int) -> int:
    return n


async def pair(ctx: dict[str, Any], *, n: int, tag: str) -> int:
    return n


async def stamp(ctx: dict[str, Any]) -> int:
    return time.time_ns()


async def work(ctx: dict[str, Any], *, seconds: float) -> int:
    started = time.time_ns()
    await asyncio.sleep(seconds)
    return started


class Saq(Adapter):
    batch_method = "gather"
    poll_commands = {"zcard": 1}  # noqa: RUF012

    def __init__(self, params: Params) -> None:
        super().__init__(params)
        self.keys = itertools.count()

    def _key(self) -> str:
        return f"{self.ns}-{next(self.keys)}"

    async def open(self) -> None:
        self.queue = Queue.from_url(self.url, name=self.ns)
        await self.queue.connect()

    async def close(self) -> None:
        await self.queue.disconnect()

    async def cleanup(self) -> None:
        redis = self.queue.redis  # type: ignore[attr-defined]
        keys = [k async for k in redis.scan_iter(match=f"saq:*{self.ns}*", count=1000)]
        for i in range(0, len(keys), 1000):
            await redis.unlink(*keys[i : i + 1000])

    async def enqueue_noops(self, start: int, stop: int) -> None:
        await asyncio.gather(
            *(self.queue.enqueue("noop", n=i, key=self._key()) for i in range(start, stop))
        )

    async def enqueue_pairs(self, start: int, stop: int) -> None:
        await asyncio.gather(
            *(
                self.queue.enqueue("pair", n=i, tag=PAIR_TAG, key=self._key())
                for i in range(start, stop)
            )
        )

    async def memory_info(self) -> dict[str, Any]:
        return dict(await self.queue.redis.info("memory"))  # type: ignore[attr-defined]

    async def drained(self, total: int) -> bool:
        return await self.queue.count("incomplete") == 0

    async def enqueue_stamp(self) -> Any:
        return await self.queue.enqueue("stamp", key=self._key())

    async def enqueue_work(self, seconds: float, tenant: str) -> Any:
        return await self.queue.enqueue("work", seconds=seconds, key=self._key())

    async def started_ns(self, handle: Any, timeout: float, *, fast: bool = False) -> int:
        # polled like the others' results (Job.refresh's wait on pub/sub can miss a job
        # that completes between its read and its subscription)
        deadline = time.monotonic() + timeout
        while True:
            job = await self.queue.job(handle.key)
            if job is not None and job.status in DONE:
                if job.status != Status.COMPLETE:
                    # a stamp that did not complete has no start to give: say why
                    raise RuntimeError(f"job {handle.key} ended {job.status}: {job.error}")
                return int(job.result)
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {handle.key} not done after {timeout:.0f}s")
            await asyncio.sleep(0.002 if fast else 0.02)

    async def serve(self, concurrency: int) -> None:
        queue = Queue.from_url(self.url, name=self.ns)
        await queue.connect()
        worker = Worker(queue, functions=[noop, pair, stamp, work], concurrency=concurrency)
        try:
            await worker.start()  # installs its own SIGTERM handler: a graceful stop
        finally:
            await queue.disconnect()

    def versions(self) -> dict[str, str | None]:
        return dist_versions("saq", "redis", "hiredis", "uvloop")


if __name__ == "__main__":
    main(Saq)
