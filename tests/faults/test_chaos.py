"""Chaos: kill -9 a random worker every second or two while 10,000 jobs run.

Four worker processes (``tests.faults.chaos_app``, 1 s leases, 0.3 s sweeps) serve
10,000 jobs: 9,700 short tasks and 300 three-step workflow runs, interleaved. A
supervisor loop here SIGKILLs a random worker every 1-2 s and starts a replacement
at once, until every job has completed. Right after each kill (well before the dead
worker's leases can expire) it snapshots the jobs the dead worker held.

Afterwards:

* nothing is lost: every job completed, and no worker died that the test did not kill;
* every side effect was applied exactly once per idempotency key (a task's job id,
  a step's key), and every key that was invoked more than once belongs to a job a
  killed worker held: duplicates only for attempts that were lost;
* exactly the jobs the killed workers held were reclaimed (one ``reclaimed`` event
  per job and kill, naming the dead worker), and nothing was fenced;
* recovery: each of those jobs was reclaimed, and leased again, within the lease plus
  a sweep interval (plus slack for a loaded machine) of the kill.

It runs on the single server with one shard, and on the local 3-master cluster with
three shards, their tenants spread over them: every worker serves every shard, and
each shard on its own primary reclaims what a killed worker held.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from fairlane.app import App
from fairlane.app.task import Task
from fairlane.app.workflows import Workflow
from fairlane.store.keys import job_shard
from fairlane.store.records import Event
from tests.faults.chaos_app import FLOW_STEPS, build_app, keys_of
from tests.faults.worker_proc import Fleet, held_by, server_ms, wait_ready, worker_env

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.embedded_only]

TASKS, FLOWS = 9_700, 300
CHUNKS = 10  # enqueued interleaved: each chunk holds tasks and runs
WORKERS, CONCURRENCY = 4, 10
PAUSE = 0.05  # s of work per task or step: long enough for kills to catch jobs running
LEASE, RENEW, SWEEP = 1.0, 0.2, 0.3  # chaos_app sets sweep_jitter 0
KILL_EVERY = (1.0, 2.0)  # s between kills, uniform
SLACK = 2.0  # s: a loaded 2-core machine, a replacement starting
OVERALL = 100.0  # s: every job completes within this
MIN_KILLS = 5


@dataclass(frozen=True)
class Kill:
    pid: int
    ms: int  # server time just after the process was reaped
    held: frozenset[str]  # jobs whose lease the dead worker held


async def _supervise(app: App, fleet: Fleet, total: int, rng: random.Random) -> list[Kill]:
    """Keep ``WORKERS`` workers up, killing a random one every ``KILL_EVERY`` s, until done."""
    live = [fleet.start() for _ in range(WORKERS)]
    for proc in live:
        await wait_ready(app, proc.pid)
    kills: list[Kill] = []
    started = time.monotonic()
    next_kill = started + rng.uniform(*KILL_EVERY)
    while True:
        stats = await app.stats()
        assert not stats.get("failed"), f"a job failed: {stats}"
        if stats.get("completed", 0) >= total:
            return kills
        assert time.monotonic() - started < OVERALL, f"jobs not done: {stats}"
        for proc in live:
            assert proc.poll() is None, f"worker {proc.pid} died unkilled ({proc.returncode})"
        if time.monotonic() >= next_kill:
            i = rng.randrange(len(live))
            victim = live[i]
            Fleet.kill(victim)
            kill_ms = await server_ms(app)
            held = await held_by(app, victim.pid)
            # the dead worker's leases cannot have expired yet: the snapshot is whole
            assert await server_ms(app) - kill_ms < (LEASE - RENEW) * 1000
            kills.append(Kill(victim.pid, kill_ms, frozenset(held)))
            live[i] = fleet.start()
            next_kill = time.monotonic() + rng.uniform(*KILL_EVERY)
        await asyncio.sleep(0.05)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _reclaims(events: list[Event]) -> list[Event]:
    return [e for e in events if e.kind == "reclaimed"]


def _first_start_after(ms: int, events: list[Event], record_start: int | None) -> int | None:
    starts = [int(e.detail["start"]) for e in events if e.detail.get("start") is not None]
    if record_start is not None:
        starts.append(record_start)
    later = [s for s in starts if s >= ms]
    return min(later) if later else None


async def _enqueue_mixed(
    task: Task[[int, float], int], flow: Workflow[[int, float], int], tasks: int, flows: int
) -> tuple[list[str], list[str]]:
    """Enqueue the tasks and the runs interleaved, in ``CHUNKS`` rounds, each round as
    another tenant (so that several shards get work); their ids."""
    task_ids: list[str] = []
    run_ids: list[str] = []
    for c in range(CHUNKS):
        tenant = f"tenant-{c}"
        lo, hi = c * tasks // CHUNKS, (c + 1) * tasks // CHUNKS
        calls = [(n, PAUSE) for n in range(lo, hi)]
        task_ids += [j.id for j in await task.enqueue_many(calls, tenant=tenant)]
        lo, hi = c * flows // CHUNKS, (c + 1) * flows // CHUNKS
        calls = [(n, PAUSE) for n in range(lo, hi)]
        run_ids += [j.id for j in await flow.enqueue_many(calls, tenant=tenant)]
    return task_ids, run_ids


def _worst_recovery(
    kills: list[Kill],
    reclaimed: dict[str, list[Event]],
    events: dict[str, list[Event]],
    starts: dict[str, int | None],
) -> tuple[int, int]:
    """The longest time (ms) from a kill to the reclaim of a job the dead worker held,
    and to that job's next lease (the start of its next attempt)."""
    worst_reclaim = worst_restart = 0
    for kill in kills:
        for job_id in kill.held:
            event = next(
                e
                for e in reclaimed[job_id]
                if e.ms >= kill.ms and f":{kill.pid}:" in str(e.detail.get("wk"))
            )
            restart = _first_start_after(event.ms, events[job_id], starts[job_id])
            assert restart is not None, f"{job_id} was never leased again"
            worst_reclaim = max(worst_reclaim, event.ms - kill.ms)
            worst_restart = max(worst_restart, restart - kill.ms)
    return worst_reclaim, worst_restart


async def test_kill_9_random_workers_during_10000_jobs(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    await _chaos(redis_url, namespace, tmp_path, shards=1, tasks=TASKS, flows=FLOWS)


@pytest.mark.cluster_only
async def test_kill_9_random_workers_serving_three_shards_on_a_cluster(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    await _chaos(redis_url, namespace, tmp_path, shards=3, tasks=TASKS, flows=FLOWS)


async def _chaos(
    redis_url: str, namespace: str, tmp_path: Path, *, shards: int, tasks: int, flows: int
) -> None:
    prefix = f"{{fl:{namespace}}}:chaos"
    app, task, flow = build_app(
        namespace, redis_url, lease=LEASE, renew=RENEW, sweep=SWEEP, shards=shards
    )
    env = worker_env(
        namespace,
        redis_url,
        prefix,
        lease=LEASE,
        renew=RENEW,
        sweep=SWEEP,
        concurrency=CONCURRENCY,
        shards=shards,
    )
    rng = random.Random(8)
    began = time.monotonic()
    async with app:
        client = app.store.client
        task_ids, run_ids = await _enqueue_mixed(task, flow, tasks, flows)
        ids = task_ids + run_ids
        with Fleet(env, tmp_path, "tests.faults.chaos_app") as fleet:
            kills = await _supervise(app, fleet, len(ids), rng)
        elapsed = time.monotonic() - began

        pipe = client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(app.store_for_job(job_id).keys.job(job_id), ["st", "start", "res"])
        records = dict(zip(ids, await pipe.execute(), strict=True))
        ledger_key, calls_key = keys_of(prefix)
        ledger = {_text(k) for k in await client.hkeys(ledger_key)}
        calls = {_text(k): int(v) for k, v in (await client.hgetall(calls_key)).items()}
        lost = set().union(*(k.held for k in kills)) if kills else set()
        events = {job_id: await app.store_for_job(job_id).job_events(job_id) for job_id in ids}
        stats = await app.stats()

    # nothing lost: every job completed; the workflows with the right result
    statuses = Counter(st.decode() for st, _, _ in records.values())
    assert statuses == {"completed": len(ids)}, statuses
    for n, run_id in enumerate(run_ids):
        assert int(records[run_id][2]) == n * sum(range(1, FLOW_STEPS + 1)), run_id
    if shards > 1:
        served = {job_shard(job_id, shards) for job_id in ids}
        assert served == set(range(shards)), f"work in shards {served} only"
        held = {job_shard(job_id, shards) for k in kills for job_id in k.held}
        assert len(held) > 1, "the killed workers held jobs of one shard only"
    assert len(kills) >= MIN_KILLS, f"only {len(kills)} kills: the chaos tested little"
    assert lost, "no killed worker held a job: the kills tested nothing"

    # exactly once per idempotency key; more invocations only where an attempt was lost
    step_keys = {f"{r}:step-{i}:1" for r in run_ids for i in range(1, FLOW_STEPS + 1)}
    assert ledger == set(task_ids) | step_keys
    assert set(calls) == ledger
    repeated = {key for key, n in calls.items() if n > 1}
    owners = {key: key.split(":step-")[0] for key in repeated}
    assert set(owners.values()) <= lost, "a side effect ran twice for a job no kill hit"

    # exactly the jobs the dead held were reclaimed, each once per kill, naming the dead
    reclaimed = {job_id: _reclaims(ev) for job_id, ev in events.items() if _reclaims(ev)}
    assert set(reclaimed) == lost
    times_lost = Counter(job_id for k in kills for job_id in k.held)
    assert {j: len(r) for j, r in reclaimed.items()} == dict(times_lost)
    assert stats.get("reclaimed") == sum(times_lost.values())
    assert stats.get("fenced", 0) == 0

    # recovery: reclaimed, and leased again, within a lease and a sweep of the kill
    bound_ms = (LEASE + SWEEP + SLACK) * 1000
    starts = {job_id: int(records[job_id][1] or 0) or None for job_id in reclaimed}
    worst_reclaim, worst_restart = _worst_recovery(kills, reclaimed, events, starts)
    print(
        f"\n{shards} shard(s): {len(ids):,} jobs ({len(run_ids)} workflow runs) in {elapsed:.1f}s; "
        f"{len(kills)} kills, {sum(times_lost.values())} leases lost, "
        f"{len(repeated)} effects invoked twice (each applied once); worst recovery: "
        f"reclaimed {worst_reclaim} ms, leased again {worst_restart} ms after the kill "
        f"(bound {bound_ms:.0f} ms)"
    )
    assert worst_reclaim <= bound_ms
    assert worst_restart <= bound_ms
