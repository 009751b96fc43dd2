"""Drain: what cancelling a tenant's 200,000 queued jobs costs the other tenants.

Tenant A has ``jobs`` no-op jobs queued (200,000 by default) in a lane no worker serves
(``held``), so that its backlog stays queued, as a backlog an operator drains does;
with ``--same-lane`` they are in B's lane, where the worker runs them too, fairly with
B's. Tenant B submits a no-op job every ``interval`` ms, one ``enqueue`` each, and a
worker process (concurrency 20) runs it; B's start delay is the job's start (its task's
clock) minus the moment before its enqueue. The server's time is all a drain takes
from B: what B waits for is the calls the drain holds the server with.

Another process drains A (``App.drain(tenant=A)``, as ``fairlane drain`` does) in
slices: ``slice`` seconds on, ``slice`` seconds off (its progress callback waits out an
off slice), from the start to the end of the drain, B's traffic running throughout. B's
jobs enqueued in an on slice are the ones "during the drain", those of an off slice the
ones "without": the two sets share the run's conditions (a machine whose other load
comes and goes weighs on both alike), which two windows one after the other do not.
A job enqueued within 50 ms of a slice's edge counts in neither. The figures: B's start
delay p50/p99/max each way and the ratio of the p99s (target: within 2x), the drain's
time, jobs/s over its on slices, its calls, the server's CPU time of its longest call
(its own clock), and the server's ``SLOWLOG`` over the run (threshold 500 us): the
longest drain call's wall time and how many took over 5 ms (target: none). The server
is a private one unless ``--redis-url`` names another (its slowlog settings are put back).

Run: ``python -m benchmarks.drain [--jobs 200000] [--chunk-us 500] [--pause 0]
[--slice 1] [--same-lane] [--redis-url URL | --server-binary PATH]``; ``--worker`` and
``--drainer`` are its processes' own entries.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import secrets
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from benchmarks.common import WorkerProcess, delete_matching, emit, percentile
from fairlane import App, Job, Task
from fairlane.app.drain import DrainProgress
from fairlane.config.settings import load_settings
from fairlane.runtime.loop import run as run_loop
from fairlane.store.drain import CHUNK_BUDGET_US
from fairlane.store.keys import AppKeys
from fairlane.testing import RedisServer

A, B = "tenant-a", "tenant-b"
SLOWLOG_US = 500
OVER_MS = 5.0
EDGE = 0.05  # s around a slice's edge whose jobs count in neither set


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


def _on(moment: float, t0: float, width: float) -> bool | None:
    """Whether ``moment`` is in an on slice (None: near an edge, or before ``t0``)."""
    if moment < t0:
        return None
    k, into = divmod(moment - t0, width)
    if into < EDGE or width - into < EDGE:
        return None
    return int(k) % 2 == 0


async def _worker(url: str, app_name: str) -> None:
    """The worker process: B's lane (A's too with --same-lane), until SIGTERM."""
    bench = make_app(app_name, url)
    emit("ready")
    await bench.app.run_worker(lanes=["default"], concurrency=20, handle_signals=True)


async def _drainer(url: str, app_name: str, args: argparse.Namespace) -> None:
    """The drain process: drains A in on slices from ``t0``, then reports."""
    bench = make_app(app_name, url)
    t0, width = args.t0, args.slice
    used: list[float] = []

    async def gate(progress: DrainProgress) -> None:
        used.append(progress.call_us / 1000)
        now = time.time()
        k = math.floor((now - t0) / width)
        if k % 2:  # an off slice: wait for the next on slice
            await asyncio.sleep(t0 + (k + 1) * width - now)

    async with bench.app:
        emit("ready")
        await asyncio.sleep(max(0.0, t0 - time.time()))
        report = await bench.app.drain(
            tenant=A, progress=gate, actor="bench", pause=args.pause / 1000, chunk_us=args.chunk_us
        )
        emit(
            "done",
            cancelled=report.cancelled,
            calls=report.calls,
            rounds=report.rounds,
            seconds=report.seconds,
            cpu_ms={"p50": percentile(used, 50), "p99": percentile(used, 99), "max": max(used)},
        )


async def _load(bench: DrainApp, jobs: int, same_lane: bool) -> float:
    began = time.perf_counter()
    task = bench.noop if same_lane else bench.held
    for start in range(0, jobs, 5000):
        await task.enqueue_many([(i,) for i in range(start, min(jobs, start + 5000))], tenant=A)
    return time.perf_counter() - began


async def _traffic(
    bench: DrainApp, interval: float, stop: asyncio.Event
) -> list[tuple[float, Job[int]]]:
    """B's jobs, one every ``interval`` s until ``stop``: (moment before enqueue, job)."""
    sent: list[tuple[float, Job[int]]] = []
    while not stop.is_set():
        before = time.time()
        sent.append((before, await bench.stamp.enqueue(tenant=B)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, before + interval - time.time()))
    return sent


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


async def bench_drain(url: str, args: argparse.Namespace) -> dict[str, Any]:
    name = f"fldrain_{secrets.token_hex(3)}"
    bench = make_app(name, url)
    meter = aioredis.Redis.from_url(url)
    saved = await meter.config_get("slowlog-*")
    server = await meter.info("server")
    own = ["--redis-url", url, "--app", name]
    worker = WorkerProcess("benchmarks.drain", ["--worker", *own])
    try:
        await worker.start()
        async with bench.app:
            load_s = await _load(bench, args.jobs, args.same_lane)
            await asyncio.sleep(1.0)  # the worker connects and settles
            await meter.config_set("slowlog-log-slower-than", SLOWLOG_US)
            await meter.config_set("slowlog-max-len", 1_000_000)
            await meter.slowlog_reset()
            t0 = time.time() + 3.0  # the drain process starts meanwhile
            passed = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("pause", "chunk_us")]
            drainer = WorkerProcess(
                "benchmarks.drain",
                ["--drainer", *own, f"--t0={t0!r}", f"--slice={args.slice}", *passed],
            )
            stop = asyncio.Event()
            traffic = asyncio.create_task(_traffic(bench, args.interval / 1000, stop))
            try:
                await drainer.start()
                done = await drainer.next_event("done", timeout=900)
                ended = time.time()
            finally:
                stop.set()
                sent = await traffic
                await drainer.close()
            split: dict[bool, list[float]] = {True: [], False: []}
            for before, job in sent:
                started_ns = await job.result(timeout=120)
                on = _on(before, t0, args.slice) if before < ended - EDGE else None
                if on is not None:
                    split[on].append(started_ns / 1e6 - before * 1000)
            logged = await _slowlog(meter)
            ran_a = int((await bench.app.stats()).get("completed", 0)) - len(sent)
        await worker.stop(timeout=120)
    finally:
        await meter.config_set("slowlog-log-slower-than", saved["slowlog-log-slower-than"])
        await meter.config_set("slowlog-max-len", saved["slowlog-max-len"])
        await worker.close()
        await delete_matching(meter, f"{AppKeys.for_app(name).prefix}*")
        await meter.aclose()
    drain_calls = [ms for fn, ms in logged if fn == "drain"]
    others = [ms for fn, ms in logged if fn != "drain"]
    quiet, during = _summary(split[False]), _summary(split[True])
    # the drain ran in its on slices alone: about half its time
    on_s = sum(1 for k in range(math.ceil(done["seconds"] / args.slice)) if k % 2 == 0)
    on_s = min(on_s * args.slice, done["seconds"])
    return {
        "server": f"{server.get('server_name', 'redis')} {server['redis_version']}",
        "load_average": os.getloadavg(),
        "jobs": args.jobs,
        "load_s": load_s,
        "interval_ms": args.interval,
        "slice_s": args.slice,
        "pause_ms": args.pause,
        "chunk_us": args.chunk_us,
        "a_lane": "default (the worker runs A too)" if args.same_lane else "held (no worker)",
        "b_without_drain": quiet,
        "b_during_drain": during,
        "p99_ratio": during["p99_ms"] / quiet["p99_ms"],
        "drain": {
            "cancelled": done["cancelled"],
            "calls": done["calls"],
            "rounds": done["rounds"],
            "seconds": done["seconds"],
            "on_seconds": on_s,
            "jobs_per_on_s": done["cancelled"] / on_s,
            # the server's CPU time of a call, by the script's own clock (SLOWLOG's wall
            # time less what the machine's other processes took from the server)
            "call_cpu_ms": done["cpu_ms"],
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
def _server(url: str | None, binary: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with RedisServer(binary) as server:
        yield server.url


def _print(result: dict[str, Any]) -> None:
    quiet, during = result["b_without_drain"], result["b_during_drain"]
    drain, log = result["drain"], result["slowlog"]
    print(
        f"B start delay without the drain: p50 {quiet['p50_ms']:.2f} ms, "
        f"p99 {quiet['p99_ms']:.2f} ms ({quiet['jobs']} jobs); during it: "
        f"p50 {during['p50_ms']:.2f} ms, p99 {during['p99_ms']:.2f} ms ({during['jobs']} jobs); "
        f"p99 ratio {result['p99_ratio']:.2f}",
        file=sys.stderr,
    )
    print(
        f"drain: {drain['cancelled']} jobs in {drain['on_seconds']:.2f} s on "
        f"({drain['jobs_per_on_s']:.0f} jobs/s, {drain['calls']} calls of server CPU p50 "
        f"{drain['call_cpu_ms']['p50']:.2f} ms, p99 {drain['call_cpu_ms']['p99']:.2f} ms, max "
        f"{drain['call_cpu_ms']['max']:.2f} ms); slowlog: longest drain call "
        f"{log['drain_max_ms']:.2f} ms, {log[f'drain_over_{OVER_MS:g}ms']} over {OVER_MS:g} ms; "
        f"load average {result['load_average'][0]:.2f}",
        file=sys.stderr,
    )
    print(json.dumps(result, indent=2))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=None, help="default: a private server")
    parser.add_argument("--server-binary", default=None, help="the private server's binary")
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--interval", type=float, default=5.0, help="ms between B's jobs")
    parser.add_argument("--slice", type=float, default=1.0, help="s on, then s off")
    parser.add_argument("--pause", type=float, default=0.0, help="ms between drain calls")
    parser.add_argument("--chunk-us", type=int, default=CHUNK_BUDGET_US, help="server CPU a call")
    parser.add_argument("--same-lane", action="store_true", help="A's jobs in B's lane")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--drainer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--app", default="", help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker or args.drainer:
        if args.worker:
            run_loop(_worker(args.redis_url, args.app))
        else:
            run_loop(_drainer(args.redis_url, args.app, args))
        emit("exit", commands={})
        return
    with _server(args.redis_url, args.server_binary) as url:
        _print(run_loop(bench_drain(url, args)))


if __name__ == "__main__":
    main()
