"""The taskiq-redis side's broker and tasks, and its worker process.

``python -m benchmarks.taskiq_worker`` runs one taskiq receiver (the programmatic
equivalent of ``taskiq worker --workers 1 --max-async-tasks N``) on a
``RedisStreamBroker`` -- taskiq-redis' broker with acknowledgements and redelivery
of unacknowledged messages, the closest to Fairlane's leases -- with results stored
by a ``RedisAsyncResultBackend``. It reports on stdout like ``benchmarks.fairlane_worker``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from taskiq.api import run_receiver_task
from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

from benchmarks.common import emit, install_counter
from fairlane.runtime.loop import run as run_loop

NOOP, STAMP, NAP = "bench.noop", "bench.stamp", "bench.nap"
DEFAULT_IDLE_TIMEOUT_MS = 600_000  # taskiq-redis' default
STOP_GRACE = 5.0  # seconds the receiver gets to stop after SIGTERM


@dataclass(frozen=True, slots=True)
class BenchBroker:
    broker: RedisStreamBroker
    stream: str
    group: str
    noop: Any  # taskiq's decorated tasks (AsyncTaskiqDecoratedTask)
    stamp: Any
    nap: Any


def make_broker(
    ns: str,
    url: str,
    *,
    consumer: str | None = None,
    idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
) -> BenchBroker:
    """The benchmark's broker in namespace ``ns``, declared alike by producer and workers."""
    stream, group = f"{ns}:stream", ns
    backend: RedisAsyncResultBackend[Any] = RedisAsyncResultBackend(url, prefix_str=f"{ns}:result")
    broker = RedisStreamBroker(
        url,
        queue_name=stream,
        consumer_group_name=group,
        consumer_name=consumer,
        idle_timeout=idle_timeout_ms,
    ).with_result_backend(backend)

    @broker.task(task_name=NOOP)
    async def noop(n: int) -> int:
        return n

    @broker.task(task_name=STAMP)
    async def stamp() -> int:
        return time.time_ns()

    @broker.task(task_name=NAP)
    async def nap(seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    return BenchBroker(broker, stream, group, noop, stamp, nap)


async def _serve(args: argparse.Namespace, sink: Counter[str]) -> None:
    bench = make_broker(
        args.ns, args.url, consumer=args.consumer, idle_timeout_ms=args.idle_timeout_ms
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, lambda: emit("counts", commands=dict(sink)))
    serving = asyncio.create_task(
        run_receiver_task(bench.broker, max_async_tasks=args.concurrency, run_startup=True)
    )

    def stop() -> None:
        serving.cancel()
        loop.call_later(STOP_GRACE, _force_exit, serving, sink)

    loop.add_signal_handler(signal.SIGTERM, stop)
    emit("ready")
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await serving
    finally:
        await bench.broker.shutdown()


def _force_exit(serving: asyncio.Task[None], sink: Counter[str]) -> None:
    """The receiver now and then ignores its cancellation (it shields its clean-up);
    the measurements are taken by then, so stop the process rather than hang."""
    if serving.done():
        return
    logging.getLogger("benchmarks").warning(
        "receiver still running %.0fs after SIGTERM; exiting", STOP_GRACE
    )
    emit("exit", commands=dict(sink))
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--ns", required=True)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--consumer", default=None)
    parser.add_argument("--idle-timeout-ms", type=int, default=DEFAULT_IDLE_TIMEOUT_MS)
    args = parser.parse_args(argv)
    # taskiq's CLI logs every task at INFO; WARNING keeps logging out of both sides' figures
    logging.basicConfig(level=logging.WARNING)
    sink = install_counter(process_wide=True)
    assert sink is not None
    # taskiq's own worker command runs on uvloop when installed, as Fairlane's does
    run_loop(_serve(args, sink))
    emit("exit", commands=dict(sink))


if __name__ == "__main__":
    main()
