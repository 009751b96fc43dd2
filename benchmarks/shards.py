"""One app's load over a Redis Cluster's primaries, with and without shards.

``python -m benchmarks.shards`` starts a private 3-master cluster, then for each shard
count (``--shards 1 3`` by default) enqueues ``--jobs`` no-op jobs from ``--tenants``
tenants and drains them with one worker (50 slots, in this process) serving every shard.
It reports the jobs per second of the drain and, from each primary's ``INFO
commandstats``, the share of the server's commands that primary ran: with one shard
every command of the app goes to one primary; with one shard per primary they spread.
Then it measures how one worker shares its slots between shards (by the weight waiting
in each, ``fairlane.policy.shardshare``), each tenant's share of the starts against its
computed fair share (its weight over all the weight waiting): two shards with a flood in
one and a steady tenant in the other (fair: one half each, while both have work); one
tenant alone in one shard against four in the other, all backlogged, equal weights
(fair: 0.20 for the lone tenant); one tenant in each of three shards, weights 5:3:2
(fair: 0.5, 0.3, 0.2). ``--share-only`` skips the drains.

``--keyed`` drains each shard count twice, without a key and with a global key on
every job (``limits={"bench:global": 100000}``, a limit the worker never reaches, so
the figure is what the key costs, parts and balancer included), and prints the keyed
drain's jobs per second against the unkeyed one's.

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
from fairlane.app.worker import Worker
from fairlane.config.settings import load_settings
from fairlane.policy.shards import shard_of_tenant
from fairlane.testing import RedisCluster

__all__ = ["main"]


@dataclass(frozen=True, slots=True)
class SpreadRun:
    shards: int
    keyed: bool
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

    @app.task(name="bench.keyed", limits={"bench:global": 100_000})
    async def keyed() -> None:
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


async def _drain(
    cluster: RedisCluster, app: App, jobs: int, tenants: int, *, keyed: bool
) -> SpreadRun:
    task = app.get_task("bench.keyed" if keyed else "bench.noop")
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
    return SpreadRun(app.shards, keyed, jobs, seconds, jobs / seconds, shares)


def spread(
    cluster: RedisCluster, shards: int, jobs: int, tenants: int, *, keyed: bool = False
) -> SpreadRun:
    app = _app(cluster.url, f"bench_{secrets.token_hex(3)}", shards)
    return asyncio.run(_drain(cluster, app, jobs, tenants, keyed=keyed))


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


async def backlogged_shares(
    url: str, shards: int, weights: list[tuple[int, float]], *, skip: int = 100, window: int = 600
) -> list[dict[str, float]]:
    """Tenants (a shard and a weight each) all backlogged on one 10-slot worker: each
    one's share of ``window`` starts after the first ``skip``, and its fair share."""
    name = f"bench_{secrets.token_hex(3)}"
    app = App(name, redis_url=url, settings=load_settings(), shards=shards)
    starts: list[str] = []
    counted = asyncio.Event()

    @app.task(name="bench.plain")
    async def plain(who: str) -> None:
        starts.append(who)
        if len(starts) >= skip + window:
            counted.set()
        await asyncio.sleep(0.01)

    pool = (f"tenant-{i}" for i in range(10_000))
    tenants: list[tuple[str, float]] = []
    for shard, weight in weights:
        taken = {t for t, _ in tenants}
        tenants.append(
            (
                next(n for n in pool if shard_of_tenant(n, shards) == shard and n not in taken),
                weight,
            )
        )
    async with app:
        for tenant, weight in tenants:
            await app.tenants.configure(tenant, weight=weight)
            await plain.enqueue_many([(tenant,)] * (skip + window), tenant=tenant)
        worker = Worker(app, lanes=[app.settings.default_lane], concurrency=10)
        running = asyncio.create_task(worker.run())
        async with asyncio.timeout(120):
            await counted.wait()
        worker.stop()
        await running
        await app.purge()
    seen = starts[skip : skip + window]
    total = sum(w for _, w in tenants)
    return [
        {
            "tenant": t,
            "shard": shard_of_tenant(t, shards),
            "share": seen.count(t) / len(seen),
            "fair_share": w / total,
        }
        for t, w in tenants
    ]


def _shares(url: str) -> dict[str, object]:
    return {
        "flood": asyncio.run(cross_shard_share(url, 1_500, 300)),
        "lone_vs_four": asyncio.run(
            backlogged_shares(url, 2, [(0, 1.0), (1, 1.0), (1, 1.0), (1, 1.0), (1, 1.0)])
        ),
        "weights_5_3_2": asyncio.run(backlogged_shares(url, 3, [(0, 5.0), (1, 3.0), (2, 2.0)])),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shards", description=__doc__)
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--share-only", action="store_true", help="only the share scenarios")
    parser.add_argument(
        "--keyed", action="store_true", help="each drain also with a global key on every job"
    )
    parser.add_argument(
        "--no-shares", action="store_true", help="skip the share scenarios (drains only)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    with RedisCluster(masters=3) as cluster:
        variants = (False, True) if args.keyed else (False,)
        runs = (
            []
            if args.share_only
            else [
                spread(cluster, count, args.jobs, args.tenants, keyed=keyed)
                for count in args.shards
                for keyed in variants
            ]
        )
        shares = {} if args.no_shares else _shares(cluster.url)
    if args.json:
        json.dump({"runs": [asdict(r) for r in runs], "cross_shard": shares}, sys.stdout, indent=2)
        print()
        return 0
    for run in runs:
        spread_ = ", ".join(f"{s:.0%}" for s in run.command_shares)
        print(
            f"shards={run.shards}{', a global key on every job' if run.keyed else ''}: "
            f"{run.jobs} jobs in {run.seconds:.1f} s "
            f"({run.jobs_per_second:,.0f} jobs/s); commands per primary: {spread_}"
        )
    plain = {r.shards: r.jobs_per_second for r in runs if not r.keyed}
    for run in runs:
        if run.keyed and run.shards in plain:
            print(
                f"shards={run.shards}: keyed {run.jobs_per_second / plain[run.shards]:.2f}x "
                "the unkeyed drain"
            )
    if not shares:
        return 0
    flood = shares["flood"]
    assert isinstance(flood, dict)
    print(
        f"two shards, a flood in one: the other's share of the starts while both had "
        f"work {flood['steady_share']:.2f} (fair: {flood['fair_share']:.2f})"
    )
    for label, key in (
        ("one tenant alone in shard 0, four in shard 1, equal weights", "lone_vs_four"),
        ("one tenant per shard over three shards, weights 5:3:2", "weights_5_3_2"),
    ):
        rows = shares[key]
        assert isinstance(rows, list)
        figures = "; ".join(
            f"{r['tenant']} (shard {r['shard']}) {r['share']:.3f} (fair {r['fair_share']:.3f})"
            for r in rows
        )
        print(f"{label}: shares of the starts while all are backlogged: {figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
