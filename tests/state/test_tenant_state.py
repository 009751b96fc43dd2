"""What 20,000 one-job tenants leave behind, once the tenant sweep has run: nothing.

On a private server (its ``used_memory`` is the app's alone), an app whose task keeps no
completed records (``Retention(completed=0)``: the records themselves are trimmed as
they settle, so the per-tenant state is all that could stay) and whose tenants are
forgotten after ``tenants.idle_ttl`` of 2 s. The state before is taken after a warm-up
of the same shape (one tenant's 50 jobs and 2,000 one-job tenants, through the same
enqueues and the same burst worker), swept in the same way: the server's own buffers
(its reply and scratch buffers) reach a high-water mark with the first burst of that
shape, about 100 KB on a fresh server, and stay there to within bytes however many
rounds of 20,000 new tenants follow; warming them makes the comparison one of stored
data alone. Compared: every key under the app's prefix with its type and size (HLEN,
ZCARD, LLEN, SCARD) -- the same keys, the same number of fields in each -- and
``used_memory`` within 5 %. ``used_memory`` counts the allocator's bytes in use (not
RSS, so MEMORY PURGE does not change it); the app's connections are closed and the slow
log emptied before each reading so that only stored data differs, and the noise of two
readings of the same state is printed beside the figures.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from fairlane import App
from fairlane.app.task import Task
from fairlane.policy.retention import Retention
from fairlane.runtime.tenant_sweep import TenantSweeper
from fairlane.store.api import Store
from fairlane.testing import RedisServer
from tests.e2e.helpers import fast_settings

pytestmark = [pytest.mark.anyio, pytest.mark.embedded_only]

TENANTS = 20_000
WARM_TENANTS = 2_000
IDLE_TTL = 2.0
SIZE = {b"hash": "hlen", b"zset": "zcard", b"list": "llen", b"set": "scard"}


@pytest.fixture(scope="module")
def private_url() -> Iterator[str]:
    with RedisServer() as server:
        yield server.url


async def snapshot(client: aioredis.Redis, pattern: str) -> dict[bytes, tuple[bytes, int]]:
    """Every key of the app with its type and its number of fields or members (a string,
    the fence counter, by its type alone), but the lane's wake list: a single token that
    is there or not by the timing of the last wake-up. A class's ring of starts holds a
    field per second it started jobs in, as many as the clock gave the run (at most its
    span, ``fairlane.policy.starts``): it is compared by its type alone."""
    out = {}
    async for key in client.scan_iter(match=pattern, count=1000):
        if key.endswith(b":wake"):
            continue
        kind = await client.type(key)
        by_clock = key.endswith(b":starts")
        size = await getattr(client, SIZE[kind])(key) if kind in SIZE and not by_clock else 0
        out[key] = (kind, int(size))
    return out


async def used_memory(client: aioredis.Redis) -> int:
    await client.slowlog_reset()
    await asyncio.sleep(1.0)  # the server's cron shrinks the keyspace's tables meanwhile
    return int((await client.info("memory"))["used_memory"])


async def enqueue_one_job_tenants(noop: Task[[], None], name: str, n: int) -> None:
    """One job each for tenants ``<name>-0`` .. ``<name>-<n-1>``, 40 enqueues in flight at
    a time (within the app's connection pool)."""
    for start in range(0, n, 40):
        await asyncio.gather(
            *(noop.enqueue(tenant=f"{name}-{i}", trace=False) for i in range(start, start + 40))
        )


async def forget_idle(store: Store) -> tuple[int, int]:
    """Sweep to the end, wait past ``idle_ttl`` and sweep to the end again: a finish tag
    above V is forgotten once the sweep has seen it unchanged for ``idle_ttl``."""
    passes, removed = await sweep_to_the_end(store)
    await asyncio.sleep(IDLE_TTL + 1.1)
    more_passes, more = await sweep_to_the_end(store)
    return passes + more_passes, removed + more


async def sweep_to_the_end(store: Store) -> tuple[int, int]:
    """Whole cycles of passes until one removes nothing; returns (passes, removed)."""
    passes = removed = 0
    while True:
        cursor, removed_in_cycle = "0", 0
        while True:
            swept = await store.sweep_tenants(cursor, 500, IDLE_TTL)
            passes += 1
            removed_in_cycle += swept.removed
            cursor = swept.cursor
            if cursor == "0":
                break
        removed += removed_in_cycle
        if removed_in_cycle == 0:
            return passes, removed


async def test_twenty_thousand_one_job_tenants_leave_nothing_behind(private_url: str) -> None:
    namespace = "state_" + secrets.token_hex(4)
    # the workers' own sweep waits an hour: this test drives the passes, then one turn
    settings = fast_settings(tenants={"idle_ttl": IDLE_TTL, "sweep_interval": 3600})

    def make_app() -> tuple[App, Task[[], None]]:
        app = App(namespace, redis_url=private_url, settings=settings)

        @app.task(retention=Retention(completed=0))
        async def noop() -> None:
            return None

        return app, noop

    meter = aioredis.Redis.from_url(private_url)
    sweeper_store = Store.from_url(private_url, namespace, max_connections=1)
    await sweeper_store.connect()
    pattern = sweeper_store.keys.match_all()
    try:
        warm, noop = make_app()
        async with warm:
            await noop.enqueue_many([() for _ in range(50)], tenant="warm")
            await enqueue_one_job_tenants(noop, "warm", WARM_TENANTS)
            await warm.run_worker(concurrency=200, burst=True)
        await forget_idle(sweeper_store)
        # what retention removed is noted per job (bounded, the newest 10,000), not per
        # tenant: it is left out of both readings
        await meter.delete(sweeper_store.keys.gone)
        before = await snapshot(meter, pattern)
        memory_before = await used_memory(meter)
        memory_again = await used_memory(meter)

        started = time.monotonic()
        app, noop = make_app()
        async with app:
            await enqueue_one_job_tenants(noop, "user", TENANTS)
            await app.run_worker(concurrency=200, burst=True)
            assert (await app.stats()).get("completed", 0) >= TENANTS + WARM_TENANTS + 50
        ran = time.monotonic() - started
        during = await snapshot(meter, pattern)
        memory_during = int((await meter.info("memory"))["used_memory"])

        passes, removed = await forget_idle(sweeper_store)
        # and the worker's own service, once: there is nothing left for it
        assert await TenantSweeper(sweeper_store, settings.tenants).turn() == 0
        assert await meter.zcard(sweeper_store.keys.gone) <= 10_000
        await meter.delete(sweeper_store.keys.gone)
        after = await snapshot(meter, pattern)
        memory_after = await used_memory(meter)
    finally:
        await sweeper_store.aclose()
        await meter.aclose()
    fields_during = sum(n for _, n in during.values())
    print(
        f"\n{TENANTS} tenants in {ran:.1f}s; during: {len(during)} keys, {fields_during} "
        f"fields/members, used_memory {memory_during}; swept in {passes} passes, "
        f"{removed} removed; used_memory before {memory_before} (again {memory_again}), "
        f"after {memory_after} ({(memory_after - memory_before) / memory_before:+.2%})"
    )
    # every tenant left a learned cost and a finish tag, and the sweeps removed them all
    assert sum(1 for key in during if b":cost:user-" in key) == TENANTS
    assert sum(n for key, (_, n) in during.items() if key.endswith(b":vt")) >= TENANTS
    assert removed >= 2 * TENANTS
    assert after == before
    assert abs(memory_after - memory_before) <= 0.05 * memory_before
