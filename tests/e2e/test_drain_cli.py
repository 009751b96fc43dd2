"""``fairlane drain APP``, against a real server: it counts, asks, cancels, reports; a
drain stopped half-way is finished by the same command run again; input the app does
not have is refused (exit 2) with nothing changed.

The app module and the helpers are those of ``test_cli.py``.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import ModuleType

import anyio
import pytest
import redis.asyncio as aioredis

from fairlane.store.keys import AppKeys
from tests.e2e import test_cli
from tests.e2e.test_cli import (
    WAIT,
    ainvoke,
    fairlane_process,
    run_fairlane,
    spec,
    status_of,
    wait_exit,
)

pytestmark = pytest.mark.anyio

# the fixtures of test_cli.py, by the names the tests take
project = test_cli.project
client = test_cli.client


async def _statuses(client: aioredis.Redis, namespace: str, ids: list[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for job_id in ids:
        status = await status_of(client, namespace, job_id) or "-"
        found[status] = found.get(status, 0) + 1
    return found


async def test_drain_counts_asks_then_cancels(
    project: ModuleType, redis_url: str, namespace: str, client: aioredis.Redis
) -> None:
    async with project.app:
        drained = [
            j.id for j in await project.add.enqueue_many([(i, i) for i in range(300)], tenant="a")
        ]
        kept = [
            j.id for j in await project.add.enqueue_many([(i, i) for i in range(40)], tenant="b")
        ]
    base = ["drain", spec(project), "--tenant", "a", "--redis-url", redis_url]
    counted = await ainvoke([*base, "--dry-run"])
    assert counted.exit_code == 0, counted.output
    assert "300 waiting job(s)" in counted.output and "tenant=a" in counted.output
    by_state = await ainvoke([*base, "--dry-run", "--state", "scheduled,deferred"])
    assert "0 waiting job(s)" in by_state.output, by_state.output
    assert "state=scheduled,deferred" in by_state.output
    declined = await ainvoke(base, input="n\n")
    assert declined.exit_code != 0 and "Aborted" in declined.output
    assert await _statuses(client, namespace, drained) == {"queued": 300}

    done = await ainvoke(base, input="y\n")
    assert done.exit_code == 0, done.output
    assert "cancelled 300 job(s)" in done.output
    assert await _statuses(client, namespace, drained) == {"cancelled": 300}
    assert await _statuses(client, namespace, kept) == {"queued": 40}
    again = await ainvoke([*base, "--yes"])
    assert again.exit_code == 0 and "nothing to drain" in again.output
    async with project.app:
        entries = await project.app.store.key_records.audit.read(10, action="drain")
    assert [e.outcome for e in entries] == ["done", "started"]
    assert entries[0].key_id.startswith("cli") and entries[0].tenant == "a"


async def test_drain_refuses_what_the_app_does_not_have(
    project: ModuleType, redis_url: str, namespace: str, client: aioredis.Redis
) -> None:
    async with project.app:
        jobs = [j.id for j in await project.add.enqueue_many([(1, 2)] * 5, tenant="a")]
    base = ["drain", spec(project), "--yes", "--redis-url", redis_url]
    for extra, message in (
        (["--task", "nope"], "no task named 'nope'"),
        (["--lane", "nope"], "no lane 'nope'"),
        (["--class", "nope"], "no class 'nope'"),
        (["--state", "running"], "waiting jobs only"),
        (["--enqueued-before", "soon"], "--enqueued-before takes"),
    ):
        refused = await ainvoke([*base, *extra])
        assert refused.exit_code == 2, refused.output
        assert message in refused.output, refused.output
    assert await _statuses(client, namespace, jobs) == {"queued": 5}


async def test_a_drain_stopped_half_way_is_finished_by_running_it_again(
    project: ModuleType, redis_url: str, namespace: str, tmp_path: Path, client: aioredis.Redis
) -> None:
    jobs = 10_000
    async with project.app:
        for _ in range(jobs // 5000):
            await project.add.enqueue_many([(1, 2)] * 5000, tenant="a")
    stats = AppKeys.for_app(namespace).stats
    args = ["drain", spec(project), "--tenant", "a", "--yes", "--redis-url", redis_url]
    with fairlane_process(args, tmp_path, tmp_path / "drain.log", interruptible=True) as proc:
        deadline = time.monotonic() + WAIT
        while int(await client.hget(stats, "cancelled") or 0) == 0:
            assert proc.poll() is None and time.monotonic() < deadline
            await anyio.sleep(0.005)
        proc.send_signal(signal.SIGINT)
        assert await wait_exit(proc) == 130
    log = (tmp_path / "drain.log").read_text()
    assert "run the same command again to finish" in log, log
    stopped = int(await client.hget(stats, "cancelled") or 0)
    assert 0 < stopped < jobs
    finished = await anyio.to_thread.run_sync(lambda: run_fairlane(args, tmp_path))
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert f"{jobs - stopped} waiting job(s)" in finished.stdout
    assert f"cancelled {jobs - stopped} job(s)" in finished.stdout
    assert int(await client.hget(stats, "cancelled") or 0) == jobs
