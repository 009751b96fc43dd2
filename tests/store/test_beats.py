"""Workers' beats: a worker that beat and then fell silent is dead, and its jobs come back
at once, whatever their leases say.

The store keeps the ids leased to each worker; a beat of another worker takes back the
jobs of one silent past the timeout (counted as an attempt, like a lost lease), frees its
capacity and drops its keys. A worker that never beat is not judged by beats, and one
that keeps beating keeps its jobs however long they run.
"""

from __future__ import annotations

import asyncio

import pytest

from fairlane.store.api import Store
from fairlane.store.beats import BeatLine
from fairlane.store.wire import NewJob, Outcome
from fairlane.testing import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.contract]

HOUR = 3_600_000


def _job(n: int) -> NewJob:
    return NewJob(f"j{n:04d}", "t", 0, "beat.job", "[]", 3, "", 0, "0,0", "0,0")


async def _leased(store: Store, worker: str) -> set[str]:
    raw = await store.client.smembers(store.keys.worker_jobs(worker))
    return {m.decode() for m in raw}


async def test_a_silent_workers_jobs_come_back_at_the_next_beat(store: Store) -> None:
    await store.enqueue("a", [_job(n) for n in range(5)])
    got = await store.exchange("victim", ["a"], 3, HOUR, slots=3)
    await store.beat("victim", 60_000, 100, 1)
    held = {j.id for j in got.jobs}
    assert await _leased(store, "victim") == held
    # alive: the beat of another worker takes nothing
    assert await store.beat("other", 60_000, 100, 1) == ([], [], [])
    await asyncio.sleep(0.05)
    retried, dead, gone = await store.beat("other", 20, 100, 1)
    assert (sorted(retried), dead, gone) == (sorted(held), [], ["victim"])
    for job_id in held:
        record = await store.read_job(job_id)
        assert record is not None
        assert record.status in {"queued", "scheduled"}
        assert "reclaimed" in [e.kind for e in await store.job_events(job_id)]
    assert await store.client.zcard(store.keys.leases) == 0
    assert not await store.client.exists(store.keys.worker_jobs("victim"))
    assert (await store.lane_state("a")).capacity == 0
    beats = {m.decode() for m in await store.client.zrange(store.keys.beats, 0, -1)}
    assert beats == {"other"}
    assert (await store.stats())["reclaimed"] == 3


async def test_settled_jobs_leave_the_workers_set(store: Store) -> None:
    await store.enqueue("a", [_job(n) for n in range(4)])
    got = await store.exchange("w", ["a"], 4, HOUR, slots=4)
    first, second, *rest = got.jobs
    # one settles with the next exchange, one on its own: both leave the set
    await store.exchange("w", ["a"], 0, HOUR, [Outcome(first.id, first.token, "ok", "1")])
    await store.ack(["a"], [Outcome(second.id, second.token, "ok", "1")], "w")
    assert await _leased(store, "w") == {j.id for j in rest}


async def test_a_worker_that_keeps_beating_keeps_its_jobs(store: Store) -> None:
    await store.enqueue("a", [_job(0)])
    await store.exchange("busy", ["a"], 1, HOUR, slots=1)
    for _ in range(5):
        await asyncio.sleep(0.03)
        await store.beat("busy", 50, 100, 1)
        assert await store.beat("other", 50, 100, 1) == ([], [], [])
    assert await _leased(store, "busy") == {"j0000"}


async def test_a_worker_that_never_beat_is_left_to_its_leases(store: Store) -> None:
    await store.enqueue("a", [_job(0)])
    await store.exchange("old", ["a"], 1, HOUR, slots=1)
    await asyncio.sleep(0.03)
    assert await store.beat("new", 10, 100, 1) == ([], [], [])
    record = await store.read_job("j0000")
    assert record is not None and record.status == "running"


async def test_a_pass_is_bounded_and_the_next_one_finishes(store: Store) -> None:
    await store.enqueue("a", [_job(n) for n in range(5)])
    await store.exchange("victim", ["a"], 5, HOUR, slots=5)
    await store.beat("victim", 60_000, 100, 1)
    await asyncio.sleep(0.03)
    first = await store.beat("other", 10, 2, 1)
    assert (len(first[0]), first[2]) == (2, ["victim"])
    assert len(await _leased(store, "victim")) == 3  # still known: the rest come next
    second = await store.beat("other", 10, 100, 1)
    assert len(second[0]) == 3
    assert not await store.client.exists(store.keys.worker_jobs("victim"))


async def test_the_blocking_twin_beats_as_the_async_call_does(store: Store) -> None:
    """``BeatLine`` sends the same keys, function and arguments, from a thread: a worker
    it beats for is alive, and its beat takes back a silent worker's jobs."""
    line = BeatLine.of(store)
    try:
        await store.enqueue("a", [_job(n) for n in range(3)])
        got = await store.exchange("victim", ["a"], 3, HOUR, slots=3)
        await asyncio.to_thread(line.beat, store.shard, "victim", 60_000, 100, 1)
        assert await store.beat("other", 60_000, 100, 1) == ([], [], [])
        await asyncio.sleep(0.05)
        retried, dead, gone = await asyncio.to_thread(line.beat, store.shard, "other", 20, 100, 1)
    finally:
        await asyncio.to_thread(line.close)
    assert (sorted(retried), dead, gone) == (sorted(j.id for j in got.jobs), [], ["victim"])
    beats = {m.decode() for m in await store.client.zrange(store.keys.beats, 0, -1)}
    assert beats == {"other"}
    assert (await store.lane_state("a")).capacity == 0


async def test_the_blocking_twin_loads_the_library_a_restarted_server_lost() -> None:
    with RedisServer() as server:
        store = Store.from_url(server.url, "relo")
        await store.connect()
        line = BeatLine.of(store)
        try:
            await store.client.function_flush()
            assert await asyncio.to_thread(line.beat, 0, "w", 60_000, 10, 1) == ([], [], [])
            assert await store.client.zscore(store.keys.beats, "w") is not None
        finally:
            line.close()
            await store.aclose()
