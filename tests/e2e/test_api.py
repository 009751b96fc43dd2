"""End-to-end tests of the public API of the durable queue, against a real server.

Every test builds its own ``App`` in a fresh namespace and runs workers in this event
loop (``tests.e2e.helpers.running_worker``). Waits are bounded; timing checks use the
test's own clock with generous margins.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

import msgspec
import pytest

from fairlane import (
    DEFAULT_CLASSES,
    App,
    Backoff,
    ClassTable,
    Job,
    JobCancelled,
    JobExpired,
    JobNotFound,
    ServiceClass,
    StoreUnavailable,
    TaskFailed,
    TenantLimits,
    UnknownTask,
)
from fairlane.app.admission import Rejected
from fairlane.codec import PayloadTooLarge
from fairlane.store.keys import JOB_FIELDS
from fairlane.store.library import encode_classes
from tests.e2e import helpers
from tests.e2e.helpers import WAIT, app_keys, make_app, running_worker

pytestmark = pytest.mark.anyio

NO_WAIT = Backoff(base=0.01, cap=0.01, jitter="none")


class Point(msgspec.Struct, frozen=True):
    x: int
    y: int


@dataclass
class Order:
    id: int
    path: list[Point]
    placed: datetime
    note: str | None = None


# -- enqueue and results --------------------------------------------------------------------------


@pytest.mark.contract
async def test_typed_arguments_and_results_round_trip(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    seen: list[tuple[object, ...]] = []

    @app.task
    async def move(order: Order, by: Point, when: datetime, *, note: str = "-") -> Order:
        seen.append((order, by, when, note))
        moved = [Point(p.x + by.x, p.y + by.y) for p in order.path]
        return Order(order.id, moved, when + timedelta(hours=1), note)

    placed = datetime(2024, 2, 29, 23, 59, 58, 250000, tzinfo=timezone(timedelta(hours=-5)))
    when = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
    async with app, running_worker(app):
        job = await move.enqueue(
            Order(7, [Point(1, 2), Point(3, 4)], placed), Point(10, 20), when, note="hi"
        )
        result = await job.result(timeout=WAIT)

    assert isinstance(result, Order)
    assert result == Order(7, [Point(11, 22), Point(13, 24)], when + timedelta(hours=1), "hi")
    assert all(isinstance(p, Point) for p in result.path)
    assert result.placed.tzinfo is not None
    # the task itself received typed values, not dicts
    (order, by, got_when, note) = seen[0]
    assert isinstance(order, Order) and isinstance(order.path[0], Point)
    assert order.placed == placed and order.placed.utcoffset() == timedelta(hours=-5)
    assert by == Point(10, 20) and got_when == when and note == "hi"


async def test_status_and_info_through_the_lifecycle(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    started, release = asyncio.Event(), asyncio.Event()

    @app.task(attempts=4)
    async def gated(n: int) -> int:
        started.set()
        await release.wait()
        return n + 1

    async with app:
        job = await gated.enqueue(41, tenant="acme")
        assert job.created is True
        assert await job.status() == "queued"
        info = await job.info()
        assert (info.id, info.status, info.task, info.tenant) == (
            job.id,
            "queued",
            gated.name,
            "acme",
        )
        assert (info.attempts, info.max_attempts, info.error) == (0, 4, None)
        assert info.enqueued_at is not None and info.finished_at is None
        assert abs((info.enqueued_at - datetime.now(UTC)).total_seconds()) < 5

        async with running_worker(app):
            async with asyncio.timeout(WAIT):
                await started.wait()
            assert await job.status() == "running"
            assert (await job.info()).attempts == 1
            release.set()
            assert await job.result(timeout=WAIT) == 42

        assert await job.status() == "completed"
        done = await job.info()
        assert done.status == "completed" and done.attempts == 1 and done.error is None
        assert done.finished_at is not None and done.enqueued_at is not None
        assert done.finished_at >= done.enqueued_at
        # a finished job's result can be read again, by a fresh handle too
        assert await Job(gated, job.id).result(timeout=WAIT) == 42
        assert (await app.stats()).get("completed") == 1


async def test_enqueue_many_returns_handles_in_order(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)

    @app.task
    async def square(n: int, label: str = "") -> str:
        return f"{label}{n * n}"

    async with app:
        assert await square.enqueue_many([]) == []
        jobs = await square.enqueue_many(
            [(i,) if i % 2 else (i, "#") for i in range(300)], tenant="bulk"
        )
        assert len(jobs) == 300 and len({j.id for j in jobs}) == 300
        assert all(j.created for j in jobs)
        stamps = [j.id[:11] for j in jobs]  # ids start with their creation time (hex ms)
        assert stamps == sorted(stamps)
        async with running_worker(app, concurrency=20):
            async with asyncio.timeout(WAIT):
                results = [await j.result() for j in jobs]
        assert results == [f"{'' if i % 2 else '#'}{i * i}" for i in range(300)]
        assert {await j.status() for j in jobs} == {"completed"}
        assert (await jobs[5].info()).tenant == "bulk"


async def test_enqueue_many_checks_every_call_before_storing(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task
    async def one(n: int) -> int:
        return n

    async with app:
        before = await app_keys(redis_url, namespace)
        with pytest.raises(TypeError):
            await one.enqueue_many([(1,), (2,), ("three",)])
        with pytest.raises(TypeError):
            await one.enqueue_many([(1,), (2, 3)])
        assert await app_keys(redis_url, namespace) == before


async def test_bind_then_enqueue_with_options(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)

    @app.task
    async def greet(name: str, *, punct: str = ".") -> str:
        return f"hello {name}{punct}"

    async with app, running_worker(app):
        job = await greet.bind("ada", punct="!").enqueue(tenant="team-7", priority=3)
        assert await job.result(timeout=WAIT) == "hello ada!"
        assert (await job.info()).tenant == "team-7"
        again = await greet.bind("bob").enqueue(idempotency_key="bob-1")
        same = await greet.bind("bob").enqueue(idempotency_key="bob-1")
        assert same.id == again.id and not same.created
        assert await same.result(timeout=WAIT) == "hello bob."


@pytest.mark.contract
async def test_enqueue_by_name_and_purge(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)

    @app.task(name="math.mul")
    async def mul(a: int, b: int) -> int:
        return a * b

    async with app:
        job = await app.enqueue("math.mul", 6, b=7, tenant="by-name")
        with pytest.raises(UnknownTask):
            await app.enqueue("math.div", 1, 2)
        with pytest.raises(TypeError):
            await app.enqueue("math.mul", 6, c=7)
        async with running_worker(app):
            assert await job.result(timeout=WAIT) == 42
        assert (await job.info()).tenant == "by-name"
        keys = await app_keys(redis_url, namespace)
        assert keys
        assert await app.purge() == len(keys)
        assert await app_keys(redis_url, namespace) == set()
        with pytest.raises(JobNotFound):
            await job.status()


# -- failures, retries, dead letters --------------------------------------------------------------


async def test_failure_raises_task_failed_with_type_and_message(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task(attempts=1)
    async def broken(n: int) -> int:
        raise ValueError(f"bad input {n}")

    async with app, running_worker(app):
        job = await broken.enqueue(7)
        with pytest.raises(TaskFailed) as caught:
            await job.result(timeout=WAIT)
        assert type(caught.value) is TaskFailed
        assert caught.value.job_id == job.id
        assert caught.value.type_name == "ValueError"
        assert caught.value.message == "bad input 7"
        assert "raise ValueError" in caught.value.traceback
        assert "bad input 7" in str(caught.value)
        assert await job.status() == "failed"
        assert (await job.info()).error == "bad input 7"


@pytest.mark.contract
async def test_retries_honour_attempts_and_backoff_then_dead_letter_and_redrive(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    runs: list[float] = []
    healed = False

    @app.task(attempts=3, backoff=Backoff(base=0.4, cap=0.8, jitter="none"))
    async def flaky(n: int) -> int:
        runs.append(time.monotonic())
        if not healed:
            raise RuntimeError(f"attempt {len(runs)} of {n}")
        return n * 10

    async with app, running_worker(app):
        job = await flaky.enqueue(5)
        with pytest.raises(TaskFailed) as caught:
            await job.result(timeout=WAIT)
        assert caught.value.type_name == "RuntimeError"
        assert caught.value.message == "attempt 3 of 5"  # the last error is kept
        assert len(runs) == 3
        # backoff after attempt 1 is 0.4 s, after attempt 2 is 0.8 s (no jitter)
        assert runs[1] - runs[0] >= 0.4 - 0.05
        assert runs[2] - runs[1] >= 0.8 - 0.05
        assert runs[2] - runs[0] < 0.4 + 0.8 + 5
        info = await job.info()
        assert (info.status, info.attempts, info.max_attempts) == ("failed", 3, 3)
        assert info.error == "attempt 3 of 5"

        dead = await app.dead_letters()
        assert [job_id for job_id, _ in dead] == [job.id]  # exactly once
        assert abs(dead[0][1] - time.time()) < 30
        await asyncio.sleep(0.5)
        assert len(runs) == 3  # a dead job is not run again by itself

        healed = True
        assert await app.redrive([job.id]) == [job.id]
        assert await job.result(timeout=WAIT) == 50
        assert len(runs) == 4
        assert await app.dead_letters() == []
        assert await app.redrive([job.id]) == []  # only dead jobs can be re-driven
        done = await job.info()
        assert (done.status, done.attempts, done.error) == ("completed", 1, None)


async def test_redrive_without_ids_takes_the_oldest(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    fail = True

    @app.task(attempts=1)
    async def sometimes(n: int) -> int:
        if fail:
            raise LookupError(str(n))
        return n

    async with app, running_worker(app, concurrency=1):
        jobs = [await sometimes.enqueue(n) for n in range(3)]
        for job in jobs:
            with pytest.raises(TaskFailed):
                await job.result(timeout=WAIT)
        dead = await app.dead_letters()
        assert sorted(job_id for job_id, _ in dead) == sorted(j.id for j in jobs)
        assert [t for _, t in dead] == sorted(t for _, t in dead)  # oldest first
        assert len(await app.dead_letters(limit=2)) == 2
        fail = False
        redriven = await app.redrive(limit=2)
        assert redriven == [job_id for job_id, _ in dead[:2]]
        assert await app.redrive() == [dead[2][0]]
        assert sorted([await j.result(timeout=WAIT) for j in jobs]) == [0, 1, 2]
        assert await app.dead_letters() == []


async def test_retry_on_limits_which_errors_are_retried(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    runs: dict[str, int] = {"value": 0, "key": 0}

    @app.task(attempts=4, backoff=NO_WAIT, retry_on=(ValueError,))
    async def picky(kind: str) -> None:
        runs[kind] += 1
        raise ValueError("retry me") if kind == "value" else KeyError("not me")

    async with app, running_worker(app):
        key_job = await picky.enqueue("key")
        value_job = await picky.enqueue("value")
        with pytest.raises(TaskFailed) as key_err:
            await key_job.result(timeout=WAIT)
        with pytest.raises(TaskFailed) as value_err:
            await value_job.result(timeout=WAIT)
    assert key_err.value.type_name == "KeyError"
    assert value_err.value.type_name == "ValueError"
    assert runs == {"key": 1, "value": 4}


async def test_async_timeout_fails_the_attempt(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    runs = 0

    @app.task(attempts=2, timeout=0.3, backoff=NO_WAIT)
    async def sleepy() -> None:
        nonlocal runs
        runs += 1
        await asyncio.sleep(30)

    async with app, running_worker(app):
        started = time.monotonic()
        job = await sleepy.enqueue()
        with pytest.raises(TaskFailed) as caught:
            await job.result(timeout=WAIT)
        assert time.monotonic() - started < 10
    assert caught.value.type_name == "TimeoutError"
    assert runs == 2


# -- scheduling: delay, at, deadline --------------------------------------------------------------


@pytest.mark.contract
async def test_delay_and_at_hold_a_job_until_its_time(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    started: dict[str, float] = {}

    @app.task
    async def stamp(label: str) -> None:
        started[label] = time.time()

    async with app, running_worker(app):
        t0 = time.time()
        later = await stamp.enqueue("delay", delay=1.2)
        at = datetime.now(UTC) + timedelta(seconds=1.5)
        at_job = await stamp.enqueue("at", at=at)
        tdelta = await stamp.enqueue("timedelta", delay=timedelta(milliseconds=800))
        now_job = await stamp.enqueue("now")
        assert await later.status() == "scheduled"
        assert await at_job.status() == "scheduled"
        await now_job.result(timeout=WAIT)
        assert await later.status() == "scheduled"
        for job in (later, at_job, tdelta):
            await job.result(timeout=WAIT)

    assert started["now"] - t0 < 1.0
    assert started["delay"] >= t0 + 1.2 - 0.05
    assert started["at"] >= at.timestamp() - 0.05
    assert started["timedelta"] >= t0 + 0.8 - 0.05
    assert max(started.values()) - t0 < 10  # and they do run, without waiting an idle period


async def test_deadline_passing_while_waiting_expires_the_job(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    ran: list[str] = []

    @app.task
    async def urgent(label: str) -> None:
        ran.append(label)

    async with app:
        short = await urgent.enqueue("short", deadline=0.4)
        delayed = await urgent.enqueue("delayed", delay=0.2, deadline=0.5)
        absolute = await urgent.enqueue(
            "absolute", deadline=datetime.now(UTC) + timedelta(seconds=0.5)
        )
        roomy = await urgent.enqueue("roomy", deadline=timedelta(seconds=60))
        await asyncio.sleep(1.0)  # no worker: every short deadline passes while the jobs wait
        async with running_worker(app):
            for job in (short, delayed, absolute):
                with pytest.raises(JobExpired) as caught:
                    await job.result(timeout=WAIT)
                assert caught.value.job_id == job.id
                assert await job.status() == "expired"
            await roomy.result(timeout=WAIT)
    assert ran == ["roomy"]


async def test_retry_that_would_pass_the_deadline_expires(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    runs = 0

    @app.task(attempts=5, backoff=Backoff(base=30.0, cap=30.0, jitter="none"))
    async def doomed() -> None:
        nonlocal runs
        runs += 1
        raise RuntimeError("try later")

    async with app, running_worker(app):
        job = await doomed.enqueue(deadline=5)
        with pytest.raises(JobExpired):
            await job.result(timeout=WAIT)
        assert runs == 1
        assert await job.status() == "expired"


async def test_bad_times_are_refused_and_store_nothing(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)

    @app.task
    async def noop() -> None:
        return None

    naive = datetime.now() + timedelta(hours=1)
    async with app:
        before = await app_keys(redis_url, namespace)
        with pytest.raises(ValueError, match="past"):
            await noop.enqueue(deadline=datetime.now(UTC) - timedelta(seconds=1))
        with pytest.raises(ValueError, match="negative"):
            await noop.enqueue(delay=-1)
        with pytest.raises(ValueError, match="negative"):
            await noop.enqueue(delay=timedelta(seconds=-5))
        with pytest.raises(ValueError, match="negative"):
            await noop.enqueue(deadline=-3)
        with pytest.raises(ValueError):
            await noop.enqueue(deadline=0)
        with pytest.raises(ValueError, match="timezone"):
            await noop.enqueue(at=naive)
        with pytest.raises(ValueError, match="timezone"):
            await noop.enqueue(deadline=naive)
        with pytest.raises(ValueError, match="either"):
            await noop.enqueue(delay=1, at=datetime.now(UTC))
        with pytest.raises(ValueError):
            await noop.enqueue(tenant="")
        with pytest.raises(ValueError):
            await noop.enqueue(priority=10**6)
        with pytest.raises(TypeError):
            await noop.enqueue(priority="high")  # type: ignore[arg-type]
        assert await app_keys(redis_url, namespace) == before
        # refused by the server (its clock decides): the deadline passes before the job may run
        with pytest.raises(Rejected, match="deadline_unmeetable"):
            await noop.enqueue(delay=10, deadline=2)
        with pytest.raises(Rejected, match="deadline_unmeetable"):
            await noop.enqueue_many([(), ()], delay=10, deadline=2)
        for pattern in ("job:*", "q:*", "lane:*:delayed", "lane:*:fair", "idem"):
            assert await app_keys(redis_url, namespace, pattern) == set(), pattern


# -- idempotency ----------------------------------------------------------------------------------


@pytest.mark.contract
async def test_idempotency_key_dedupes_and_runs_once(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    runs: list[int] = []

    @app.task
    async def charge(amount: int) -> int:
        runs.append(amount)
        return amount

    async with app:
        first = await charge.enqueue(100, idempotency_key="invoice-1")
        second = await charge.enqueue(999, idempotency_key="invoice-1", tenant="other")
        assert first.created is True
        assert (second.id, second.created) == (first.id, False)
        other = await charge.enqueue(5, idempotency_key="invoice-2")
        assert other.id != first.id and other.created
        async with running_worker(app):
            assert await second.result(timeout=WAIT) == 100
            assert await other.result(timeout=WAIT) == 5
            third = await charge.enqueue(7, idempotency_key="invoice-1")
            assert (third.id, third.created) == (first.id, False)
            await asyncio.sleep(0.3)
    assert sorted(runs) == [5, 100]


# -- fairness and priority ------------------------------------------------------------------------


async def test_priority_then_fifo_within_a_tenant(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    order: list[str] = []

    @app.task
    async def record(label: str) -> None:
        order.append(label)

    plan = [
        ("low-1", -3),
        ("mid-1", 0),
        ("mid-2", 0),
        ("high-1", 5),
        ("mid-3", 0),
        ("high-2", 5),
        ("top-1", 1000),
        ("low-2", -3),
        ("high-3", 5),
        ("bottom", -1000),
    ]
    async with app:
        jobs = [await record.enqueue(label, tenant="t", priority=p) for label, p in plan]
        async with running_worker(app, concurrency=1):
            async with asyncio.timeout(WAIT):
                for job in jobs:
                    await job.result()
    assert order == [
        "top-1",
        "high-1",
        "high-2",
        "high-3",
        "mid-1",
        "mid-2",
        "mid-3",
        "low-1",
        "low-2",
        "bottom",
    ]


async def test_tenants_take_turns(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    order: list[str] = []

    @app.task
    async def work(owner: str, n: int) -> None:
        order.append(owner)

    async with app:
        big = await work.enqueue_many([("big", n) for n in range(50)], tenant="big")
        small = await work.enqueue_many([("small", n) for n in range(5)], tenant="small")
        async with running_worker(app, concurrency=1):
            async with asyncio.timeout(WAIT):
                for job in [*big, *small]:
                    await job.result()
    assert len(order) == 55
    small_at = [i for i, t in enumerate(order) if t == "small"]
    assert len(small_at) == 5
    # fair dispatch: the small tenant's jobs interleave with the big one's, they are not all last
    assert max(small_at) < 15, order


# -- cancellation ---------------------------------------------------------------------------------


async def test_cancel_a_queued_job(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    ran: list[str] = []

    @app.task
    async def work(label: str) -> str:
        ran.append(label)
        return label

    async with app:
        doomed = await work.enqueue("doomed")
        scheduled = await work.enqueue("scheduled", delay=0.5)
        kept = await work.enqueue("kept")
        assert await doomed.cancel() == "cancelled"
        assert await scheduled.cancel() == "cancelled"
        assert await doomed.status() == "cancelled"
        assert await doomed.cancel() == "cancelled"  # cancelling twice is harmless
        async with running_worker(app):
            assert await kept.result(timeout=WAIT) == "kept"
            for job in (doomed, scheduled):
                with pytest.raises(JobCancelled) as caught:
                    await job.result(timeout=WAIT)
                assert caught.value.job_id == job.id
            await asyncio.sleep(1.0)  # past the scheduled job's time
        assert await kept.cancel() == "completed"  # a finished job stays finished
        assert await Job(work, "00000000000nosuchjob").cancel() == "missing"
    assert ran == ["kept"]


@pytest.mark.contract
async def test_cancel_a_running_job(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url, lease={"renew_interval": 0.1, "duration": 2.0})
    started = asyncio.Event()
    interrupted = asyncio.Event()

    @app.task
    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            interrupted.set()
            raise

    @app.task
    async def after() -> str:
        return "still serving"

    async with app, running_worker(app):
        job = await forever.enqueue()
        async with asyncio.timeout(WAIT):
            await started.wait()
        assert await job.cancel() == "cancelling"
        with pytest.raises(JobCancelled):
            await job.result(timeout=WAIT)
        assert interrupted.is_set()
        assert await job.status() == "cancelled"
        info = await job.info()
        assert info.finished_at is not None and info.attempts == 1
        # the worker goes on serving
        assert await (await after.enqueue()).result(timeout=WAIT) == "still serving"


# -- bad input ------------------------------------------------------------------------------------


async def test_bad_calls_fail_at_the_call_site(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url, max_payload_bytes=2000)

    @app.task
    async def add(a: int, b: int = 1, *, scale: int = 1) -> int:
        return (a + b) * scale

    async with app:
        before = await app_keys(redis_url, namespace)
        with pytest.raises(TypeError, match="signature"):
            await add.enqueue(1, c=2)
        with pytest.raises(TypeError, match="signature"):
            await add.enqueue(1, 2, 3)
        with pytest.raises(TypeError, match="signature"):
            await add.enqueue()
        with pytest.raises(TypeError, match="signature"):
            await add.enqueue(1, a=1)
        with pytest.raises(TypeError, match="type"):
            await add.enqueue("1")
        with pytest.raises(TypeError, match="type"):
            await add.enqueue(1, scale=1.5)
        with pytest.raises(TypeError):
            await add.enqueue(object())
        with pytest.raises(TypeError, match="signature"):
            await add.bind(1, 2, 3).enqueue()  # type: ignore[call-arg]
        with pytest.raises(PayloadTooLarge, match="2000"):
            await add.enqueue(int("9" * 2100))
        assert isinstance(PayloadTooLarge("x"), ValueError)
        assert await app_keys(redis_url, namespace) == before


async def test_task_declarations_are_checked(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)

    async def tenant_param(tenant: str) -> None: ...

    async def delay_param(x: int, delay: float) -> None: ...

    def sync_fn() -> None: ...

    async def async_fn() -> None: ...

    with pytest.raises(ValueError, match="reserved"):
        app.task(tenant_param)
    with pytest.raises(ValueError, match="reserved"):
        app.task(delay_param)
    with pytest.raises(ValueError, match="executor"):
        app.task(sync_fn)
    with pytest.raises(ValueError, match="async"):
        app.task(executor="thread")(async_fn)
    with pytest.raises(ValueError, match="attempts"):
        app.task(attempts=0)(async_fn)
    with pytest.raises(ValueError, match="timeout"):
        app.task(timeout=0)(async_fn)
    task = app.task(name="the-one")(async_fn)
    with pytest.raises(ValueError, match="already"):
        app.task(name="the-one")(async_fn)
    assert app.get_task("the-one") is task
    with pytest.raises(UnknownTask):
        app.get_task("nope")
    assert set(app.tasks) == {"the-one"}
    with pytest.raises(ValueError):
        App("bad:name", redis_url=redis_url)
    with pytest.raises(RuntimeError, match="not connected"):
        await task.enqueue()


async def test_unreachable_server_fails_fast() -> None:
    app = App("unreachable", redis_url="redis://127.0.0.1:1/0")
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        async with asyncio.timeout(20), app:
            pytest.fail("connected to a server that does not exist")
    assert time.monotonic() - started < 10


async def test_malformed_records_are_dead_lettered_not_executed(
    redis_url: str, namespace: str
) -> None:
    # arguments that do not fit are handed back for another worker within the deploy
    # window (tests/runtime/test_deploys.py); with none, they are dead at once
    app = make_app(namespace, redis_url, worker={"deploy_window": 0})
    ran: list[int] = []

    @app.task(attempts=3, backoff=NO_WAIT)
    async def count(n: int) -> int:
        ran.append(n)
        return n

    assert {"args", "task", "max"} <= set(JOB_FIELDS)
    record_broken, args_broken = "MalformedJob", "MalformedArguments"
    corruptions = {  # label -> (corruption, the error type it is dead-lettered with)
        "missing args": (lambda c, k: c.hdel(k, "args"), record_broken),
        "missing task": (lambda c, k: c.hdel(k, "task"), record_broken),
        "not utf-8": (lambda c, k: c.hset(k, "args", b'{"n": "\xff\xfe"}'), record_broken),
        "wrong type": (lambda c, k: c.hset(k, "args", b'{"n": "seven"}'), args_broken),
        "extra field": (lambda c, k: c.hset(k, "args", b'{"n": 1, "m": 2}'), args_broken),
        "missing field": (lambda c, k: c.hset(k, "args", b"{}"), args_broken),
        "not json": (lambda c, k: c.hset(k, "args", b"{not json"), args_broken),
    }
    async with app:
        client = app.store.client
        bad: dict[str, Job[int]] = {}
        for label, (corrupt, _) in corruptions.items():
            job = await count.enqueue(1)
            await corrupt(client, app.store.keys.job(job.id))
            bad[label] = job
        good = await count.enqueue(2)
        async with running_worker(app):
            assert await good.result(timeout=WAIT) == 2
            for label, job in bad.items():
                with pytest.raises(TaskFailed) as caught:
                    await job.result(timeout=WAIT)
                assert caught.value.type_name == corruptions[label][1], label
                assert caught.value.message, label
                assert await job.status() == "failed", label
            # the worker is still healthy
            assert await (await count.enqueue(3)).result(timeout=WAIT) == 3
        dead = [job_id for job_id, _ in await app.dead_letters()]
        assert sorted(dead) == sorted(job.id for job in bad.values())  # each exactly once
        for label, job in bad.items():
            info = await job.info()
            assert info.attempts <= 1, label  # never retried
            assert info.error, label
    assert sorted(ran) == [2, 3]


async def test_job_of_an_unknown_task_is_handed_back_then_dead(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url, worker={"deploy_window": 0.2, "handback_delay": 0.05})

    @app.task(attempts=2, backoff=NO_WAIT)
    async def known() -> None:
        return None

    async with app:
        job = await known.enqueue()
        await app.store.client.hset(app.store.keys.job(job.id), "task", "no.such.task")
        async with running_worker(app):
            with pytest.raises(TaskFailed) as caught:
                await job.result(timeout=WAIT)
        assert caught.value.type_name == "UnknownTask"
        assert "no.such.task" in caught.value.message
        assert "within the deploy window" in caught.value.message
        # handed back without spending its attempts; the last lease ended it
        assert (await job.info()).attempts == 1
        assert (await app.stats())["handed_back"] >= 1
        assert [job_id for job_id, _ in await app.dead_letters()] == [job.id]


async def test_job_handles_for_missing_records(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)

    @app.task
    async def noop() -> None:
        return None

    async with app:
        ghost = Job(noop, "00000000000nosuchjob")
        with pytest.raises(JobNotFound):
            await ghost.status()
        with pytest.raises(JobNotFound):
            await ghost.info()
        with pytest.raises(JobNotFound):
            await ghost.result(timeout=WAIT)


# -- executors ------------------------------------------------------------------------------------


async def test_thread_executor_runs_sync_functions(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    add = app.task(executor="thread")(helpers.sync_add)
    where = app.task(executor="thread")(helpers.thread_name)

    fail = app.task(executor="thread", attempts=2, backoff=NO_WAIT)(helpers.sync_fail)
    odd = app.task(executor="thread", attempts=3, backoff=NO_WAIT)(helpers.sync_unserializable)
    leave = app.task(executor="thread")(helpers.sync_exit)

    async with app, running_worker(app):
        assert await (await add.enqueue(2, 3)).result(timeout=WAIT) == 5
        name = await (await where.enqueue()).result(timeout=WAIT)
        failing = await fail.enqueue("no such row")
        with pytest.raises(TaskFailed) as caught:
            await failing.result(timeout=WAIT)
        assert caught.value.type_name == "LookupError"
        assert caught.value.message == "no such row"
        assert (await failing.info()).attempts == 2
        unserializable = await odd.enqueue()
        with pytest.raises(TaskFailed):
            await unserializable.result(timeout=WAIT)
        exiting = await leave.enqueue(4)
        with pytest.raises(TaskFailed) as exited:
            await exiting.result(timeout=WAIT)
        assert exited.value.type_name == "SystemExit"
        # the worker still serves
        assert await (await add.enqueue(1, 1)).result(timeout=WAIT) == 2
    assert name.startswith("fairlane-sync")
    assert add(4, 5) == 9  # calling a task directly runs the function in this process


async def test_process_executor_runs_in_a_child(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    helpers.children_import_tests(monkeypatch)
    app = make_app(namespace, redis_url)
    square = app.task(executor="process")(helpers.cpu_square)
    fail = app.task(executor="process", attempts=1)(helpers.process_fail)

    async with app, running_worker(app):
        first = await square.enqueue(12)
        failing = await fail.enqueue("lost key")
        result = await first.result(timeout=30)
        assert result["square"] == 144
        assert result["pid"] != os.getpid()
        with pytest.raises(TaskFailed) as caught:
            await failing.result(timeout=30)
    assert caught.value.type_name.endswith("KeyError")
    assert "lost key" in caught.value.message


# -- resilience -----------------------------------------------------------------------------------


async def test_failing_tasks_never_stop_the_worker(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)

    class Weird(Exception):
        def __str__(self) -> str:
            raise RuntimeError("cannot even describe myself")

    @app.task(attempts=1)
    async def bad(kind: int) -> object:
        if kind == 0:
            raise ValueError("plain")
        if kind == 1:
            raise Weird()
        if kind == 2:
            return object()  # not serializable
        if kind == 3:
            return "\ud800"  # a lone surrogate cannot be encoded
        if kind == 4:
            raise TimeoutError("looks like a timeout")
        if kind == 5:
            sys.exit(2)  # a library calling sys.exit() must not end the worker
        return 1 / 0

    @app.task
    async def good(n: int) -> int:
        return n

    async with app, running_worker(app, concurrency=8):
        failing = await bad.enqueue_many([(i % 7,) for i in range(70)])
        fine = await good.enqueue_many([(i,) for i in range(40)])
        async with asyncio.timeout(WAIT):
            assert [await j.result() for j in fine] == list(range(40))
            for job in failing:
                with pytest.raises(TaskFailed):
                    await job.result()
        assert await (await good.enqueue(99)).result(timeout=WAIT) == 99
        stats = await app.stats()
    assert (stats.get("failed"), stats.get("completed")) == (70, 41)


async def test_run_worker_in_burst_mode_leaves_the_app_usable(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task
    async def triple(n: int) -> int:
        return 3 * n

    async with app:
        jobs = await triple.enqueue_many([(n,) for n in range(20)])
        async with asyncio.timeout(WAIT):
            await app.run_worker(concurrency=4, burst=True)
        assert {await j.status() for j in jobs} == {"completed"}
        assert [await j.result(timeout=WAIT) for j in jobs] == [3 * n for n in range(20)]


# -- tenant weights -------------------------------------------------------------------------------


async def test_backlogged_tenants_share_dispatches_by_weight(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    order: list[str] = []

    @app.task
    async def work(owner: str) -> None:
        order.append(owner)

    async with app:
        await app.tenants.configure("heavy", weight=3)
        assert await app.tenants.weight("heavy") == 3.0
        assert await app.tenants.weight("light") == 1.0
        jobs = [
            *await work.enqueue_many([("heavy",)] * 60, tenant="heavy"),
            *await work.enqueue_many([("light",)] * 60, tenant="light"),
        ]
        async with running_worker(app, concurrency=1):
            async with asyncio.timeout(WAIT):
                for job in jobs:
                    await job.result()
        await app.tenants.reset("heavy")
        assert await app.tenants.weight("heavy") == 1.0
    first = order[:40]
    # weights 3:1 while both are backlogged: 30 and 10 of 40, within one job
    assert 29 <= first.count("heavy") <= 31, first


async def test_bad_tenant_settings_are_refused(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    async with app:
        for weight in (0, -1, float("nan"), float("inf"), 2e6):
            with pytest.raises(ValueError, match="weight"):
                await app.tenants.configure("acme", weight=weight)
        with pytest.raises(TypeError):
            await app.tenants.configure("acme", weight="3")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="tenant"):
            await app.tenants.configure("", weight=2)
        assert await app.tenants.weight("acme") == 1.0


async def test_tenant_concurrency_settings_round_trip(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    async with app:
        assert await app.tenants.limits("acme") is None
        await app.tenants.configure("acme", floor=2, max_concurrency=10)
        assert await app.tenants.limits("acme") == TenantLimits(floor=2, max_concurrency=10)
        # one setting at a time keeps the others; the weight is separate
        await app.tenants.configure("acme", burst_pct=0.5, weight=4)
        await app.tenants.configure("acme", burst_floor=3)
        expected = TenantLimits(floor=2, max_concurrency=10, burst_floor=3, burst_pct=0.5)
        assert await app.tenants.limits("acme") == expected
        assert await app.tenants.weight("acme") == 4.0
        # nothing is written when any value is refused
        with pytest.raises(ValueError, match="below the floor"):
            await app.tenants.configure("acme", max_concurrency=1, weight=9)
        with pytest.raises(TypeError, match="floor must be an int"):
            await app.tenants.configure("acme", floor=True)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="max_concurrency must be an int"):
            await app.tenants.configure("acme", max_concurrency=2.5)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="burst_floor must be >= 0"):
            await app.tenants.configure("acme", burst_floor=-1)
        for pct in (-0.1, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="burst_pct"):
                await app.tenants.configure("acme", burst_pct=pct)
        with pytest.raises(TypeError, match="burst_pct must be a number"):
            await app.tenants.configure("acme", burst_pct=False)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="unknown tenant settings"):
            await app.tenants.reset("acme", "cap")  # type: ignore[arg-type]
        assert await app.tenants.limits("acme") == expected
        assert await app.tenants.weight("acme") == 4.0
        # reset lifts the named settings, or all of them
        await app.tenants.reset("acme", "max_concurrency", "burst_floor")
        assert await app.tenants.limits("acme") == TenantLimits(floor=2, burst_pct=0.5)
        assert await app.tenants.weight("acme") == 4.0
        await app.tenants.reset("acme", "floor", "burst_pct")  # all back to the defaults
        assert await app.tenants.limits("acme") is None
        await app.tenants.configure("acme", max_concurrency=5, weight=2)
        await app.tenants.reset("acme")
        assert await app.tenants.limits("acme") is None
        assert await app.tenants.weight("acme") == 1.0


@pytest.mark.contract
async def test_concurrent_configures_of_one_tenant_lose_nothing(
    redis_url: str, namespace: str
) -> None:
    apps = [make_app(namespace, redis_url) for _ in range(2)]
    async with apps[0], apps[1]:
        for round_ in range(1, 6):
            await asyncio.gather(
                apps[0].tenants.configure("acme", floor=round_),
                apps[1].tenants.configure("acme", burst_floor=round_),
                apps[0].tenants.configure("acme", max_concurrency=10 * round_),
                apps[1].tenants.configure("acme", burst_pct=round_ / 10),
            )
            expected = TenantLimits(
                floor=round_,
                max_concurrency=10 * round_,
                burst_floor=round_,
                burst_pct=round_ / 10,
            )
            assert await apps[0].tenants.limits("acme") == expected


# -- lanes, classes, slots and limits -------------------------------------------------------------


async def _declared_table(app: App, lane: str) -> bytes | None:
    raw: bytes | None = await app.store.client.hget(app.store.keys.lane(lane).state, "table")
    return raw


async def test_lanes_are_declared_when_the_app_connects_and_the_worker_starts(
    redis_url: str, namespace: str
) -> None:
    gpu = ClassTable([ServiceClass("train", nominal_share=0.5), ServiceClass("bulk", batch=True)])
    app = App(namespace, redis_url=redis_url, settings=helpers.fast_settings(), lanes={"gpu": gpu})
    async with app:
        assert await _declared_table(app, "gpu") == encode_classes(gpu).encode()
        # the lane the app's jobs use by default is recorded with the default classes
        default = encode_classes(ClassTable(DEFAULT_CLASSES)).encode()
        assert await _declared_table(app, "default") == default
        late = [ServiceClass("only", nominal_share=1.0)]
        app.lane("late", classes=late)
        assert await _declared_table(app, "late") is None
        async with running_worker(app, lanes=["late"]):
            await helpers.eventually(
                lambda: _is_declared(app, "late", encode_classes(late).encode())
            )


async def _is_declared(app: App, lane: str, table: bytes) -> bool:
    return await _declared_table(app, lane) == table


async def test_enqueue_carries_class_slots_and_limits(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    app.lane("gpu", classes=[ServiceClass("train", nominal_share=0.5), *DEFAULT_CLASSES[1:]])

    @app.task(lane="gpu", service_class="train", slots=2, limits={"model:big": 8})
    async def fit(n: int, *, tag: str = "") -> int:
        return n

    async with app:
        job = await fit.enqueue(1)
        info = await job.info()
        assert (info.service_class, info.slots, info.limits) == ("train", 2, {"model:big": 8})
        # a call's class and slots replace the task's; its limits add to the task's
        job = await fit.enqueue(
            2, service_class="batch", slots=1, limits={"doc:884": 4, "model:big": 2}
        )
        info = await job.info()
        assert (info.service_class, info.slots) == ("batch", 1)
        assert info.limits == {"doc:884": 4, "model:big": 2}
        job = await fit.bind(3, tag="x").enqueue(service_class="standard", limits={"u:1": 1})
        info = await job.info()
        assert (info.service_class, info.slots) == ("standard", 2)
        assert info.limits == {"model:big": 8, "u:1": 1}
        job = await app.enqueue(fit.name, 4, slots=3)
        assert (await job.info()).slots == 3
        jobs = await fit.enqueue_many([(5,), (6,)], service_class="batch", limits={"d:1": 0})
        for job in jobs:
            info = await job.info()
            assert (info.service_class, info.slots) == ("batch", 2)
            assert info.limits == {"d:1": 0, "model:big": 8}


async def test_bad_class_slots_and_limits_are_refused_and_store_nothing(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    app.lane("gpu", classes=[ServiceClass("train", nominal_share=1.0)])

    @app.task(lane="gpu", service_class="train")
    async def fit(n: int) -> int:
        return n

    @app.task
    async def plain(n: int) -> int:
        return n

    async with app:
        before = await app_keys(redis_url, namespace)
        with pytest.raises(ValueError, match=r"lane 'gpu' has no service class 'batch'.*train"):
            await fit.enqueue(1, service_class="batch")
        with pytest.raises(ValueError, match="default classes are guaranteed, standard, batch"):
            await plain.enqueue(1, service_class="gold")
        with pytest.raises(TypeError, match="service_class"):
            await plain.enqueue(1, service_class="")
        for slots in (0, -2):
            with pytest.raises(ValueError, match="slots"):
                await plain.enqueue(1, slots=slots)
        for wrong in (True, 1.5, "2"):
            with pytest.raises(TypeError, match="slots must be an int"):
                await plain.enqueue(1, slots=wrong)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="reserved for tenants"):
            await plain.enqueue(1, limits={"tenant:acme": 3})
        with pytest.raises(ValueError, match="at most 16"):
            await plain.enqueue(1, limits={f"k{i}": 1 for i in range(17)})
        with pytest.raises(ValueError, match="newlines"):
            await plain.enqueue(1, limits={"a\nb": 1})
        with pytest.raises(ValueError, match=">= 0"):
            await plain.enqueue(1, limits={"doc:1": -1})
        with pytest.raises(TypeError, match="must be an int"):
            await plain.enqueue(1, limits={"doc:1": False})
        with pytest.raises(ValueError, match="has no service class"):
            await fit.bind(1).enqueue(service_class="standard")
        with pytest.raises(ValueError, match="has no service class"):
            await app.enqueue(fit.name, 1, service_class="standard")
        with pytest.raises(ValueError, match="has no service class"):
            await fit.enqueue_many([(1,), (2,)], service_class="standard")
        with pytest.raises(ValueError, match="reserved"):
            await plain.enqueue_many([(1,), (2,)], limits={"tenant:x": 1})
        assert await app_keys(redis_url, namespace) == before


async def test_a_worker_counts_slots_not_jobs(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    app.lane("wide", classes=[ServiceClass("all", nominal_share=1.0)])
    running: set[int] = set()
    peak = 0
    gate = asyncio.Event()

    @app.task(lane="wide", service_class="all", slots=2)
    async def hold(n: int) -> int:
        nonlocal peak
        running.add(n)
        peak = max(peak, len(running))
        await gate.wait()
        running.discard(n)
        return n

    async def two_running() -> bool:
        return len(running) == 2

    async with app, running_worker(app, lanes=["wide"], concurrency=4) as worker:
        jobs = await hold.enqueue_many([(n,) for n in range(3)])
        await helpers.eventually(two_running)
        await asyncio.sleep(0.3)  # the third would have started by now if it fitted
        assert running == {0, 1} and worker.statistics().slots_in_use == 4
        gate.set()
        assert [await j.result(timeout=WAIT) for j in jobs] == [0, 1, 2]
        assert peak == 2
        # a job as wide as the worker runs too
        assert await (await hold.enqueue(9, slots=4)).result(timeout=WAIT) == 9
        assert worker.statistics().slots_in_use == 0
