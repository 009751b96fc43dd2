"""kill -9 of a worker at every step boundary of a workflow: checkpoints make it exactly-once.

A ten-step workflow (``tests.faults.workflow_app``) records each step's side effect in
a ledger keyed by the step's idempotency key, and counts raw invocations apart. One
run per kill point, each killing the worker process that runs it exactly once:

* after step k's checkpoint, for every k in 0..10 (0: before step 1; 10: after the
  last checkpoint, before the run returns);
* inside step k, after its side effect but before its checkpoint, for every k in 1..10.

Worker processes serve one run at a time (concurrency 1), so each kill hits only the
run that asked for it; a dead worker is replaced at once, until every run completes.
A killed run is reclaimed when its 1 s lease expires and replays its checkpoints on
another worker. Afterwards every run has completed with the right result, and its
ledger holds exactly the ten step keys ``run:step-n:1``: for boundary kills each side
effect ran once; for kills before a checkpoint the killed step ran twice, both times
under the same key (two invocations on one ledger key, still ten keys in all).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fairlane.app import App
from fairlane.app.job import Job, JobInfo
from fairlane.store.runs import RunHistory
from tests.faults.worker_proc import Fleet, worker_env
from tests.faults.workflow_app import STEPS, build_app, expected_total, keys_of

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LEASE, RENEW, SWEEP = 1.0, 0.2, 0.3
WORKERS = 4  # processes, one run at a time each
BOUNDARIES = range(STEPS + 1)  # killed right after step k's checkpoint
BEFORE_CHECKPOINT = range(1, STEPS + 1)  # killed inside step k, after its side effect
OVERALL = 90.0  # s: every run completes within this


@dataclass(frozen=True)
class Outcome:
    """What one run left behind: its result, ledgers, kill marker, record and history."""

    result: int
    ledger: dict[str, int]  # step idempotency key -> side effects under it
    calls: dict[int, int]  # step number -> invocations
    marker: str  # where the kill fired, and in which pid
    info: JobInfo
    history: RunHistory


async def _statuses(app: App, ids: list[str]) -> list[str]:
    pipe = app.store.client.pipeline(transaction=False)
    for run_id in ids:
        pipe.hget(app.store.keys.job(run_id), "st")
    return [(st or b"?").decode() for st in await pipe.execute()]


async def _serve_until_done(app: App, ids: list[str], fleet: Fleet, started: float) -> int:
    """Keep ``WORKERS`` worker processes up until every run completes; returns the deaths."""
    live = [fleet.start() for _ in range(WORKERS)]
    deaths = 0
    while True:
        statuses = await _statuses(app, ids)
        if all(st == "completed" for st in statuses):
            return deaths
        assert not {"failed", "expired", "cancelled"} & set(statuses), statuses
        assert time.monotonic() - started < OVERALL, f"runs not done: {statuses}"
        for i, proc in enumerate(live):
            if proc.poll() is not None:  # it killed itself: replace it
                deaths += 1
                live[i] = fleet.start()
        await asyncio.sleep(0.05)


async def _outcome(app: App, prefix: str, job: Job[int]) -> Outcome:
    client = app.store.client
    ledger, calls, marker = keys_of(prefix, job.id)
    return Outcome(
        await job.result(timeout=5),
        {k.decode(): int(v) for k, v in (await client.hgetall(ledger)).items()},
        {int(k): int(v) for k, v in (await client.hgetall(calls)).items()},
        (await client.get(marker) or b"").decode(),
        await job.info(),
        await app.store.runs.history(job.id),
    )


def _check(mode: str, kill_at: int, seed: int, run_id: str, out: Outcome) -> None:
    what = f"run {run_id} ({mode} kill at {kill_at})"
    assert out.result == expected_total(seed), what
    # the kill fired where it was meant to (the marker makes it fire once)
    assert out.marker.rsplit(":", 1)[0] == f"{mode}:{kill_at}", what
    # reclaimed once: the killed slice counts as an attempt, the replay is the second
    assert out.info.attempts == 2, f"{what}: {out.info.attempts} attempts"
    # every step ran under the key of its first attempt, whatever the crashes
    keys = {f"{run_id}:step-{n}:1" for n in range(1, STEPS + 1)}
    ledger, calls = out.ledger, out.calls
    assert set(ledger) == keys, f"{what}: ledger keys {sorted(ledger)}"
    if mode == "boundary":
        # the checkpoint was written before the kill: nothing ran twice
        assert set(ledger.values()) == {1}, f"{what}: {ledger}"
        assert calls == dict.fromkeys(range(1, STEPS + 1), 1), f"{what}: {calls}"
    else:
        # the killed step's effect happened, its checkpoint did not: it ran again,
        # under the same idempotency key, so a consumer keyed by it dedupes
        twice = f"{run_id}:step-{kill_at}:1"
        assert ledger[twice] == 2, f"{what}: {ledger}"
        assert {k: v for k, v in ledger.items() if k != twice} == dict.fromkeys(
            keys - {twice}, 1
        ), what
        assert calls == {n: 2 if n == kill_at else 1 for n in range(1, STEPS + 1)}, what
        assert sum(calls.values()) == STEPS + 1 and len(ledger) == STEPS, what
    # the history: ten step checkpoints in order, split between the dead worker and the next
    history = out.history
    assert [(c.kind, c.name) for c in history.steps] == [
        ("step", f"step-{n}") for n in range(1, STEPS + 1)
    ], what
    before = kill_at if mode == "boundary" else kill_at - 1  # checkpoints of the dead one
    writers = [c.worker for c in history.steps]
    assert len(set(writers[:before])) <= 1 and len(set(writers[before:])) <= 1, what
    if 0 < before < STEPS:
        assert writers[0] != writers[-1], f"{what}: one worker wrote every checkpoint"
    assert sum(e.kind == "slice" for e in history.log) == 2, f"{what}: {history.log}"


async def test_kill_9_at_every_step_boundary(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    prefix = f"{{fl:{namespace}}}:wfkill"
    app, flow = build_app(namespace, redis_url, lease=LEASE, renew=RENEW, sweep=SWEEP)
    env = worker_env(
        namespace, redis_url, prefix, lease=LEASE, renew=RENEW, sweep=SWEEP, concurrency=1
    )
    plan = [("boundary", k) for k in BOUNDARIES] + [("effect", k) for k in BEFORE_CHECKPOINT]
    started = time.monotonic()
    async with app:
        runs = [
            (mode, kill_at, seed, await flow.enqueue(seed, kill_at, mode))
            for seed, (mode, kill_at) in enumerate(plan, start=1)
        ]
        with Fleet(env, tmp_path, "tests.faults.workflow_app") as fleet:
            deaths = await _serve_until_done(app, [job.id for *_, job in runs], fleet, started)
        outcomes = [await _outcome(app, prefix, job) for *_, job in runs]
    elapsed = time.monotonic() - started

    for (mode, kill_at, seed, job), out in zip(runs, outcomes, strict=True):
        _check(mode, kill_at, seed, job.id, out)
    # each run killed its worker once, and nothing else killed one
    assert deaths == len(plan), f"{deaths} worker deaths for {len(plan)} kills"
    print(f"\n{len(plan)} runs, {deaths} kills and worker restarts, {elapsed:.1f}s")
