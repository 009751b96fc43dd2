"""Fairlane's side of the suite: throughput, calls per job, latency, enqueue, idle, recovery.

Each phase uses a namespace (app name) of its own and deletes its keys when done.
Workers run in separate processes (``benchmarks.fairlane_worker``); the producer
runs in this process, its commands counted into a sink of its own.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from typing import Any

from benchmarks.common import (
    Meter,
    WorkerProcess,
    agrees,
    call_report,
    counting,
    delete_matching,
    idle_counts,
    mismatch,
    percentile,
    script_commands,
    wait_until,
)
from benchmarks.config import Config
from benchmarks.fairlane_worker import BenchApp, make_app
from fairlane.store.keys import AppKeys
from fairlane.store.redis import LIBRARY_CODE

IN_SCRIPTS = script_commands(LIBRARY_CODE)
WORKER = "benchmarks.fairlane_worker"
LEASE_ENV = {
    "FAIRLANE_LEASE__DURATION": "2",
    "FAIRLANE_LEASE__RENEW_INTERVAL": "0.5",
    "FAIRLANE_LEASE__SWEEP_INTERVAL": "0.5",
}


def _worker(
    cfg: Config,
    name: str,
    concurrency: int,
    *,
    burst: bool = False,
    env: dict[str, str] | None = None,
) -> WorkerProcess:
    args = ["--url", cfg.url, "--app", name, "--concurrency", str(concurrency)]
    return WorkerProcess(WORKER, [*args, "--burst"] if burst else args, env)


async def _cleanup(meter: Meter, name: str) -> None:
    with meter.own():
        await delete_matching(meter.client, f"{AppKeys.for_app(name).prefix}*")


async def _completed(meter: Meter, name: str) -> int:
    with meter.own():
        raw = await meter.client.hget(AppKeys.for_app(name).stats, "completed")
    return int(raw or 0)


async def _enqueue_many(bench: BenchApp, jobs: int, batch: int) -> None:
    for start in range(0, jobs, batch):
        await bench.noop.enqueue_many([(i,) for i in range(start, min(jobs, start + batch))])


async def _enqueue_loop(bench: BenchApp, jobs: int) -> None:
    for i in range(jobs):
        await bench.noop.enqueue(i)


# -- 1 and 2: throughput and calls per job -----------------------------------------------


async def throughput(cfg: Config, meter: Meter) -> dict[str, Any]:
    """Enqueue ``cfg.jobs`` no-op jobs, then time one worker process draining them."""
    name = f"flbench_{cfg.run_id}_tp"
    bench = make_app(name, cfg.url)
    producer: Counter[str] = Counter()
    worker = _worker(cfg, name, cfg.concurrency, burst=True)
    try:
        with counting(producer):
            async with bench.app:
                await meter.reset()
                base = Counter(producer)  # not the connection set-up
                started = time.perf_counter()
                await _enqueue_many(bench, cfg.jobs, cfg.batch)
                enqueue_s = time.perf_counter() - started
                enqueue_calls = await meter.calls()
                enqueue_counted = producer - base
        await meter.reset()
        ready = await worker.start()
        done = await wait_until(lambda: _is_done(meter, name, cfg.jobs), timeout=cfg.timeout)
        worker_counted = await worker.exited(cfg.timeout)
        drain_calls = await meter.calls()
    finally:
        await worker.close()
        await _cleanup(meter, name)
    seconds = done - ready
    return {
        "jobs": cfg.jobs,
        "concurrency": cfg.concurrency,
        "enqueue_seconds": enqueue_s,
        "drain_seconds": seconds,
        "jobs_per_s": cfg.jobs / seconds,
        "calls": {
            "enqueue": call_report(enqueue_calls, enqueue_counted, cfg.jobs, IN_SCRIPTS),
            "drain": call_report(drain_calls, worker_counted, cfg.jobs, IN_SCRIPTS),
            "total": call_report(
                enqueue_calls + drain_calls, enqueue_counted + worker_counted, cfg.jobs, IN_SCRIPTS
            ),
        },
    }


async def _is_done(meter: Meter, name: str, jobs: int) -> bool:
    return await _completed(meter, name) >= jobs


# -- 3: idle enqueue -> start latency -----------------------------------------------------


async def latency(cfg: Config, meter: Meter) -> dict[str, Any]:
    """One job at a time to an idle worker: the task's start time minus the enqueue time."""
    name = f"flbench_{cfg.run_id}_lat"
    bench = make_app(name, cfg.url)
    worker = _worker(cfg, name, cfg.concurrency)
    starts: list[float] = []
    round_trips: list[float] = []
    try:
        await worker.start()
        async with bench.app:
            await asyncio.sleep(cfg.settle)  # the worker connects and blocks waiting
            for i in range(cfg.latency_warmup + cfg.latency_samples):
                await asyncio.sleep(cfg.latency_gap)  # the worker is back to blocking
                before = time.time_ns()
                job = await bench.stamp.enqueue()
                started = await job.result(timeout=30)
                after = time.time_ns()
                if i >= cfg.latency_warmup:
                    starts.append((started - before) / 1e6)
                    round_trips.append((after - before) / 1e6)
        await worker.stop()
    finally:
        await worker.close()
        await _cleanup(meter, name)
    return latency_report(starts, round_trips)


def latency_report(starts: list[float], round_trips: list[float]) -> dict[str, Any]:
    return {
        "samples": len(starts),
        "p50_ms": percentile(starts, 50),
        "p99_ms": percentile(starts, 99),
        "max_ms": max(starts),
        "mean_ms": sum(starts) / len(starts),
        "round_trip_p50_ms": percentile(round_trips, 50),
        "round_trip_p99_ms": percentile(round_trips, 99),
    }


# -- 4: enqueue rates ---------------------------------------------------------------------


async def enqueue(cfg: Config, meter: Meter) -> dict[str, Any]:
    """``enqueue_many`` in batches, and a plain loop of awaited ``enqueue`` calls."""
    name = f"flbench_{cfg.run_id}_enq"
    bench = make_app(name, cfg.url)
    out: dict[str, Any] = {}
    try:
        for variant in ("many", "loop"):
            producer: Counter[str] = Counter()
            with counting(producer):
                async with bench.app:
                    await meter.reset()
                    base = Counter(producer)
                    started = time.perf_counter()
                    if variant == "many":
                        await _enqueue_many(bench, cfg.jobs, cfg.batch)
                    else:
                        await _enqueue_loop(bench, cfg.jobs)
                    seconds = time.perf_counter() - started
                    calls = await meter.calls()
                    counted = producer - base
            await _cleanup(meter, name)
            out[variant] = {
                "jobs": cfg.jobs,
                "batch": cfg.batch if variant == "many" else 1,
                "seconds": seconds,
                "jobs_per_s": cfg.jobs / seconds,
                "calls": call_report(calls, counted, cfg.jobs, IN_SCRIPTS),
            }
    finally:
        await _cleanup(meter, name)
    return out


# -- 5: idle commands ---------------------------------------------------------------------


async def idle(cfg: Config, meter: Meter) -> dict[str, Any]:
    """Commands per second of one worker with nothing to do."""
    name = f"flbench_{cfg.run_id}_idle"
    worker = _worker(cfg, name, cfg.concurrency)
    try:
        calls, counted = await idle_counts(
            worker, meter, settle=cfg.idle_settle, seconds=cfg.idle_seconds
        )
    finally:
        await worker.close()
        await _cleanup(meter, name)
    return idle_report(cfg.idle_seconds, calls, counted, IN_SCRIPTS)


def idle_report(
    seconds: float, calls: Counter[str], counted: Counter[str], in_scripts: frozenset[str]
) -> dict[str, Any]:
    sent = sum(n for cmd, n in calls.items() if cmd not in in_scripts)
    return {
        "seconds": seconds,
        "commands_per_s": sum(calls.values()) / seconds,
        "client_calls_per_s": sent / seconds,
        "client_calls_counted_per_s": sum(counted.values()) / seconds,
        "server_by_command": dict(calls.most_common()),
        "client_by_command": dict(counted.most_common()),
        "server_minus_counted": mismatch(calls, counted, in_scripts),
        "views_agree": agrees(calls, counted, in_scripts),
    }


# -- 6: recovery after kill -9 ------------------------------------------------------------


async def recovery(cfg: Config, meter: Meter) -> dict[str, Any]:
    """Kill worker A with SIGKILL; time until worker B has completed every job A held."""
    name = f"flbench_{cfg.run_id}_rec"
    bench = make_app(name, cfg.url)
    keys = AppKeys.for_app(name)
    a = _worker(cfg, name, cfg.recovery_concurrency, env=LEASE_ENV)
    b = _worker(cfg, name, cfg.recovery_concurrency, env=LEASE_ENV)
    try:
        async with bench.app:
            await bench.nap.enqueue_many([(cfg.recovery_task_s,)] * cfg.recovery_jobs)
        await asyncio.gather(a.start(), b.start())
        await asyncio.sleep(cfg.recovery_kill_after)
        killed = time.time()
        os.kill(a.pid, signal.SIGKILL)
        held = await _held_by(meter, keys, a.pid)

        async def held_done() -> bool:
            with meter.own():
                async with meter.client.pipeline(transaction=False) as pipe:
                    for job_id in held:
                        pipe.hget(keys.job(job_id), "st")
                    states = await pipe.execute()
            return all(st == b"completed" for st in states)

        recovered = await wait_until(held_done, interval=0.01, timeout=cfg.timeout)
        all_done = await wait_until(
            lambda: _is_done(meter, name, cfg.recovery_jobs), interval=0.01, timeout=cfg.timeout
        )
        await b.stop()
    finally:
        await a.close()
        await b.close()
        await _cleanup(meter, name)
    return {
        "jobs": cfg.recovery_jobs,
        "task_seconds": cfg.recovery_task_s,
        "concurrency": cfg.recovery_concurrency,
        "held_by_killed": len(held),
        "recovery_seconds": recovered - killed,
        "all_done_seconds": all_done - killed,
        "lease_seconds": float(LEASE_ENV["FAIRLANE_LEASE__DURATION"]),
        "renew_interval": float(LEASE_ENV["FAIRLANE_LEASE__RENEW_INTERVAL"]),
        "sweep_interval": float(LEASE_ENV["FAIRLANE_LEASE__SWEEP_INTERVAL"]),
    }


async def _held_by(meter: Meter, keys: AppKeys, pid: int) -> list[str]:
    """Ids of the jobs leased to the worker process ``pid``."""
    with meter.own():
        leased = [x.decode() for x in await meter.client.zrange(keys.leases, 0, -1)]
        async with meter.client.pipeline(transaction=False) as pipe:
            for job_id in leased:
                pipe.hget(keys.job(job_id), "wk")
            owners = await pipe.execute()
    return [
        job_id
        for job_id, wk in zip(leased, owners, strict=True)
        if wk and wk.decode().split(":")[-2] == str(pid)
    ]


PHASES = {
    "throughput": throughput,
    "latency": latency,
    "enqueue": enqueue,
    "idle": idle,
    "recovery": recovery,
}
