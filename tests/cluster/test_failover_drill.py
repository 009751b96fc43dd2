"""A failover drill: a primary of a cluster with a replica per primary dies mid-run.

An app of three shards shares a global key (limit 4) between tenants of every shard;
two workers serve them. The primary holding shard 1 is killed with SIGKILL while the
key is busy. The app must keep serving the other shards while the replica is promoted,
the failed shard's work must resume after it, and every job must finish. The key's
running count is recorded at every start across the failover: replication is
asynchronous, so the promoted replica may have missed the last orders the balancer
sent that shard (a lowered part comes back higher) until the next pass lowers it again;
the test holds the count to what that can add (the failed shard's whole part, at most
the key), and prints what it saw.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from fairlane import App
from fairlane.testing import RedisCluster
from tests.cluster.test_global_keys import peak_overlap
from tests.e2e.helpers import eventually, fast_settings, running_workers
from tests.shards.test_sharding import tenants_of

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LIMIT = 4
JOBS = 60
DRILL_WAIT = 90.0


def _promoted(cluster: RedisCluster, shard: int) -> bool:
    client = redis.Redis(port=cluster.followers[shard].port, socket_timeout=2.0)
    try:
        return client.info("replication").get("role") == "master"
    finally:
        client.close()


async def _count_at_least(spans: list[tuple[float, float, str]], count: int) -> bool:
    return len(spans) >= count


async def test_a_primary_dies_and_the_app_serves_on() -> None:
    with RedisCluster(replicas=1, node_timeout_ms=1000) as cluster:
        app = App("drill", redis_url=cluster.url, settings=fast_settings(), shards=3)
        spans: list[tuple[float, float, str]] = []

        @app.task(limits={"model:big": LIMIT}, attempts=5)
        async def call_model(who: str) -> None:
            start = time.monotonic()
            await asyncio.sleep(0.05)
            spans.append((start, time.monotonic(), who))

        tenants = {shard: names[0] for shard, names in tenants_of(app, range(3)).items()}
        async with app:
            jobs = []
            for tenant in tenants.values():
                jobs += await call_model.enqueue_many([(tenant,)] * JOBS, tenant=tenant)
            async with running_workers(app, count=2, concurrency=16):
                await eventually(lambda: _count_at_least(spans, 30), timeout=DRILL_WAIT)
                killed = time.monotonic()
                await asyncio.to_thread(cluster.servers[1].kill)
                await eventually(
                    lambda: asyncio.to_thread(_promoted, cluster, 1), timeout=DRILL_WAIT, every=0.1
                )
                promoted = time.monotonic()
                await asyncio.gather(*(job.result(timeout=DRILL_WAIT) for job in jobs))
    served = {who for start, _, who in spans if killed <= start < promoted}
    after = {who for start, _, who in spans if start >= promoted}
    peak = peak_overlap([(s, e) for s, e, _ in spans])
    print(
        f"failover drill: promoted {promoted - killed:.2f} s after the kill; "
        f"shards serving meanwhile: {sorted(served)}; peak on the key {peak} (limit {LIMIT})"
    )
    assert len({who for *_, who in spans}) == 3
    assert served - {tenants[1]}, "no other shard was served while the primary was down"
    assert tenants[1] in after, "the failed shard's work did not resume"
    assert peak <= 2 * LIMIT
