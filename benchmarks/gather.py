"""Enqueue, then gather: the results a producer reads back after the fact.

A producer enqueues ``--jobs`` no-op jobs with ``enqueue_many`` (batches of
``--batch``), one worker process of ``benchmarks.fairlane_worker`` (burst mode,
concurrency 100) drains them all, and only then does the producer await every
result (``Job.result``, ``--gather`` at a time). The task keeps the default
retention, so this measures what a user who does not think about retention gets:
how many results come back, how many raise ``JobNotFound`` (with a sample message),
the time of each part, and the server's memory after the drain (``used_memory``
against before the enqueue) with the records kept.

Run: ``python -m benchmarks.gather [--jobs 100000] [--redis-url URL]``; without a URL
a private server is started (the bundled Valkey or ``redis-server``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import time
from typing import Any

import redis.asyncio as aioredis

from benchmarks.common import WorkerProcess, delete_matching
from benchmarks.fairlane_worker import make_app
from fairlane import JobNotFound
from fairlane.testing import RedisServer

WORKER = "benchmarks.fairlane_worker"


async def _used_memory(client: aioredis.Redis) -> int:
    return int((await client.info("memory"))["used_memory"])


async def _gather(handles: list[Any], at_once: int) -> tuple[int, int, str | None]:
    got = missing = 0
    sample: str | None = None
    for start in range(0, len(handles), at_once):
        chunk = handles[start : start + at_once]
        answers = await asyncio.gather(
            *(h.result(timeout=60) for h in chunk), return_exceptions=True
        )
        for answer in answers:
            if isinstance(answer, JobNotFound):
                missing += 1
                sample = sample or str(answer)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                got += 1
    return got, missing, sample


async def run(url: str, jobs: int, batch: int, at_once: int) -> dict[str, Any]:
    """One enqueue-drain-gather round on ``url``; its figures."""
    name = f"gather-{secrets.token_hex(4)}"
    bench = make_app(name, url)
    client = aioredis.Redis.from_url(url)
    figures: dict[str, Any] = {"jobs": jobs, "batch": batch, "gather": at_once}
    try:
        async with bench.app:
            before = await _used_memory(client)
            began = time.perf_counter()
            handles: list[Any] = []
            for start in range(0, jobs, batch):
                calls = [(n,) for n in range(start, min(jobs, start + batch))]
                handles += await bench.noop.enqueue_many(calls)
            figures["enqueue_s"] = time.perf_counter() - began
            worker = WorkerProcess(
                WORKER, ["--url", url, "--app", name, "--concurrency", "100", "--burst"]
            )
            began = time.perf_counter()
            try:
                await worker.start()
                await worker.exited(timeout=900)
            finally:
                await worker.close()
            figures["drain_s"] = time.perf_counter() - began
            figures["memory_mib"] = (await _used_memory(client) - before) / 2**20
            kept = await client.zcard(bench.app.store.keys.kept(bench.noop.name, "ok"))
            figures["kept_records"] = int(kept)
            began = time.perf_counter()
            got, missing, sample = await _gather(handles, at_once)
            figures["gather_s"] = time.perf_counter() - began
            figures.update(results=got, not_found=missing, not_found_message=sample)
    finally:
        await delete_matching(client, f"{{fl:{name}}}*")
        await client.aclose()
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--gather", type=int, default=1000, help="results awaited at once")
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args(argv)
    if args.redis_url:
        figures = asyncio.run(run(args.redis_url, args.jobs, args.batch, args.gather))
    else:
        with RedisServer() as server:
            figures = asyncio.run(run(server.url, args.jobs, args.batch, args.gather))
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
