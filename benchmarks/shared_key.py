"""Shared key: quiet tenants behind a flood on one throttle key of limit L, real workers.

A flood tenant enqueues ``flood`` jobs of ``job_ms`` that all take the shared key
``model:big`` at limit ``limit`` (L); then ``quiet`` jobs of the same length, from
``quiet_tenants`` tenants in turn, one every ``gap_ms``, also on the key, while the
flood is still backlogged on it. One worker process runs them. The figure is each
quiet job's start delay (its task's start time minus the time just before its
enqueue), p50/p99/max, and the number of the key's hand-offs it waited for (the jobs
on the key that started after it was enqueued, itself included: 1 is the very next).
Three runs of the same workload:

* ``fair``: the tenants as themselves, the key at L, the worker's concurrency larger
  than L (so the lane is not the bottleneck, the key is). The key's waiters are served
  by the store's rule: tenant-fair once issue 16's rule is in the store, FIFO across
  tenants before it.
* ``fifo``: the same, every job under one tenant: one tenant's waiters are served
  priority then FIFO by construction, so this is FIFO waiters on the same key.
* ``no_key``: the tenants as themselves, no key, the worker's concurrency L: the lane's
  own fair queue does what the key did.

Ratios, in one run: ``fifo`` p99 over ``fair`` p99 (target: at least 10x), ``fair``
p99 over the time of 3 of the key's hand-offs, ``3 * job_ms / L`` (target: at most
1; the same target counted, p99 of the hand-offs waited at most 3), and ``fair`` p99
over ``no_key`` p99 (what the key costs against the lane's own fair queue). The
targets are printed as pass/fail lines, not asserted: timings depend on the machine.

Run: ``python -m benchmarks.shared_key [--redis-url URL]`` (default: a private server)
``[--limit 4] [--flood 400] [--job-ms 100] [--quiet 40] [--quiet-tenants 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import time
from typing import Any

from benchmarks.common import Meter, WorkerProcess, delete_matching, percentile
from benchmarks.fairlane_worker import make_app
from fairlane.runtime.loop import run as run_loop
from fairlane.store.keys import AppKeys
from fairlane.testing import RedisServer

WORKER = "benchmarks.fairlane_worker"
KEY = "model:big"
MODES = ("fair", "fifo", "no_key")


async def one_run(
    url: str,
    mode: str,
    *,
    prefix: str = "flshared",
    limit: int = 4,
    flood: int = 400,
    job_ms: float = 100.0,
    quiet: int = 40,
    quiet_tenants: int = 5,
    gap_ms: float = 200.0,
    concurrency: int = 16,
) -> dict[str, Any]:
    """One run of ``mode`` (``fair``, ``fifo``, ``no_key``); the quiet jobs' figures."""
    name = f"{prefix}_{os.getpid()}_{mode}"
    bench = make_app(name, url, "jobs")
    slots = limit if mode == "no_key" else max(concurrency, limit + 1)
    limits = None if mode == "no_key" else {KEY: limit}
    args = ["--url", url, "--app", name, "--concurrency", str(slots), "--charge", "jobs"]
    worker = WorkerProcess(WORKER, args)
    seconds = job_ms / 1000
    try:
        await worker.start()
        async with bench.app:
            await asyncio.sleep(1.0)  # the worker connects and blocks waiting
            flood_jobs = []
            for start in range(0, flood, 500):
                calls = [(seconds,)] * min(500, flood - start)
                tenant = "shared" if mode == "fifo" else "flood"
                flood_jobs += await bench.work.enqueue_many(calls, tenant=tenant, limits=limits)
            # the quiet jobs arrive while the flood is backlogged on the key (or the lane)
            t0 = time.monotonic() + 2 * seconds
            quiet_jobs = []
            for i in range(quiet):
                await asyncio.sleep(max(0.0, t0 + i * gap_ms / 1000 - time.monotonic()))
                tenant = "shared" if mode == "fifo" else f"quiet-{i % quiet_tenants}"
                before = time.time_ns()
                job = await bench.work.enqueue(seconds, tenant=tenant, limits=limits)
                quiet_jobs.append((before, job))
            quiet_starts = [(b, int(await j.result(timeout=900))) for b, j in quiet_jobs]
            flood_starts = [int(await j.result(timeout=900)) for j in flood_jobs]
        await worker.stop(timeout=600)
    finally:
        await worker.close()
        meter = Meter(url)
        with meter.own():
            await delete_matching(meter.client, f"{AppKeys.for_app(name).prefix}*")
        await meter.aclose()
    delays = [(start - before) / 1e6 for before, start in quiet_starts]
    # every start of a job on the key (or the lane) is one hand-off of its slots
    starts = sorted(flood_starts + [s for _, s in quiet_starts])
    waited = [
        float(bisect.bisect_right(starts, s) - bisect.bisect_right(starts, b))
        for b, s in quiet_starts
    ]
    return {
        "mode": mode,
        "limit": limit,
        "slots": slots,
        "flood": flood,
        "quiet": quiet,
        "job_ms": job_ms,
        "quiet_start_delay_ms": {
            "p50": percentile(delays, 50),
            "p99": percentile(delays, 99),
            "max": max(delays),
        },
        "quiet_hand_offs": {
            "p50": percentile(waited, 50),
            "p99": percentile(waited, 99),
            "max": max(waited),
        },
        "flood_drained_s": (max(starts) - min(starts)) / 1e9 + seconds,
    }


async def run_all(url: str, prefix: str = "flshared", **options: Any) -> dict[str, Any]:
    """The three runs and their ratios."""
    runs = {mode: await one_run(url, mode, prefix=prefix, **options) for mode in MODES}
    fair, fifo, no_key = (runs[m]["quiet_start_delay_ms"]["p99"] for m in MODES)
    fair_run = runs["fair"]
    three = 3 * fair_run["job_ms"] / fair_run["limit"]
    return {
        **runs,
        "three_hand_offs_ms": three,
        "ratios": {
            "fifo_over_fair_p99": fifo / fair if fair > 0 else float("inf"),
            "fair_p99_over_three_hand_offs": fair / three,
            "fair_over_no_key_p99": fair / no_key if no_key > 0 else float("inf"),
        },
    }


def verdicts(result: dict[str, Any]) -> list[str]:
    """The targets as pass/fail lines."""
    r, three = result["ratios"], result["three_hand_offs_ms"]
    fair = result["fair"]["quiet_start_delay_ms"]["p99"]
    counted = result["fair"]["quiet_hand_offs"]["p99"]
    lines = [
        (fair <= three, f"quiet p99 {fair:.1f} ms, within 3 hand-offs of the key ({three:.1f} ms)"),
        (counted <= 3, f"quiet p99 waited {counted:.2f} of the key's hand-offs (target <= 3)"),
        (r["fifo_over_fair_p99"] >= 10,
         f"quiet p99 {r['fifo_over_fair_p99']:.1f}x better than FIFO waiters (target >= 10x)"),
    ]  # fmt: skip
    return [f"{'PASS' if ok else 'FAIL'}: {text}" for ok, text in lines]


async def _main(url: str | None, **options: Any) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(RedisServer()).url
        return await run_all(url, **options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", default=None, help="default: a private server")
    parser.add_argument("--limit", type=int, default=4, help="the shared key's limit L")
    parser.add_argument("--flood", type=int, default=400)
    parser.add_argument("--job-ms", type=float, default=100.0)
    parser.add_argument("--quiet", type=int, default=40)
    parser.add_argument("--quiet-tenants", type=int, default=5)
    parser.add_argument("--gap-ms", type=float, default=200.0)
    parser.add_argument("--concurrency", type=int, default=16, help="the worker's, above L")
    args = parser.parse_args()
    result = run_loop(
        _main(
            args.redis_url, limit=args.limit, flood=args.flood, job_ms=args.job_ms,
            quiet=args.quiet, quiet_tenants=args.quiet_tenants, gap_ms=args.gap_ms,
            concurrency=args.concurrency,
        )
    )  # fmt: skip
    titles = {
        "fair": "fair waiters (the store's rule), tenants as themselves",
        "fifo": "FIFO waiters (one tenant)",
        "no_key": f"no key, lane of {args.limit} slots (the lane's fair queue)",
    }
    for mode in MODES:
        d, h = result[mode]["quiet_start_delay_ms"], result[mode]["quiet_hand_offs"]
        print(
            f"{titles[mode]}: quiet start delay p50 {d['p50']:.1f} ms, p99 {d['p99']:.1f} ms, "
            f"max {d['max']:.1f} ms; hand-offs waited p50 {h['p50']:.1f}, p99 {h['p99']:.2f}"
        )
    for line in verdicts(result):
        print(line)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
