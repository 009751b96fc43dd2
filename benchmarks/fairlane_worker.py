"""The Fairlane side's app and tasks, and its worker process.

Run as ``python -m benchmarks.fairlane_worker``.

The benchmark starts this script in a separate process so that the worker has an
event loop of its own, as in production. It reports on stdout, one JSON line per
event: ``ready`` just before ``App.run_worker`` is called (the worker still has to
connect) and ``exit`` when it is done.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass
from typing import Literal

from benchmarks.common import emit
from fairlane import App, Backoff, Retention, Task
from fairlane.runtime.loop import run as run_loop

NOOP, PAIR, STAMP = "bench.noop", "bench.pair", "bench.stamp"
NAP, WORK = "bench.nap", "bench.work"


@dataclass(frozen=True, slots=True)
class BenchApp:
    app: App
    noop: Task[[int], int]
    pair: Task[[int, str], int]
    stamp: Task[[], int]
    nap: Task[[float], float]
    work: Task[[float], int]


def make_app(name: str, url: str, charge: Literal["jobs", "cost"] = "cost") -> BenchApp:
    """The benchmark's app, declared identically by the producer and the workers."""
    app = App(name, redis_url=url, charge=charge)

    @app.task(name=NOOP)
    async def noop(n: int) -> int:
        return n

    @app.task(name=PAIR)
    async def pair(n: int, tag: str) -> int:
        return n

    @app.task(name=STAMP)
    async def stamp() -> int:
        return time.time_ns()

    # no backoff: a reclaimed job is runnable again as soon as it is swept
    @app.task(name=NAP, backoff=Backoff(base=0.0, cap=0.0, jitter="none"))
    async def nap(seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    # every record kept: the noisy-neighbor run reads when each flood job started
    @app.task(name=WORK, retention=Retention(completed=None, failed=None))
    async def work(seconds: float) -> int:
        started = time.time_ns()
        await asyncio.sleep(seconds)  # a model or tool call: the slot is held, the loop free
        return started

    return BenchApp(app, noop, pair, stamp, nap, work)


async def _serve(args: argparse.Namespace) -> None:
    bench = make_app(args.app, args.url, args.charge)
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    # until the worker installs its own handlers (graceful stop), SIGTERM cancels the start
    loop.add_signal_handler(signal.SIGTERM, main.cancel)
    emit("ready")
    with contextlib.suppress(asyncio.CancelledError):
        await bench.app.run_worker(
            concurrency=args.concurrency, burst=args.burst, handle_signals=True
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--app", required=True)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--burst", action="store_true")
    parser.add_argument("--charge", choices=["jobs", "cost"], default="cost")
    args = parser.parse_args(argv)
    # neither system logs per job at WARNING, so logging costs the same on both sides
    logging.basicConfig(level=logging.WARNING)
    run_loop(_serve(args))
    emit("exit", commands={})


if __name__ == "__main__":
    main()
