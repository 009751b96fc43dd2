"""A running attempt is stopped at its job's deadline, end to end: a real server and an
in-process worker of one slot.

For each executor, a task that would run far past its deadline is stopped there -- an
async one cancelled where it awaits, a thread one let go (the thread cannot be stopped;
it runs on and its result is discarded), a process one killed with its child -- and
its job ends ``expired`` with ``DeadlineExceeded``: within the spec's second of its
deadline by the server's own record, after one attempt although retries were allowed,
counted as expired and never as failed or retried, and its one slot free for the next
job at once. ``explain`` says it was stopped at its deadline while running. Each slow
job is enqueued once a first job has run, so that it starts well before its deadline
whatever the worker's start-up costs; bounds are budgets, not timings.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from fairlane import App, Backoff
from fairlane.app.job import Job
from fairlane.errors import JobExpired, TaskFailed
from fairlane.insight.explain import explain
from fairlane.store.records import JobRecord
from tests.e2e import helpers
from tests.e2e.helpers import WAIT, eventually, make_app, running_worker

pytestmark = pytest.mark.anyio

#: the slow jobs' deadline, seconds after they are enqueued (on a worker already serving)
DEADLINE = 0.5
#: how late past its deadline an attempt may end: the spec's budget
LATE_MS = 1000
NO_WAIT = Backoff(base=0.0, cap=0.0, jitter="none")


def _quick(app: App) -> None:
    @app.task(name="quick")
    async def quick() -> int:
        return 1


async def _expired_at_its_deadline(app: App, job: Job[object]) -> JobRecord:
    """The job expired at its deadline while its one attempt ran: its record."""
    with pytest.raises(JobExpired) as caught:
        await job.result(timeout=WAIT)
    assert caught.value.type_name == "DeadlineExceeded"
    record = await app.store.read_job(job.id)
    assert record is not None
    assert (record.status, record.attempts) == ("expired", 1)  # retries allowed, none made
    start, deadline, fin = record.started_ms, record.deadline_ms, record.finished_ms
    assert start is not None and deadline is not None and fin is not None
    assert start < deadline  # it was running when its deadline came
    # never early (its worker reads the server's clock), and late within the budget
    assert 0 <= fin - deadline < LATE_MS, (deadline, fin)
    return record


async def _next_job_started_at_once(app: App, expired: JobRecord, after: Job[object]) -> None:
    """``after``, waiting for the worker's one slot, took it as the expired job left it."""
    assert await after.result(timeout=WAIT) == 1
    record = await app.store.read_job(after.id)
    assert record is not None and record.started_ms is not None
    assert expired.finished_ms is not None
    assert expired.finished_ms <= record.started_ms < expired.finished_ms + LATE_MS


async def _counted_as_expired(app: App, completed: int) -> None:
    stats = await app.store.stats()
    assert stats.get("expired") == 1, stats
    assert stats.get("completed") == completed, stats
    assert "failed" not in stats and "retried" not in stats, stats


async def test_an_async_attempt_is_cancelled_at_its_deadline_and_expires(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    _quick(app)
    stopped: list[str] = []

    @app.task(name="dawdle", attempts=3, backoff=NO_WAIT, timeout=60)
    async def dawdle() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            stopped.append("cancelled")  # where it awaited: cooperatively
            raise

    async with app:
        async with running_worker(app, concurrency=1):
            assert await (await app.get_task("quick").enqueue()).result(timeout=WAIT) == 1
            slow = await dawdle.enqueue(deadline=DEADLINE)
            after = await app.get_task("quick").enqueue()
            expired = await _expired_at_its_deadline(app, slow)
            await _next_job_started_at_once(app, expired, after)
        assert stopped == ["cancelled"]
        await _counted_as_expired(app, completed=2)
        answer = explain(await app.store.job_record(slow.id), await app.store.job_events(slow.id))
        assert answer.summary.endswith("expired at its deadline while running."), answer.summary
        [ran] = [s for s in answer.segments if s.what == "running"]
        assert ran.cause == "deadline"
        assert ran.why.endswith("stopped at its deadline while running, expired (DeadlineExceeded)")


async def test_a_thread_attempt_is_let_go_at_its_deadline_and_expires(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    _quick(app)
    release = threading.Event()

    @app.task(name="block", executor="thread", attempts=3, backoff=NO_WAIT, timeout=60)
    def block() -> str:
        release.wait(WAIT)
        return "late"

    async with app:
        async with running_worker(app, concurrency=1):
            assert await (await app.get_task("quick").enqueue()).result(timeout=WAIT) == 1
            slow = await block.enqueue(deadline=DEADLINE)
            after = await app.get_task("quick").enqueue()
            try:
                expired = await _expired_at_its_deadline(app, slow)
                await _next_job_started_at_once(app, expired, after)
            finally:
                release.set()  # the thread returns; its result is discarded
        record = await app.store.read_job(slow.id)
        assert record is not None and (record.status, record.attempts) == ("expired", 1)
        await _counted_as_expired(app, completed=2)


@pytest.mark.embedded_only
async def test_a_process_attempt_is_killed_at_its_deadline_and_expires(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    helpers.children_import_tests(monkeypatch)
    app = make_app(namespace, redis_url)
    _quick(app)
    sleeper = app.task(executor="process", attempts=3, backoff=NO_WAIT, timeout=60)(
        helpers.sleep_in_child
    )
    pid_file = tmp_path / "child.pid"

    async with app:
        async with running_worker(app, concurrency=1):
            # the pool's child has started once the first job has run
            assert await (await app.get_task("quick").enqueue()).result(timeout=WAIT) == 1
            slow = await sleeper.enqueue(60.0, str(pid_file), deadline=2 * DEADLINE)
            after = await app.get_task("quick").enqueue()
            expired = await _expired_at_its_deadline(app, slow)
            await _next_job_started_at_once(app, expired, after)
            pid = int(pid_file.read_text())

            async def killed() -> bool:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return True  # killed and reaped
                return False

            await eventually(killed)
        await _counted_as_expired(app, completed=2)


async def test_an_attempt_whose_timeout_comes_first_still_times_out(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task(name="short", attempts=1, timeout=0.05)
    async def short() -> None:
        await asyncio.sleep(60)

    async with app:
        async with running_worker(app, concurrency=1):
            job = await short.enqueue(deadline=30)
            with pytest.raises(TaskFailed) as caught:
                await job.result(timeout=WAIT)
        assert type(caught.value) is TaskFailed and caught.value.type_name == "TimeoutError"
        assert (await job.status()) == "failed"
