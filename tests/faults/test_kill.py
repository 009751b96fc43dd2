"""kill -9 of a worker mid-run: every job still completes, re-runs are only the lost ones.

Two worker processes run 2,000 short jobs; each job appends its number and the pid
that ran it to a ledger before returning. At ~30% one worker is SIGKILLed and a
replacement started. Afterwards: every job completed and is in the ledger; the jobs
run twice are exactly among those the dead worker held leases on at the kill (its
in-flight jobs), at most its concurrency of them; each of those was reclaimed once;
and the last of them completed within a lease plus a sweep period (plus slack) of
the kill.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.faults.worker_proc import (
    Fleet,
    build_app,
    eventually,
    held_by,
    server_ms,
    wait_ready,
    worker_env,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

JOBS = 2000
CONCURRENCY = 8
PAUSE = 0.02  # s of work per job
LEASE, RENEW, SWEEP = 1.5, 0.3, 0.5
SWEEP_JITTER = 0.25  # LeaseSettings.sweep_jitter default
SLACK = 5.0  # s: a replacement's start, a loaded machine


async def test_kill_9_mid_run_loses_nothing(redis_url: str, namespace: str, tmp_path: Path) -> None:
    ledger = f"{{fl:{namespace}}}:ledger"
    app, tasks = build_app(namespace, redis_url)
    env = worker_env(
        namespace, redis_url, ledger, lease=LEASE, renew=RENEW, sweep=SWEEP, concurrency=CONCURRENCY
    )
    async with app:
        client, keys = app.store.client, app.store.keys
        with Fleet(env, tmp_path) as fleet:
            victim, survivor = fleet.start(), fleet.start()
            await wait_ready(app, victim.pid)
            await wait_ready(app, survivor.pid)
            jobs = await tasks.record.enqueue_many([(n, PAUSE) for n in range(JOBS)])
            number = {job.id: n for n, job in enumerate(jobs)}

            async def progressed() -> bool:
                return int(await client.llen(ledger)) >= JOBS * 3 // 10

            await eventually(progressed, "30% of the jobs to run", timeout=60)
            kill_ms = await server_ms(app)
            Fleet.kill(victim)
            in_flight = await held_by(app, victim.pid)
            snapshot_ms = await server_ms(app)
            # the victim's leases cannot have expired yet, so the snapshot is complete
            assert snapshot_ms - kill_ms < (LEASE - RENEW) * 1000
            assert in_flight, "the killed worker held no jobs: the kill tested nothing"
            assert len(in_flight) <= 2 * CONCURRENCY  # running + finished, not yet settled
            replacement = fleet.start()

            async def all_done() -> bool:
                return (await app.stats()).get("completed", 0) >= JOBS

            await eventually(all_done, f"all {JOBS} jobs to complete", timeout=90, step=0.1)
            assert replacement.poll() is None and survivor.poll() is None

        pipe = client.pipeline(transaction=False)
        for job in jobs:
            pipe.hmget(keys.job(job.id), ["st", "att", "fin"])
        records = dict(zip([j.id for j in jobs], await pipe.execute(), strict=True))
        entries = [e.decode() for e in await client.lrange(ledger, 0, -1)]
        stats = await app.stats()

    assert {st for st, _, _ in records.values()} == {b"completed"}
    assert stats["completed"] == JOBS
    runs = Counter(int(entry.split(":")[0]) for entry in entries)
    assert set(runs) == set(range(JOBS)), "a job completed without running"
    twice = {n for n, count in runs.items() if count > 1}
    lost = {number[i] for i in in_flight}
    assert max(runs.values()) <= 2
    assert twice <= lost, f"jobs re-run that the dead worker did not hold: {sorted(twice - lost)}"
    assert len(twice) <= CONCURRENCY
    retried = {number[i] for i, (_, att, _) in records.items() if int(att) > 1}
    assert retried == lost, "exactly the dead worker's jobs get a second attempt"
    assert stats.get("reclaimed", 0) == len(in_flight)
    assert stats.get("fenced", 0) == 0

    recovery = (max(int(records[i][2]) for i in in_flight) - kill_ms) / 1000
    bound = LEASE + SWEEP * (1 + SWEEP_JITTER) + SLACK
    print(
        f"\nkill -9 at {JOBS * 3 // 10}+ of {JOBS} jobs: {len(in_flight)} in flight, "
        f"{len(twice)} run twice, recovery {recovery:.2f}s (bound {bound:.2f}s)"
    )
    assert recovery <= bound
