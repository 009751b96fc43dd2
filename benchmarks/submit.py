"""Admission decisions per second: concurrent submitters against a lane with admission.

``processes`` submitter processes each call ``task.submit`` in a loop for ``seconds``,
awaiting each call before the next (one at a time per process), for 100 tenants in
turn, one unit per job. The lane's pool has ``capacity`` units (by default more than
the run can submit, so every job is accepted; a smaller one measures a mix of accepted
and rejected). No worker runs: each decision is the enqueue script's admission path,
which reserves units and stores the job, or refuses it. The figures are the decisions
per second over all processes (decisions / the slowest process's loop time), each
status's count, and the per-call latency p50/p99/max across all calls; and where a
call's time goes: the submitters' CPU time per call (their Python, the client library
and the socket calls) and the server's FCALL microseconds per call (``INFO
commandstats``, reset before the submitters start; the server is the run's alone).

Run: ``python -m benchmarks.submit [--redis-url URL] [--processes 4] [--seconds 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import time
from collections import Counter
from typing import Any

import redis.asyncio as aioredis

from benchmarks.common import delete_matching, percentile
from fairlane import App
from fairlane.config.pools import parse_config
from fairlane.runtime.loop import run as run_loop
from fairlane.store.keys import AppKeys

DEFAULT_URL = "redis://127.0.0.1:6379/0"
TENANTS = 100
TASK = "bench.submit_noop"


def config(capacity: float) -> dict[str, Any]:
    """One pool on the default lane; queue bounds far above what a run submits."""
    return {
        "pools": {
            "default": {
                "capacity_units": capacity,
                "classes": {
                    "standard": {
                        "nominal_share": 1.0,
                        "max_queue": 10_000_000,
                        "response_when_full": "reject",
                    }
                },
            }
        },
        "estimation": {"safety_multiplier": 1.0},
    }


def make_app(name: str, url: str, capacity: float) -> tuple[App, Any]:
    app = App(name, redis_url=url, config=parse_config(config(capacity)))

    @app.task(name=TASK)
    async def noop(n: int) -> int:
        return n

    return app, noop


async def _submitter(
    url: str, name: str, capacity: float, seconds: float, *, index: int, start: Any
) -> dict[str, Any]:
    app, noop = make_app(name, url, capacity)
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    async with app:
        await asyncio.to_thread(start.wait, 60)  # every process connected: go together
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        end = t0 + seconds
        n = 0
        while True:
            before = time.perf_counter()
            if before >= end:
                break
            adm = await noop.submit(n, tenant=f"t{(n + index) % TENANTS}", estimate=1.0)
            latencies.append((time.perf_counter() - before) * 1000)
            statuses[adm.status] += 1
            n += 1
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
    return {"elapsed": elapsed, "cpu": cpu, "latencies_ms": latencies, "statuses": dict(statuses)}


def _child(args: tuple[str, str, float, float, int, Any, Any]) -> None:
    url, name, capacity, seconds, index, start, results = args
    results.put(run_loop(_submitter(url, name, capacity, seconds, index=index, start=start)))


async def _reset_stats(url: str) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        await client.config_resetstat()
    finally:
        await client.aclose()


async def _fcall_stats(url: str) -> dict[str, int]:
    """FCALL's calls and microseconds in ``INFO commandstats`` since the reset."""
    client = aioredis.Redis.from_url(url)
    try:
        stat = (await client.info("commandstats")).get("cmdstat_fcall", {})
    finally:
        await client.aclose()
    return {"calls": int(stat.get("calls", 0)), "usec": int(stat.get("usec", 0))}


async def _cleanup(url: str, name: str) -> None:
    app = App(name, redis_url=url)
    async with app:
        await delete_matching(app.store.client, f"{AppKeys.for_app(name).prefix}*")


def bench_submit(url: str, processes: int, seconds: float, capacity: float) -> dict[str, Any]:
    name = f"flsubmit_{os.getpid()}"
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(processes)
    run_loop(_reset_stats(url))
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_child, args=((url, name, capacity, seconds, i, start, results),))
        for i in range(processes)
    ]
    try:
        for p in procs:
            p.start()
        runs = [results.get(timeout=seconds + 120) for _ in procs]
        # read before the clean-up: the submitters' FCALLs alone (they declare their
        # lane before the start barrier, so those few calls are in the count too)
        fcall = run_loop(_fcall_stats(url))
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        run_loop(_cleanup(url, name))
    latencies = [x for r in runs for x in r["latencies_ms"]]
    statuses: Counter[str] = Counter()
    for r in runs:
        statuses.update(r["statuses"])
    elapsed = max(r["elapsed"] for r in runs)
    decisions = len(latencies)
    return {
        "processes": processes,
        "seconds": seconds,
        "capacity_units": capacity,
        "decisions": len(latencies),
        "decisions_per_s": len(latencies) / elapsed,
        "per_process_per_s": [len(r["latencies_ms"]) / r["elapsed"] for r in runs],
        "statuses": dict(statuses),
        # where a call's time goes: the submitter's own CPU (Python, the client library,
        # the socket calls) and the server's time in the enqueue function
        "client_cpu_us_per_call": sum(r["cpu"] for r in runs) * 1e6 / decisions,
        "server_fcall_us_per_call": fcall["usec"] / max(1, fcall["calls"]),
        "server_fcall_calls": fcall["calls"],
        "latency_ms": {
            "p50": percentile(latencies, 50),
            "p99": percentile(latencies, 99),
            "max": max(latencies),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=DEFAULT_URL)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--capacity",
        type=float,
        default=10_000_000,
        help="pool capacity in units (one per job; default: every job is accepted)",
    )
    args = parser.parse_args()
    r = bench_submit(args.redis_url, args.processes, args.seconds, args.capacity)
    lat = r["latency_ms"]
    print(
        f"{r['decisions']} decisions in {r['seconds']:g} s from {r['processes']} processes: "
        f"{r['decisions_per_s']:,.0f}/s; latency p50 {lat['p50']:.2f} ms, "
        f"p99 {lat['p99']:.2f} ms, max {lat['max']:.2f} ms; {r['statuses']}; per call: "
        f"client CPU {r['client_cpu_us_per_call']:.0f} us, "
        f"server FCALL {r['server_fcall_us_per_call']:.0f} us"
    )
    print(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
