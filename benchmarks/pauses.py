"""An operator's pauses with real workers, on a private server.

``python -m benchmarks.pauses`` runs an app with three workers of 8 slots each in this
process (one clock for every start), no-op jobs of 2 ms:

* ``shares``: tenants ``paused`` (weight 1), ``light`` (1) and ``heavy`` (2), 2,000 jobs
  each, ``paused`` paused before the workers start. Every start is checked against the
  pause table as it stood (a start of a paused tenant's job is a violation). While
  paused: light's and heavy's shares of the starts against their weights' shares of
  what is left (1/3, 2/3). After 1,200 starts the tenant is resumed: its share of the
  next 600 starts against its weight's share (1/4), and the starts until its first.
* ``task``: 50,000 jobs of a task parked by its pause (a tenant's flood of it under
  way), then resumed: how long the resume took, the longest server call it made
  (SLOWLOG), and the seconds until the first parked job started again.
* ``overhead``: a drain of 20,000 no-op jobs with nothing paused, then with a pause of
  an unrelated tenant in force (the pause table is read once per fetch): jobs/s of
  each, and their ratio.

The figures are ratios and counts within one run; the server and the workers share the
machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from collections.abc import Callable
from typing import Any

import redis

from benchmarks.common import serving
from fairlane import App
from fairlane.config.settings import load_settings
from fairlane.policy.pauses import Scope, ScopeKind
from fairlane.testing import RedisServer

__all__ = ["main"]

WORKERS, SLOTS = 3, 8


def _app(url: str) -> App:
    settings = load_settings(worker={"concurrency": SLOTS, "idle_block": 0.2})
    return App(f"pz_{secrets.token_hex(3)}", redis_url=url, settings=settings)


async def _until(check: Callable[[], bool], timeout: float = 300.0) -> None:
    """Poll ``check`` (a count the tasks keep) until it holds; TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done after {timeout} s")
        await asyncio.sleep(0.005)


async def shares_run(url: str, per_tenant: int = 2000, held_for: int = 1200) -> dict[str, Any]:
    app = _app(url)
    starts: list[str] = []
    paused = {"paused"}
    violations = 0

    @app.task(name="pz.work")
    async def work(owner: str) -> None:
        nonlocal violations
        if owner in paused:
            violations += 1
        starts.append(owner)
        await asyncio.sleep(0.002)

    async with app:
        await app.tenants.configure("heavy", weight=2.0)
        for tenant in ("paused", "light", "heavy"):
            await work.enqueue_many([(tenant,)] * per_tenant, tenant=tenant)
        await app.tenants.pause("paused", reason="benchmark")

        async def body() -> int:
            await _until(lambda: len(starts) >= held_for)
            paused.clear()  # from here a start of its is not a violation
            at = len(starts)
            await app.tenants.resume("paused")
            await _until(lambda: len(starts) >= at + 600)
            return at

        resumed_at = await serving(app, body, workers=WORKERS, concurrency=SLOTS)
        await app.purge()
    held = starts[:resumed_at]
    after = starts[resumed_at : resumed_at + 600]
    return {
        "violations": violations,
        "while_paused_starts": len(held),
        "light_share": held.count("light") / len(held),
        "heavy_share": held.count("heavy") / len(held),
        "light_target": 1 / 3,
        "heavy_target": 2 / 3,
        "resumed_share_next_600": after.count("paused") / len(after),
        "resumed_target": 1 / 4,
        "starts_until_first_after_resume": after.index("paused") if "paused" in after else None,
    }


async def task_run(url: str, parked: int = 50_000) -> dict[str, Any]:
    app = _app(url)
    first: list[float] = []

    @app.task(name="pz.bad")
    async def bad(n: int) -> None:
        if not first:
            first.append(time.monotonic())

    @app.task(name="pz.good")
    async def good(n: int) -> None:
        await asyncio.sleep(0)

    client = redis.Redis.from_url(url)
    async with app:
        scope = app.pauses.scope(task=bad.name)
        await app.pauses.pause(scope, reason="benchmark")
        for i in range(0, parked, 5000):
            await bad.enqueue_many([(n,) for n in range(i, i + 5000)], tenant="flood")
        await good.enqueue_many([(n,) for n in range(200)], tenant="other")

        async def park_all() -> tuple[float, float]:
            await _until(lambda: _parked(client, app) >= parked, timeout=600)
            client.config_set("slowlog-max-len", 1_000_000)
            client.config_set("slowlog-log-slower-than", 0)
            client.slowlog_reset()
            began = time.monotonic()
            await app.pauses.resume(scope)
            took = time.monotonic() - began
            await _until(lambda: bool(first))
            return took, first[0] - began

        took, to_first = await serving(app, park_all, workers=WORKERS, concurrency=SLOTS)
        client.config_set("slowlog-log-slower-than", 10_000)
        log = client.slowlog_get(1_000_000)
        fcalls = [e["duration"] for e in log if _function(e) == b"resume"]
        dispatch = [e["duration"] for e in log if _function(e) == b"exchange"]
        await app.purge()
    return {
        "parked": parked,
        "resume_seconds": took,
        "resume_calls": len(fcalls),
        "longest_resume_call_ms": max(fcalls) / 1000 if fcalls else None,
        "longest_exchange_call_ms": max(dispatch) / 1000 if dispatch else None,
        "seconds_to_first_start": to_first,
    }


def _function(entry: dict[str, Any]) -> bytes:
    """The library function a SLOWLOG entry called (b'' for any other command)."""
    words = entry["command"].split()
    if len(words) < 2 or words[0].upper() != b"FCALL":
        return b""
    return words[1].rpartition(b"_")[2]


def _parked(client: redis.Redis, app: App) -> int:
    total = 0
    for key in client.scan_iter(match=f"{app.store.keys.prefix}parked:*", count=1000):
        total += int(client.zcard(key))
    return total


async def _drain_rate(url: str, jobs: int, *, paused: bool) -> float:
    app = _app(url)
    done = 0

    @app.task(name="pz.noop")
    async def noop(n: int) -> None:
        nonlocal done
        done += 1

    async with app:
        await noop.enqueue_many([(n,) for n in range(jobs)], tenant="acme")
        if paused:
            unrelated = Scope(ScopeKind.TENANT, tenant="someone-else")
            await app.pauses.pause(unrelated, check_tenant=False)
        began = time.monotonic()
        await serving(app, lambda: _until(lambda: done >= jobs), workers=WORKERS, concurrency=SLOTS)
        rate = jobs / (time.monotonic() - began)
        await app.purge()
    return rate


async def overhead_run(url: str, jobs: int = 20_000) -> dict[str, Any]:
    plain = await _drain_rate(url, jobs, paused=False)
    paused = await _drain_rate(url, jobs, paused=True)
    again = await _drain_rate(url, jobs, paused=False)
    return {
        "no_pause_jobs_per_s": plain,
        "unrelated_pause_jobs_per_s": paused,
        "no_pause_again_jobs_per_s": again,
        "ratio": paused / ((plain + again) / 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pauses", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--redis-url", help="a server to use instead of a private one")
    args = parser.parse_args(argv)

    def run_all(url: str) -> dict[str, Any]:
        return {
            "shares": asyncio.run(shares_run(url)),
            "task": asyncio.run(task_run(url)),
            "overhead": asyncio.run(overhead_run(url)),
        }

    if args.redis_url:
        figures = run_all(args.redis_url)
    else:
        with RedisServer() as server:
            figures = run_all(server.url)
    if args.json:
        json.dump(figures, sys.stdout, indent=2)
        print()
        return 0
    for name, values in figures.items():
        shown = ", ".join(
            f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
        )
        print(f"{name}: {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
