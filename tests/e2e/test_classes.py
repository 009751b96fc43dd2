"""Service classes, slot widths and throttle keys with real workers.

Each test records what runs, in the order it starts, and checks the rules by counting
(how many batch jobs start after a guaranteed or standard arrival, the most jobs of a
key ever running at once), never by timing.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

import pytest

from fairlane import App, ServiceClass
from fairlane.app.task import Task
from tests.e2e.helpers import WAIT, make_app, running_worker

pytestmark = pytest.mark.anyio

CAPACITY = 8


@dataclass
class Recorder:
    """What started, in order, and the most of each label ever running at once."""

    started: list[str] = field(default_factory=list)
    running: Counter[str] = field(default_factory=Counter)
    peak: Counter[str] = field(default_factory=Counter)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    seen_at_start: dict[str, Counter[str]] = field(default_factory=dict)

    async def run(self, labels: list[str], seconds: float) -> None:
        self.started.append(labels[0])
        self.seen_at_start[labels[0]] = Counter(self.running)
        for label in labels:
            self.running[label] += 1
            self.peak[label] = max(self.peak[label], self.running[label])
        self.changed.set()
        try:
            await asyncio.sleep(seconds)
        finally:
            for label in labels:
                self.running[label] -= 1

    async def wait_until(self, label: str, running: int) -> None:
        async with asyncio.timeout(WAIT):
            while self.running[label] < running:
                self.changed.clear()
                await self.changed.wait()


def _app(namespace: str, redis_url: str) -> tuple[App, Task[[list[str], float], None], Recorder]:
    """An app whose guaranteed class keeps a quarter of the lane free even while idle."""
    app = make_app(namespace, redis_url)
    app.lane(
        "default",
        classes=[
            ServiceClass("guaranteed", nominal_share=0.5, min_slots=1, lendable=0.5),
            ServiceClass("standard", nominal_share=0.5, min_slots=1),
            ServiceClass("batch", batch=True),
        ],
    )
    rec = Recorder()

    @app.task
    async def work(labels: list[str], seconds: float) -> None:
        await rec.run(labels, seconds)

    return app, work, rec


async def test_a_guaranteed_job_is_not_delayed_by_a_batch_flood(
    redis_url: str, namespace: str
) -> None:
    app, work, rec = _app(namespace, redis_url)
    async with app:
        # long batch jobs: none finishes while the guaranteed job arrives and starts
        flood = await work.enqueue_many(
            [(["batch"], 1.0)] * 12, tenant="bulk", service_class="batch"
        )
        async with running_worker(app, concurrency=CAPACITY):
            # batch borrows every slot nobody keeps: 8 less guaranteed's reserve of 2
            await rec.wait_until("batch", CAPACITY - 2)
            urgent = await work.enqueue(
                ["guaranteed"], 0.0, tenant="vip", service_class="guaranteed"
            )
            await urgent.result(timeout=WAIT)
            for job in flood:
                await job.result(timeout=WAIT)
    # the reserve is never lent, so the guaranteed job started with the batch jobs still
    # running: it waited for none of them
    assert rec.peak["batch"] == CAPACITY - 2, rec.peak
    assert rec.seen_at_start["guaranteed"]["batch"] == CAPACITY - 2, rec.seen_at_start


async def test_batch_borrows_idle_capacity_and_gives_it_back(
    redis_url: str, namespace: str
) -> None:
    app, work, rec = _app(namespace, redis_url)
    async with app:
        flood = await work.enqueue_many(
            [(["batch"], 0.05)] * 300, tenant="bulk", service_class="batch"
        )
        async with running_worker(app, concurrency=CAPACITY):
            await rec.wait_until("batch", CAPACITY - 2)
            steady = await work.enqueue_many([(["standard"], 0.05)] * 40, tenant="acme")
            for job in steady:
                await job.result(timeout=WAIT)
            for job in flood:
                await job.result(timeout=WAIT)
    first = rec.started.index("standard")
    last = len(rec.started) - 1 - rec.started[::-1].index("standard")
    # once standard work waits, batch starts nothing new: every slot a batch job gives
    # back goes to standard, which borrows guaranteed's lendable idle share as well
    assert rec.started[first:last].count("batch") == 0, rec.started[first : last + 1]
    assert rec.peak["standard"] == CAPACITY - 2, rec.peak
    # and the flood got its capacity back afterwards: all of it finished
    assert rec.started.count("batch") == 300


async def test_throttle_keys_and_tenant_ceiling_cap_what_runs(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    rec = Recorder()

    @app.task
    async def work(labels: list[str], seconds: float) -> None:
        await rec.run(labels, seconds)

    async with app:
        await app.tenants.configure("capped", max_concurrency=3)
        jobs = [
            *await work.enqueue_many([(["doc:1"], 0.02)] * 30, tenant="acme", limits={"doc:1": 2}),
            *await work.enqueue_many(
                [(["user:a", "sub"], 0.02)] * 20,
                tenant="acme",
                limits={"sub:acme/a": 1, "org:acme": 4},
            ),
            *await work.enqueue_many([(["capped"], 0.02)] * 30, tenant="capped"),
            *await work.enqueue_many([(["free"], 0.02)] * 30, tenant="other"),
        ]
        async with running_worker(app, concurrency=12):
            for job in jobs:
                await job.result(timeout=WAIT)
    assert rec.peak["doc:1"] == 2, rec.peak
    assert rec.peak["user:a"] == 1, rec.peak
    assert 1 <= rec.peak["capped"] <= 3, rec.peak
    # a throttled key holds back nobody else: the unthrottled tenant filled the slots
    assert rec.peak["free"] >= 5, rec.peak
    assert len(rec.started) == 110


async def test_a_wide_job_occupies_its_slots(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    rec = Recorder()

    @app.task(slots=3)
    async def wide(labels: list[str], seconds: float) -> None:
        await rec.run(labels, seconds)

    @app.task
    async def narrow(labels: list[str], seconds: float) -> None:
        await rec.run(labels, seconds)

    async with app:
        jobs = [
            *await wide.enqueue_many([(["wide", "slots", "slots", "slots"], 0.03)] * 10),
            *await narrow.enqueue_many([(["narrow", "slots"], 0.01)] * 20),
        ]
        async with running_worker(app, concurrency=6):
            for job in jobs:
                await job.result(timeout=WAIT)
    assert rec.peak["slots"] <= 6, rec.peak
    assert rec.peak["wide"] == 2, rec.peak


async def test_a_flood_in_one_lane_leaves_another_lanes_capacity_alone(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    rec = Recorder()

    @app.task(lane="heavy")
    async def render(labels: list[str], seconds: float) -> None:
        await rec.run(labels, seconds)

    @app.task(lane="light")
    async def ping(labels: list[str], seconds: float) -> None:
        await rec.run(labels, seconds)

    async with app:
        flood = await render.enqueue_many([(["heavy"], 1.0)] * 8)
        async with (
            running_worker(app, lanes=["heavy"], concurrency=4),
            running_worker(app, lanes=["light"], concurrency=2),
        ):
            await rec.wait_until("heavy", 4)
            quick = await ping.enqueue_many([(["light"], 0.0)] * 6)
            for job in quick:
                await job.result(timeout=WAIT)
            # all light work ran while the heavy lane's first jobs were still running
            assert rec.running["heavy"] == 4
            assert rec.started.count("heavy") == 4
            for job in flood:
                await job.result(timeout=WAIT)
        heavy = await app.store.lane_state("heavy")
        light = await app.store.lane_state("light")
    # each lane counted only its own workers' slots, and both left when they stopped
    assert (heavy.capacity, light.capacity) == (0, 0)
    assert rec.peak["heavy"] == 4 and rec.peak["light"] <= 2
