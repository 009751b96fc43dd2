"""A store that fills: admission stops at the memory mark, and a full server still drains.

Each test starts a private server with the ``noeviction`` policy (what ``fairlane
doctor`` asks for) and a small ``maxmemory``; workers and the gateway run in this
process (``tests.e2e.helpers``, ``httpx`` on the gateway's ASGI app).

1. Producers flooding a 12 MB server -- ``enqueue_many`` from several tasks at once,
   ``submit`` with an idempotency key on a lane with an admission pool, the gateway --
   are refused ``store_full`` (``Rejected``, a rejected ``Admission``, a 429 with
   Retry-After, counted by the gateway's metrics) before the server refuses a single
   write: its error stats count no OOM, and it stays under its limit. What was
   refused left nothing behind (no job record, no idempotency entry, no
   reservation). A worker then drains the backlog, and the producers are accepted
   again.
2. A server pushed past its limit with plain keys by a raw client (no mark in the
   way): a worker starts there without loading the library again, dispatches, keeps
   its leases by renewing them (each job outlasts its lease), beats, sweeps and acks,
   logging no refusal; the tenant sweep runs there too; and every
   write the server refuses reaches its caller as Fairlane's ``StoreFull`` (or, for a
   submission, ``Rejected("store_full")``): a function, a transaction, a pipeline, a
   script, the synchronous client, the gateway's other routes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from fairlane import App, Context, Rejected, StoreFull
from fairlane.app.job import Job
from fairlane.config.pools import parse_config
from fairlane.config.settings import DurabilitySettings
from fairlane.gateway import ApiKeys, create_app
from fairlane.policy.retention import Retention
from fairlane.store.base import unavailable
from fairlane.store.connection import create_sync_client
from fairlane.testing import RedisServer
from tests.e2e.helpers import WAIT, app_keys, eventually, fast_settings, running_workers
from tests.metrics.helpers import parse, series

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.embedded_only]

ADMIN_KEY = "admin-" + "f" * 32
ANSWERS = "fairlane_gateway_admissions_total"
TENANT = "acme"
PAD = "x" * 200  # each flooded job's argument
BATCH = 100
PRODUCERS = 4
METERED = "metered"
DROP_COMPLETED = Retention(completed=0)
POOL = {
    "pools": {
        METERED: {
            "capacity_units": 1_000_000,
            "classes": {
                "standard": {
                    "nominal_share": 1.0,
                    "max_queue": 1_000_000,
                    "response_when_full": "reject",
                }
            },
        }
    },
    "estimation": {"safety_multiplier": 1.0},
}


@pytest.fixture
def small_server() -> Iterator[RedisServer]:
    with RedisServer(extra_args=["--maxmemory", "12mb", "--maxmemory-policy", "noeviction"]) as s:
        yield s


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer(extra_args=["--maxmemory-policy", "noeviction"]) as s:
        yield s


@asynccontextmanager
async def http(app: App) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    """The app's gateway and a key of ``TENANT`` (minted now: the store has room yet)."""
    api = create_app(app, admin_key=ADMIN_KEY)
    minted = await ApiKeys(app.store.key_records).create(TENANT)
    headers = {"Authorization": f"Bearer {minted.key}"}
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        yield client, headers


def oom_errors(raw: redis.Redis) -> int:
    """Writes the server refused for want of memory, by its own count."""
    stats: dict[str, Any] = raw.info("errorstats")
    return int(stats.get("errorstat_OOM", {}).get("count", 0))


def memory(raw: redis.Redis) -> tuple[int, int]:
    info: dict[str, Any] = raw.info("memory")
    return int(info["used_memory"]), int(info["maxmemory"])


def assert_store_full(error: Rejected) -> None:
    assert error.reason == "store_full"
    assert error.retry_after is not None and error.retry_after >= 1


# -- 1. the mark: refused before the server refuses, nothing left behind, drained ------------


async def test_producers_are_refused_at_the_mark_before_the_server_refuses_and_a_worker_drains(
    small_server: RedisServer,
) -> None:
    url = small_server.url
    app = App("flood", redis_url=url, settings=fast_settings(), config=parse_config(POOL))

    @app.task(name="flood", gateway=True, retention=DROP_COMPLETED)
    async def flood(n: int, pad: str) -> None:
        return None

    @app.task(name="metered", lane=METERED, retention=DROP_COMPLETED)
    async def metered(n: int) -> None:
        return None

    raw = redis.Redis.from_url(url)
    async with app, http(app) as (gateway, key):
        assert (await metered.submit(0, tenant=TENANT, estimate=1)).status == "accepted"
        reserved = await reservation(app)
        stored: list[str] = []

        async def producer(k: int) -> Rejected:
            while True:
                try:
                    jobs = await flood.enqueue_many(
                        [(n, PAD) for n in range(BATCH)], tenant=f"t{k}"
                    )
                except Rejected as refused:
                    return refused
                stored.extend(job.id for job in jobs)

        refusals = await asyncio.gather(*(producer(k) for k in range(PRODUCERS)))
        for refused in refusals:
            assert_store_full(refused)

        # while full: a pooled submit, a pooled batch and the gateway are refused too
        late = await metered.submit(1, tenant=TENANT, estimate=1, idempotency_key="late-1")
        assert (late.status, late.reason, late.job) == ("rejected", "store_full", None)
        assert late.retry_after is not None and late.retry_after >= 1
        with pytest.raises(Rejected) as batch:
            await metered.enqueue_many([(n,) for n in range(10)], tenant=TENANT, estimate=1)
        assert_store_full(batch.value)
        answer = await gateway.post(
            "/v1/jobs", json={"task": "flood", "args": [1, PAD]}, headers=key
        )
        assert answer.status_code == 429, answer.text
        assert answer.json()["reason"] == "store_full"
        assert int(answer.headers["Retry-After"]) >= 1
        # the store counts none of these (nothing was written): the gateway counts its own
        told = series(parse((await gateway.get("/metrics")).text), ANSWERS)
        assert told[(("reason", "store_full"), ("verdict", "rejected"))] == 1

        # refused before the server refused anything, and nothing of it written
        used, limit = memory(raw)
        assert oom_errors(raw) == 0
        assert used < limit
        records = await app_keys(url, "flood", "job:*")
        assert len(records) == len(stored) + 1  # the flood's jobs and the first metered one
        assert not await app.store.client.hexists(app.store.keys.idem, "late-1")
        assert await reservation(app) == reserved

        async with running_workers(app, lanes=["default", METERED], concurrency=50):

            async def drained() -> bool:
                return (await app.stats()).get("completed", 0) >= len(stored) + 1

            await eventually(drained, timeout=60, every=0.2)
            await eventually(accepted_again(flood), timeout=WAIT, every=0.2)
            again = await gateway.post(
                "/v1/jobs", json={"task": "flood", "args": [2, PAD]}, headers=key
            )
            assert again.status_code == 202, again.text
            assert (await metered.submit(2, tenant=TENANT, estimate=1)).admitted
    assert oom_errors(raw) == 0
    raw.close()


async def reservation(app: App) -> int:
    """Milli-units reserved in the metered lane's class."""
    raw = await app.store.client.hget(app.store.keys.lane(METERED).state, "ar:standard")
    return int(raw or 0)


def accepted_again(task: Any) -> Any:
    async def check() -> bool:
        try:
            await task.enqueue_many([(n, PAD) for n in range(BATCH)])
        except Rejected as refused:
            assert_store_full(refused)
            return False
        return True

    return check


# -- 2. past the limit: workers still run, every refusal is Fairlane's ------------------------

LEASE = {"duration": 1.0, "renew_interval": 0.2, "sweep_interval": 0.3, "sweep_jitter": 0.0}
JOBS = 12
OUTLASTS_LEASE = 1.5  # seconds each job runs: longer than its lease, so only renewals keep it


def past_limit_app(url: str, **settings: Any) -> App:
    app = App("past", redis_url=url, settings=fast_settings(lease=LEASE, **settings))

    @app.task(name="slow", gateway=True, attempts=1, retention=Retention(completed=None))
    async def slow(n: int) -> int:
        await asyncio.sleep(OUTLASTS_LEASE)
        return n

    # on a lane no worker serves: its run waits for the test's signal
    @app.workflow(name="approval", lane="held", gateway=True)
    async def approval(ctx: Context, doc: str) -> Any:
        return await ctx.wait_for_signal("approve", timeout=60)

    return app


def fill_past_the_limit(raw: redis.Redis) -> None:
    """Plain keys written by a raw client, then a limit under what the server uses."""
    pipe = raw.pipeline(transaction=False)
    for i in range(4000):
        pipe.set(f"ballast:{i}", "b" * 1000)
    pipe.execute()
    used, _ = memory(raw)
    raw.config_set("maxmemory", str(used // 2))
    with pytest.raises(redis.OutOfMemoryError):
        raw.set("ballast:probe", "b")


def function_loads(raw: redis.Redis) -> int:
    stats: dict[str, Any] = raw.info("commandstats")
    return int(stats.get("cmdstat_function|load", {}).get("calls", 0))


async def test_a_server_past_its_limit_still_runs_workers_and_every_refusal_is_fairlanes(
    server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="fairlane")
    url = server.url
    raw = redis.Redis.from_url(url)
    producer = past_limit_app(url)
    async with producer, http(producer) as (gateway, key):
        slow = producer.get_task("slow")
        ids = [job.id for job in await slow.enqueue_many([(n,) for n in range(JOBS)])]
        run = await producer.get_task("approval").enqueue("contract", tenant=TENANT)
        fill_past_the_limit(raw)
        loads = function_loads(raw)

        # a worker's app connects, declares and serves as it would anywhere
        worker_app = past_limit_app(url)
        async with worker_app, running_workers(worker_app, concurrency=JOBS):
            assert function_loads(raw) == loads  # the library was there: not loaded again
            task = worker_app.get_task("slow")
            results = [await Job(task, i).result(timeout=WAIT) for i in ids]
            assert results == list(range(JOBS))
            attempts = {(await Job(task, i).info()).attempts for i in ids}
            assert attempts == {1}  # each kept its lease past its length: renewals ran
            # the tenant sweep a worker runs every minute, by hand: it deletes, so it runs
            assert (await worker_app.store.sweep_tenants("0", 1000, 3600.0)).examined > 0
            # nothing the worker did was refused: no outage, no failure logged
            assert [r.getMessage() for r in caplog.records] == []
            await refusals_are_fairlanes(producer, gateway, key, run.id, url)
        assert (await producer.stats()).get("completed", 0) == JOBS
    raw.close()


async def refusals_are_fairlanes(
    app: App, gateway: httpx.AsyncClient, key: dict[str, str], run_id: str, url: str
) -> None:
    slow = app.get_task("slow")
    # at the mark (the server is past it): refused before anything is sent
    with pytest.raises(Rejected) as marked:
        await slow.enqueue(1)
    assert_store_full(marked.value)
    answer = await gateway.post("/v1/jobs", json={"task": "slow", "args": [1]}, headers=key)
    assert (answer.status_code, answer.json()["reason"]) == (429, "store_full")
    assert int(answer.headers["Retry-After"]) >= 1

    # the mark off: the server's own refusal, of the function call and of the pipeline
    # that waits for durability, is the same answer
    unmarked = past_limit_app(url, queues={"memory_high_water": None})
    async with unmarked:
        task = unmarked.get_task("slow")
        with pytest.raises(Rejected) as refused:
            await task.enqueue(1)
        assert_store_full(refused.value)
        with pytest.raises(Rejected) as batch:
            await task.enqueue_many([(1,), (2,)])
        assert_store_full(batch.value)
        waited = await task.submit(1, durability=DurabilitySettings(aof=True))
        assert (waited.status, waited.reason) == ("rejected", "store_full")

    # writes outside a submission: StoreFull, with a retry hint
    with pytest.raises(StoreFull) as weight:
        await app.tenants.configure(TENANT, weight=2)
    with pytest.raises(StoreFull) as limits:  # a WATCH/MULTI transaction
        await app.tenants.configure(TENANT, max_concurrency=3)
    client = aioredis.Redis.from_url(url)
    sync = create_sync_client(url)
    try:
        with pytest.raises(StoreFull) as piped, unavailable():
            await client.pipeline(transaction=False).set("k", "v").get("k").execute()
        with pytest.raises(StoreFull) as scripted, unavailable():
            await client.eval("return redis.call('SET', KEYS[1], 'v')", 1, "k")
        with pytest.raises(StoreFull) as blocking, unavailable():
            sync.set("k", "v")
    finally:
        await client.aclose()
        sync.close()
    for error in (weight, limits, piped, scripted, blocking):
        assert error.value.retry_after >= 1
        assert "maxmemory" in str(error.value)

    # the gateway's other writes: 503 store_full, not a server error
    signalled = await gateway.post(
        f"/v1/runs/{run_id}/signals/approve", json={"payload": True}, headers=key
    )
    assert (signalled.status_code, signalled.json()["reason"]) == (503, "store_full")
    assert int(signalled.headers["Retry-After"]) >= 1
    # reading, cancelling and watching still work
    assert (await gateway.get(f"/v1/jobs/{run_id}", headers=key)).status_code == 200
    assert (await gateway.delete(f"/v1/jobs/{run_id}", headers=key)).json()["status"] in (
        "cancelled",
        "cancelling",
    )
