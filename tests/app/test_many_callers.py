"""More callers than connections wait for one; they do not fail.

An app's calls share a pool of ``connection.max_connections`` connections. The most
common async pattern, ``asyncio.gather`` over many enqueues, puts far more calls in
flight than that: each must wait its turn and succeed, and ``StoreUnavailable`` stays
the answer for a server that cannot be reached, nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from fairlane import App, StoreBusy, StoreUnavailable
from fairlane.config.settings import Settings

pytestmark = [pytest.mark.anyio, pytest.mark.contract]

CALLERS = 1000


def _app(redis_url: str, namespace: str, **connection: float) -> App:
    settings = Settings(redis_url=redis_url, connection={"max_connections": 8, **connection})
    app = App(namespace, settings=settings)

    @app.task(name="noop")
    async def noop(i: int) -> int:
        return i

    return app


async def test_a_thousand_gathered_enqueues_all_succeed(redis_url: str, namespace: str) -> None:
    app = _app(redis_url, namespace)
    noop = app.registry.tasks["noop"]
    async with app:
        jobs = await asyncio.gather(*(noop.enqueue(i, tenant="t") for i in range(CALLERS)))
        assert len({job.id for job in jobs}) == CALLERS
        states = await asyncio.gather(*(job.status() for job in jobs))
    assert set(states) == {"queued"}


async def test_a_thousand_gathered_submits_are_all_accepted(redis_url: str, namespace: str) -> None:
    app = _app(redis_url, namespace)
    noop = app.registry.tasks["noop"]
    async with app:
        answers = await asyncio.gather(*(noop.submit(i, tenant="t") for i in range(CALLERS)))
        assert {answer.status for answer in answers} == {"accepted"}
        assert len({answer.job.id for answer in answers if answer.job}) == CALLERS


async def test_a_caller_that_waits_past_the_timeout_is_told_the_store_is_busy(
    redis_url: str, namespace: str
) -> None:
    """A wait for a connection is bounded like any call: one longer than
    ``connection.timeout`` fails as busy, not as an unreachable server, and stores
    nothing; submit answers ``unavailable`` with reason ``store_busy``."""
    app = _app(redis_url, namespace, timeout=0.5)
    noop = app.registry.tasks["noop"]
    async with app:
        gate = app.sharded.stores[0].gates[0]
        async with contextlib.AsyncExitStack() as held:  # every place taken, for now
            for _ in range(gate.limit):
                await held.enter_async_context(gate.slot())
            with pytest.raises(StoreBusy) as caught:
                await noop.enqueue(1, tenant="t")
            assert not isinstance(caught.value, StoreUnavailable)
            answer = await noop.submit(2, tenant="t")
            assert (answer.status, answer.reason) == ("unavailable", "store_busy")
        # with the places free again, calls go through
        await noop.enqueue(3, tenant="t")
        stats = await app.stats()
    assert stats["fifo"] == 1  # the store's FIFO counter: one job was ever stored
