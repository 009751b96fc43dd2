"""One app's load over a Redis Cluster's primaries, with and without shards.

``python -m benchmarks.shards`` starts a private 3-master cluster, then for each shard
count (``--shards 1 3`` by default) enqueues ``--jobs`` no-op jobs from ``--tenants``
tenants and drains them with one worker (50 slots, in this process) serving every shard.
It reports the jobs per second of the drain and, from each primary's ``INFO
commandstats``, the share of the server's commands that primary ran: with one shard
every command of the app goes to one primary; with one shard per primary they spread.
Then it runs two shards on one worker with a flood in one shard and a steady tenant in
the other, and reports the steady shard's share of the starts while both have work,
against its computed fair share across shards (one half).

The figures are ratios within one run (shares, and jobs/s of one count against the
other); on a 2-core machine the three server processes and the workers share the same
cores, so absolute throughput says little about a real cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from dataclasses import asdict, dataclass

import redis

from fairlane import App
from fairlane.config.settings import load_settings
from fairlane.policy.shards import shard_of_tenant
from fairlane.testing import RedisCluster

__all__ = ["main"]


@dataclass(frozen=True, slots=True)
class SpreadRun:
    shards: int
    jobs: int
    seconds: float
    jobs_per_second: float
    #: each primary's share of the commands the run sent (in slot order)
    command_shares: list[float]


def _app(url: str, name: str, shards: int) -> App:
    settings = load_settings(worker={"concurrency": 50, "fetch_batch": 50})
    app = App(name, redis_url=url, settings=settings, shards=shards)

    @app.task(name="bench.noop")
    async def noop() -> None:
        return None

    @app.task(name="bench.sleep")
    async def sleep(seconds: float) -> None:
        await asyncio.sleep(seconds)

    return app


def _commands(cluster: RedisCluster) -> list[int]:
    counts = []
    for server in cluster.servers:
        client = redis.Redis(host=server.host, port=server.port)
        try:
            stats = client.info("commandstats")
            counts.append(sum(int(v["calls"]) for v in stats.values()))
        finally:
            client.close()
    return counts


async def _drain(cluster: RedisCluster, app: App, jobs: int, tenants: int) -> SpreadRun:
    task = app.get_task("bench.noop")
    per_tenant = jobs // tenants
    async with app:
        for t in range(tenants):
            await task.enqueue_many([()] * per_tenant, tenant=f"tenant-{t}")
        before = _commands(cluster)
        started = time.perf_counter()
        await app.run_worker(concurrency=50, burst=True)
        seconds = time.perf_counter() - started
        after = _commands(cluster)
        await app.purge()
    sent = [a - b for a, b in zip(after, before, strict=True)]
    total = sum(sent) or 1
    shares = [round(n / total, 3) for n in sent]
    return SpreadRun(app.shards, jobs, seconds, jobs / seconds, shares)


def spread(cluster: RedisCluster, shards: int, jobs: int, tenants: int) -> SpreadRun:
    app = _app(cluster.url, f"bench_{secrets.token_hex(3)}", shards)
    return asyncio.run(_drain(cluster, app, jobs, tenants))


async def cross_shard_share(url: str, flood_jobs: int, steady_jobs: int) -> dict[str, float]:
    """A flood in shard 0 and a steady tenant in shard 1 on one 4-slot worker: the
    steady shard's share of the starts while both had work."""
    name = f"bench_{secrets.token_hex(3)}"
    app = App(name, redis_url=url, settings=load_settings(), shards=2)
    starts: list[int] = []
    flooding = asyncio.Event()

    @app.task(name="bench.mark")
    async def mark(shard: int) -> None:
        starts.append(shard)
        if len(starts) >= 20:
            flooding.set()
        await asyncio.sleep(0.01)

    names = [f"tenant-{i}" for i in range(100)]
    flood = next(n for n in names if shard_of_tenant(n, 2) == 0)
    steady = next(n for n in names if shard_of_tenant(n, 2) == 1)
    async with app:
        await mark.enqueue_many([(0,)] * flood_jobs, tenant=flood)
        worker = asyncio.create_task(app.run_worker(concurrency=4, burst=True))
        async with asyncio.timeout(60):
            await flooding.wait()
        await mark.enqueue_many([(1,)] * steady_jobs, tenant=steady)
        await worker
        await app.purge()
    first = starts.index(1)
    last = len(starts) - 1 - starts[::-1].index(1)
    overlap = starts[first : last + 1]
    return {"steady_share": overlap.count(1) / len(overlap), "fair_share": 0.5}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shards", description=__doc__)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    with RedisCluster(masters=3) as cluster:
        runs = [spread(cluster, count, args.jobs, args.tenants) for count in args.shards]
        share = asyncio.run(cross_shard_share(cluster.url, 1_500, 300))
    if args.json:
        json.dump({"runs": [asdict(r) for r in runs], "cross_shard": share}, sys.stdout, indent=2)
        print()
        return 0
    for run in runs:
        shares = ", ".join(f"{s:.0%}" for s in run.command_shares)
        print(
            f"shards={run.shards}: {run.jobs} jobs in {run.seconds:.1f} s "
            f"({run.jobs_per_second:,.0f} jobs/s); commands per primary: {shares}"
        )
    print(
        f"two shards, a flood in one: the other's share of the starts while both had "
        f"work {share['steady_share']:.2f} (fair: {share['fair_share']:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
