"""Overload: a 16-slot lane offered more work than it can serve, with and without admission.

The token-pool experiment of the background reading (seed 002), with Fairlane's real
worker and store: one worker process with ``slots`` slots serves one lane; jobs take
``job_ms`` each, so the lane serves ``slots / job_ms`` jobs per second. For ``seconds``
the benchmark offers ``load`` times that, at an even pace, one job in
``1 / guaranteed_share`` in the ``guaranteed`` class and the rest ``standard``, all
from one tenant (so that only classes and admission tell the jobs apart). Three
variants of the same lane:

* ``admission``: a pool (``fairlane.config.pools``) of ``slots`` units, each job declaring one
  unit; ``guaranteed`` has a nominal half and lends none of it (``lendable = 0``),
  ``standard`` the other half; both classes reject when full. A job is admitted only
  if a slot's worth of units is free for its class, so the lane's queue stays empty
  and the guaranteed class's start delay flat; excess standard work is rejected
  (``class_full``, with a Retry-After) at submission.
* ``no_admission``: the same two classes as the lane's slot shares, no pool: every job
  is accepted; the guaranteed class keeps its slots, the standard backlog grows.
* ``one_class``: no pool and one class: every job accepted into one first-in first-out
  queue, which is what the seed's baseline without admission control does.

Figures per variant: the most jobs waiting in the lane (sampled every 20 ms from the
lane's own counters), the number still waiting when the offer ends, admitted/rejected
counts per class and the guaranteed jobs' start delay (task start minus the moment
before ``submit``) p50/p99/max. The benchmark stops after the offer and the guaranteed
jobs have started; it does not wait for the standard backlog to drain.

Run: ``python -m benchmarks.overload [--redis-url URL] [--seconds 8]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from typing import Any

from benchmarks.common import DEFAULT_URL, WorkerProcess, delete_matching, emit, percentile
from fairlane import App, Retention, Task
from fairlane.config.lanes import LaneClasses
from fairlane.config.pools import parse_config
from fairlane.policy.classes import ServiceClass
from fairlane.runtime.loop import run as run_loop
from fairlane.store.keys import AppKeys

LANE = "overload"
TASK = "bench.overload"
TENANT = "t"
VARIANTS = ("admission", "no_admission", "one_class")
SAMPLE_EVERY = 0.02


def pool_config(slots: int) -> dict[str, Any]:
    """The ``admission`` variant's pool: ``slots`` units, half of them kept for guaranteed."""
    return {
        "pools": {
            LANE: {
                "capacity_units": slots,
                "classes": {
                    "guaranteed": {
                        "nominal_share": 0.5,
                        "lendable": 0.0,
                        "max_queue": slots,
                        "response_when_full": "reject",
                    },
                    "standard": {
                        "nominal_share": 0.5,
                        "max_queue": slots,
                        "response_when_full": "reject",
                    },
                },
            }
        },
        "estimation": {"safety_multiplier": 1.0},
    }


def make_app(name: str, url: str, variant: str, slots: int) -> tuple[App, Task[[float], int]]:
    """The app of one variant, declared alike by the producer and the worker."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {VARIANTS}")
    if variant == "admission":
        app = App(name, redis_url=url, config=parse_config(pool_config(slots)))
    elif variant == "no_admission":
        table = parse_config(pool_config(slots)).pools[LANE].table
        app = App(name, redis_url=url, lanes={LANE: table})
    else:
        one: LaneClasses = [ServiceClass("standard", nominal_share=1.0)]
        app = App(name, redis_url=url, lanes={LANE: one})

    @app.task(name=TASK, lane=LANE, retention=Retention(completed=None, failed=None))
    async def work(seconds: float) -> int:
        started = time.time_ns()
        await asyncio.sleep(seconds)  # a model call: the slot is held, the loop free
        return started

    return app, work


async def _lane_counts(app: App) -> dict[str, int]:
    raw = await app.store.client.hgetall(app.store.keys.lane(LANE).state)
    out = {"queued": 0, "admitted": 0, "deferred": 0}
    for key, value in raw.items():
        name = key.decode() if isinstance(key, bytes) else str(key)
        kind = name.split(":", 1)[0]
        if kind == "d":
            out["queued"] += int(value)
        elif kind == "an":
            out["admitted"] += int(value)
        elif kind == "ad":
            out["deferred"] += int(value)
    return out


def _tally(
    offered: list[tuple[str, int, Any]],
) -> tuple[dict[str, dict[str, int]], dict[str, int], list[tuple[int, Any]]]:
    """Decisions per class, reasons, and the admitted guaranteed jobs with their times."""
    counts: dict[str, dict[str, int]] = {
        c: {"offered": 0, "accepted": 0, "deferred": 0, "rejected": 0}
        for c in ("guaranteed", "standard")
    }
    reasons: dict[str, int] = {}
    guaranteed = []
    for cls, before, adm in offered:
        counts[cls]["offered"] += 1
        counts[cls][adm.status if adm.status in counts[cls] else "rejected"] += 1
        if adm.reason:
            reasons[f"{cls}:{adm.reason}"] = reasons.get(f"{cls}:{adm.reason}", 0) + 1
        if cls == "guaranteed" and adm.job is not None:
            guaranteed.append((before, adm.job))
    return counts, reasons, guaranteed


async def run_variant(
    url: str,
    name: str,
    variant: str,
    *,
    slots: int = 16,
    job_ms: float = 100.0,
    load: float = 1.5,
    guaranteed_share: float = 0.2,
    seconds: float = 8.0,
) -> dict[str, Any]:
    """One variant on app ``name``; its keys are deleted afterwards."""
    app, work = make_app(name, url, variant, slots)
    capacity = slots / (job_ms / 1000)
    rate = capacity * load
    total = int(rate * seconds)
    every = max(1, round(1 / guaranteed_share))
    args = ["worker", "--url", url, "--app", name, "--variant", variant, "--slots", str(slots)]
    worker = WorkerProcess("benchmarks.overload", args)
    samples: list[dict[str, int]] = []
    try:
        await worker.start()
        async with app:
            await asyncio.sleep(1.0)  # the worker connects and registers its slots

            async def one(i: int) -> tuple[str, int, Any]:
                cls = "guaranteed" if i % every == 0 else "standard"
                asked = "standard" if variant == "one_class" else cls
                before = time.time_ns()
                adm = await work.submit(
                    job_ms / 1000, tenant=TENANT, service_class=asked, estimate=1.0
                )
                return cls, before, adm

            stop = asyncio.Event()

            async def sample() -> None:
                while not stop.is_set():
                    samples.append(await _lane_counts(app))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), SAMPLE_EVERY)

            sampler = asyncio.create_task(sample())
            t0 = time.perf_counter()
            pending = []
            for i in range(total):
                delay = t0 + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                pending.append(asyncio.create_task(one(i)))
            offered = await asyncio.gather(*pending)
            offer_s = time.perf_counter() - t0
            stop.set()
            await sampler
            at_end = await _lane_counts(app)
            counts, reasons, guaranteed = _tally(offered)
            delays = [(await job.result(timeout=300) - before) / 1e6 for before, job in guaranteed]
        await worker.stop()
    finally:
        await worker.close()
        cleaner = App(name, redis_url=url)
        async with cleaner:
            await delete_matching(cleaner.store.client, f"{AppKeys.for_app(name).prefix}*")
    return {
        "variant": variant,
        "slots": slots,
        "job_ms": job_ms,
        "capacity_jobs_per_s": capacity,
        "offered_jobs_per_s": rate,
        "offer_seconds": offer_s,
        "offered": total,
        "max_queued": max((s["queued"] + s["deferred"] for s in samples), default=0),
        "queued_at_end": at_end["queued"] + at_end["deferred"],
        "max_admitted_unfinished": max((s["admitted"] for s in samples), default=0),
        "samples": len(samples),
        "classes": counts,
        "reasons": reasons,
        "guaranteed": {
            "samples": len(delays),
            "p50_ms": percentile(delays, 50),
            "p99_ms": percentile(delays, 99),
            "max_ms": max(delays, default=float("nan")),
        },
    }


async def run_all(
    url: str, prefix: str, variants: tuple[str, ...] = VARIANTS, **options: Any
) -> dict[str, Any]:
    return {v: await run_variant(url, f"{prefix}_{v}", v, **options) for v in variants}


# -- the worker process -------------------------------------------------------------------


async def _serve(args: argparse.Namespace) -> None:
    app, _ = make_app(args.app, args.url, args.variant, args.slots)
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    loop.add_signal_handler(signal.SIGTERM, main.cancel)  # until the worker's own handlers
    emit("ready")
    with contextlib.suppress(asyncio.CancelledError):
        await app.run_worker(lanes=[LANE], concurrency=args.slots, handle_signals=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command")
    w = sub.add_parser("worker")
    w.add_argument("--url", required=True)
    w.add_argument("--app", required=True)
    w.add_argument("--variant", choices=VARIANTS, required=True)
    w.add_argument("--slots", type=int, default=16)
    parser.add_argument("--redis-url", default=DEFAULT_URL)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--load", type=float, default=1.5)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.command == "worker":
        run_loop(_serve(args))
        emit("exit", commands={})
        return
    result = run_loop(
        run_all(args.redis_url, f"floverload_{os.getpid()}", seconds=args.seconds, load=args.load)
    )
    for variant, r in result.items():
        g = r["guaranteed"]
        print(
            f"{variant:>13}: max queued {r['max_queued']:>5}, at end {r['queued_at_end']:>5}; "
            f"guaranteed p50 {g['p50_ms']:8.1f} ms, p99 {g['p99_ms']:8.1f} ms; "
            f"{r['classes']}"
        )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
