"""Batch work ages and does not drive scale-up, end to end with real workers.

A lane of two slots is kept busy by standard work: a producer enqueues standard jobs
faster than the lane runs them, so standard work is always waiting and a batch class,
which runs on spare slots only, would never run. With ``max_wait`` the batch job waits
while it is young -- standard jobs enqueued after it start before it -- and once it has
waited past ``max_wait`` it is served as the class above: it starts while standard work
enqueued before that moment is still waiting. Without ``max_wait`` it starts only once
the producer has stopped. And ``/autoscale`` reads 5 batch and 1 standard job waiting
as a scale backlog of 1.

Times are the tasks' own (``time.time()``, on the machine the server runs on); the one
bound asserted is the rule's (no start before ``max_wait``), never a speed.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import pytest

from fairlane import App, ServiceClass
from fairlane.app.worker import Worker
from tests.e2e.helpers import WAIT, eventually, fast_settings, running_workers
from tests.metrics.test_metrics import autoscale, metrics_worker

pytestmark = pytest.mark.anyio

MAX_WAIT = 1.0  # seconds
RUN = 0.05  # seconds a standard job runs
BURST, EVERY = 4, 0.05  # the producer: 4 jobs every 50 ms, twice what 2 slots run


@dataclass
class Log:
    enqueued: dict[int, float] = field(default_factory=dict)  # standard job -> when
    started: dict[int, float] = field(default_factory=dict)  # standard job -> when
    batch_enqueued: float = 0.0
    batch_started: float | None = None
    stopped: float | None = None  # when the producer made its last enqueue


def _app(namespace: str, redis_url: str, max_wait: float | None, log: Log) -> App:
    table = [
        ServiceClass("standard", nominal_share=1.0),
        ServiceClass("batch", batch=True, max_wait=max_wait),
    ]
    app = App(namespace, redis_url=redis_url, settings=fast_settings(), lanes={"busy": table})

    @app.task(name="work", lane="busy")
    async def work(i: int) -> None:
        log.started[i] = time.time()
        await asyncio.sleep(RUN)

    @app.task(name="nightly", lane="busy", service_class="batch")
    async def nightly() -> None:
        log.batch_started = time.time()

    return app


async def _produce(app: App, log: Log, *, until: float) -> None:
    """Standard jobs, faster than the lane runs them, until ``until`` or the batch job started
    and ran a while."""
    work = app.tasks["work"]
    i = 0
    while time.time() < until and (
        log.batch_started is None or time.time() < log.batch_started + 0.3
    ):
        for _ in range(BURST):
            await work.enqueue(i, tenant="steady")
            log.enqueued[i] = time.time()
            i += 1
        await asyncio.sleep(EVERY)
    log.stopped = time.time()


async def _run(namespace: str, redis_url: str, max_wait: float | None, produce_for: float) -> Log:
    log = Log()
    app = _app(namespace, redis_url, max_wait, log)
    async with app, running_workers(app, lanes=["busy"], concurrency=2):
        work = app.tasks["work"]
        for i in range(-20, 0):  # a backlog before the batch job comes
            await work.enqueue(i, tenant="steady")
            log.enqueued[i] = time.time()
        log.batch_enqueued = time.time()
        handle = await app.tasks["nightly"].enqueue(tenant="nightly")
        await _produce(app, log, until=time.time() + produce_for)
        await handle.result(timeout=WAIT + produce_for)
    return log


async def test_an_aged_batch_job_takes_a_slot_from_waiting_standard_work(
    redis_url: str, namespace: str
) -> None:
    log = await _run(namespace, redis_url, MAX_WAIT, produce_for=15.0)
    assert log.batch_started is not None and log.stopped is not None
    started = log.batch_started
    # never before its max_wait: the lane was busy, batch had no spare slot
    assert started - log.batch_enqueued >= MAX_WAIT - 0.01
    # while young it was overtaken: standard jobs enqueued after it started before it
    overtook = [i for i, t in log.started.items() if t < started and i >= 0]
    assert overtook
    # once aged it was served as standard: standard work enqueued before its start was
    # still waiting when it started, and the producer was still at it
    waiting = [
        i for i, t in log.enqueued.items() if t < started and log.started.get(i, 1e18) > started
    ]
    assert waiting
    assert started < log.stopped


async def test_without_max_wait_batch_waits_for_the_lane_to_drain(
    redis_url: str, namespace: str
) -> None:
    log = await _run(namespace, redis_url, None, produce_for=2.5)
    assert log.batch_started is not None and log.stopped is not None
    assert log.batch_started > log.stopped


async def test_autoscale_counts_five_batch_and_one_standard_as_a_backlog_of_one(
    redis_url: str, namespace: str
) -> None:
    log = Log()
    app = _app(namespace, redis_url, MAX_WAIT, log)

    @app.task(name="noop", lane="served")
    async def noop() -> None:
        return None

    async with app:
        for _ in range(5):
            await app.tasks["nightly"].enqueue(tenant="t")
        await app.tasks["work"].enqueue(0, tenant="t")
        # the worker serves another lane: the backlog on `busy` holds still
        worker: Worker
        async with metrics_worker(app, ["served"]) as worker:

            async def counted() -> bool:
                view = await autoscale(worker)
                return view["lanes"].get("busy", {}).get("backlog_batch") == 5

            await eventually(counted)
            view = await autoscale(worker)
    busy = view["lanes"]["busy"]
    assert busy["backlog"] == {"batch": 5, "standard": 1}
    assert busy["backlog_total"] == 1
    assert busy["backlog_batch"] == 5
