"""Global keys across the shards of one app, on a private 3-primary cluster.

``python -m benchmarks.globalkeys`` starts a private :class:`fairlane.testing.RedisCluster`
of three primaries and runs an app of three shards with two workers of 16 slots each
(in this process: one clock for every job's record), tenants in every shard:

* ``limit``: ``limits={"model:big": 4}``, jobs of 40 ms: the most jobs on the key at
  once, counted at every start.
* ``rate``: ``rates={"model:rpm": Rate(20, per=1.0)}``: the most starts in any one
  second (the promise: at most ``limit + burst``, 40) and the rate over the run.
* ``moves``: the demand on one shard only, then on another: seconds from the enqueue
  until that shard runs 90 % of the key's limit (4 of 4).
* ``shares``: one tenant alone in one shard against four in another, equal weights,
  all waiting on one key of limit 10: the lone tenant's share of the key's starts.
* ``pause``: an upstream's pushback (``Throttled``, 2 s) on one shard: seconds until the
  last start on the key in another shard.
* ``traffic``: the balancer's calls a second with the workers idle and a key known to
  every shard, whatever the job rate (commands counted by each primary).

The figures are ratios and bounds within one run; on a 2-core machine the three
servers and the workers share the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from typing import Any

import redis

from benchmarks.common import serving
from fairlane import App, Rate, Throttled
from fairlane.app.worker import Worker
from fairlane.config.settings import load_settings
from fairlane.policy.shards import shard_of_tenant
from fairlane.testing import RedisCluster

__all__ = ["main"]

SHARDS = 3
Spans = list[tuple[float, float, str]]


def _app(url: str) -> App:
    settings = load_settings(worker={"concurrency": 16, "idle_block": 0.5})
    return App(f"gk_{secrets.token_hex(3)}", redis_url=url, settings=settings, shards=SHARDS)


def _tenants(per_shard: int) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {s: [] for s in range(SHARDS)}
    i = 0
    while any(len(v) < per_shard for v in found.values()):
        name = f"tenant-{i}"
        names = found[shard_of_tenant(name, SHARDS)]
        if len(names) < per_shard:
            names.append(name)
        i += 1
    return found


def peak(spans: Spans) -> int:
    events = sorted([(s, 1) for s, _, _ in spans] + [(e, -1) for _, e, _ in spans])
    most = running = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


async def limit_run(url: str) -> dict[str, Any]:
    app = _app(url)
    spans: Spans = []

    @app.task(name="gk.limit", limits={"model:big": 4})
    async def call(who: str) -> None:
        start = time.monotonic()
        await asyncio.sleep(0.04)
        spans.append((start, time.monotonic(), who))

    async with app:
        jobs = []
        for names in _tenants(2).values():
            for t in names:
                jobs += await call.enqueue_many([(t,)] * 50, tenant=t)
        await serving(app, lambda: asyncio.gather(*(j.result(timeout=120) for j in jobs)))
        await app.purge()
    busy = max(e for _, e, _ in spans) - min(s for s, _, _ in spans)
    return {
        "limit": 4,
        "peak": peak(spans),
        "jobs": len(spans),
        "utilization": len(spans) * 0.04 / busy / 4,
    }


async def rate_run(url: str) -> dict[str, Any]:
    app = _app(url)
    starts: list[float] = []

    @app.task(name="gk.rate", rates={"model:rpm": Rate(20, per=1.0)})
    async def call() -> None:
        starts.append(time.monotonic())

    async with app:
        jobs = []
        for (t,) in _tenants(1).values():
            jobs += await call.enqueue_many([()] * 60, tenant=t)
        await serving(app, lambda: asyncio.gather(*(j.result(timeout=120) for j in jobs)))
        await app.purge()
    starts.sort()
    worst = max(sum(1 for t in starts if s <= t < s + 1.0) for s in starts)
    steady = [t for t in starts if t >= starts[0] + 2.0]
    rate = (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else 0.0
    return {"limit": 20, "burst": 20, "worst_second": worst, "steady_rate": rate}


async def moves_run(url: str) -> dict[str, Any]:
    app = _app(url)
    spans: Spans = []

    @app.task(name="gk.moves", limits={"model:big": 4})
    async def call(who: str) -> None:
        start = time.monotonic()
        await asyncio.sleep(0.1)
        spans.append((start, time.monotonic(), who))

    tenants = _tenants(1)
    reached: list[float] = []

    async def body() -> None:
        for t in (tenants[1][0], tenants[2][0]):
            asked = time.monotonic()
            jobs = await call.enqueue_many([(t,)] * 60, tenant=t)
            await asyncio.gather(*(j.result(timeout=120) for j in jobs))
            mine = [x for x in spans if x[2] == t]
            full = min(s for s, _, _ in mine if sum(1 for a, b, _ in mine if a <= s < b) >= 4)
            reached.append(full - asked)

    async with app:
        await serving(app, body)
        await app.purge()
    return {"seconds_to_full": reached, "peak": peak(spans)}


async def shares_run(url: str) -> dict[str, Any]:
    app = _app(url)
    starts: list[tuple[float, str]] = []

    @app.task(name="gk.shares", limits={"model:big": 10})
    async def call(who: str) -> None:
        starts.append((time.monotonic(), who))
        await asyncio.sleep(0.04)

    tenants = _tenants(4)
    lone, crowd = tenants[0][0], tenants[1]
    async with app:
        jobs = await call.enqueue_many([(lone,)] * 200, tenant=lone)
        for t in crowd:
            jobs += await call.enqueue_many([(t,)] * 200, tenant=t)
        await serving(app, lambda: asyncio.gather(*(j.result(timeout=120) for j in jobs)))
        await app.purge()
    order = [w for _, w in sorted(starts)]
    end = min(len(order) - order[::-1].index(t) for t in [lone, *crowd])
    window = order[len(order) // 10 : end]
    return {"lone_share": window.count(lone) / len(window), "fair_share": 0.2}


async def pause_run(url: str) -> dict[str, Any]:
    app = _app(url)
    starts: list[tuple[float, str]] = []
    pushed: list[float] = []
    tenants = _tenants(1)
    loud = tenants[0][0]

    @app.task(name="gk.pause", limits={"model:big": 6})
    async def call(who: str) -> None:
        now = time.monotonic()
        if who == loud and not pushed:
            pushed.append(now)
            raise Throttled("model:big", retry_after=2.0)
        starts.append((now, who))
        await asyncio.sleep(0.05)

    async with app:
        jobs = []
        for (t,) in tenants.values():
            jobs += await call.enqueue_many([(t,)] * 100, tenant=t)
        await serving(app, lambda: asyncio.gather(*(j.result(timeout=120) for j in jobs)))
        await app.purge()
    at = pushed[0]
    others = [t - at for t, who in starts if who != loud and at <= t < at + 1.9]
    return {"last_start_elsewhere_after_pushback": max(others, default=0.0), "pause": 2.0}


def _calls(cluster: RedisCluster) -> int:
    total = 0
    for server in cluster.servers:
        client = redis.Redis(host=server.host, port=server.port)
        try:
            total += sum(int(v["calls"]) for v in client.info("commandstats").values())
        finally:
            client.close()
    return total


async def traffic_run(cluster: RedisCluster, seconds: float = 5.0) -> dict[str, Any]:
    """The app's idle traffic with the balancer and without it: the difference is the
    balancer's, whatever the job rate."""
    out: dict[str, Any] = {}
    for balanced in (True, False):
        app = _app(cluster.url)

        @app.task(name="gk.traffic", limits={"model:big": 4})
        async def call() -> None:
            return None

        workers = [Worker(app, lanes=["default"], concurrency=16) for _ in range(2)]
        if not balanced:
            for w in workers:
                w.balancer = None
        async with app:
            jobs = []
            for (t,) in _tenants(1).values():
                jobs += await call.enqueue_many([()] * 5, tenant=t)
            async with asyncio.TaskGroup() as group:
                for w in workers:
                    group.create_task(w.run())
                if balanced:
                    await asyncio.gather(*(j.result(timeout=60) for j in jobs))
                await asyncio.sleep(1.0)
                before, passes = _calls(cluster), _passes(workers)
                await asyncio.sleep(seconds)
                calls = (_calls(cluster) - before) / seconds
                rate = (_passes(workers) - passes) / seconds
                for w in workers:
                    w.stop()
            await app.purge()
        out["calls_per_second" if balanced else "calls_per_second_without_balancer"] = calls
        if balanced:
            out["passes_per_second"] = rate
    out["balancer_calls_per_second"] = (
        out["calls_per_second"] - out["calls_per_second_without_balancer"]
    )
    return out


def _passes(workers: list[Worker]) -> int:
    return sum(w.balancer.passes for w in workers if w.balancer is not None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.globalkeys", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    with RedisCluster(masters=3) as cluster:
        url = cluster.url
        figures = {
            "limit": asyncio.run(limit_run(url)),
            "rate": asyncio.run(rate_run(url)),
            "moves": asyncio.run(moves_run(url)),
            "shares": asyncio.run(shares_run(url)),
            "pause": asyncio.run(pause_run(url)),
            "traffic": asyncio.run(traffic_run(cluster)),
        }
    if args.json:
        json.dump(figures, sys.stdout, indent=2)
        print()
        return 0
    for name, values in figures.items():
        shown = ", ".join(f"{k}={_fmt(v)}" for k, v in values.items())
        print(f"{name}: {shown}")
    return 0


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
