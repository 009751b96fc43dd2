"""The beat thread (fairlane.runtime.beating) against a real server, and in a real worker.

The thread beats every shard it is given, from its own connection, while each shard's
leases can be live; it falls silent in a shard whose leases have run out (so another
worker's beat takes that worker's jobs back) and beats there again once they are
renewed; an unreachable server is one warning and its calls stay bounded; and it beats
no more once stopped -- by ``stop``, by a worker's graceful stop (before its goodbye,
which no beat follows) or by the cancellation of the worker's task. What is checked is
who beat, and whether a beat came, never how long anything took.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import threading
from collections.abc import AsyncIterator, Callable

import pytest

from fairlane.app.worker import Worker
from fairlane.config.settings import LeaseSettings
from fairlane.runtime.beating import BeatShard, BeatThread
from fairlane.store.api import Store
from fairlane.store.beats import BeatLine
from fairlane.store.wire import NewJob
from tests.e2e.helpers import eventually, make_app

pytestmark = pytest.mark.anyio

HOUR = 3_600_000
QUICK = LeaseSettings(duration=3.0, renew_interval=1.0, heartbeat_interval=0.02, worker_timeout=0.2)
FOREVER: Callable[[], float] = lambda: math.inf  # noqa: E731 - leases that never run out
SHARDS = 3
#: how long another worker's beat waits on silence in these tests: many beats of QUICK
JUDGE_MS = 1000


@pytest.fixture
async def sharded(redis_url: str, namespace: str) -> AsyncIterator[list[Store]]:
    """The stores of an app of three shards (sharing one store's connections)."""
    home = Store.from_url(redis_url, namespace, shards=SHARDS)
    await home.connect()
    try:
        yield [home, *(home.shard_store(i, SHARDS) for i in range(1, SHARDS))]
    finally:
        await home.aclose()


async def _beaten(store: Store, worker: str) -> float | None:
    """When ``worker`` last beat in ``store``'s shard (server ms), if it has."""
    return await store.client.zscore(store.keys.beats, worker)


async def _beats_again(store: Store, worker: str) -> bool:
    """Whether ``worker`` beats in ``store``'s shard: a beat after its first one seen."""
    first = await _beaten(store, worker)

    async def later() -> bool:
        now = await _beaten(store, worker)
        return now is not None and (first is None or now > first)

    await eventually(later)
    return True


async def _silent_through(store: Store, worker: str, beats: int) -> bool:
    """Whether ``worker``'s last beat in the shard stays as it is for ``beats`` intervals."""
    before = await _beaten(store, worker)
    await asyncio.sleep(beats * QUICK.heartbeat_interval)
    return await _beaten(store, worker) == before


async def test_every_shard_is_beaten_until_stop_and_never_after(sharded: list[Store]) -> None:
    thread = BeatThread(
        BeatLine.of(sharded[0]), "w", QUICK, [BeatShard(i, FOREVER) for i in range(SHARDS)]
    )
    thread.start()
    try:
        for store in sharded:
            assert await _beats_again(store, "w")
    finally:
        await thread.stop()
    assert not thread.alive
    for store in sharded:
        await store.client.zrem(store.keys.beats, "w")
    await asyncio.sleep(10 * QUICK.heartbeat_interval)
    assert [await _beaten(store, "w") for store in sharded] == [None] * SHARDS
    await thread.stop()  # a second stop is a no-op


async def test_a_shard_whose_leases_ran_out_falls_silent_and_its_jobs_come_back(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The rule: beat while the leases can be live. A worker whose loop renewed nothing
    for a whole lease stops beating, so another worker's beat takes its jobs back; once
    a renewal gets through it beats again."""
    job = NewJob("j0", "t", 0, "beat.job", "[]", 3, "", 0, "0,0", "0,0")
    await store.enqueue("a", [job])
    await store.exchange("stuck", ["a"], 1, HOUR, slots=1)
    until = [math.inf]
    thread = BeatThread(BeatLine.of(store), "stuck", QUICK, [BeatShard(0, lambda: until[0])])
    caplog.set_level(logging.INFO, logger="fairlane.worker")

    def said(words: str) -> int:
        return sum(words in r.getMessage() for r in list(caplog.records))

    thread.start()
    try:
        assert await _beats_again(store, "stuck")
        # beating, it keeps its job however often another worker judges (past the
        # judge's timeout since its first beat, so only beats since then can save it)
        for _ in range(3):
            await asyncio.sleep(JUDGE_MS / 2000)
            assert await store.beat("other", JUDGE_MS, 100, 1) == ([], [], [])
        until[0] = -math.inf  # its leases have run out

        async def fell_silent() -> bool:  # said before its next beat would be sent
            return said("stops beating") == 1

        await eventually(fell_silent)
        assert await _silent_through(store, "stuck", 10)

        async def taken_back() -> bool:
            retried, _, gone = await store.beat("other", JUDGE_MS, 100, 1)
            return retried == ["j0"] and gone == ["stuck"]

        await eventually(taken_back)
        until[0] = math.inf  # renewed again
        assert await _beats_again(store, "stuck")
    finally:
        await thread.stop()
    assert (said("stops beating"), said("beating again")) == (1, 1)


async def test_an_unreachable_server_is_one_warning_and_stop_stays_bounded(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    line = BeatLine(
        f"redis://127.0.0.1:{port}", namespace, 1, socket_timeout=0.5, connect_timeout=0.5
    )
    thread = BeatThread(line, "w", QUICK, [BeatShard(0, FOREVER)])
    caplog.set_level(logging.DEBUG, logger="fairlane.worker")

    def about() -> list[int]:
        return [r.levelno for r in caplog.records if "beating" in r.getMessage()]

    thread.start()
    try:

        async def failed_thrice() -> bool:
            return len(about()) >= 3

        await eventually(failed_thrice)
    finally:
        await thread.stop()
    assert not thread.alive
    levels = about()
    assert levels[0] == logging.WARNING and set(levels[1:]) == {logging.DEBUG}


def _beat_threads(worker: Worker) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"fairlane-beat {worker.id}"]


async def test_a_stopped_worker_beats_no_more_after_its_goodbye(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url, lease=QUICK.model_dump())
    async with app:
        store = app.store
        worker = Worker(app, lanes=[app.settings.default_lane], concurrency=2)
        running = asyncio.create_task(worker.run())
        assert await _beats_again(store, worker.id)
        assert len(_beat_threads(worker)) == 1
        worker.stop()
        await running
        assert _beat_threads(worker) == []
        assert await _beaten(store, worker.id) is None  # it said goodbye
        assert await _silent_through(store, worker.id, 10)
        assert await _beaten(store, worker.id) is None


async def test_a_cancelled_worker_ends_its_beat_thread(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url, lease=QUICK.model_dump())
    async with app:
        store = app.store
        worker = Worker(app, lanes=[app.settings.default_lane], concurrency=2)
        running = asyncio.create_task(worker.run())
        assert await _beats_again(store, worker.id)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert _beat_threads(worker) == []
        # no goodbye on cancellation: the last beat stays, and none follows it
        assert await _beaten(store, worker.id) is not None
        assert await _silent_through(store, worker.id, 10)
