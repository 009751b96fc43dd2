"""Server memory under a long stream of short jobs with retention set: does it stay flat?

``python -m benchmarks.memory --jobs 1000000`` runs that many no-op jobs through one
in-process worker, feeding them in batches so that the backlog stays bounded, and
samples the server's ``INFO memory`` ``used_memory`` at evenly spaced points of
progress (plus once after the drain). It prints the samples and the growth of the
samples after warm-up relative to the level at warm-up (the sample at ``--warmup``
of the run, 20 % by default). Without ``--redis-url`` it starts a private server.

:func:`measure` is also what ``tests/faults/test_memory_flat.py`` runs at a smaller
size, where the bound is asserted; here the figures are only reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from dataclasses import asdict, dataclass, field

import redis.asyncio as aioredis

from fairlane import App
from fairlane.app.worker import Worker
from fairlane.config.settings import load_settings
from fairlane.policy.backoff import Backoff
from fairlane.policy.retention import Retention
from fairlane.store.api import unlink_matching
from fairlane.testing import RedisServer

__all__ = ["MemoryRun", "Sample", "main", "measure"]


@dataclass(frozen=True, slots=True)
class Sample:
    """``used_memory`` (bytes) when ``done`` jobs had completed, ``at`` s into the run."""

    done: int
    used_memory: int
    at: float


@dataclass(slots=True)
class MemoryRun:
    jobs: int
    keep: int
    seconds: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    drained: Sample | None = None  # after the last job completed, nothing queued
    warmup: float = 0.2

    @property
    def baseline(self) -> Sample:
        """The first sample at or past the warm-up fraction of the run."""
        cut = self.jobs * self.warmup
        return next(s for s in self.samples if s.done >= cut)

    @property
    def after_warmup(self) -> list[Sample]:
        return [s for s in self.samples if s.done >= self.baseline.done]

    @property
    def growth(self) -> float:
        """Highest level after warm-up (the drain included) over the level at warm-up."""
        levels = [s.used_memory for s in self.after_warmup]
        if self.drained is not None:
            levels.append(self.drained.used_memory)
        return max(levels) / self.baseline.used_memory

    def report(self) -> str:
        lines = [
            f"{self.jobs:,} jobs in {self.seconds:.1f}s ({self.jobs / self.seconds:,.0f} jobs/s), "
            f"retention: {self.keep:,} completed records",
            f"{'completed':>12} {'used_memory':>14} {'MiB':>8} {'s':>7}",
        ]
        for s in [*self.samples, *([self.drained] if self.drained else [])]:
            lines.append(
                f"{s.done:>12,} {s.used_memory:>14,} {s.used_memory / 2**20:>8.2f} {s.at:>7.1f}"
            )
        base = self.baseline
        lines.append(
            f"level at warm-up ({base.done:,} jobs): {base.used_memory / 2**20:.2f} MiB; "
            f"highest after it: {self.growth:.3f}x"
        )
        return "\n".join(lines)


async def _used_memory(client: aioredis.Redis) -> int:
    info = await client.info("memory")
    return int(info["used_memory"])


async def _noop(n: int) -> None:
    return None


async def measure(
    url: str,
    jobs: int,
    *,
    samples: int = 20,
    keep: int = 1000,
    batch: int = 1000,
    backlog: int = 5000,
    concurrency: int = 100,
    warmup: float = 0.2,
    app_name: str | None = None,
    keep_keys: bool = False,
) -> MemoryRun:
    """Run ``jobs`` no-op jobs through a worker with retention ``keep``; sample memory.

    The app's keys are deleted afterwards unless ``keep_keys`` (to inspect them)."""
    name = app_name or "memflat_" + secrets.token_hex(3)
    settings = load_settings(
        environ={},
        redis_url=url,
        worker={"concurrency": concurrency, "idle_block": 0.5, "grace_period": 1.0},
    )
    app = App(name, redis_url=url, settings=settings)
    # a failed record would be retained too: bound both, by count (age trims only on sweeps)
    noop = app.task(
        name="noop", attempts=1, backoff=Backoff(0, 0, "none"), retention=Retention(keep, keep)
    )(_noop)
    run = MemoryRun(jobs=jobs, keep=keep, warmup=warmup)
    step = max(1, jobs // samples)
    probe = aioredis.Redis.from_url(url)
    try:
        async with app:
            worker = Worker(app, lanes=[app.settings.default_lane], concurrency=concurrency)
            serving = asyncio.create_task(worker.run())
            started = time.monotonic()
            enqueued, next_sample = 0, step

            async def completed() -> int:
                return (await app.stats()).get("completed", 0)

            done = 0
            while done < jobs:
                if serving.done():
                    serving.result()  # a crashed worker fails the run with its error
                    raise RuntimeError("the worker stopped before the jobs were done")
                while enqueued < jobs and enqueued - done < backlog:
                    size = min(batch, jobs - enqueued)
                    await noop.enqueue_many([(enqueued + i,) for i in range(size)], trace=False)
                    enqueued += size
                done = await completed()
                while done >= next_sample and next_sample <= jobs:
                    run.samples.append(
                        Sample(done, await _used_memory(probe), time.monotonic() - started)
                    )
                    next_sample += step
                if enqueued - done >= backlog or enqueued >= jobs:
                    await asyncio.sleep(0.01)
            run.seconds = time.monotonic() - started
            run.drained = Sample(done, await _used_memory(probe), run.seconds)
            worker.stop()
            await serving
            if not keep_keys:
                await unlink_matching(probe, f"*{{fl:{name}}}*")
    finally:
        await probe.aclose()
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--keep", type=int, default=1000, help="completed records retained")
    parser.add_argument("--warmup", type=float, default=0.2, help="fraction of the run")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--redis-url", help="a server to use (default: a private one)")
    parser.add_argument("--json", help="also write the samples to this file")
    args = parser.parse_args(argv)

    async def go(url: str) -> MemoryRun:
        return await measure(
            url,
            args.jobs,
            samples=args.samples,
            keep=args.keep,
            warmup=args.warmup,
            concurrency=args.concurrency,
        )

    if args.redis_url:
        run = asyncio.run(go(args.redis_url))
    else:
        with RedisServer() as server:
            run = asyncio.run(go(server.url))
    print(run.report())
    if args.json:
        with open(args.json, "w") as out:
            json.dump({**asdict(run), "growth": run.growth}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
