"""A lane's capacity is the live sum of its workers' slots.

Workers are counted in each lane they serve from their first exchange; a worker that
leaves, or whose heartbeat goes stale, is taken out again. Every change is visible in
the lane's cached capacity, and dispatch never hands out more slots than it holds.
"""

from __future__ import annotations

import asyncio

import pytest

from fairlane.store.api import Store
from fairlane.store.wire import NewJob

pytestmark = [pytest.mark.anyio, pytest.mark.contract]


def _job(n: int, *, slots: int = 1) -> NewJob:
    return NewJob(f"j{n:04d}", "t", 0, "cap.job", "[]", 1, "", 0, "0,0", "0,0", slots=slots)


async def test_capacity_follows_workers_joining_and_leaving(store: Store) -> None:
    await store.exchange("w1", ["a", "b"], 0, 60_000, slots=4)
    await store.exchange("w2", ["a"], 0, 60_000, slots=6)
    await store.exchange("w2", ["a"], 0, 60_000, slots=6)  # counted once
    assert (await store.lane_state("a")).capacity == 10
    assert (await store.lane_state("b")).capacity == 4
    await store.leave("w1", 60_000, ["a", "b"])
    assert (await store.lane_state("a")).capacity == 6
    assert (await store.lane_state("b")).capacity == 0


async def test_a_stale_worker_is_taken_out_of_capacity(store: Store) -> None:
    await store.exchange("gone", ["a"], 0, 60_000, slots=5)
    await store.exchange("alive", ["a"], 0, 60_000, slots=3)
    await asyncio.sleep(0.05)
    await store.renew("alive", 60_000, [])
    await store.sweep(100, 1, 20)  # heartbeats older than 20 ms are stale
    assert (await store.lane_state("a")).capacity == 3
    members = {m.decode() for m in await store.client.zrange(store.keys.workers, 0, -1)}
    assert members == {"alive"}


async def test_dispatch_never_exceeds_the_lane_capacity(store: Store) -> None:
    await store.enqueue("a", [_job(n) for n in range(20)])
    first = await store.exchange("w1", ["a"], 10, 60_000, slots=4)
    # w1 asks for 10 slots but the lane only has its 4
    assert len(first.jobs) == 4
    second = await store.exchange("w2", ["a"], 10, 60_000, slots=3)
    assert len(second.jobs) == 3
    state = await store.lane_state("a")
    assert state.capacity == 7
    assert state.in_flight == {"standard": 7}
    assert state.waiting["standard"] == 13


async def test_a_wide_job_waits_for_its_slots_and_is_not_overtaken(store: Store) -> None:
    await store.enqueue("a", [_job(0), _job(1, slots=3), _job(2)])
    got = await store.exchange("w1", ["a"], 4, 60_000, slots=4)
    assert [j.id for j in got.jobs] == ["j0000", "j0001"]
    assert [j.slots for j in got.jobs] == [1, 3]
    # the lane is full: the narrow job behind waits rather than take a slot it lacks
    assert (await store.exchange("w1", ["a"], 4, 60_000, slots=4)).jobs == []
