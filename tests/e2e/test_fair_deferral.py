"""Fair deferral end to end, with a real worker: who a pool admits from its deferred queue.

A class's deferred jobs are admitted tenant-fairly by weight, FIFO within a tenant; a
head that does not fit does not keep a smaller job of another tenant out, and a wide
head is overtaken at most ``OVERTAKE_LIMIT`` times (``fairlane.policy.admission.deferral``,
the contract's Fair deferral). Each test fills a small pool, defers the jobs it studies,
then runs one worker of concurrency 1: every exchange settles one job, so each
readmission pass follows one release of one unit and the order is the rules' own, not a
race. Checks count jobs in the order they ran; no test asserts on timing, and every wait
is bounded.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fairlane import App, Job
from fairlane.config.pools import parse_config
from fairlane.policy.admission import OVERTAKE_LIMIT
from tests.e2e.helpers import WAIT, fast_settings, running_worker

pytestmark = pytest.mark.anyio

LANE = "default"


def deferral_app(namespace: str, redis_url: str, capacity: float) -> App:
    """One deferring class on the default lane; reservations are the declared units."""
    config: dict[str, Any] = {
        "pools": {
            LANE: {
                "capacity_units": capacity,
                "classes": {
                    "standard": {
                        "nominal_share": 1.0,
                        "max_queue": 10_000,
                        "response_when_full": "defer",
                    }
                },
            }
        },
        "estimation": {"safety_multiplier": 1.0, "max_reservation_units": capacity},
    }
    settings = fast_settings()
    return App(namespace, redis_url=redis_url, settings=settings, config=parse_config(config))


async def left_behind(app: App) -> list[str]:
    """The keys of fair deferral (groups, tags, V, finish tags) still on the server."""
    pattern = f"{app.store.keys.prefix}lane:{LANE}:c:*:d*"
    return sorted([k.decode() async for k in app.store.client.scan_iter(match=pattern)])


# -- 1. a flood's deferred jobs and a steady tenant's: shares by weight ------------------------

FLOOD, STEADY = 300, 90
STEADY_WEIGHT = 3.0  # against the flood's 1: the steady tenant's share is 75 %


async def test_steady_tenant_is_admitted_by_weight_not_behind_the_flood(
    redis_url: str, namespace: str
) -> None:
    app = deferral_app(namespace, redis_url, capacity=4)
    ran: list[str] = []

    @app.task
    async def work(who: str) -> None:
        ran.append(who)

    async with app:
        await app.tenants.configure("steady", weight=STEADY_WEIGHT)
        # four units of room: the first four of the flood are admitted, the rest of the
        # flood is deferred, and then every job of the steady tenant
        flood = [await work.submit("flood", tenant="flood", estimate=1.0) for _ in range(FLOOD)]
        steady = [await work.submit("steady", tenant="steady", estimate=1.0) for _ in range(STEADY)]
        assert [a.status for a in flood[:4]] == ["accepted"] * 4
        assert {a.status for a in flood[4:] + steady} == {"deferred"}
        async with running_worker(app, concurrency=1):
            for answer in flood + steady:
                assert answer.job is not None
                await Job(work, answer.job.id).result(timeout=WAIT)
        # once nothing is deferred, nothing of the queue is left: no group, no tag, no V
        assert await left_behind(app) == []
    # behind the four admitted at once, while both tenants had deferred jobs: the steady
    # tenant took its weight's share of what was admitted (FIFO would have given it none
    # until the whole flood had run). The lane's own fair queue orders at most the four
    # admitted jobs, so the window is counted from the fifth job on.
    window = ran[4 : 4 + int(STEADY / 0.75)]
    share = window.count("steady") / len(window)
    assert abs(share - 0.75) <= 0.03, share
    assert ran.count("steady") == STEADY and ran.count("flood") == FLOOD


# -- 2. a wide deferred head, smaller jobs of another tenant behind it -------------------------

FILLERS, SMALLS = 4, 20


async def test_smaller_jobs_pass_a_wide_head_until_it_is_held_for(
    redis_url: str, namespace: str
) -> None:
    app = deferral_app(namespace, redis_url, capacity=4)
    ran: list[str] = []

    @app.task
    async def work(what: str) -> None:
        ran.append(what)
        await asyncio.sleep(0.01)

    async with app:
        # four one-unit fillers take the pool; a job as wide as the pool is deferred,
        # then the small ones of another tenant behind it ("a-wide" sorts first, so it is
        # the first head tried, found not to fit, and pinned)
        fillers = [
            await work.submit("filler", tenant="filler", estimate=1.0) for _ in range(FILLERS)
        ]
        wide = await work.submit("wide", tenant="a-wide", estimate=4.0)
        smalls = [await work.submit("small", tenant="small", estimate=1.0) for _ in range(SMALLS)]
        assert {a.status for a in fillers} == {"accepted"}
        assert (wide.status, wide.reason) == ("deferred", "class_full")
        assert {a.status for a in smalls} == {"deferred"}
        async with running_worker(app, concurrency=1):
            for answer in [*fillers, wide, *smalls]:
                assert answer.job is not None
                await Job(work, answer.job.id).result(timeout=WAIT)
        assert await left_behind(app) == []
    # each release freed one unit: a small job got in past the wide head every time,
    # until the head had been overtaken OVERTAKE_LIMIT times; then the class was held for
    # it and it got the whole pool once what had been admitted had run (so every job
    # admitted before it ran before it, and none admitted after it did)
    before = ran[: ran.index("wide")]
    assert sorted(before) == sorted(["filler"] * FILLERS + ["small"] * OVERTAKE_LIMIT)
    assert ran.count("small") == SMALLS
