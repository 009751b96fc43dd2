"""A poison job -- one that kills whichever worker runs it -- ends in the dead-letter set.

Each time a worker dies the test starts another (as a supervisor would), which takes the
job back from the dead one: its sweep once the lease has expired, or its beat once the
dead worker has been silent for ``worker_timeout``, whichever comes first (a replacement
that starts late finds both true and its beat thread speaks first). Either counts as an
attempt. With attempts=3 the job kills three workers and the fourth dead-letters it, with
LeaseExpired or WorkerLost as the last attempt's error, instead of the fleet
crash-looping forever.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from fairlane.errors import TaskFailed
from tests.faults.worker_proc import Fleet, build_app, worker_env

pytestmark = pytest.mark.anyio

ATTEMPTS = 3


async def test_poison_job_is_dead_lettered_after_its_attempts(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    ledger = f"{{fl:{namespace}}}:ledger"
    app, tasks = build_app(namespace, redis_url)
    assert tasks.suicide.options.attempts == ATTEMPTS
    env = worker_env(namespace, redis_url, ledger, lease=1.5, renew=0.3, sweep=0.5)
    async with app:
        job = await tasks.suicide.enqueue()
        deaths = 0
        with Fleet(env, tmp_path) as fleet:
            worker = fleet.start()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 90
            while await job.status() not in ("failed", "completed"):
                assert loop.time() < deadline, f"the poison job is still {await job.status()}"
                if worker.poll() is not None:
                    assert worker.returncode == -signal.SIGKILL
                    deaths += 1
                    assert deaths <= ATTEMPTS, "the poison job keeps killing workers"
                    worker = fleet.start()
                await asyncio.sleep(0.05)
            survivor_alive = worker.poll() is None

        with pytest.raises(TaskFailed) as failure:
            await job.result(timeout=5)
        info = await job.info()
        dead = [job_id for job_id, _ in await app.dead_letters()]
        runs = await app.store.client.llen(ledger)
        stats = await app.stats()

    assert deaths == ATTEMPTS
    assert survivor_alive, "the worker that dead-lettered the job must be alive"
    assert failure.value.type_name in ("LeaseExpired", "WorkerLost")
    assert f"attempt {ATTEMPTS}" in failure.value.message
    assert info.status == "failed" and info.attempts == ATTEMPTS
    assert dead == [job.id]
    assert runs == ATTEMPTS
    assert stats.get("reclaimed") == ATTEMPTS
    assert stats.get("failed") == 1 and stats.get("retried") == ATTEMPTS - 1
