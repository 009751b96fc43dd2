"""The server restarting and the connection failing under load; acknowledged enqueues.

Workers run in this process (``tests.e2e.helpers``), through :class:`FaultProxy` where
the link is what breaks, so each job's executions are counted in a plain dict: the
ledger of what ran. Producers talk to the server directly unless the test says so.

1. ``submit`` answers ``unavailable`` within the read timeout while the link is
   blackholed, at once while the server is down, and ``accepted`` once it is back;
   pooled connections reset while idle are reconnected, not failed; a worker rides
   out a restart that lost the data and the function library (loaded again on
   first use, lanes declared again) and runs what is submitted after it.
2. Every connection reset, again and again, mid-load: every job completes, none
   runs twice unless its lease was reclaimed, and the worker stops within its grace.
3. The link blackholed longer than a renewal interval but shorter than the lease:
   the running jobs finish and are settled when it comes back; nothing is lost.
4. The server SIGKILLed mid-load with AOF ``everysec`` and started again on the same
   port and directory: workers reconnect unaided, and every job acknowledged more
   than a second before the kill completes (the test prints how many were lost), and
   a result awaited across the restart arrives.
5. ``durability``: WAITAOF against a server with the AOF on; WAIT and WAITAOF asking
   for a replica that is not there report the shortfall within the timeout; a real
   replica (the same binary with ``--replicaof``) acknowledges.
6. An outage is logged once per loop, and the backoff doubles, capped and jittered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis

from fairlane import App, Context, TaskFailed
from fairlane.app.admission import NotAcknowledged
from fairlane.app.task import Task
from fairlane.config.settings import DurabilitySettings
from fairlane.gateway.ui.actions import retry
from fairlane.policy.backoff import Backoff
from fairlane.policy.retention import Retention
from fairlane.runtime.outage import Outage
from fairlane.store.wire import StoreUnavailable
from fairlane.testing import RedisServer
from tests.e2e.helpers import fast_settings, running_workers
from tests.faults.proxy import FaultProxy

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.embedded_only]

TIMEOUT = 0.5  # the apps' read and connect timeouts in these tests
LEASE = {"duration": 4.0, "renew_interval": 0.2, "sweep_interval": 0.3, "sweep_jitter": 0.0}


def make(namespace: str, url: str, ledger: Counter[int]) -> tuple[App, Task[Any, int]]:
    """An app with one task, ``work(n)``, that notes each execution of job ``n``."""
    settings = fast_settings(
        lease=LEASE,
        worker={"grace_period": 2.0, "idle_block": 0.5},
        connection={"timeout": TIMEOUT, "connect_timeout": TIMEOUT},
    )
    app = App(namespace, redis_url=url, settings=settings)

    @app.task(
        name="work",
        attempts=10,
        backoff=Backoff(0, 0, "none"),
        retention=Retention(completed=None, failed=None),
    )
    async def work(n: int, seconds: float = 0.01) -> int:
        await asyncio.sleep(seconds)
        ledger[n] += 1
        return n

    return app, work


async def wait_until(
    check: Callable[[], Awaitable[bool]], what: str, timeout: float, every: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(every)


async def statuses(app: App, ids: list[str]) -> Counter[str]:
    pipe = app.store.client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(app.store.keys.job(job_id), "st")
    return Counter((st or b"missing").decode() for st in await pipe.execute())


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


@pytest.fixture
def aof_server() -> Iterator[RedisServer]:
    with RedisServer(appendonly=True) as srv:
        yield srv


# -- 1. producers: unavailable, not a hang -------------------------------------------------


async def test_submit_is_unavailable_within_the_timeout_then_recovers(
    server: RedisServer, namespace: str
) -> None:
    ledger: Counter[int] = Counter()
    async with FaultProxy(server.host, server.port) as proxy:
        app, work = make(namespace, proxy.url, ledger)
        async with app:
            assert (await work.submit(1)).status == "accepted"

            proxy.pause()  # blackholed: the pooled connection is open but silent
            began = time.monotonic()
            answer = await work.submit(2)
            took = time.monotonic() - began
            assert answer.status == "unavailable" and answer.reason == "store_unavailable"
            assert TIMEOUT * 0.8 <= took < TIMEOUT + 0.5, took
            began = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await work.enqueue(3)
            assert time.monotonic() - began < 2 * TIMEOUT + 0.5
            proxy.resume()
            assert (await work.submit(4)).status == "accepted"

            # idle pooled connections reset (RST) under the pool: the next calls
            # reconnect instead of failing once each
            await asyncio.gather(*(work.submit(4) for _ in range(8)))
            assert proxy.reset() >= 8
            await asyncio.sleep(0.05)  # the resets reach the idle sockets
            answers = await asyncio.gather(*(work.submit(4) for _ in range(8)))
            assert [a.status for a in answers] == ["accepted"] * 8

            await asyncio.to_thread(server.kill)  # down: refused at once
            began = time.monotonic()
            assert (await work.submit(5)).status == "unavailable"
            assert time.monotonic() - began < TIMEOUT
            await asyncio.to_thread(server.restart)

            async with running_workers(app, concurrency=4):
                assert (await work.enqueue(5)).id
                await asyncio.to_thread(server.kill)
                await asyncio.sleep(0.5)  # the worker's calls fail meanwhile
                await asyncio.to_thread(
                    server.restart
                )  # no persistence: data and function library are gone
                answer = await work.submit(6)
                assert answer.status == "accepted", answer
                # the worker reconnects, declares its lanes again and runs it
                assert answer.job is not None and await answer.job.result(timeout=10) == 6


# -- 2, 3. the link breaks under a running worker ---------------------------------------


async def test_worker_survives_repeated_connection_resets(redis_url: str, namespace: str) -> None:
    host, port = redis_url.removeprefix("redis://").split("/")[0].split(":")
    ledger: Counter[int] = Counter()
    producer, work = make(namespace, redis_url, ledger)
    count = 300
    async with FaultProxy(host, int(port)) as proxy:
        consumer, _ = make(namespace, proxy.url, ledger)
        async with producer, consumer:
            jobs = await work.enqueue_many([(n,) for n in range(count)])
            ids = [job.id for job in jobs]
            async with running_workers(consumer, concurrency=20, stop_timeout=10):
                for _ in range(6):
                    await asyncio.sleep(0.15)
                    proxy.reset()

                async def done() -> bool:
                    return (await statuses(producer, ids))["completed"] == count

                await wait_until(done, "every job to complete", 30)
                # the last reset lands while the worker stops: it must not hang on it
                proxy.reset()
                stopping = time.monotonic()
            took = time.monotonic() - stopping
            stats = await producer.stats()
    assert took < consumer.settings.worker.grace_period + 1.0, f"stopping took {took:.1f}s"
    assert proxy.resets >= 6, "the resets must have cut live connections"
    assert set(ledger) == set(range(count)), "a job never ran"
    reruns = sum(ledger.values()) - count
    assert reruns <= stats.get("reclaimed", 0), (reruns, stats)
    print(f"\nresets: {proxy.resets} connections cut; reruns {reruns}; stats {stats}")


async def test_blackhole_shorter_than_the_lease_loses_nothing(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="fairlane.worker")
    host, port = redis_url.removeprefix("redis://").split("/")[0].split(":")
    ledger: Counter[int] = Counter()
    producer, work = make(namespace, redis_url, ledger)
    count = 40
    async with FaultProxy(host, int(port)) as proxy:
        consumer, _ = make(namespace, proxy.url, ledger)
        async with producer, consumer:
            jobs = await work.enqueue_many([(n, 0.6) for n in range(count)])
            ids = [job.id for job in jobs]
            async with running_workers(consumer, concurrency=10):

                async def running() -> bool:
                    return (await statuses(producer, ids))["running"] >= 5

                await wait_until(running, "jobs to be running", 10)
                # longer than several renewals, shorter than the 4 s lease
                proxy.pause()
                await asyncio.sleep(1.5)
                finished_while_cut = sum(ledger.values())
                proxy.resume()

                async def done() -> bool:
                    return (await statuses(producer, ids))["completed"] == count

                await wait_until(done, "every job to complete", 30)
            stats = await producer.stats()
    assert finished_while_cut > 0, "running jobs must carry on while the link is cut"
    # one warning per loop and outage (fetch, settle, renew, sweep), not one per attempt
    down = [r for r in caplog.records if "store is unreachable" in r.getMessage()]
    again = [r for r in caplog.records if "still unreachable" in r.getMessage()]
    assert 1 <= len(down) <= 4 and again, (len(down), len(again))
    assert set(ledger) == set(range(count))
    assert sum(ledger.values()) == count, "no job may run twice"
    print(f"\nfinished while cut: {finished_while_cut}; stats {stats}")


# -- 4. the server restarts mid-load ---------------------------------------------------------


async def test_server_restart_with_aof_loses_at_most_the_last_second(
    aof_server: RedisServer, namespace: str
) -> None:
    ledger: Counter[int] = Counter()
    producer, work = make(namespace, aof_server.url, ledger)
    consumer, _ = make(namespace, aof_server.url, ledger)
    acked: dict[str, float] = {}  # job id -> when its enqueue was acknowledged
    refused = 0
    kill_at = 0.0
    stop_producing = asyncio.Event()

    async def produce() -> None:
        nonlocal refused
        n = 0
        while not stop_producing.is_set():
            try:
                batch = await work.enqueue_many([(n + i,) for i in range(10)])
            except StoreUnavailable:
                refused += 1
            else:
                now = time.monotonic()
                acked.update((job.id, now) for job in batch)
                n += 10
            await asyncio.sleep(0.01)

    async with producer, consumer:
        async with running_workers(consumer, count=2, concurrency=20), asyncio.TaskGroup() as tg:
            tg.create_task(produce())
            await asyncio.sleep(1.5)
            # a producer awaiting a result across the restart: due after the server is back
            late = await work.enqueue(-1, delay=1.0)
            kill_at = time.monotonic()
            await asyncio.to_thread(aof_server.kill)
            # ... which starts waiting (and subscribing) while the server is down
            result = tg.create_task(late.result(timeout=20))
            await asyncio.sleep(0.5)
            await asyncio.to_thread(aof_server.restart)
            await asyncio.sleep(1.0)
            stop_producing.set()
            ids = list(acked)

            async def settled() -> bool:
                found = await statuses(producer, ids)
                return found["completed"] + found["missing"] == len(ids)

            await wait_until(settled, "every stored job to complete", 30)
        found = await statuses(producer, ids)
        missing = []
        pipe = producer.store.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.exists(producer.store.keys.job(job_id))
        for job_id, exists in zip(ids, await pipe.execute(), strict=True):
            if not exists:
                missing.append(job_id)
    lost_ages = sorted(kill_at - acked[job_id] for job_id in missing)
    print(
        f"\nacknowledged {len(ids)} jobs, {refused} batches refused while down; "
        f"lost {len(missing)} (acknowledged {lost_ages[:3]}... s before the kill); {found}"
    )
    assert result.result() == -1, "a result awaited across the restart must arrive"
    assert refused > 0, "the producer must have seen the outage"
    assert sum(1 for t in acked.values() if t > kill_at) > 0, "enqueues resumed after the restart"
    assert all(age < 1.5 for age in lost_ages), "only the last second of writes may be lost"
    assert found["completed"] == len(ids) - len(missing)


# -- 5. acknowledged enqueues ----------------------------------------------------------------


async def test_waitaof_and_wait_report_what_was_acknowledged(
    aof_server: RedisServer, server: RedisServer, namespace: str
) -> None:
    ledger: Counter[int] = Counter()
    app, work = make(namespace, aof_server.url, ledger)
    async with app:
        local = await work.submit(1, durability=DurabilitySettings(aof=True, timeout=1.0))
        assert local.status == "accepted" and local.acknowledgement is not None
        assert local.acknowledgement.met and local.acknowledgement.local

        for asked in (DurabilitySettings(replicas=1, timeout=0.2),
                      DurabilitySettings(replicas=1, aof=True, timeout=0.2)):  # fmt: skip
            began = time.monotonic()
            answer = await work.submit(2, durability=asked)
            took = time.monotonic() - began
            ack = answer.acknowledgement
            assert answer.status == "accepted" and ack is not None
            assert not ack.met and ack.replicas == 0, ack
            assert 0.15 <= took < 0.2 + TIMEOUT, took
            assert answer.job is not None and await answer.job.status() == "queued"

        with pytest.raises(NotAcknowledged) as raised:
            await work.enqueue(3, durability=DurabilitySettings(replicas=1, timeout=0.1))
        assert len(raised.value.jobs) == 1 and "1 replica" in str(raised.value)
        with pytest.raises(NotAcknowledged):
            await work.enqueue_many(
                [(4,), (5,)], durability=DurabilitySettings(replicas=1, timeout=0.1)
            )

        # the primary streams its data to a new replica at once, not after the 5 s delay
        await app.store.client.config_set("repl-diskless-sync-delay", 0)
        with RedisServer(extra_args=["--replicaof", aof_server.host, str(aof_server.port)]) as rep:
            replica = redis.Redis.from_url(rep.url, socket_timeout=5)
            try:

                async def linked() -> bool:
                    info = await asyncio.to_thread(replica.info, "replication")
                    return info.get("master_link_status") == "up"

                await wait_until(linked, "the replica to sync", 10)
            finally:
                replica.close()
            answer = await work.submit(6, durability=DurabilitySettings(replicas=1, timeout=2.0))
            assert answer.acknowledgement is not None and answer.acknowledgement.met
            assert answer.acknowledgement.replicas == 1

    plain, plain_work = make(namespace, server.url, ledger)
    async with plain:  # the AOF off: WAITAOF is refused, and that is reported
        answer = await plain_work.submit(7, durability=DurabilitySettings(aof=True))
        ack = answer.acknowledgement
        assert answer.status == "accepted" and ack is not None
        assert not ack.met and ack.error is not None and "appendonly" in ack.error


async def test_children_and_dashboard_retries_wait_for_the_apps_durability(
    server: RedisServer, namespace: str
) -> None:
    """A workflow's children and the dashboard's retries are enqueues like any other:
    with ``durability`` asking for a replica that is not there, a run's children are
    stored but the run does not go on, and a retry says it was not acknowledged."""
    shortfall = DurabilitySettings(replicas=1, timeout=0.1)
    app = App(namespace, redis_url=server.url, settings=fast_settings(), durability=shortfall)

    @app.task(name="child")
    async def child() -> int:
        return 1

    @app.workflow(name="parent", attempts=1)
    async def parent(ctx: Context) -> int:
        (one,) = await ctx.gather(ctx.call(child))
        return one

    async with app:
        run = await parent.enqueue(durability=DurabilitySettings())
        async with running_workers(app):
            with pytest.raises(TaskFailed) as failed:
                await run.result(timeout=10)
        assert failed.value.type_name.endswith(".NotAcknowledged"), failed.value
        assert await app.store.job_fields(f"{run.id}.0.0", "task") == [b"child"]

        gone = await child.enqueue(durability=DurabilitySettings())
        await gone.cancel()
        outcome, new_id = await retry(app, gone.id)
        assert outcome == "accepted:not_acknowledged" and new_id is not None


# -- the backoff and the log of an outage ----------------------------------------------------


def test_outage_logs_once_and_backs_off_within_its_cap(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="test.outage")
    outage = Outage("fetching", logging.getLogger("test.outage"), base=0.1, cap=5.0)
    delays = [outage.failed(OSError("refused")) for _ in range(12)]
    for n, delay in enumerate(delays, start=1):
        step = min(5.0, 0.1 * 2 ** (n - 1))
        assert step / 2 <= delay <= step, (n, delay)
    assert len({round(d, 6) for d in delays[8:]}) > 1, "capped delays must still be jittered"
    outage.recovered()
    assert not outage.down and outage.failures == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # one when it went down, one when it came back
    assert "unreachable" in warnings[0] and "answers again" in warnings[1]
