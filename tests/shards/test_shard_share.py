"""A worker's slots go to the shards by the weight waiting in each (policy/shardshare.py).

One worker serves every shard; every tenant is backlogged on a plain task of equal
duration. A tenant's share of the starts, counted while all of them are backlogged (past
the first exchanges, before any backlog runs out), is its weight's share of all the
weight waiting, within 3 points. The counts are of starts, not times: a loaded machine
slows every job alike. Marked ``contract``: they also run on the local 3-master
cluster, where the shards sit on different primaries.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from fairlane import App
from tests.e2e.helpers import WAIT, running_worker
from tests.shards.test_sharding import sharded_app, tenants_of

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.contract]

CONCURRENCY = 10
JOBS_EACH = 600  # more than any tenant starts by the window's end: all stay backlogged
SKIP = 100  # the first starts, while the loops learn their shards' weights
WINDOW = 600  # starts counted


async def shares_of_starts(app: App, weights: dict[str, float]) -> dict[str, float]:
    """Each tenant's share of ``WINDOW`` starts after the first ``SKIP``, every tenant
    backlogged with ``JOBS_EACH`` jobs of the same task before the worker starts."""
    starts: list[str] = []
    counted = asyncio.Event()

    @app.task
    async def plain(who: str) -> None:
        starts.append(who)
        if len(starts) >= SKIP + WINDOW:
            counted.set()
        await asyncio.sleep(0.01)

    async with app:
        for tenant, weight in weights.items():
            await app.tenants.configure(tenant, weight=weight)
            await plain.enqueue_many([(tenant,)] * JOBS_EACH, tenant=tenant)
        async with running_worker(app, concurrency=CONCURRENCY):
            async with asyncio.timeout(WAIT * 4):
                await counted.wait()
    window = Counter(starts[SKIP : SKIP + WINDOW])
    by_the_end = Counter(starts[: SKIP + WINDOW])
    assert all(by_the_end[t] < JOBS_EACH for t in weights), "a backlog ran out"
    return {t: window[t] / WINDOW for t in weights}


async def test_a_lone_tenant_gets_its_weights_share_not_its_shards(
    redis_url: str, namespace: str
) -> None:
    """One tenant alone in shard 0 against four in shard 1, equal weights: the lone
    tenant's share is 1/5 (a turn about the shards gave it 1/2)."""
    app = sharded_app(namespace, redis_url, shards=2)
    names = tenants_of(app, [0, 1], per_shard=4)
    lone, crowd = names[0][0], names[1]
    shares = await shares_of_starts(app, {lone: 1.0, **dict.fromkeys(crowd, 1.0)})
    assert abs(shares[lone] - 0.20) <= 0.03, f"lone tenant's share {shares[lone]:.3f} (fair 0.20)"
    crowd_share = sum(shares[t] for t in crowd)
    assert abs(crowd_share - 0.80) <= 0.03, f"the crowd's share {crowd_share:.3f} (fair 0.80)"


async def test_three_shards_share_by_their_weights(redis_url: str, namespace: str) -> None:
    """One tenant in each of three shards, weights 5:3:2: shares 0.5, 0.3, 0.2."""
    app = sharded_app(namespace, redis_url, shards=3)
    names = tenants_of(app, [0, 1, 2])
    weights = {names[0][0]: 5.0, names[1][0]: 3.0, names[2][0]: 2.0}
    shares = await shares_of_starts(app, weights)
    for tenant, weight in weights.items():
        fair = weight / 10
        assert abs(shares[tenant] - fair) <= 0.03, (
            f"{tenant} (weight {weight:g}) got {shares[tenant]:.3f} of the starts (fair {fair})"
        )
