"""taskiq-redis' driver: ``RedisStreamBroker`` with a ``RedisAsyncResultBackend``.

Run with the Python of taskiq's own environment (see ``_driver.py`` for the protocol).
The stream broker is taskiq-redis' broker with consumer groups and acknowledgements,
which redelivers a lost worker's messages as Fairlane's leases do. Its worker is
``taskiq.api.run_receiver_task`` (the programmatic form of ``taskiq worker --workers 1
--max-async-tasks N``); a message is acknowledged when its result is stored (taskiq's
default). taskiq-redis has no batch enqueue: a batch is ``asyncio.gather`` over ``kiq``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from _driver import PAIR_TAG, Adapter, Params, dist_versions, main
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from taskiq.api import run_receiver_task
from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker


def _field(info: dict[Any, Any], name: str) -> Any:
    return info.get(name, info.get(name.encode()))


class Taskiq(Adapter):
    batch_method = "gather"
    poll_commands = {"xinfo|groups": 1}  # noqa: RUF012

    def __init__(self, params: Params) -> None:
        super().__init__(params)
        self.stream, self.group = f"{self.ns}:stream", self.ns
        self.broker: Any = None
        self._last_id: bytes | None = None

    def _make(self) -> None:
        backend: RedisAsyncResultBackend[Any] = RedisAsyncResultBackend(
            self.url, prefix_str=f"{self.ns}:result"
        )
        broker = RedisStreamBroker(
            self.url, queue_name=self.stream, consumer_group_name=self.group
        ).with_result_backend(backend)

        @broker.task(task_name="bench.noop")
        async def noop(n: int) -> int:
            return n

        @broker.task(task_name="bench.pair")
        async def pair(n: int, tag: str) -> int:
            return n

        @broker.task(task_name="bench.stamp")
        async def stamp() -> int:
            return time.time_ns()

        @broker.task(task_name="bench.work")
        async def work(seconds: float) -> int:
            started = time.time_ns()
            await asyncio.sleep(seconds)
            return started

        self.broker, self.noop, self.pair = broker, noop, pair
        self.stamp, self.work = stamp, work

    async def open(self) -> None:
        self._make()
        self.client = Redis.from_url(self.url)  # the benchmark's own: progress, clean-up
        await self.broker.startup()  # creates the consumer group before anything is sent

    async def close(self) -> None:
        await self.broker.shutdown()
        await self.client.aclose()

    async def cleanup(self) -> None:
        keys = [k async for k in self.client.scan_iter(match=f"*{self.ns}*", count=1000)]
        for i in range(0, len(keys), 1000):
            await self.client.unlink(*keys[i : i + 1000])
        # the consumer group went with the stream: made again, as open() made it (at the
        # stream's end), so that a job sent before a worker starts (`startup`) reaches it
        with contextlib.suppress(ResponseError):  # BUSYGROUP: the stream was not removed
            await self.client.xgroup_create(self.stream, self.group, id="$", mkstream=True)

    async def enqueue_noops(self, start: int, stop: int) -> None:
        await asyncio.gather(*(self.noop.kiq(i) for i in range(start, stop)))

    async def enqueue_pairs(self, start: int, stop: int) -> None:
        await asyncio.gather(*(self.pair.kiq(i, PAIR_TAG) for i in range(start, stop)))

    async def memory_info(self) -> dict[str, Any]:
        return dict(await self.client.info("memory"))

    async def drained(self, total: int) -> bool:
        """Every message delivered and acknowledged (acked once its result is stored)."""
        if self._last_id is None:
            entries = await self.client.xrevrange(self.stream, count=1)
            self._last_id = bytes(entries[0][0])
        for group in await self.client.xinfo_groups(self.stream):
            if _field(group, "name") in (self.group, self.group.encode()):
                delivered = _field(group, "last-delivered-id")
                if isinstance(delivered, str):
                    delivered = delivered.encode()
                return bool(delivered == self._last_id and int(_field(group, "pending")) == 0)
        return False

    async def enqueue_stamp(self) -> Any:
        return await self.stamp.kiq()

    async def enqueue_work(self, seconds: float, tenant: str) -> Any:
        return await self.work.kiq(seconds)

    async def started_ns(self, handle: Any, timeout: float, *, fast: bool = False) -> int:
        # taskiq polls for results; 2 ms keeps the wait short without flooding the server
        result = await handle.wait_result(check_interval=0.002 if fast else 0.02, timeout=timeout)
        return int(result.return_value)

    async def serve(self, concurrency: int) -> None:
        self._make()
        try:
            await run_receiver_task(self.broker, max_async_tasks=concurrency, run_startup=True)
        finally:
            await self.broker.shutdown()

    def versions(self) -> dict[str, str | None]:
        return dist_versions("taskiq-redis", "taskiq", "redis", "hiredis", "uvloop")


if __name__ == "__main__":
    main(Taskiq)
