"""Fencing tokens against a worker that comes back from the dead, and renewal that works.

1. A worker is frozen (SIGSTOP) while it runs a job, past its lease. A second worker
   reclaims the job and completes it. The first is then thawed (SIGCONT): its attempt
   finishes and it sends its result, which the store rejects (``fenced``), so the
   job's result stays the second worker's. (The job holds until a point in time, so
   the thawed attempt ends at once, before the worker's next renewal could tell it
   the lease is gone; a worker that learns that first drops the attempt unwritten,
   which is safe too but not the case under test.)
2. A job running ten times the lease length on a healthy worker, with another worker
   sweeping all along, is never reclaimed: renewals keep its lease ahead.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from pathlib import Path

import pytest

from fairlane.store.wire import Outcome
from tests.faults.worker_proc import (
    Fleet,
    build_app,
    eventually,
    held_by,
    worker_env,
)

pytestmark = pytest.mark.anyio


async def test_late_completion_of_a_frozen_worker_is_fenced(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    lease, renew, sweep = 1.5, 0.3, 0.5
    ledger = f"{{fl:{namespace}}}:ledger"
    app, tasks = build_app(namespace, redis_url)
    env = worker_env(namespace, redis_url, ledger, lease=lease, renew=renew, sweep=sweep)
    async with app:
        with Fleet(env, tmp_path) as fleet:
            frozen = fleet.start()
            job = await tasks.hold.enqueue(2 * lease, "held")

            async def started() -> bool:
                return await app.store.client.lindex(ledger, 0) == f"held:{frozen.pid}".encode()

            # freeze it inside the attempt, not before: the job has run its first line
            await eventually(started, "the job to start", timeout=30)
            assert job.id in await held_by(app, frozen.pid)
            os.kill(frozen.pid, signal.SIGSTOP)
            try:
                rescuer = fleet.start()
                result = await job.result(timeout=30)
                assert result == rescuer.pid
                stats = await app.stats()
                assert stats.get("reclaimed") == 1 and stats.get("fenced", 0) == 0
            finally:
                os.kill(frozen.pid, signal.SIGCONT)

            async def fenced() -> int:
                return (await app.stats()).get("fenced", 0)

            assert await eventually(fenced, "the late completion to be fenced", timeout=30) == 1
            assert frozen.poll() is None, "the thawed worker must survive its lost lease"

        record = await app.store.job_record(job.id)
        starts = [e.decode() for e in await app.store.client.lrange(ledger, 0, -1)]
        stats = await app.stats()
    assert record["st"] == b"completed"
    assert int(record["att"]) == 2
    assert int(record["res"]) == rescuer.pid, "the fenced write must not replace the result"
    assert starts == [f"held:{frozen.pid}", f"held:{rescuer.pid}"]
    assert stats.get("completed") == 1 and stats.get("fenced") == 1


async def test_a_renewed_lease_is_never_reclaimed(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    lease, renew, sweep = 0.6, 0.15, 0.2
    ledger = f"{{fl:{namespace}}}:ledger"
    app, tasks = build_app(namespace, redis_url)
    env = worker_env(namespace, redis_url, ledger, lease=lease, renew=renew, sweep=sweep)
    async with app:
        leases = app.store.keys.leases
        with Fleet(env, tmp_path) as fleet:
            workers = [fleet.start(), fleet.start()]
            job = await tasks.hold.enqueue(10 * lease, "long")

            async def lease_expiry() -> float | None:
                return await app.store.client.zscore(leases, job.id)

            expiries = [await eventually(lease_expiry, "the job to start", timeout=30)]
            deadline = asyncio.get_running_loop().time() + 30 * lease
            while await job.status() == "running":  # one look per lease length
                assert asyncio.get_running_loop().time() < deadline, "the job never finished"
                await asyncio.sleep(lease)
                expiry = await lease_expiry()
                if expiry is not None:
                    expiries.append(expiry)
            result = await job.result(timeout=30)
            assert result in {w.pid for w in workers}
            assert all(w.poll() is None for w in workers)

        record = await app.store.job_record(job.id)
        starts = [e.decode() for e in await app.store.client.lrange(ledger, 0, -1)]
        stats = await app.stats()
    assert starts == [f"long:{result}"], "the job ran more than once"
    assert int(record["att"]) == 1
    assert stats.get("reclaimed", 0) == 0
    assert stats.get("fenced", 0) == 0
    # the lease moved ahead at every look, all through the run
    assert len(expiries) >= 5
    assert all(a < b for a, b in itertools.pairwise(expiries)), expiries


@pytest.mark.contract
async def test_a_settlement_sent_again_is_not_counted_as_fenced(
    redis_url: str, namespace: str
) -> None:
    """A worker whose settlement call lost its reply sends it again: the store applied
    it the first time, so the second is neither applied nor counted as a stale write;
    a write of a lease the store reclaimed meanwhile still is."""
    app, tasks = build_app(namespace, redis_url)
    async with app:
        store = app.store
        kept, lost = await tasks.record.enqueue_many([(1, 0.0), (2, 0.0)])
        fetched = await store.exchange("w", ["default"], 2, 60_000)
        tokens = {job.id: job.token for job in fetched.jobs}
        done = Outcome(kept.id, tokens[kept.id], "ok", "1")
        assert await store.ack(["default"], [done]) == [1]
        assert await store.ack(["default"], [done]) == [2]
        assert await kept.status() == "completed"
        # the other lease is reclaimed (its worker presumed lost) before its write lands
        await store.client.zadd(store.keys.leases, {lost.id: 0})
        await store.sweep(10, 0, 60_000)
        late = Outcome(lost.id, tokens[lost.id], "ok", "2")
        assert await store.ack(["default"], [late]) == [0]
        stats = await app.stats()
        assert (stats.get("resettled"), stats.get("fenced")) == (1, 1)
