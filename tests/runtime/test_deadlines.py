"""Attempt timeouts on one loop timer (fairlane.runtime.deadlines), on a real loop: an
attempt is told when its time is up and not while it has time left, an attempt that
ended is never told, attempts due together are told together, and emptied buckets do
not pile up in the heap however many attempts come and go. A deadline on a real
server's clock becomes a due time of the loop's that is never early, and none before
the clock has been read."""

from __future__ import annotations

import asyncio

import pytest

from fairlane.runtime.deadlines import Deadlines, ServerClock
from fairlane.store.api import Store
from tests.e2e.helpers import eventually

pytestmark = pytest.mark.anyio


def _idle_tasks(n: int) -> list[asyncio.Task[None]]:
    return [asyncio.create_task(asyncio.Event().wait()) for _ in range(n)]


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_an_attempt_is_told_when_due_and_not_while_it_has_time_left() -> None:
    told: list[list[tuple[asyncio.Task[None], str]]] = []
    deadlines = Deadlines(told.append)
    short, long = _idle_tasks(2)
    deadlines.add(1, long, "long", 3600.0)
    deadlines.add(2, short, "short", 0.01)

    async def due() -> bool:
        return bool(told)

    await eventually(due)
    assert told == [[(short, "short")]]
    assert len(deadlines) == 1  # the long one waits on
    await _cancel([short, long])


async def test_an_attempt_that_ended_is_never_told() -> None:
    told: list[list[tuple[asyncio.Task[None], str]]] = []
    deadlines = Deadlines(told.append)
    [task] = _idle_tasks(1)
    deadlines.discard(1, deadlines.add(1, task, "j", 0.01))
    assert len(deadlines) == 0
    later = _idle_tasks(1)
    deadlines.add(2, later[0], "later", 0.03)

    async def due() -> bool:
        return bool(told)

    await eventually(due)
    assert told == [[(later[0], "later")]]
    await _cancel([task, *later])


async def test_attempts_due_in_the_same_millisecond_are_told_together() -> None:
    told: list[list[tuple[asyncio.Task[None], str]]] = []
    deadlines = Deadlines(told.append)
    tasks = _idle_tasks(5)
    due = deadlines.due(0.05)
    for n, task in enumerate(tasks):
        deadlines.put(due, n, task, f"j{n}")

    async def all_told() -> bool:
        return sum(len(batch) for batch in told) == 5

    await eventually(all_told)
    assert len(told) == 1
    await _cancel(tasks)


async def test_emptied_buckets_do_not_pile_up() -> None:
    deadlines = Deadlines(lambda due: None)
    [task] = _idle_tasks(1)
    for n in range(20_000):  # one bucket per attempt: every due time a different ms
        deadlines.discard(n, deadlines.add(n, task, "j", 600.0 + n / 1000))
    assert len(deadlines) == 0
    assert deadlines.entries <= 2 + 1024 + 1
    await _cancel([task])


async def test_a_deadline_on_the_servers_clock_falls_due_on_the_loops_never_early(
    store: Store,
) -> None:
    clock = ServerClock()
    assert clock.due(1_000) is None  # not read yet: no deadline is timed
    assert await clock.sync(store.server_time_ms)
    deadline = await store.server_time_ms() + 200
    due = clock.due(deadline)
    assert due is not None
    loop = asyncio.get_running_loop()
    await asyncio.sleep(due / 1000 - loop.time())
    reached = await store.server_time_ms()
    # due no earlier than the deadline; later by a round trip, within a generous budget
    assert deadline <= reached < deadline + 1000, (deadline, reached)
