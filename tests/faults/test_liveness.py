"""A worker's liveness: a slow event loop neither fakes it nor loses it.

Real worker processes with the default lease settings (1 s beats, a worker silent 3 s
is dead, 30 s leases), each task noting in a ledger where it ran:

1. A worker whose event loop a task blocks for 10 s (``time.sleep`` in an async task),
   next to a second worker, keeps its jobs: none runs twice, the blocking job completes
   on its first attempt, nothing is reclaimed, fenced or dead-lettered; its beats go on
   all through the block (they are sent from a thread).
2. A worker frozen (SIGSTOP) for 8 s is dead: the other worker takes its jobs back,
   never before the worker timeout of silence and within the 5 s of a dead worker
   (``tests/faults/test_kill.py`` holds kill -9 to it); thawed (SIGCONT), every result
   its stale attempts send is fenced and none is applied.
3. ``/health`` answers 503 while a task blocks the worker's loop, and 200 once it is
   free again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from fairlane import App
from fairlane.config.sections import LeaseSettings
from tests.faults.worker_proc import (
    Fleet,
    build_app,
    eventually,
    go_key,
    held_by,
    server_ms,
    wait_ready,
    worker_env,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

DEFAULTS = LeaseSettings()
#: with the defaults, a dead worker's jobs are taken back within this of its death
DEFAULT_RECOVERY = 5.0
STALL = 10.0  # s the blocked worker's loop is blocked
FREEZE = 8.0  # s the frozen worker is stopped


def _env(namespace: str, url: str, ledger: str, **options: int) -> dict[str, str]:
    lease = DEFAULTS
    return worker_env(
        namespace,
        url,
        ledger,
        lease=lease.duration,
        renew=lease.renew_interval,
        sweep=lease.sweep_interval,
        **options,
    )


async def _ledger(app: App, ledger: str) -> list[str]:
    return [e.decode() for e in await app.store.client.lrange(ledger, 0, -1)]


async def _worker_id(app: App, pid: int) -> str:
    """The id of the worker process ``pid``, once it has beaten."""

    async def beaten() -> str | None:
        members = await app.store.client.zrange(app.store.keys.beats, 0, -1)
        ids = [m.decode() for m in members if f":{pid}:".encode() in m]
        return ids[0] if ids else None

    return await eventually(beaten, f"worker {pid} to beat", timeout=30)


async def test_a_blocked_loop_keeps_its_jobs_next_to_another_worker(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    ledger = f"{{fl:{namespace}}}:ledger"
    app, tasks = build_app(namespace, redis_url)
    async with app:
        client, beats = app.store.client, app.store.keys.beats
        with Fleet(_env(namespace, redis_url, ledger, concurrency=8), tmp_path) as fleet:
            blocked = fleet.start()
            await wait_ready(app, blocked.pid)
            # seven side-effecting jobs running on it, and the one that blocks its loop
            side = await tasks.armed.enqueue_many([(STALL + 2, f"side{n}") for n in range(7)])
            stall = await tasks.stall.enqueue(STALL, "stall")
            ids = {job.id for job in side} | {stall.id}

            async def all_started() -> bool:
                return len(await _ledger(app, ledger)) == len(ids)

            await eventually(all_started, "every job to start", timeout=30)
            assert await held_by(app, blocked.pid) == ids
            other = fleet.start()
            await wait_ready(app, other.pid)
            await _worker_id(app, other.pid)  # the other worker beats, and would judge
            blocked_id = await _worker_id(app, blocked.pid)
            await client.set(go_key(ledger), 1)

            async def blocking() -> bool:
                return f"stall-blocking:{blocked.pid}" in await _ledger(app, ledger)

            await eventually(blocking, "the loop to block", timeout=30)
            # the blocked worker's beats, seen while its loop is blocked
            seen: list[float] = []
            while f"stall-free:{blocked.pid}" not in await _ledger(app, ledger):
                score = await client.zscore(beats, blocked_id)
                if score is not None:
                    seen.append(score)
                await asyncio.sleep(0.25)
            everything = [*side, stall]

            async def finished() -> bool:
                done = {"completed", "failed"}
                return all([await job.status() in done for job in everything])

            await eventually(finished, "every job to finish", timeout=60, step=0.1)
            results = [
                await job.result(timeout=5) if await job.status() == "completed" else None
                for job in everything
            ]
            assert other.poll() is None and blocked.poll() is None

        entries = await _ledger(app, ledger)
        record = {job.id: await app.store.job_record(job.id) for job in everything}
        stats = await app.stats()
        dead = await app.dead_letters()

    runs = Counter(e.split(":")[0] for e in entries if "-" not in e.split(":")[0])
    twice = sorted(tag for tag, n in runs.items() if n > 1)
    print(
        f"\nloop blocked {STALL:.0f}s next to another worker (defaults): "
        f"{len(twice)} of {len(runs)} jobs run twice, {len(dead)} dead-lettered, "
        f"reclaimed {stats.get('reclaimed', 0)}, fenced {stats.get('fenced', 0)}; "
        f"{len(set(seen))} beats of the blocked worker seen during the block"
    )
    assert len(set(seen)) > 1, "the blocked worker's beats stopped while its loop was blocked"
    assert twice == [] and set(runs) == {f"side{n}" for n in range(7)} | {"stall"}
    assert dead == []
    assert (record[stall.id]["st"], int(record[stall.id]["att"])) == (b"completed", 1)
    assert results == [blocked.pid] * len(everything), "every job completed where it first ran"
    assert all(int(r["att"]) == 1 for r in record.values()), "a job took a second attempt"
    assert {r["st"] for r in record.values()} == {b"completed"}
    assert stats.get("reclaimed", 0) == 0 and stats.get("fenced", 0) == 0


async def test_a_frozen_worker_is_taken_for_dead_and_fenced_when_it_thaws(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    ledger = f"{{fl:{namespace}}}:ledger"
    app, tasks = build_app(namespace, redis_url)
    async with app:
        client, store = app.store.client, app.store
        with Fleet(_env(namespace, redis_url, ledger, concurrency=8), tmp_path) as fleet:
            frozen = fleet.start()
            await wait_ready(app, frozen.pid)
            # each ends 2 s after the go: inside the freeze, so that the thawed attempt
            # ends at once and sends its result before a renewal tells it the lease is gone
            jobs = await tasks.armed.enqueue_many([(2.0, f"f{n}") for n in range(4)])
            ids = {job.id for job in jobs}

            async def all_started() -> bool:
                return len(await _ledger(app, ledger)) == len(ids)

            await eventually(all_started, "every job to start", timeout=30)
            assert await held_by(app, frozen.pid) == ids
            rescuer = fleet.start()
            await wait_ready(app, rescuer.pid)
            frozen_id = await _worker_id(app, frozen.pid)
            await client.set(go_key(ledger), 1)

            async def all_armed() -> bool:
                armed = [e for e in await _ledger(app, ledger) if "-armed:" in e]
                return len(armed) == len(ids)

            await eventually(all_armed, "every attempt to see the go", timeout=30)
            stop_ms = await server_ms(app)
            os.kill(frozen.pid, signal.SIGSTOP)
            try:
                last_beat = await client.zscore(store.keys.beats, frozen_id)
                assert last_beat is not None

                async def all_reclaimed() -> bool:
                    return (await app.stats()).get("reclaimed", 0) == len(ids)

                await eventually(all_reclaimed, "the frozen worker's jobs", timeout=FREEZE)
                assert (await app.stats()).get("fenced", 0) == 0
                await asyncio.sleep(max(0.0, stop_ms / 1000 + FREEZE - await server_ms(app) / 1000))
            finally:
                os.kill(frozen.pid, signal.SIGCONT)

            async def fenced() -> bool:
                return (await app.stats()).get("fenced", 0) == len(ids)

            await eventually(fenced, "every late result to be fenced", timeout=30)
            results = [await job.result(timeout=60) for job in jobs]
            assert frozen.poll() is None, "the thawed worker must survive its lost leases"

        reclaimed_ms = [
            e.ms for i in ids for e in await store.job_events(i) if e.kind == "reclaimed"
        ]
        records = [await store.job_record(i) for i in ids]
        stats = await app.stats()
        starts = Counter(e for e in await _ledger(app, ledger) if "-armed" not in e)

    taken_back = (max(reclaimed_ms) - stop_ms) / 1000
    print(
        f"\nSIGSTOP {FREEZE:.0f}s (defaults): {len(ids)} jobs taken back {taken_back:.2f}s "
        f"after the stop ({(min(reclaimed_ms) - last_beat) / 1000:.2f}s after its last beat); "
        f"after SIGCONT fenced {stats.get('fenced', 0)}, completed {stats.get('completed', 0)}"
    )
    assert len(reclaimed_ms) == len(ids), "each job taken back once"
    assert min(reclaimed_ms) - last_beat >= DEFAULTS.worker_timeout * 1000
    assert taken_back <= DEFAULT_RECOVERY
    assert results == [rescuer.pid] * len(ids), "a stale result was applied"
    assert all(int(r["att"]) == 2 for r in records)
    assert {r["st"] for r in records} == {b"completed"}
    expected = {f"f{n}:{pid}" for n in range(len(ids)) for pid in (frozen.pid, rescuer.pid)}
    assert set(starts) == expected and set(starts.values()) == {1}
    assert stats.get("fenced") == len(ids) and stats.get("completed") == len(ids)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:  # not serving yet
        return 0


async def test_health_fails_while_the_loop_is_blocked_and_recovers(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    ledger = f"{{fl:{namespace}}}:ledger"
    port = _free_port()
    app, tasks = build_app(namespace, redis_url)
    async with app:
        env = _env(namespace, redis_url, ledger, concurrency=2, health_port=port)
        with Fleet(env, tmp_path) as fleet:
            worker = fleet.start()
            await wait_ready(app, worker.pid)
            seen: list[int] = []

            async def status(code: int) -> bool:
                got = await asyncio.to_thread(_health, port)
                if not seen or seen[-1] != got:
                    seen.append(got)
                return got == code

            await eventually(lambda: status(200), "a healthy worker", timeout=30, step=0.1)
            await app.store.client.set(go_key(ledger), 1)
            job = await tasks.stall.enqueue(5.0, "stall")
            await eventually(lambda: status(503), "/health to fail", timeout=30, step=0.1)
            await eventually(lambda: status(200), "/health to recover", timeout=30, step=0.1)
            assert await job.result(timeout=30) == worker.pid
        record = await app.store.job_record(job.id)
    assert seen[-3:] == [200, 503, 200]
    assert int(record["att"]) == 1
