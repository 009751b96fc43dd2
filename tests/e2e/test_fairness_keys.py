"""Fairness keys with real workers: two levels of fair sharing, tenants then their own keys.

Order-based, not timing-based: tasks record who starts, in order, and the tests count.

* A tenant that spreads its flood over 1,000 fairness keys against a tenant that puts its
  whole flood on one key, both backlogged in one class: the starts split 50/50 within 2
  points (tenants share by weight, whatever their keys).
* Inside one tenant, an end user flooding its key does not stall another end user: the
  quiet key's job starts within a few starts of its arrival. The same run without keys
  (the tenant's jobs in arrival order) is the contrast, and shows the test can fail.
* A bad key is refused at the call site, with a clear error, and nothing is written.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fairlane import App
from tests.e2e.helpers import WAIT, app_keys, make_app, running_worker

pytestmark = pytest.mark.anyio

SPREAD_KEYS, PER_KEY = 1000, 2
CONCURRENCY = 10


async def test_a_flood_over_1000_keys_gets_no_more_than_a_flood_on_one(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    started: list[str] = []
    flood = SPREAD_KEYS * PER_KEY
    done = asyncio.Event()

    @app.task
    async def work(owner: str) -> None:
        started.append(owner)
        if len(started) >= 2 * flood:
            done.set()

    async with app:
        for k in range(SPREAD_KEYS):
            await work.enqueue_many(
                [("spread",)] * PER_KEY, tenant="spread", fairness_key=f"user-{k}"
            )
        await work.enqueue_many([("single",)] * flood, tenant="single", fairness_key="one")
        async with running_worker(app, concurrency=CONCURRENCY):
            async with asyncio.timeout(4 * WAIT):
                await done.wait()
    # both tenants are backlogged until one of them runs out: count the first half
    window = started[:flood]
    share = window.count("spread") / len(window)
    print(f"spread over {SPREAD_KEYS} keys: {share:.1%} of the first {len(window)} starts")
    assert abs(share - 0.5) <= 0.02, share


async def _starts_before_quiet(redis_url: str, namespace: str, *, keyed: bool) -> list[int]:
    """For each of three quiet jobs, how many flood jobs started between its enqueue and
    its start, with the flood and the quiet end user in one tenant."""
    app = make_app(namespace, redis_url)
    started: list[str] = []
    swing = asyncio.Event()

    @app.task
    async def work(owner: str, seconds: float) -> None:
        started.append(owner)
        if len(started) >= 3 * CONCURRENCY:
            swing.set()
        await asyncio.sleep(seconds)

    def key(name: str) -> dict[str, Any]:
        return {"fairness_key": name} if keyed else {}

    between: list[int] = []
    async with app:
        flood = await work.enqueue_many([("flood", 0.01)] * 300, tenant="acme", **key("big"))
        async with running_worker(app, concurrency=CONCURRENCY):
            async with asyncio.timeout(2 * WAIT):
                await swing.wait()
                for n in range(3):
                    arrival = len(started)
                    quiet = await work.enqueue(f"quiet{n}", 0.0, tenant="acme", **key("small"))
                    await quiet.result()
                    start = started.index(f"quiet{n}")
                    between.append(started[arrival:start].count("flood"))
                for job in flood:
                    await job.result()
    return between


async def test_a_flooding_end_user_does_not_stall_another_of_the_same_tenant(
    redis_url: str, namespace: str
) -> None:
    between = await _starts_before_quiet(redis_url, namespace, keyed=True)
    print(f"keyed: flood starts between each quiet arrival and its start: {between}")
    # the quiet key enters at the head of the tenant's queue: only flood jobs already
    # leased when it arrived (at most a worker's slots' worth) can start before it
    assert max(between) <= CONCURRENCY, between


async def test_without_keys_the_quiet_end_user_waits_behind_the_flood(
    redis_url: str, namespace: str
) -> None:
    between = await _starts_before_quiet(redis_url, namespace, keyed=False)
    print(f"unkeyed: flood starts between each quiet arrival and its start: {between}")
    # arrival order within the tenant: the first quiet job waits for most of the flood
    assert between[0] >= 100, between


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ("", ValueError),
        ("user\x00one", ValueError),
        ("line\nbreak", ValueError),
        ("k" * 201, ValueError),
        (42, TypeError),
    ],
)
async def test_a_bad_key_is_refused_at_the_call_site_and_nothing_is_written(
    redis_url: str, namespace: str, bad: Any, error: type[Exception]
) -> None:
    app: App = make_app(namespace, redis_url)

    @app.task
    async def work(i: int) -> None:
        return None

    async with app:
        before = await app_keys(redis_url, namespace)
        with pytest.raises(error, match="fairness_key"):
            await work.enqueue(1, tenant="acme", fairness_key=bad)
        with pytest.raises(error, match="fairness_key"):
            await work.submit(1, tenant="acme", fairness_key=bad)
        with pytest.raises(error, match="fairness_key"):
            await work.enqueue_many([(1,), (2,)], tenant="acme", fairness_key=bad)
        with pytest.raises(error, match="fairness_key"):
            await app.tenants.configure_key("acme", bad, weight=2)
        assert await app_keys(redis_url, namespace) == before


async def test_a_keys_weight_gives_it_that_share_of_its_tenant(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    started: list[str] = []
    done = asyncio.Event()

    @app.task
    async def work(owner: str) -> None:
        started.append(owner)
        if len(started) >= 800:
            done.set()

    async with app:
        await app.tenants.configure_key("acme", "gold", weight=3)
        assert await app.tenants.key_weights("acme") == {"gold": 3.0}
        await work.enqueue_many([("gold",)] * 400, tenant="acme", fairness_key="gold")
        await work.enqueue_many([("plain",)] * 400, tenant="acme", fairness_key="plain")
        async with running_worker(app, concurrency=CONCURRENCY):
            async with asyncio.timeout(2 * WAIT):
                await done.wait()
        await app.tenants.configure_key("acme", "gold", weight=1)
        assert await app.tenants.key_weights("acme") == {}
    window = started[:400]
    share = window.count("gold") / len(window)
    assert abs(share - 0.75) <= 0.02, share
