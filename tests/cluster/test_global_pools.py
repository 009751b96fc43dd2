"""Global admission pools on a private 3-primary cluster: one pool for an app of three
shards.

The pool holds 4 units; every job reserves 1 (safety multiplier 1) and the class
rejects when full. Tenants of all three shards submit; after every submission the units
reserved on the three shards (their ``ar:`` fields) are read and summed. Reservations
rise only in a submission (the test's, one at a time: a rejecting pool admits nothing
later) and fall when jobs end, so a sum read after each submission, shard by shard, is
at most the sum just after it: a sum within the pool at every read means within it at
every instant. Then the demand moves to one shard, whose jobs hold until released: it
gets the whole pool within a few of the balancer's passes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from fairlane import App, FairlaneConfig
from fairlane.app.task import Task
from fairlane.config.pools import Pool
from fairlane.policy.admission import EstimationSettings, PoolConfig
from fairlane.policy.classes import ClassTable
from fairlane.runtime.worker import Worker
from tests.e2e.helpers import WAIT, fast_settings, running_workers
from tests.shards.test_sharding import tenants_of

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.contract,
    pytest.mark.parametrize("redis_url", ["cluster"], indirect=True),
]

SHARDS, UNITS = 3, 4


def _app(namespace: str, redis_url: str) -> App:
    pool = Pool("default", ClassTable(), PoolConfig(capacity_units=UNITS))
    config = FairlaneConfig(
        pools={"default": pool},
        estimation=EstimationSettings(max_reservation_units=UNITS, safety_multiplier=1.0),
    )
    return App(
        namespace, redis_url=redis_url, settings=fast_settings(), config=config, shards=SHARDS
    )


async def reserved(app: App) -> list[int]:
    """Each shard's reserved milli-units in the pool."""
    out = []
    for store in app.stores:
        state = await store.client.hgetall(store.keys.lane("default").state)
        out.append(sum(int(v) for k, v in state.items() if k.startswith(b"ar:")))
    return out


def _passes(workers: Sequence[Worker]) -> int:
    return sum(w.balancer.passes for w in workers if w.balancer is not None)


async def test_a_pool_holds_for_the_whole_app(redis_url: str, namespace: str) -> None:
    app = _app(namespace, redis_url)
    gate = asyncio.Event()

    @app.task
    async def work(hold: bool) -> None:
        if hold:
            await gate.wait()
        else:
            await asyncio.sleep(0.03)

    tenants = tenants_of(app, range(SHARDS), per_shard=2)
    everyone = [t for names in tenants.values() for t in names]
    peaks: list[int] = []
    async with app:
        # before any worker (and so any balancer): an equal share each, 1 job of 1.33 units
        first = [await work.submit(True, tenant=t, estimate=1.0) for t in everyone]
        assert sum(a.status == "accepted" for a in first) == SHARDS
        assert await reserved(app) == [1000] * SHARDS
        gate.set()
        async with running_workers(app, count=2, concurrency=16) as workers:
            accepted = []
            for i in range(90):
                adm = await work.submit(False, tenant=everyone[i % len(everyone)], estimate=1.0)
                peaks.append(sum(await reserved(app)))
                if adm.status == "accepted" and adm.job is not None:
                    accepted.append(adm.job)
                await asyncio.sleep(0.01)
            await asyncio.gather(*(j.result(timeout=WAIT) for j in accepted))
            moved = [
                await _demand_on(app, work, workers, tenant=tenants[s][0], gate=gate, peaks=peaks)
                for s in (1, 2)
            ]
    assert max(peaks) <= UNITS * 1000, peaks
    print(f"\nsubmits {len(peaks)}, accepted {len(accepted)} of 90, peak {max(peaks)} mu")
    for seconds, passes in moved:
        print(f"whole pool on one shard after {seconds:.2f} s, {passes} passes")
        assert passes <= 6, f"the pool reached one shard after {seconds:.2f} s, {passes} passes"


async def _demand_on(
    app: App,
    work: Task[Any, Any],
    workers: Sequence[Worker],
    *,
    tenant: str,
    gate: asyncio.Event,
    peaks: list[int],
) -> tuple[float, int]:
    """Only ``tenant`` submits, jobs that hold until released, until it holds the whole
    pool; how long that took and how many passes, then its jobs are released."""
    gate.clear()
    asked, passes = time.monotonic(), _passes(workers)
    held = []
    async with asyncio.timeout(WAIT):
        while len(held) < UNITS:
            adm = await work.submit(True, tenant=tenant, estimate=1.0)
            peaks.append(sum(await reserved(app)))
            if adm.status == "accepted" and adm.job is not None:
                held.append(adm.job)
            else:
                await asyncio.sleep(0.02)
    took = (time.monotonic() - asked, _passes(workers) - passes)
    gate.set()
    await asyncio.gather(*(j.result(timeout=WAIT) for j in held))
    return took
