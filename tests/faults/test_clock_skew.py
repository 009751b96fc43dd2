"""A worker whose host clock is an hour off still runs leases, delays, deadlines and
cron ticks on the server's clock.

The worker process runs under libfaketime (``LD_PRELOAD``), which shifts the wall clock
of everything in it -- ``time.time``, ``datetime.now``, the C library -- by an hour
either way; its monotonic clock is left alone, as a host's would be. The test's own
process keeps the true time. Checked, in server time: a job held longer than its lease
is never reclaimed (renewals extend the lease on the server's clock); a delayed job
starts after its delay, not an hour early or late; a job with a deadline completes
rather than expiring, and one still running at its deadline is stopped then, not an
hour early or late; and the cron ticks the skewed worker enqueues are the server's
seconds, one per second.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fairlane.app import App
from fairlane.app.job import Job
from fairlane.errors import JobExpired
from fairlane.store.keys import AppKeys
from tests.faults.skew_app import LEASE, build_app
from tests.faults.worker_proc import ROOT, eventually, server_ms

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.embedded_only]

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
# CI installs it (scripts/test) and sets this: there a missing library fails the test
if os.environ.get("FAIRLANE_REQUIRE_SYSTEM_PACKAGES") == "1":
    assert LIBFAKETIME.exists(), f"FAIRLANE_REQUIRE_SYSTEM_PACKAGES=1 but {LIBFAKETIME} is missing"
SKEW_S = 3600


def _start_skewed_worker(app: App, url: str, skew: str, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRLANE_")}
    path = env.get("PYTHONPATH")
    env.update(
        PYTHONPATH=f"{ROOT}{os.pathsep}{path}" if path else str(ROOT),
        FLT_APP=app.name,
        FLT_URL=url,
        LD_PRELOAD=str(LIBFAKETIME),
        FAKETIME=skew,
        FAKETIME_DONT_FAKE_MONOTONIC="1",
        FAKETIME_NO_CACHE="1",
    )
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.faults.skew_app"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def _fields(app: App, job: Job[object], *names: str) -> list[int]:
    values = await app.store.job_fields(job.id, *names)
    return [int(v) if v is not None else -1 for v in values]


@pytest.mark.skipif(not LIBFAKETIME.exists(), reason="libfaketime is not installed")
@pytest.mark.parametrize("skew", ["+1h", "-1h"])
async def test_a_worker_an_hour_off_keeps_the_servers_time(
    redis_url: str, namespace: str, skew: str, tmp_path: Path
) -> None:
    app = build_app(namespace, redis_url)
    async with app:
        worker = _start_skewed_worker(app, redis_url, skew, tmp_path / "worker.log")
        try:
            stamp = await app.get_task("stamp").enqueue()
            worker_ms = await stamp.result(timeout=30)
            sent_ms = await server_ms(app)
            # the worker really lives an hour off
            assert abs(abs(worker_ms - sent_ms) - SKEW_S * 1000) < 60_000, (worker_ms, sent_ms)

            hold = app.get_task("hold")
            held = await hold.enqueue(3 * LEASE)  # outlives its lease several times over
            delayed = await hold.enqueue(0.0, delay=1.5)
            due = await hold.enqueue(0.0, deadline=20)
            overdue = await hold.enqueue(30.0, deadline=2)
            for job in (held, delayed, due):
                await job.result(timeout=30)
            with pytest.raises(JobExpired):
                await overdue.result(timeout=30)
            ticks_seen_by = await server_ms(app)

            async def some_ticks() -> bool:
                return len(await _cron_ticks(app)) >= 3

            await eventually(some_ticks, "three cron ticks", timeout=15)
            ticks_until = await server_ms(app)
            ticks = await _cron_ticks(app)
        finally:
            worker.terminate()
            await asyncio.to_thread(worker.wait, 15)
            print((tmp_path / "worker.log").read_text(errors="replace")[-3000:])

        # renewed on the server's clock: one attempt, never reclaimed
        assert await _fields(app, held, "att") == [1]
        # the delay was counted by the server: neither at once nor an hour off
        enq, start = await _fields(app, delayed, "enq", "start")
        assert 1500 <= start - enq < 10_000, (enq, start)
        status = await due.status()
        assert status == "completed"
        # stopped at its deadline on the server's clock, within the spec's second
        att, deadline, fin = await _fields(app, overdue, "att", "dl", "fin")
        assert att == 1 and 0 <= fin - deadline < 1000, (deadline, fin)
        # cron ticks are the server's seconds: consecutive, and close to its clock
        assert ticks == list(range(ticks[0], ticks[0] + len(ticks)))
        assert ticks_seen_by // 1000 - 5 <= ticks[0] and ticks[-1] <= ticks_until // 1000 + 1


async def _cron_ticks(app: App) -> list[int]:
    raw = await app.store.client.hgetall(AppKeys.for_app(app.name).idem)
    return sorted(int(k.rsplit(b":", 1)[1]) for k in raw if k.startswith(b"cron:"))
