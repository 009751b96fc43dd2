"""A job through Sentinel: a real sentinel process, from the same binary, monitoring a private
server; the app finds the master by asking it, by URL and by ``App(sentinels=...)``, and
finds the new one after the sentinel fails over to a replica."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest
import redis
from redis.asyncio.sentinel import SentinelConnectionPool

from fairlane import App
from fairlane.config.settings import DurabilitySettings
from fairlane.testing import RedisSentinel, RedisServer
from tests.e2e.helpers import WAIT, fast_settings, running_worker

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def sentinel() -> Iterator[tuple[RedisServer, RedisSentinel]]:
    with RedisServer() as server, RedisSentinel(server, service_name="jobs") as watcher:
        yield server, watcher


@pytest.mark.parametrize("spelling", ["url", "options"])
async def test_a_job_runs_through_sentinel(
    sentinel: tuple[RedisServer, RedisSentinel], spelling: str
) -> None:
    server, watcher = sentinel
    name = f"sentinel_{spelling}"
    if spelling == "url":
        app = App(name, redis_url=watcher.url, settings=fast_settings())
    else:
        app = App(
            name,
            sentinels=[f"{watcher.host}:{watcher.port}"],
            service_name="jobs",
            settings=fast_settings(),
        )
    assert app.redis_url == watcher.url

    @app.task
    async def shout(text: str) -> str:
        return text.upper()

    async with app, running_worker(app) as worker:
        # the client asks the sentinel for the master, not a fixed address
        assert isinstance(app.store.client.connection_pool, SentinelConnectionPool)
        job = await shout.enqueue("hi", tenant="acme")
        assert await job.result(timeout=WAIT) == "HI"
        # the worker's beat thread, on a blocking client of its own, found the master too
        beats = app.store.keys.beats
        deadline = time.monotonic() + WAIT
        while await app.store.client.zscore(beats, worker.id) is None:
            assert time.monotonic() < deadline, "the worker never beat"
            await asyncio.sleep(0.05)
        # the master the sentinel named is the private server: the record is there
        direct = redis.Redis.from_url(server.url)
        try:
            assert direct.exists(app.store.keys.job(job.id)) == 1
        finally:
            direct.close()
        assert await app.purge() > 0


def test_sentinel_url_needs_a_service() -> None:
    with pytest.raises(ValueError, match="service"):
        App("x", redis_url=None, sentinels=["127.0.0.1:26379"])


async def _eventually(check: Callable[[], Awaitable[bool]], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"{what} within {timeout}s"
        await asyncio.sleep(0.1)


async def test_a_failover_to_the_replica_keeps_every_acknowledged_job() -> None:
    """The master is SIGKILLed while a worker runs; the sentinel promotes its replica.
    The app and the worker find the new master by themselves, every job whose enqueue
    the replica acknowledged (``durability=`` with one replica) completes, and new
    jobs run."""
    with (
        RedisServer() as primary,
        RedisServer(extra_args=["--replicaof", primary.host, str(primary.port)]) as replica,
        RedisSentinel(primary, service_name="ha", down_after_ms=1000) as watcher,
    ):
        replica_client = redis.Redis.from_url(replica.url)
        sentinel_client = redis.Redis(host=watcher.host, port=watcher.port)
        try:

            async def replica_known() -> bool:
                linked = replica_client.info("replication")["master_link_status"] == "up"
                return linked and len(sentinel_client.sentinel_slaves("ha")) == 1

            await _eventually(replica_known, "the replica to sync and the sentinel to see it", 30)
            app = App(
                "failover",
                redis_url=watcher.url,
                settings=fast_settings(),
                durability=DurabilitySettings(replicas=1, timeout=2.0),
            )

            @app.task
            async def slow_double(n: int) -> int:
                await asyncio.sleep(0.05)
                return 2 * n

            async with app, running_worker(app, concurrency=4):
                before = await slow_double.enqueue_many([(n,) for n in range(40)])
                # the worker is serving (declared, fetching) before the primary goes: a
                # worker that starts during the failover is another case
                await before[0].result(timeout=WAIT)
                await asyncio.to_thread(primary.kill)
                # new submissions answer unavailable until the sentinel has promoted
                # the replica, then go to it
                after = None
                deadline = time.monotonic() + 30
                while after is None:
                    answer = await slow_double.submit(100)
                    if answer.job is not None:
                        after = answer.job
                    else:
                        assert time.monotonic() < deadline, "no master after the failover"
                        await asyncio.sleep(0.2)
                master = sentinel_client.sentinel_get_master_addr_by_name("ha")
                assert int(master[1]) == replica.port
                results = [await job.result(timeout=WAIT * 2) for job in before]
                assert results == [2 * n for n in range(40)]
                assert await after.result(timeout=WAIT) == 200
        finally:
            replica_client.close()
            sentinel_client.close()
