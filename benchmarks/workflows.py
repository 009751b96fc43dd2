"""Durable workflows: what slicing buys short jobs, and what a checkpoint costs.

(a) **Slicing.** One worker with one slot runs a workflow of 200 steps of 50 ms (an
async sleep: 10 s of work). Once its first step has started, 50 short jobs arrive, one
every 100 ms, from another tenant and, in a second pair of runs, from the workflow's
own tenant. The figure is each short job's start delay (the task's ``time.time_ns()``
at its start minus the producer's just before the enqueue), p50/p99/max, with slicing
(``slice_steps=10``, ``slice_seconds=0.5``) and without (``slice_steps=10_000``,
``slice_seconds=1e9``: the run holds the slot to the end), and the long run's total time.

(b) **Checkpoint overhead.** A workflow of N (2,000) no-op steps (``async def noop(n)``)
with slicing off, against the same N awaits as plain code. Per step: wall time in us,
server calls (``FCALL``s, each one round trip) and Redis commands (every command the
server executed, those inside Fairlane's functions included), from ``CONFIG RESETSTAT``
before the run and ``INFO commandstats`` after it. Each workflow figure is taken end to
end (enqueue to result) minus the same workflow run with 0 steps, divided by N, so that
the enqueue, dispatch and result are not charged to the steps. For contrast: the same
steps as synchronous functions (thread executor), and with slicing on at the default
20 steps a slice (each slice replays the history so far: 100 slices for 2,000 steps).

The server is private (``fairlane.testing.RedisServer``, its own free port) unless
``--redis-url`` names one, whose statistics are then reset (``CONFIG RESETSTAT``):
keep other clients off it. The worker runs in the benchmark's event loop (the figures
are long waits and per-step costs, which a second process would not change much).

Run: ``python -m benchmarks.workflows [--steps N] [--redis-url URL] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from benchmarks.common import Meter, delete_matching, percentile
from fairlane import App, Context, Retention
from fairlane.app.worker import Worker
from fairlane.runtime.loop import run as run_loop
from fairlane.store.keys import AppKeys
from fairlane.testing import RedisServer

KEEP_ALL = Retention(completed=None, failed=None)
UNSLICED = {"slice_steps": 10_000, "slice_seconds": 1e9}
SLICED = {"slice_steps": 10, "slice_seconds": 0.5}


@contextlib.asynccontextmanager
async def _serving(app: App, url: str) -> AsyncIterator[None]:
    """The app connected, one worker with one slot in this loop; keys deleted after."""
    meter = Meter(url)
    try:
        async with app:
            worker = Worker(app, lanes=[app.settings.default_lane], concurrency=1)
            running = asyncio.create_task(worker.run())
            try:
                yield
            finally:
                worker.stop()
                await asyncio.wait_for(running, 60)
    finally:
        await delete_matching(meter.client, f"{AppKeys.for_app(app.name).prefix}*")
        await meter.aclose()


# -- (a) slicing ---------------------------------------------------------------------


async def slicing(
    url: str,
    *,
    sliced: bool,
    same_tenant: bool,
    steps: int = 200,
    step_ms: float = 50.0,
    shorts: int = 50,
    gap_ms: float = 100.0,
) -> dict[str, Any]:
    """One run of scenario (a); the short jobs' start delays in ms."""
    shape = SLICED if sliced else UNSLICED
    name = f"flwf_{os.getpid()}_{'sliced' if sliced else 'whole'}_{int(same_tenant)}"
    app = App(name, redis_url=url)
    started = asyncio.Event()

    async def nap(n: int) -> int:
        started.set()
        await asyncio.sleep(step_ms / 1000)
        return n

    @app.workflow(name="bench.long", retention=KEEP_ALL, **shape)  # type: ignore[arg-type]
    async def long_run(ctx: Context, count: int) -> int:
        total = 0
        for n in range(count):
            total += await ctx.step(f"step-{n}", nap, n)
        return total

    @app.task(name="bench.short")
    async def short() -> int:
        return time.time_ns()

    async with _serving(app, url):
        t0 = time.perf_counter()
        run = await long_run.enqueue(steps, tenant="long")
        await started.wait()
        sent = []
        for _ in range(shorts):
            before = time.time_ns()
            sent.append((before, await short.enqueue(tenant="long" if same_tenant else "short")))
            await asyncio.sleep(gap_ms / 1000)
        delays = [(await job.result(timeout=600) - before) / 1e6 for before, job in sent]
        assert await run.result(timeout=600) == sum(range(steps))
        run_s = time.perf_counter() - t0
        slices = sum(e.kind == "slice" for e in (await app.store.runs.history(run.id)).log)
    return {
        "sliced": sliced,
        "same_tenant": same_tenant,
        **shape,
        "short_start_delay_ms": {
            "p50": percentile(delays, 50),
            "p99": percentile(delays, 99),
            "max": max(delays),
        },
        "long_run_s": run_s,
        "slices": slices,
        "steps": steps,
        "step_ms": step_ms,
        "shorts": shorts,
        "gap_ms": gap_ms,
    }


# -- (b) checkpoint overhead -----------------------------------------------------------


async def noop(n: int) -> int:
    return n


def sync_noop(n: int) -> int:
    return n


async def plain_code(steps: int, repeats: int = 5) -> float:
    """us per step of the same no-op awaits as plain code (best of ``repeats``)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        total = 0
        for n in range(steps):
            total += await noop(n)
        best = min(best, time.perf_counter() - t0)
    return best / steps * 1e6


async def overhead(url: str, steps: int) -> list[dict[str, Any]]:
    """Scenario (b): one row per flavour of the N-step no-op workflow."""
    app = App(f"flwf_{os.getpid()}_overhead", redis_url=url)

    def flavour(name: str, fn: Any, **shape: Any) -> Any:
        @app.workflow(name=name, retention=KEEP_ALL, **shape)
        async def flow(ctx: Context, count: int) -> int:
            total = 0
            for n in range(count):
                total += await ctx.step(f"step-{n}", fn, n)
            return total

        return flow

    flavours = [
        ("workflow, async no-op steps, slicing off", flavour("bench.async", noop, **UNSLICED)),
        ("workflow, sync no-op steps (thread)", flavour("bench.sync", sync_noop, **UNSLICED)),
        ("workflow, async no-op, 20 steps a slice", flavour("bench.sliced", noop)),
    ]
    meter = Meter(url)
    rows = [{"what": "plain code, async no-op awaits", "us_per_step": await plain_code(steps)}]
    try:
        async with _serving(app, url):
            warm = await flavours[0][1].enqueue(10)  # warm up: connections, functions
            await warm.result(timeout=60)
            for what, flow in flavours:
                runs = {}
                for count in (0, steps):
                    await meter.reset()
                    t0 = time.perf_counter()
                    job = await flow.enqueue(count)
                    assert await job.result(timeout=600) == sum(range(count))
                    seconds = time.perf_counter() - t0
                    calls = await meter.calls()
                    with meter.own():
                        processed = (await meter.client.info("stats"))["total_commands_processed"]
                    runs[count] = (seconds, calls, processed)
                (s0, c0, p0), (s1, c1, p1) = runs[0], runs[steps]
                per_step = Counter({k: v - c0.get(k, 0) for k, v in c1.items()})
                rows.append(
                    {
                        "what": what,
                        "us_per_step": (s1 - s0) / steps * 1e6,
                        "fcalls_per_step": per_step["fcall"] / steps,
                        "commands_per_step": sum(per_step.values()) / steps,
                        "total_commands_processed_per_step": (p1 - p0) / steps,
                        "by_command_per_step": {
                            k: v / steps for k, v in per_step.most_common() if v > 0
                        },
                        "run_s": s1,
                        "empty_run_ms": s0 * 1000,
                    }
                )
    finally:
        await meter.aclose()
    return rows


# -- report --------------------------------------------------------------------------


def _print(slicing_runs: list[dict[str, Any]], rows: list[dict[str, Any]], steps: int) -> None:
    print("(a) 200 steps x 50 ms on one slot; 50 short jobs arrive, one every 100 ms")
    print(
        f"{'short jobs from':<17}{'slicing':<28}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
        f"{'long run s':>12}{'slices':>8}"
    )
    for r in slicing_runs:
        d = r["short_start_delay_ms"]
        mode = "10 steps / 0.5 s" if r["sliced"] else "off"
        who = "the same tenant" if r["same_tenant"] else "another tenant"
        print(
            f"{who:<17}{mode:<28}{d['p50']:>9.1f}{d['p99']:>9.1f}{d['max']:>9.1f}"
            f"{r['long_run_s']:>12.2f}{r['slices']:>8}"
        )
    print()
    print(f"(b) {steps:,} no-op steps: cost per step (end to end, minus a 0-step run)")
    print(f"{'':<44}{'us/step':>9}{'fcalls':>8}{'commands':>10}{'processed':>11}")
    for r in rows:
        if "fcalls_per_step" not in r:
            print(f"{r['what']:<44}{r['us_per_step']:>9.2f}{'-':>8}{'-':>10}{'-':>11}")
            continue
        print(
            f"{r['what']:<44}{r['us_per_step']:>9.1f}{r['fcalls_per_step']:>8.2f}"
            f"{r['commands_per_step']:>10.2f}{r['total_commands_processed_per_step']:>11.2f}"
        )
    print(
        "commands: every command the server ran, inside functions too (commandstats); "
        "processed: INFO stats total_commands_processed"
    )
    for r in rows[1:2]:
        top = ", ".join(f"{k} {v:.2f}" for k, v in list(r["by_command_per_step"].items())[:8])
        print(f"per step, {r['what']}: {top}")


async def _main(url: str | None, steps: int) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        if url is None:
            url = stack.enter_context(RedisServer()).url
        slicing_runs = [
            await slicing(url, sliced=sliced, same_tenant=same)
            for same in (False, True)
            for sliced in (True, False)
        ]
        rows = await overhead(url, steps)
    return {"slicing": slicing_runs, "overhead": rows, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None, help="default: a private server")
    parser.add_argument("--steps", type=int, default=2000, help="steps of the no-op workflow")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    results = run_loop(_main(args.redis_url, args.steps))
    _print(results["slicing"], results["overhead"], args.steps)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
