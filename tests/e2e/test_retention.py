"""Retention end to end: finished job records stay bounded by count and by age.

Records are counted with SCAN over the app's ``job:*`` keys, and the retention
indexes (``kept:<task>:ok`` / ``kept:<task>:failed``) are read directly.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from fairlane import Backoff, Job, JobNotFound, Retention, TaskFailed
from fairlane.store.keys import AppKeys
from tests.e2e.helpers import WAIT, app_keys, eventually, make_app, running_worker

pytestmark = pytest.mark.anyio

NO_WAIT = Backoff(base=0.01, cap=0.01, jitter="none")


async def test_count_bound_holds_over_twenty_thousand_jobs(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url, worker={"fetch_batch": 200})
    done = 0

    @app.task(retention=Retention(completed=100))
    async def noop(n: int) -> None:
        nonlocal done
        done += 1

    total = 20_000
    keys = AppKeys.for_app(namespace)
    async with app:
        client = app.store.client
        started = time.monotonic()
        jobs = []
        for first in range(0, total, 2_000):
            jobs += await noop.enqueue_many([(n,) for n in range(first, first + 2_000)])
        assert len(jobs) == total
        async with running_worker(app, concurrency=200):

            async def all_done() -> bool:
                return (await app.stats()).get("completed", 0) >= total

            await eventually(all_done, timeout=90, every=0.2)
        assert done == total
        assert time.monotonic() - started < 90

        records = await app_keys(redis_url, namespace, "job:*")
        assert 0 < len(records) <= 110
        kept = await client.zcard(keys.kept(noop.name, "ok"))
        assert 0 < kept <= 100
        # the records that remain are the newest ones, and each is in the index
        newest = {keys.job(j.id).encode() for j in jobs[-50:]}
        assert newest <= records
        assert await client.zscore(keys.kept(noop.name, "ok"), jobs[-1].id) is not None
        assert await jobs[-1].status() == "completed"
        with pytest.raises(JobNotFound):
            await jobs[0].status()
        with pytest.raises(JobNotFound):
            await jobs[0].result(timeout=WAIT)


async def test_age_bound_removes_records_after_the_sweep(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url, lease={"sweep_interval": 0.2})

    @app.task(retention=Retention(completed="1s"))
    async def short_lived(n: int) -> int:
        return n

    @app.task(retention=Retention(completed=None))
    async def kept_forever(n: int) -> int:
        return n

    keys = AppKeys.for_app(namespace)
    async with app, running_worker(app):
        jobs = [await short_lived.enqueue(n, idempotency_key=f"once-{n}") for n in range(5)]
        forever = await kept_forever.enqueue(99)
        assert [await j.result(timeout=WAIT) for j in jobs] == list(range(5))
        assert await forever.result(timeout=WAIT) == 99
        last_finish = max([(await j.info()).finished_at for j in jobs])  # type: ignore[type-var]
        assert last_finish is not None
        client = app.store.client
        assert await client.hlen(keys.idem) == 5
        assert len(await app_keys(redis_url, namespace, "job:*")) == 6

        async def gone() -> bool:
            records = await app_keys(redis_url, namespace, "job:*")
            return records == {keys.job(forever.id).encode()}

        await eventually(gone, timeout=WAIT)
        # not before the age had passed (the server's clock is this machine's)
        assert time.time() - last_finish.timestamp() >= 1.0 - 0.05
        assert await client.zcard(keys.kept(short_lived.name, "ok")) == 0
        for job in jobs:
            with pytest.raises(JobNotFound):
                await job.status()
        # the idempotency entries went with their jobs: the same key makes a new job
        assert await client.hlen(keys.idem) == 0
        again = await short_lived.enqueue(7, idempotency_key="once-0")
        assert again.created and again.id != jobs[0].id
        assert await again.result(timeout=WAIT) == 7
        # a task that keeps its records forever is untouched
        assert await forever.status() == "completed"


async def test_idempotency_entry_is_removed_with_its_job_on_count_trim(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task(retention=Retention(completed=2))
    async def step(n: int) -> int:
        return n

    keys = AppKeys.for_app(namespace)
    async with app, running_worker(app, concurrency=1):
        jobs = []
        for n in range(6):
            job = await step.enqueue(n, idempotency_key=f"step-{n}")
            assert await job.result(timeout=WAIT) == n
            jobs.append(job)
        client = app.store.client
        idem = {k.decode(): v.decode() for k, v in (await client.hgetall(keys.idem)).items()}
        assert idem == {"step-4": jobs[4].id, "step-5": jobs[5].id}
        records = await app_keys(redis_url, namespace, "job:*")
        assert records == {keys.job(jobs[4].id).encode(), keys.job(jobs[5].id).encode()}
        # a trimmed key is free again; a kept one still deduplicates
        fresh = await step.enqueue(100, idempotency_key="step-0")
        assert fresh.created
        dup = await step.enqueue(100, idempotency_key="step-5")
        assert (dup.id, dup.created) == (jobs[5].id, False)
        assert await fresh.result(timeout=WAIT) == 100


async def test_failed_records_are_bounded_too(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)

    @app.task(attempts=2, backoff=NO_WAIT, retention=Retention(completed=1, failed=5))
    async def always_fails(n: int) -> None:
        raise RuntimeError(f"no {n}")

    keys = AppKeys.for_app(namespace)
    async with app, running_worker(app, concurrency=10):
        jobs = await always_fails.enqueue_many([(n,) for n in range(60)])

        async def all_failed() -> bool:
            return (await app.stats()).get("failed", 0) >= 60

        await eventually(all_failed)
        client = app.store.client
        assert await client.zcard(keys.kept(always_fails.name, "failed")) <= 5
        records = await app_keys(redis_url, namespace, "job:*")
        assert 0 < len(records) <= 5
        # the dead-letter set only names records that still exist
        dead = [job_id for job_id, _ in await app.dead_letters(limit=1000)]
        assert 0 < len(dead) <= 5
        assert {keys.job(job_id).encode() for job_id in dead} == records
        by_id = {job.id: n for n, job in enumerate(jobs)}
        for job_id in dead:
            with pytest.raises(TaskFailed) as caught:
                await jobs[by_id[job_id]].result(timeout=WAIT)
            assert caught.value.message == f"no {by_id[job_id]}"


async def test_cancelled_and_expired_records_count_as_failed(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task(retention=Retention(completed=None, failed=3))
    async def idle(n: int) -> None:
        return None

    keys = AppKeys.for_app(namespace)
    async with app:
        cancelled = [await idle.enqueue(n) for n in range(6)]
        for job in cancelled:
            assert await job.cancel() == "cancelled"
        expiring = [await idle.enqueue(n, deadline=0.2) for n in range(4)]
        await asyncio.sleep(0.4)
        async with running_worker(app):

            async def expired() -> bool:
                return (await app.stats()).get("expired", 0) >= 4

            await eventually(expired)
        index = keys.kept(idle.name, "failed")
        assert await app.store.client.zcard(index) <= 3
        records = await app_keys(redis_url, namespace, "job:*")
        assert len(records) <= 3
        assert records <= {keys.job(j.id).encode() for j in expiring}


async def test_enqueue_then_gather_reads_every_result_with_the_defaults(
    redis_url: str, namespace: str
) -> None:
    """The most common pattern there is: enqueue a batch, let it drain, then await each
    result. With the default retention none of them is gone."""
    app = make_app(namespace, redis_url)

    @app.task
    async def double(n: int) -> int:
        return 2 * n

    total = 3000
    async with app:
        jobs = await double.enqueue_many([(n,) for n in range(total)])
        async with running_worker(app, concurrency=100):

            async def drained() -> bool:
                return (await app.stats()).get("completed", 0) >= total

            await eventually(drained, timeout=60, every=0.1)
        results = await asyncio.gather(*(job.result(timeout=WAIT) for job in jobs))
    assert results == [2 * n for n in range(total)]


async def test_a_trimmed_jobs_error_names_retention_and_its_setting(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task(retention=Retention(completed=5))
    async def noop(n: int) -> int:
        return n

    async with app:
        jobs = await noop.enqueue_many([(n,) for n in range(20)])
        async with running_worker(app, concurrency=4):

            async def drained() -> bool:
                return (await app.stats()).get("completed", 0) >= 20

            await eventually(drained)
        assert await jobs[-1].result(timeout=WAIT) == 19
        for read in (jobs[0].status, jobs[0].info, lambda: jobs[0].result(timeout=WAIT)):
            with pytest.raises(JobNotFound) as raised:
                await read()
            message = str(raised.value)
            assert "retention removed its completed record" in message
            assert "count bound" in message and "Retention(completed=last 5)" in message
        never: Job[int] = Job(noop, "0" * 27)
        with pytest.raises(JobNotFound, match="never enqueued in this app"):
            await never.status()
