"""Noisy neighbor: does a quiet tenant wait behind another tenant's flood?

One tenant enqueues ``flood`` jobs of ``flood_ms`` each; right after, another tenant
enqueues ``quiet`` jobs of ``quiet_ms``. One worker process at ``concurrency`` runs
them. The figure is each quiet job's start delay (its task's start time minus the
time just before its enqueue), p50/p99/max, with tenant fairness on -- the two
tenants as themselves -- and, for contrast, off: every job under one shared tenant,
so that dispatch is plain FIFO. No priorities are set by hand; every job costs the same.

Run: ``python -m benchmarks.noisy [--redis-url URL]``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import time
from typing import Any, Literal

from benchmarks.common import Meter, WorkerProcess, delete_matching, percentile
from benchmarks.fairlane_worker import make_app
from fairlane.runtime.loop import run as run_loop
from fairlane.store.keys import AppKeys

WORKER = "benchmarks.fairlane_worker"
DEFAULT_URL = "redis://127.0.0.1:6379/0"


async def noisy_neighbor(
    url: str,
    *,
    fair: bool,
    charge: Literal["jobs", "cost"] = "cost",
    flood: int = 2000,
    flood_ms: float = 50.0,
    quiet: int = 20,
    quiet_ms: float = 5.0,
    concurrency: int = 20,
) -> dict[str, Any]:
    """One run; returns the quiet tenant's start delays (ms) and the flood's drain time."""
    name = f"flnoisy_{os.getpid()}_{'fair' if fair else 'fifo'}_{charge}"
    bench = make_app(name, url, charge)
    meter = Meter(url)
    args = ["--url", url, "--app", name, "--concurrency", str(concurrency), "--charge", charge]
    worker = WorkerProcess(WORKER, args)
    flood_tenant, quiet_tenant = ("flood", "quiet") if fair else ("shared", "shared")
    try:
        await worker.start()
        async with bench.app:
            await asyncio.sleep(1.0)  # the worker connects and blocks waiting
            t0 = time.perf_counter()
            flood_jobs = []
            for start in range(0, flood, 500):
                calls = [(flood_ms / 1000,)] * min(500, flood - start)
                flood_jobs += await bench.work.enqueue_many(calls, tenant=flood_tenant)
            quiet_jobs = []
            for _ in range(quiet):
                before = time.time_ns()
                job = await bench.work.enqueue(quiet_ms / 1000, tenant=quiet_tenant)
                quiet_jobs.append((before, job))
            starts = [(before, await job.result(timeout=600)) for before, job in quiet_jobs]
            delays = [(start - before) / 1e6 for before, start in starts]
            quiet_done = time.perf_counter() - t0
            # when flood jobs gave their slots back: no quiet job can start before one does
            ends = sorted([await job.result(timeout=600) + flood_ms * 1e6 for job in flood_jobs])
            beyond = [(start - _first_after(ends, before)) / 1e6 for before, start in starts]
        await worker.stop(timeout=600)
    finally:
        await worker.close()
        with meter.own():
            await delete_matching(meter.client, f"{AppKeys.for_app(name).prefix}*")
        await meter.aclose()
    return {
        "fair": fair,
        "charge": charge,
        "quiet_start_delay_ms": {
            "p50": percentile(delays, 50),
            "p99": percentile(delays, 99),
            "max": max(delays),
        },
        "quiet_done_after_s": quiet_done,
        # start delay beyond the first slot a flood job gave back after the quiet job
        # arrived: what the scheduler adds to what the fleet's load imposes
        "quiet_delay_beyond_first_free_slot_ms": {
            "p50": percentile(beyond, 50),
            "p99": percentile(beyond, 99),
            "max": max(beyond),
        },
        "flood": flood,
        "flood_ms": flood_ms,
        "quiet": quiet,
        "quiet_ms": quiet_ms,
        "concurrency": concurrency,
    }


def _first_after(ends: list[int], moment: int) -> int:
    return ends[bisect.bisect_left(ends, moment)] if ends[-1] >= moment else moment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=DEFAULT_URL)
    parser.add_argument("--flood", type=int, default=2000)
    parser.add_argument("--no-contrast", action="store_true", help="skip the FIFO run")
    args = parser.parse_args()
    runs: list[tuple[bool, Literal["jobs", "cost"]]] = [(True, "cost"), (True, "jobs")]
    if not args.no_contrast:
        runs.append((False, "jobs"))
    results = [
        run_loop(noisy_neighbor(args.redis_url, fair=fair, charge=charge, flood=args.flood))
        for fair, charge in runs
    ]
    for r in results:
        d = r["quiet_start_delay_ms"]
        mode = "FIFO (one shared tenant)"
        if r["fair"]:
            mode = f"fair, charged by {'learned cost' if r['charge'] == 'cost' else 'job'}"
        b = r["quiet_delay_beyond_first_free_slot_ms"]
        print(
            f"{mode}: quiet tenant start delay p50 {d['p50']:.1f} ms, "
            f"p99 {d['p99']:.1f} ms, max {d['max']:.1f} ms; beyond the first free slot "
            f"p50 {b['p50']:.1f} ms, p99 {b['p99']:.1f} ms"
        )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
