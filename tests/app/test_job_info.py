"""``Job.info()`` shows the job's retry envelope: when it may run next, its deadline, and
the idempotency key it was submitted with, read from its record on a real server."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from fairlane.policy.backoff import Backoff
from tests.e2e.helpers import WAIT, eventually, make_app, running_worker

pytestmark = pytest.mark.anyio

BACKOFF = 30.0  # seconds: the retry stays scheduled for the whole test


async def test_a_delayed_job_shows_its_envelope(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)

    @app.task(name="later")
    async def later(n: int) -> int:
        return n

    async with app:
        job = await later.enqueue(1, delay=20, deadline=60, idempotency_key="order-7")
        info = await job.info()
        assert info.status == "scheduled" and info.enqueued_at is not None
        # the server's times: the delay and the deadline count from its enqueue
        assert info.not_before == info.enqueued_at + timedelta(seconds=20)
        assert info.deadline == info.enqueued_at + timedelta(seconds=60)
        assert info.idempotency_key == "order-7"
        plain = await (await later.enqueue(2)).info()
        assert plain.not_before == plain.enqueued_at
        assert plain.deadline is None and plain.idempotency_key is None


async def test_a_retry_shows_when_it_may_run_again(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    failed = asyncio.Event()

    @app.task(name="flaky", attempts=3, backoff=Backoff(BACKOFF, BACKOFF, "none"))
    async def flaky() -> None:
        failed.set()
        raise RuntimeError("not yet")

    async with app:
        job = await flaky.enqueue(idempotency_key="once")
        async with running_worker(app):
            async with asyncio.timeout(WAIT):
                await failed.wait()

            async def retry_scheduled() -> bool:
                return (await job.info()).status == "scheduled"

            await eventually(retry_scheduled)
        info = await job.info()
        assert info.attempts == 1 and info.error == "not yet"
        assert info.enqueued_at is not None and info.not_before is not None
        # the backoff counts from the failed attempt's end, after the enqueue
        wait = (info.not_before - info.enqueued_at).total_seconds()
        assert BACKOFF <= wait < BACKOFF + WAIT
        assert info.idempotency_key == "once" and info.deadline is None
