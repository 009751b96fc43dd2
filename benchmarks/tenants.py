"""Dispatch throughput against the number of active tenants.

``jobs`` no-op jobs are spread evenly over ``T`` tenants (at least one job each), then
one worker process at ``concurrency`` drains them; reported as jobs/s per ``T`` and as
a ratio to the single-tenant run. Fair dispatch is O(log T) per job: the ratio shows
what many tenants cost.

Run: ``python -m benchmarks.tenants [--redis-url URL] [--tenants 1,100,10000,100000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from benchmarks.common import Meter, WorkerProcess, delete_matching, wait_until
from benchmarks.fairlane_worker import make_app
from fairlane.runtime.loop import run as run_loop
from fairlane.store.keys import AppKeys

WORKER = "benchmarks.fairlane_worker"
DEFAULT_URL = "redis://127.0.0.1:6379/0"


ENQUEUE_BATCH = 1_000


async def drain_rate(url: str, tenants: int, jobs: int, concurrency: int) -> dict[str, Any]:
    """Jobs/s for one worker draining ``jobs`` spread over ``tenants`` tenants."""
    name = f"fltenants_{os.getpid()}_{tenants}"
    bench = make_app(name, url)
    meter = Meter(url)
    keys = AppKeys.for_app(name)
    total = max(jobs, tenants)
    try:
        async with bench.app:
            per, extra = divmod(total, tenants)
            # calls of at most ENQUEUE_BATCH jobs: dozens in flight of many more would keep
            # the server busier than a client waits for one reply
            calls = [
                bench.noop.enqueue_many(
                    [(i,) for i in range(start, min(n, start + ENQUEUE_BATCH))], tenant=f"t{t}"
                )
                for t in range(tenants)
                for n in (per + (t < extra),)
                for start in range(0, n, ENQUEUE_BATCH)
            ]
            for chunk in range(0, len(calls), 48):  # a tenant per call: many calls in flight
                await asyncio.gather(*calls[chunk : chunk + 48])
        args = ["--url", url, "--app", name, "--concurrency", str(concurrency)]
        worker = WorkerProcess(WORKER, args)
        try:
            started = await worker.start()

            async def done() -> bool:
                with meter.own():
                    raw = await meter.client.hget(keys.stats, "completed")
                return int(raw or 0) >= total

            finished = await wait_until(done, timeout=600, interval=0.005)
            await worker.stop()
        finally:
            await worker.close()
    finally:
        with meter.own():
            await delete_matching(meter.client, f"{keys.prefix}*")
        await meter.aclose()
    seconds = finished - started
    return {"tenants": tenants, "jobs": total, "seconds": seconds, "jobs_per_s": total / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=DEFAULT_URL)
    parser.add_argument("--tenants", default="1,100,10000,100000")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    args = parser.parse_args()
    results = []
    for tenants in (int(t) for t in args.tenants.split(",")):
        result = run_loop(drain_rate(args.redis_url, tenants, args.jobs, args.concurrency))
        results.append(result)
        base = results[0]["jobs_per_s"]
        print(
            f"{tenants:>7} tenants: {result['jobs']:>7} jobs, {result['jobs_per_s']:>8,.0f} "
            f"jobs/s ({result['jobs_per_s'] / base:.2f}x the first)",
            flush=True,
        )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
