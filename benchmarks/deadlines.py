"""A burst of jobs with deadlines a lane cannot meet, on a private server.

``python -m benchmarks.deadlines`` runs one in-process worker of ``--slots`` slots.
It first runs 40 jobs so the worker learns their length (``--length`` s, +-10 %),
then submits ``--burst`` jobs at once, each with a deadline ``--deadline`` s after
its submission: far more than the slots can finish in time. Every submission is
estimated first (``fairlane.policy.startpredict``); those not expected to finish by
their deadline are refused (``deadline_unmeetable``), the others are taken, and dispatch
expires a taken job whose learned length no longer fits before its deadline when its
turn comes; a running attempt still running at its deadline is stopped there.

Printed, as counts: refused at submit, taken, expired before they started, started,
started and finished by their deadline, started and missed it (stopped at the deadline,
or finished after it), and for the jobs that finished, how close to the deadline the
latest one finished. The submissions are concurrent, so their estimates race: jobs
estimated at the same moment all see the same queue, and those taken beyond what fits
are the ones dispatch expires.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import secrets
import sys
from datetime import timedelta
from typing import Any

from fairlane import App
from fairlane.app.worker import Worker
from fairlane.config.settings import load_settings
from fairlane.errors import FairlaneError
from fairlane.testing import RedisServer

__all__ = ["main"]


async def _run(url: str, slots: int, length: float, burst: int, deadline: float) -> dict[str, Any]:
    settings = load_settings(worker={"concurrency": slots, "idle_block": 0.2})
    app = App(f"dl_{secrets.token_hex(3)}", redis_url=url, settings=settings)
    rng = random.Random(3)

    @app.task(name="dl.work", attempts=3)
    async def work(seconds: float) -> None:
        await asyncio.sleep(seconds)

    async with app:
        worker = Worker(app, lanes=["default"], concurrency=slots)
        async with asyncio.TaskGroup() as group:
            group.create_task(worker.run())
            learn = await work.enqueue_many([(length,)] * 40, tenant="t")
            for job in learn:
                await job.result(timeout=60)
            await worker.durations.send()
            answers = await asyncio.gather(
                *(
                    work.submit(
                        length * rng.uniform(0.9, 1.1),
                        tenant="t",
                        deadline=timedelta(seconds=deadline),
                    )
                    for _ in range(burst)
                )
            )
            taken = [a.job for a in answers if a.job is not None]
            for job in taken:
                with contextlib.suppress(FairlaneError):  # expired jobs raise
                    await job.result(timeout=deadline + 30)
            infos = [await job.info() for job in taken]
            worker.stop()
        await app.purge()
    refused = sum(a.reason == "deadline_unmeetable" for a in answers)
    started = [i for i in infos if i.attempts > 0]
    on_time = [
        i
        for i in started
        if i.status == "completed" and i.finished_at and i.deadline and i.finished_at <= i.deadline
    ]
    late = [i for i in started if i not in on_time]
    margins = [
        (i.deadline - i.finished_at).total_seconds()
        for i in on_time
        if i.deadline and i.finished_at
    ]
    return {
        "burst": burst,
        "slots": slots,
        "length_s": length,
        "deadline_s": deadline,
        "refused_at_submit": refused,
        "taken": len(taken),
        "expired_before_start": sum(i.status == "expired" and i.attempts == 0 for i in infos),
        "started": len(started),
        "started_met_deadline": len(on_time),
        "started_missed_deadline": len(late),
        "missed": [{"status": i.status, "error": i.error} for i in late][:5],
        "closest_finish_before_deadline_s": round(min(margins), 3) if margins else None,
        "other_answers": sorted(
            {a.reason or a.status for a in answers if a.reason != "deadline_unmeetable"}
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.deadlines")
    parser.add_argument("--url", help="a server to use (default: a private one)")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--length", type=float, default=0.2)
    parser.add_argument("--burst", type=int, default=400)
    parser.add_argument("--deadline", type=float, default=2.0)
    args = parser.parse_args(argv)

    def run(url: str) -> dict[str, Any]:
        return asyncio.run(_run(url, args.slots, args.length, args.burst, args.deadline))

    if args.url:
        out = run(args.url)
    else:
        with RedisServer() as server:
            out = run(server.url)
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
