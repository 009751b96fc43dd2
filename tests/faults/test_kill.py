"""kill -9 of a worker mid-run: every job still completes, re-runs are only the lost ones.

Two worker processes run 2,000 short jobs; each job appends its number and the pid
that ran it to a ledger before returning. At ~30% one worker is SIGKILLed and a
replacement started. Afterwards: every job completed and is in the ledger; the jobs
run twice are exactly among those the dead worker held leases on at the kill (its
in-flight jobs), at most its concurrency of them; each of those was reclaimed once;
and the last of them completed within a lease plus a sweep period (plus slack) of
the kill. With three scheduling shards the same holds in every shard: the worker
served them all, and its jobs in each are reclaimed by that shard's sweep. With the
default settings (30 s leases) the dead worker's silence gives it away instead: every
job it held is taken back within 5 s of the kill, by the others' beats.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from fairlane import App, Job
from fairlane.config.sections import LeaseSettings
from fairlane.store.keys import job_shard
from tests.faults.worker_proc import (
    FaultTasks,
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
DEFAULTS = LeaseSettings()
#: with the defaults, a dead worker's jobs are taken back within this of its death
DEFAULT_RECOVERY = 5.0


@pytest.mark.parametrize(("shards", "defaults"), [(1, False), (3, False), (1, True)])
async def test_kill_9_mid_run_loses_nothing(
    redis_url: str, namespace: str, tmp_path: Path, shards: int, defaults: bool
) -> None:
    ledger = f"{{fl:{namespace}}}:ledger"
    lease, renew, sweep = (
        (DEFAULTS.duration, DEFAULTS.renew_interval, DEFAULTS.sweep_interval)
        if defaults
        else (LEASE, RENEW, SWEEP)
    )
    app, tasks = build_app(namespace, redis_url, shards=shards)
    env = worker_env(
        namespace,
        redis_url,
        ledger,
        lease=lease,
        renew=renew,
        sweep=sweep,
        concurrency=CONCURRENCY,
        shards=shards,
    )
    tenants = _one_tenant_per_shard(app)
    async with app:
        client = app.store.client
        with Fleet(env, tmp_path) as fleet:
            victim, survivor = fleet.start(), fleet.start()
            await wait_ready(app, victim.pid)
            await wait_ready(app, survivor.pid)
            jobs, number = await _enqueue_in_every_shard(tasks, tenants)

            async def progressed() -> bool:
                return int(await client.llen(ledger)) >= JOBS * 3 // 10

            await eventually(progressed, "30% of the jobs to run", timeout=60)
            kill_ms = await server_ms(app)
            Fleet.kill(victim)
            in_flight = await held_by(app, victim.pid)
            snapshot_ms = await server_ms(app)
            # the victim's leases cannot have expired yet, so the snapshot is complete
            assert snapshot_ms - kill_ms < (lease - renew) * 1000
            assert in_flight, "the killed worker held no jobs: the kill tested nothing"
            assert len(in_flight) <= 2 * CONCURRENCY  # running + finished, not yet settled
            replacement = fleet.start()

            async def all_done() -> bool:
                return (await app.stats()).get("completed", 0) >= JOBS

            await eventually(all_done, f"all {JOBS} jobs to complete", timeout=90, step=0.1)
            assert replacement.poll() is None and survivor.poll() is None

        pipe = client.pipeline(transaction=False)
        for job in jobs:
            pipe.hmget(app.store_for_job(job.id).keys.job(job.id), ["st", "att", "fin"])
        records = dict(zip([j.id for j in jobs], await pipe.execute(), strict=True))
        entries = [e.decode() for e in await client.lrange(ledger, 0, -1)]
        stats = await app.stats()
        reclaimed_ms = [
            e.ms
            for i in in_flight
            for e in await app.store_for_job(i).job_events(i)
            if e.kind == "reclaimed"
        ]

    twice = _check_runs(records, entries, stats, {number[i] for i in in_flight}, number)

    assert len(reclaimed_ms) == len(in_flight)
    taken_back = (max(reclaimed_ms) - kill_ms) / 1000
    recovery = (max(int(records[i][2]) for i in in_flight) - kill_ms) / 1000
    bound = LEASE + SWEEP * (1 + SWEEP_JITTER) + SLACK
    print(
        f"\nkill -9 at {JOBS * 3 // 10}+ of {JOBS} jobs ({'defaults' if defaults else 'short'}"
        f" leases): {len(in_flight)} in flight, {len(twice)} run twice, taken back "
        f"{taken_back:.2f}s and done {recovery:.2f}s after the kill"
    )
    if defaults:
        assert taken_back <= DEFAULT_RECOVERY
    else:
        assert recovery <= bound
    if shards > 1:
        assert len({job_shard(i, shards) for i in in_flight}) > 1, (
            "the killed worker held jobs of one shard only: the shards were not all served"
        )


def _check_runs(
    records: dict[str, list[bytes]],
    entries: list[str],
    stats: dict[str, int],
    lost: set[int],
    number: dict[str, int],
) -> set[int]:
    """Every job completed once, but those the dead worker held (``lost``), which ran at
    most twice and were reclaimed once each. Returns the numbers of those run twice."""
    assert {st for st, _, _ in records.values()} == {b"completed"}
    assert stats["completed"] == JOBS
    runs = Counter(int(entry.split(":")[0]) for entry in entries)
    assert set(runs) == set(range(JOBS)), "a job completed without running"
    twice = {n for n, count in runs.items() if count > 1}
    assert max(runs.values()) <= 2
    assert twice <= lost, f"jobs re-run that the dead worker did not hold: {sorted(twice - lost)}"
    assert len(twice) <= CONCURRENCY
    retried = {number[i] for i, (_, att, _) in records.items() if int(att) > 1}
    assert retried == lost, "exactly the dead worker's jobs get a second attempt"
    assert stats.get("reclaimed", 0) == len(lost)
    assert stats.get("fenced", 0) == 0
    return twice


async def _enqueue_in_every_shard(
    tasks: FaultTasks, tenants: list[str]
) -> tuple[list[Job[int]], dict[str, int]]:
    """The jobs, interleaved over the tenants (so every shard is busy), and each one's n."""
    jobs: list[Job[int]] = []
    number: dict[str, int] = {}
    for part, tenant in enumerate(tenants):
        calls = [(n, PAUSE) for n in range(part, JOBS, len(tenants))]
        made = await tasks.record.enqueue_many(calls, tenant=tenant)
        number.update((job.id, n) for job, (n, _) in zip(made, calls, strict=True))
        jobs += made
    return jobs, number


def _one_tenant_per_shard(app: App) -> list[str]:
    names = (f"tenant-{i}" for i in range(10_000))
    found: dict[int, str] = {}
    for name in names:
        found.setdefault(app.shard_of(name), name)
        if len(found) == app.shards:
            return [found[s] for s in range(app.shards)]
    raise AssertionError("no tenant name found for some shard")
