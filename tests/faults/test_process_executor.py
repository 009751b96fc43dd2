"""Process-executor tasks that crash or hang fail their own attempts, never the worker.

One worker process runs ``executor="process"`` tasks that segfault, that call
``os._exit(1)``, and that sleep past their timeout. Each fails every attempt (two) and
ends dead-lettered with ChildCrashed or TimeoutError; the worker process keeps its pid
and afterwards still completes an ordinary job and a process-pool job.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fairlane.errors import TaskFailed
from tests.faults.worker_proc import Fleet, build_app, wait_ready, worker_env

pytestmark = pytest.mark.anyio


async def test_crashing_children_fail_only_their_attempts(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    ledger = f"{{fl:{namespace}}}:ledger"
    app, tasks = build_app(namespace, redis_url, processes=2)
    assert tasks.segfault and tasks.hard_exit and tasks.nap and tasks.square
    env = worker_env(namespace, redis_url, ledger, concurrency=4, processes=2)
    async with app:
        with Fleet(env, tmp_path) as fleet:
            worker = fleet.start()
            await wait_ready(app, worker.pid)
            bad = {
                "ChildCrashed (segfault)": await tasks.segfault.enqueue(),
                "ChildCrashed (os._exit)": await tasks.hard_exit.enqueue(),
                "TimeoutError": await tasks.nap.enqueue(30.0),
            }
            failures: dict[str, TaskFailed] = {}
            for label, job in bad.items():
                with pytest.raises(TaskFailed) as failure:
                    await job.result(timeout=60)
                failures[label] = failure.value
            assert worker.poll() is None, "a crashing child took the worker down"
            # the same worker process still serves both kinds of job
            pid = await (await tasks.whoami.enqueue()).result(timeout=30)
            square = await (await tasks.square.enqueue(12)).result(timeout=30)
            assert worker.poll() is None
        infos = {label: await job.info() for label, job in bad.items()}
        dead = {job_id for job_id, _ in await app.dead_letters()}

    assert pid == worker.pid
    assert square == 144
    for label, failure in failures.items():
        assert failure.type_name == label.split()[0], (label, failure)
        assert infos[label].status == "failed" and infos[label].attempts == 2, infos[label]
    assert dead == {job.id for job in bad.values()}
    assert "exit code -11" in failures["ChildCrashed (segfault)"].message
    assert "exit code 1" in failures["ChildCrashed (os._exit)"].message
