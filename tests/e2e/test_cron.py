"""Cron: one job per tick however many workers run the schedule, and the tick arithmetic."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta, timezone

import pytest
from cronsim import CronSim
from hypothesis import given
from hypothesis import strategies as st

from fairlane import App, Job
from fairlane.runtime.cron import CRON_TENANT, tick_key
from fairlane.store.keys import AppKeys
from tests.e2e.helpers import eventually, make_app, running_worker

pytestmark = pytest.mark.anyio


# -- tick keys and the next tick ------------------------------------------------------------------


def test_tick_key_names_the_task_and_the_epoch_second() -> None:
    tick = datetime(2025, 3, 4, 5, 6, tzinfo=UTC)
    assert tick_key("reports", tick) == f"cron:reports:{int(tick.timestamp())}"
    assert tick_key("reports", tick) == "cron:reports:1741064760"
    assert tick_key("reports", tick) != tick_key("billing", tick)
    assert tick_key("reports", tick) != tick_key("reports", tick + timedelta(minutes=1))


@given(
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)),
    st.integers(min_value=-14 * 60, max_value=14 * 60),
)
def test_tick_key_is_the_same_instant_in_any_timezone(naive: datetime, offset_minutes: int) -> None:
    tick = naive.replace(tzinfo=UTC, microsecond=0)
    elsewhere = tick.astimezone(timezone(timedelta(minutes=offset_minutes)))
    assert tick_key("t", elsewhere) == tick_key("t", tick)


@pytest.mark.parametrize(
    ("schedule", "after", "expected"),
    [
        ("* * * * *", "2025-01-01T10:07:30", "2025-01-01T10:08:00"),
        ("* * * * *", "2025-01-01T10:07:00", "2025-01-01T10:08:00"),  # strictly after a tick
        ("*/15 * * * *", "2025-01-01T10:07:30", "2025-01-01T10:15:00"),
        ("*/15 * * * *", "2025-01-01T10:15:00", "2025-01-01T10:30:00"),
        ("0 0 * * *", "2025-12-31T23:59:59", "2026-01-01T00:00:00"),
        ("30 2 * * 1", "2025-01-01T00:00:00", "2025-01-06T02:30:00"),  # next Monday
        ("0 12 29 2 *", "2025-03-01T00:00:00", "2028-02-29T12:00:00"),
    ],
)
def test_next_tick(schedule: str, after: str, expected: str) -> None:
    start = datetime.fromisoformat(after).replace(tzinfo=UTC)
    tick = next(CronSim(schedule, start))
    assert tick == datetime.fromisoformat(expected).replace(tzinfo=UTC)
    assert tick.tzinfo is not None
    # the loop computes the following tick from this one: it must move on
    assert next(CronSim(schedule, tick)) > tick


@given(st.datetimes(min_value=datetime(2001, 1, 1), max_value=datetime(2090, 1, 1)))
def test_every_minute_ticks_on_the_next_whole_minute(naive: datetime) -> None:
    now = naive.replace(tzinfo=UTC)
    ticks = CronSim("* * * * *", now)
    first = next(ticks)
    assert first > now
    assert first - now <= timedelta(minutes=1)
    assert (first.second, first.microsecond) == (0, 0)
    assert next(ticks) - first == timedelta(minutes=1)


def test_bad_schedules_are_refused_at_declaration() -> None:
    app = App("cron_decl")
    for bad in ("61 * * * *", "not a schedule", "* * *", "* * * * * * * *"):
        with pytest.raises(ValueError, match="cron"):

            @app.cron(bad, name="nightly")
            async def job() -> None: ...

    with pytest.raises(ValueError, match="without arguments"):

        @app.cron("* * * * *", name="nightly")
        async def needs_input(day: str) -> None: ...

    # a refused declaration leaves nothing behind: the name can be declared again
    assert app.crons == {} and app.tasks == {}

    @app.cron("0 3 * * *", name="nightly")
    async def nightly(dry_run: bool = False) -> None: ...

    assert set(app.crons) == set(app.tasks) == {"nightly"}
    assert app.crons["nightly"].schedule == "0 3 * * *"
    assert app.crons["nightly"].task is nightly
    assert nightly.options.attempts == 1


# -- end to end ----------------------------------------------------------------------------------


async def _cron_jobs(app: App) -> dict[str, str]:
    """The app's cron idempotency keys -> job ids."""
    raw = await app.store.client.hgetall(AppKeys.for_app(app.name).idem)
    return {k.decode(): v.decode() for k, v in raw.items() if k.startswith(b"cron:")}


async def test_three_workers_enqueue_each_minute_tick_once(redis_url: str, namespace: str) -> None:
    runs: list[float] = []
    apps: list[App] = []
    for _ in range(3):  # three workers, each with its own app object and connection
        app = make_app(namespace, redis_url)

        @app.cron("* * * * *", name="minutely")
        async def minutely() -> None:
            runs.append(time.time())

        apps.append(app)

    now = datetime.now(UTC)
    if 60 - now.second - now.microsecond / 1e6 < 2:  # too close to a boundary: start after it
        await asyncio.sleep(62 - now.second - now.microsecond / 1e6)
    started = datetime.now(UTC)
    tick = next(CronSim("* * * * *", started))
    key = tick_key("minutely", tick)
    app = apps[0]
    async with AsyncExitStack() as stack:
        for each in apps:
            await stack.enter_async_context(each)
            await stack.enter_async_context(running_worker(each, concurrency=2))

        async def ran() -> bool:
            return key in await _cron_jobs(app) and len(runs) >= 1

        await eventually(ran, timeout=(tick - started).total_seconds() + 10, every=0.2)
        await asyncio.sleep(1.5)  # room for a duplicate to show up, if there were one
        jobs = await _cron_jobs(app)
        stats = await app.stats()
        job = Job(app.get_task("minutely"), jobs[key])
        info = await job.info()

    assert len(runs) == 1
    assert runs[0] >= tick.timestamp() - 0.05  # not before its tick
    assert list(jobs) == [key]
    assert stats.get("completed") == 1
    assert (info.status, info.tenant, info.task) == ("completed", CRON_TENANT, "minutely")


async def test_second_resolution_schedule_yields_one_job_per_tick(
    redis_url: str, namespace: str
) -> None:
    """Many ticks in a few seconds (cronsim's optional seconds field): each tick once, in order."""
    runs: list[float] = []
    apps: list[App] = []
    for _ in range(3):
        app = make_app(namespace, redis_url)

        @app.cron("* * * * * *", name="every-second")
        async def every_second() -> None:
            runs.append(time.time())

        apps.append(app)

    started = time.time()
    async with AsyncExitStack() as stack:
        for each in apps:
            await stack.enter_async_context(each)
            await stack.enter_async_context(running_worker(each, concurrency=2))
        await asyncio.sleep(3.5)
        stopped = time.time()
    async with apps[0] as app:
        await asyncio.sleep(0.1)
        jobs = await _cron_jobs(app)
        stats = await app.stats()

    ticks = sorted(int(k.rsplit(":", 1)[1]) for k in jobs)
    assert 2 <= len(ticks) <= 5
    assert ticks == list(range(ticks[0], ticks[0] + len(ticks)))  # consecutive, none skipped
    assert ticks[0] > started - 1 and ticks[-1] <= stopped
    assert len(set(jobs.values())) == len(jobs)  # one job per tick
    assert len(runs) == stats.get("completed")
    # every tick ran once; only the last may still wait, enqueued as the workers stopped
    assert len(ticks) - 1 <= len(runs) <= len(ticks)
