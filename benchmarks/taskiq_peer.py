"""The peer's side of the suite: taskiq-redis measured exactly as Fairlane is.

Same phases, same server, same worker process model (``benchmarks.taskiq_worker``),
same task bodies; each phase uses a namespace of its own (stream, consumer group,
result keys) and deletes its keys when done. taskiq-redis has no batch enqueue: its
batch figure is ``asyncio.gather`` over ``kiq`` calls, ``cfg.batch`` at a time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from typing import Any

from redis.asyncio.lock import Lock

from benchmarks.common import (
    Meter,
    WorkerProcess,
    call_report,
    counting,
    delete_matching,
    idle_counts,
    script_commands,
    wait_until,
)
from benchmarks.config import Config
from benchmarks.fairlane_suite import idle_report, latency_report
from benchmarks.taskiq_worker import BenchBroker, make_broker

# the only Lua taskiq-redis runs is redis-py's Lock (around its reclaim of unacked messages)
IN_SCRIPTS = script_commands(
    Lock.LUA_RELEASE_SCRIPT, Lock.LUA_EXTEND_SCRIPT, Lock.LUA_REACQUIRE_SCRIPT
)
WORKER = "benchmarks.taskiq_worker"
RECOVERY_IDLE_TIMEOUT_MS = 2_000  # the counterpart of Fairlane's 2 s lease in that phase


def _worker(
    cfg: Config,
    ns: str,
    concurrency: int,
    *,
    consumer: str | None = None,
    idle_timeout_ms: int | None = None,
) -> WorkerProcess:
    args = ["--url", cfg.url, "--ns", ns, "--concurrency", str(concurrency)]
    if consumer:
        args += ["--consumer", consumer]
    if idle_timeout_ms:
        args += ["--idle-timeout-ms", str(idle_timeout_ms)]
    return WorkerProcess(WORKER, args)


async def _cleanup(meter: Meter, ns: str) -> None:
    with meter.own():
        await delete_matching(meter.client, f"*{ns}*")


def _field(info: dict[Any, Any], name: str) -> Any:
    return info.get(name, info.get(name.encode()))


async def _drained(meter: Meter, bench: BenchBroker, last_id: bytes) -> bool:
    """Every message delivered and acknowledged (acked once its result is stored)."""
    with meter.own():
        groups = await meter.client.xinfo_groups(bench.stream)
    for group in groups:
        if _field(group, "name") in (bench.group, bench.group.encode()):
            delivered = _field(group, "last-delivered-id")
            delivered = delivered.encode() if isinstance(delivered, str) else delivered
            return bool(delivered == last_id and int(_field(group, "pending")) == 0)
    return False


async def _last_id(meter: Meter, bench: BenchBroker) -> bytes:
    with meter.own():
        entries = await meter.client.xrevrange(bench.stream, count=1)
    return bytes(entries[0][0])


async def _kiq_gather(bench: BenchBroker, jobs: int, batch: int) -> None:
    for start in range(0, jobs, batch):
        await asyncio.gather(*(bench.noop.kiq(i) for i in range(start, min(jobs, start + batch))))


async def _kiq_loop(bench: BenchBroker, jobs: int) -> None:
    for i in range(jobs):
        await bench.noop.kiq(i)


async def throughput(cfg: Config, meter: Meter) -> dict[str, Any]:
    ns = f"tqbench_{cfg.run_id}_tp"
    bench = make_broker(ns, cfg.url)
    producer: Counter[str] = Counter()
    worker = _worker(cfg, ns, cfg.concurrency)
    try:
        with counting(producer):
            await bench.broker.startup()  # creates the consumer group
            try:
                await meter.reset()
                base = Counter(producer)  # not the connection set-up
                started = time.perf_counter()
                await _kiq_gather(bench, cfg.jobs, cfg.batch)
                enqueue_s = time.perf_counter() - started
                enqueue_calls = await meter.calls()
                enqueue_counted = producer - base
            finally:
                await bench.broker.shutdown()
        last_id = await _last_id(meter, bench)
        await meter.reset()
        ready = await worker.start()
        done = await wait_until(lambda: _drained(meter, bench, last_id), timeout=cfg.timeout)
        worker_counted = await worker.stop(cfg.timeout)
        drain_calls = await meter.calls()
    finally:
        await worker.close()
        await _cleanup(meter, ns)
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


async def latency(cfg: Config, meter: Meter) -> dict[str, Any]:
    ns = f"tqbench_{cfg.run_id}_lat"
    bench = make_broker(ns, cfg.url)
    worker = _worker(cfg, ns, cfg.concurrency)
    starts: list[float] = []
    round_trips: list[float] = []
    try:
        await bench.broker.startup()
        try:
            await worker.start()
            await asyncio.sleep(cfg.settle)
            for i in range(cfg.latency_warmup + cfg.latency_samples):
                await asyncio.sleep(cfg.latency_gap)
                before = time.time_ns()
                task = await bench.stamp.kiq()
                # taskiq polls for results; 2 ms keeps the wait short without flooding
                result = await task.wait_result(check_interval=0.002, timeout=30)
                after = time.time_ns()
                if i >= cfg.latency_warmup:
                    starts.append((int(result.return_value) - before) / 1e6)
                    round_trips.append((after - before) / 1e6)
        finally:
            await bench.broker.shutdown()
        await worker.stop()
    finally:
        await worker.close()
        await _cleanup(meter, ns)
    return latency_report(starts, round_trips)


async def enqueue(cfg: Config, meter: Meter) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for variant in ("many", "loop"):
        ns = f"tqbench_{cfg.run_id}_enq_{variant}"
        bench = make_broker(ns, cfg.url)
        producer: Counter[str] = Counter()
        try:
            with counting(producer):
                await bench.broker.startup()
                try:
                    await meter.reset()
                    base = Counter(producer)
                    started = time.perf_counter()
                    if variant == "many":
                        await _kiq_gather(bench, cfg.jobs, cfg.batch)
                    else:
                        await _kiq_loop(bench, cfg.jobs)
                    seconds = time.perf_counter() - started
                    calls = await meter.calls()
                    counted = producer - base
                finally:
                    await bench.broker.shutdown()
        finally:
            await _cleanup(meter, ns)
        out[variant] = {
            "jobs": cfg.jobs,
            "batch": cfg.batch if variant == "many" else 1,
            "seconds": seconds,
            "jobs_per_s": cfg.jobs / seconds,
            "calls": call_report(calls, counted, cfg.jobs, IN_SCRIPTS),
        }
    return out


async def idle(cfg: Config, meter: Meter) -> dict[str, Any]:
    ns = f"tqbench_{cfg.run_id}_idle"
    worker = _worker(cfg, ns, cfg.concurrency)
    try:
        calls, counted = await idle_counts(
            worker, meter, settle=cfg.idle_settle, seconds=cfg.idle_seconds
        )
    finally:
        await worker.close()
        await _cleanup(meter, ns)
    return idle_report(cfg.idle_seconds, calls, counted, IN_SCRIPTS)


async def recovery(cfg: Config, meter: Meter) -> dict[str, Any]:
    """As Fairlane's: messages pending on the killed consumer are reclaimed (XAUTOCLAIM)
    by the other once idle for ``RECOVERY_IDLE_TIMEOUT_MS``."""
    ns = f"tqbench_{cfg.run_id}_rec"
    bench = make_broker(ns, cfg.url)
    a = _worker(
        cfg, ns, cfg.recovery_concurrency, consumer="A", idle_timeout_ms=RECOVERY_IDLE_TIMEOUT_MS
    )
    b = _worker(
        cfg, ns, cfg.recovery_concurrency, consumer="B", idle_timeout_ms=RECOVERY_IDLE_TIMEOUT_MS
    )
    try:
        await bench.broker.startup()
        try:
            for _ in range(cfg.recovery_jobs):
                await bench.nap.kiq(cfg.recovery_task_s)
        finally:
            await bench.broker.shutdown()
        last_id = await _last_id(meter, bench)
        await asyncio.gather(a.start(), b.start())
        await asyncio.sleep(cfg.recovery_kill_after)
        killed = time.time()
        os.kill(a.pid, signal.SIGKILL)
        with meter.own():
            pending = await meter.client.xpending_range(
                bench.stream, bench.group, min="-", max="+", count=100_000, consumername="A"
            )
        held = {p["message_id"] for p in pending}

        async def held_done() -> bool:
            with meter.own():
                still = await meter.client.xpending_range(
                    bench.stream, bench.group, min="-", max="+", count=100_000
                )
            return not held & {p["message_id"] for p in still}

        recovered = await wait_until(held_done, interval=0.01, timeout=cfg.timeout)
        all_done = await wait_until(
            lambda: _drained(meter, bench, last_id), interval=0.01, timeout=cfg.timeout
        )
        await b.stop()
    finally:
        await a.close()
        await b.close()
        await _cleanup(meter, ns)
    return {
        "jobs": cfg.recovery_jobs,
        "task_seconds": cfg.recovery_task_s,
        "concurrency": cfg.recovery_concurrency,
        "held_by_killed": len(held),
        "recovery_seconds": recovered - killed,
        "all_done_seconds": all_done - killed,
        "idle_timeout_seconds": RECOVERY_IDLE_TIMEOUT_MS / 1000,
    }


PHASES = {
    "throughput": throughput,
    "latency": latency,
    "enqueue": enqueue,
    "idle": idle,
    "recovery": recovery,
}
