"""A job through Sentinel: a real sentinel process, from the same binary, monitoring a private
server; the app finds the master by asking it, by URL and by ``App(sentinels=...)``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from redis.asyncio.sentinel import SentinelConnectionPool

from fairlane import App
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

    async with app, running_worker(app):
        # the client asks the sentinel for the master, not a fixed address
        assert isinstance(app.store.client.connection_pool, SentinelConnectionPool)
        job = await shout.enqueue("hi", tenant="acme")
        assert await job.result(timeout=WAIT) == "HI"
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
