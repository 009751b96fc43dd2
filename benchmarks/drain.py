"""Drain: what cancelling a tenant's 200,000 queued jobs costs the other tenants.

Tenant A has ``jobs`` no-op jobs queued (200,000 by default) in a lane no worker serves
(``held``), so that its backlog stays queued, as a backlog an operator drains does;
with ``--same-lane`` they are in B's lane, where the worker runs them too, fairly with
B's. Tenant B submits a no-op job every ``interval`` ms, one ``enqueue`` each, and a
worker process (concurrency 20) runs it; B's start delay is the job's start (its task's
clock) minus the moment before its enqueue. The server's time is all a drain takes
from B: what B waits for is the calls the drain holds the server with.

Two windows on the same app, the same backlog: first without a drain (``window``
seconds), then while another process drains A (``App.drain(tenant=A)``, as ``fairlane
drain`` does), B's jobs counted from the drain's first call to its last. The figures:
B's start delay p50/p99/max in each window and the ratio of the p99s (target: within
2x), the drain's duration, jobs and jobs/s, its calls, and the server's ``SLOWLOG``
over the drain (threshold 500 us): the longest drain call and how many took over 5 ms
(target: none). The server is a private one unless ``--redis-url`` names another (its
slowlog settings are put back).

Run: ``python -m benchmarks.drain [--jobs 200000] [--chunk-us 1000] [--pause 0] [--same-lane]
[--redis-url URL]``; ``--worker`` and ``--drainer`` are its processes' own entries.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from benchmarks.common import WorkerProcess, delete_matching, emit, percentile
from fairlane import App, Task
from fairlane.app.drain import DrainProgress
from fairlane.config.settings import load_settings
from fairlane.runtime.loop import run as run_loop
from fairlane.store.drain import CHUNK_BUDGET_US
from fairlane.store.keys import AppKeys
from fairlane.testing import RedisServer

A, B = "tenant-a", "tenant-b"
SLOWLOG_US = 500
OVER_MS = 5.0


@dataclass(frozen=True, slots=True)
class DrainApp:
    app: App
    held: Task[[int], None]  # A's jobs in the lane no worker serves
    noop: Task[[int], None]  # A's jobs in B's lane (--same-lane)
    stamp: Task[[], int]  # B's jobs: when they started


def make_app(name: str, url: str) -> DrainApp:
    """The benchmark's app, declared alike by each of its processes; its lanes unbounded,
    as A's backlog is far past the default bounds."""
    settings = load_settings(
        queues={"tenant_max_queued": None, "lane_max_queued": None}, environ={}
    )
    app = App(name, redis_url=url, settings=settings)

    @app.task(name="drain.held", lane="held")
    async def held(n: int) -> None:
        return None

    @app.task(name="drain.noop")
    async def noop(n: int) -> None:
        return None

    @app.task(name="drain.stamp")
    async def stamp() -> int:
        return time.time_ns()

    return DrainApp(app, held, noop, stamp)


async def _worker(url: str, app_name: str) -> None:
    """The worker process: B's lane (A's too with --same-lane), until SIGTERM."""
    bench = make_app(app_name, url)
    emit("ready")
    await bench.app.run_worker(lanes=["default"], concurrency=20, handle_signals=True)


async def _drainer(url: str, app_name: str, pause: float, chunk_us: int) -> None:
    """The drain process: drains A, then reports its figures."""
    bench = make_app(app_name, url)
    calls: list[float] = []

    def seen(progress: DrainProgress) -> None:
        calls.append(time.time())

    async with bench.app:
        emit("ready")
        started = time.time()
        report = await bench.app.drain(
            tenant=A, progress=seen, actor="bench", pause=pause, chunk_us=chunk_us
        )
        emit(
            "done",
            started=started,
            first=calls[0] if calls else started,
            last=calls[-1] if calls else started,
            cancelled=report.cancelled,
            calls=report.calls,
            rounds=report.rounds,
            seconds=report.seconds,
            longest_cpu_ms=report.longest_call_us / 1000,
        )


async def _load(bench: DrainApp, jobs: int, same_lane: bool) -> float:
    began = time.perf_counter()
    task = bench.noop if same_lane else bench.held
    for start in range(0, jobs, 5000):
        await task.enqueue_many([(i,) for i in range(start, min(jobs, start + 5000))], tenant=A)
    return time.perf_counter() - began


async def _traffic(
    bench: DrainApp, interval: float, stop: asyncio.Event
) -> list[tuple[float, Any]]:
    """B's jobs, one every ``interval`` s until ``stop``: (moment before enqueue, job)."""
    sent: list[tuple[float, Any]] = []
    while not stop.is_set():
        before = time.time()
        sent.append((before, await bench.stamp.enqueue(tenant=B)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, before + interval - time.time()))
    return sent


async def _delays(sent: list[tuple[float, Any]], lo: float, hi: float) -> list[float]:
    """The start delays (ms) of the jobs enqueued between ``lo`` and ``hi`` (every job
    waited for)."""
    out = []
    for before, job in sent:
        started_ns = await job.result(timeout=120)
        if lo <= before <= hi:
            out.append(started_ns / 1e6 - before * 1000)
    return out


def _summary(delays: list[float]) -> dict[str, float]:
    return {
        "jobs": len(delays),
        "p50_ms": percentile(delays, 50),
        "p99_ms": percentile(delays, 99),
        "max_ms": max(delays),
    }


async def _slowlog(client: aioredis.Redis) -> list[tuple[str, float]]:
    """(function, ms) of every FCALL the slowlog holds."""
    entries = await client.slowlog_get(1_000_000)
    out = []
    for entry in entries:
        words = entry["command"].split()
        if words and words[0].upper() == b"FCALL":
            out.append((words[1].decode().split("_", 1)[1], entry["duration"] / 1000))
    return out


async def bench_drain(
    url: str,
    *,
    jobs: int,
    interval: float,
    window: float,
    pause: float,
    chunk_us: int,
    same_lane: bool,
) -> dict[str, Any]:
    name = f"fldrain_{secrets.token_hex(3)}"
    bench = make_app(name, url)
    meter = aioredis.Redis.from_url(url)
    saved = await meter.config_get("slowlog-*")
    server = await meter.info("server")
    own = ["--redis-url", url, "--app", name]
    worker = WorkerProcess("benchmarks.drain", ["--worker", *own])
    drainer = WorkerProcess(
        "benchmarks.drain",
        ["--drainer", *own, "--pause", str(pause * 1000), "--chunk-us", str(chunk_us)],
    )
    try:
        await worker.start()
        async with bench.app:
            load_s = await _load(bench, jobs, same_lane)
            await asyncio.sleep(1.0)  # the worker connects and settles
            # without a drain
            stop = asyncio.Event()
            traffic = asyncio.create_task(_traffic(bench, interval, stop))
            t0 = time.time()
            await asyncio.sleep(window)
            stop.set()
            sent = await traffic
            quiet = _summary(await _delays(sent, t0 + 0.5, time.time()))
            # while A is drained
            await meter.config_set("slowlog-log-slower-than", SLOWLOG_US)
            await meter.config_set("slowlog-max-len", 1_000_000)
            await meter.slowlog_reset()
            stop = asyncio.Event()
            traffic = asyncio.create_task(_traffic(bench, interval, stop))
            await asyncio.sleep(0.5)
            await drainer.start()
            done = await drainer.next_event("done", timeout=600)
            stop.set()
            sent += await traffic
            during = _summary(await _delays(sent, done["first"], done["last"]))
            logged = await _slowlog(meter)
            ran_a = int((await bench.app.stats()).get("completed", 0)) - len(sent)
        await worker.stop(timeout=120)
    finally:
        await meter.config_set("slowlog-log-slower-than", saved["slowlog-log-slower-than"])
        await meter.config_set("slowlog-max-len", saved["slowlog-max-len"])
        await worker.close()
        await drainer.close()
        await delete_matching(meter, f"{AppKeys.for_app(name).prefix}*")
        await meter.aclose()
    drain_calls = [ms for fn, ms in logged if fn == "drain"]
    others = [ms for fn, ms in logged if fn != "drain"]
    span = done["last"] - done["first"]
    return {
        "server": f"{server.get('server_name', 'redis')} {server['redis_version']}",
        "load_average": os.getloadavg(),
        "jobs": jobs,
        "load_s": load_s,
        "interval_ms": interval * 1000,
        "pause_ms": pause * 1000,
        "chunk_us": chunk_us,
        "a_lane": "default (the worker runs A too)" if same_lane else "held (no worker)",
        "b_without_drain": quiet,
        "b_during_drain": during,
        "p99_ratio": during["p99_ms"] / quiet["p99_ms"],
        "drain": {
            "cancelled": done["cancelled"],
            "calls": done["calls"],
            "rounds": done["rounds"],
            "seconds": done["seconds"],
            "jobs_per_s": done["cancelled"] / done["seconds"],
            "first_to_last_call_s": span,
            # the server's CPU time (the script's clock): the SLOWLOG's wall time less
            # what the machine's other processes took from the server meanwhile
            "longest_call_cpu_ms": done["longest_cpu_ms"],
        },
        "slowlog": {
            "threshold_us": SLOWLOG_US,
            "drain_calls_logged": len(drain_calls),
            "drain_max_ms": max(drain_calls, default=0.0),
            f"drain_over_{OVER_MS:g}ms": sum(1 for ms in drain_calls if ms > OVER_MS),
            "other_fcalls_logged": len(others),
            "other_max_ms": max(others, default=0.0),
        },
        "a_jobs_run_meanwhile": max(0, ran_a),
    }


@contextlib.contextmanager
def _server(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with RedisServer() as server:
        yield server.url


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None, help="default: a private server")
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--interval", type=float, default=5.0, help="ms between B's jobs")
    parser.add_argument("--window", type=float, default=8.0, help="s of B without a drain")
    parser.add_argument("--pause", type=float, default=0.0, help="ms between drain calls")
    parser.add_argument(
        "--chunk-us", type=int, default=CHUNK_BUDGET_US, help="server CPU us per drain call"
    )
    parser.add_argument("--same-lane", action="store_true", help="A's jobs in B's lane")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--drainer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--app", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        run_loop(_worker(args.redis_url, args.app))
    elif args.drainer:
        run_loop(_drainer(args.redis_url, args.app, args.pause / 1000, args.chunk_us))
    if args.worker or args.drainer:
        emit("exit", commands={})
        return
    with _server(args.redis_url) as url:
        result = run_loop(
            bench_drain(
                url,
                jobs=args.jobs,
                interval=args.interval / 1000,
                window=args.window,
                pause=args.pause / 1000,
                chunk_us=args.chunk_us,
                same_lane=args.same_lane,
            )
        )
    quiet, during, drain, log = (
        result["b_without_drain"],
        result["b_during_drain"],
        result["drain"],
        result["slowlog"],
    )
    print(
        f"B start delay without a drain: p50 {quiet['p50_ms']:.2f} ms, "
        f"p99 {quiet['p99_ms']:.2f} ms ({quiet['jobs']} jobs); during the drain: "
        f"p50 {during['p50_ms']:.2f} ms, p99 {during['p99_ms']:.2f} ms ({during['jobs']} jobs); "
        f"p99 ratio {result['p99_ratio']:.2f}",
        file=sys.stderr,
    )
    print(
        f"drain: {drain['cancelled']} jobs in {drain['seconds']:.2f} s "
        f"({drain['jobs_per_s']:.0f} jobs/s, {drain['calls']} calls); slowlog: longest drain call "
        f"{log['drain_max_ms']:.2f} ms, {log[f'drain_over_{OVER_MS:g}ms']} over {OVER_MS:g} ms "
        f"(its CPU time at most {drain['longest_call_cpu_ms']:.2f} ms)",
        file=sys.stderr,
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
