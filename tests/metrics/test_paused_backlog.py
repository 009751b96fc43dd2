"""Paused work is no signal to scale on: ``/autoscale``'s backlog and the backlog gauges
leave out the slots a paused lane, class or tenant holds back in their queues (reported
as ``paused`` and ``fairlane_lane_paused_slots``); a paused task's jobs are parked, out
of the waiting slots; ``fairlane_paused_scopes{kind}`` and ``fairlane_parked_jobs``
count the pauses and what they parked. A real server and a worker serving its metrics
port; the held jobs wait on lanes no worker serves, so the figures hold still.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fairlane import App, ServiceClass
from fairlane.policy.pauses import Scope, ScopeKind
from fairlane.store.keys import AppKeys
from fairlane.store.pausing import scope_field
from fairlane.store.reads import Cmd
from fairlane.store.views.lanes import LaneState
from fairlane.store.views.pauses import paused_work
from tests.e2e.helpers import WAIT, eventually, fast_settings
from tests.metrics.helpers import value
from tests.metrics.test_metrics import autoscale, metrics_worker, scrape

pytestmark = pytest.mark.anyio


def _app(namespace: str, redis_url: str) -> App:
    render = [ServiceClass("interactive", nominal_share=1.0), ServiceClass("bulk", batch=True)]
    app = App(namespace, redis_url=redis_url, settings=fast_settings(), lanes={"render": render})

    @app.task(name="frame", lane="render", service_class="interactive")
    async def frame() -> None:
        return None

    @app.task(name="reel", lane="render", service_class="bulk")
    async def reel() -> None:
        return None

    @app.task(name="standard", lane="quiet")
    async def standard() -> None:
        return None

    @app.task(name="nightly", lane="quiet", service_class="batch")
    async def nightly() -> None:
        return None

    @app.task(name="noop", lane="served")
    async def noop() -> None:
        return None

    return app


async def _enqueue(app: App) -> None:
    task = app.get_task
    for tenant, standard, nightly in (("a", 3, 4), ("b", 2, 1)):
        await task("standard").enqueue_many([()] * standard, tenant=tenant)
        await task("nightly").enqueue_many([()] * nightly, tenant=tenant)
    await task("frame").enqueue_many([()] * 2, tenant="c")
    await task("reel").enqueue_many([()] * 5, tenant="c")


async def test_paused_work_leaves_the_backlog_and_is_counted(
    redis_url: str, namespace: str
) -> None:
    app = _app(namespace, redis_url)
    async with app, metrics_worker(app, ["served"]) as worker:
        await _enqueue(app)
        await app.tenants.pause("a", reason="loop", for_=600)
        await app.tenants.pause("b", for_=0.05)  # ends at once: it holds nothing
        await app.tenants.quarantine("b")  # refuses submissions, holds no waiting work
        await app.pauses.pause(app.pauses.scope(lane="render"))
        await app.pauses.pause(app.pauses.scope(task="noop"))
        parked = await app.get_task("noop").enqueue_many([()] * 3, tenant="d")
        await asyncio.sleep(0.1)  # past b's pause's end

        async def settled() -> bool:
            s = await scrape(worker)
            return value(s, "fairlane_parked_jobs") == 3

        await eventually(settled)
        view, s = await autoscale(worker), await scrape(worker)
        quiet, render = view["lanes"]["quiet"], view["lanes"]["render"]
        assert quiet["backlog"] == {"batch": 1, "standard": 2}
        assert (quiet["backlog_total"], quiet["backlog_batch"], quiet["paused"]) == (2, 1, 7)
        assert render["backlog"] == {"bulk": 0, "interactive": 0}
        assert (render["backlog_total"], render["backlog_batch"], render["paused"]) == (0, 0, 7)
        assert view["lanes"]["served"]["backlog_total"] == 0  # parked: out of the slots
        assert value(s, "fairlane_lane_backlog_slots", lane="quiet") == 2
        assert value(s, "fairlane_lane_batch_backlog_slots", lane="quiet") == 1
        assert value(s, "fairlane_lane_paused_slots", lane="quiet", **{"class": "standard"}) == 3
        assert value(s, "fairlane_lane_paused_slots", lane="render", **{"class": "bulk"}) == 5
        # the waiting slots are all still there
        assert value(s, "fairlane_lane_waiting_slots", lane="quiet", **{"class": "standard"}) == 5
        scopes = {got["kind"]: n for got, n in s["fairlane_paused_scopes"]}
        assert scopes == {"tenant": 1, "key": 0, "task": 1, "lane": 1, "refuse": 1}

        await app.tenants.resume("a")
        await app.tenants.resume("b")
        await app.pauses.resume(app.pauses.scope(lane="render"))
        await app.pauses.resume(app.pauses.scope(task="noop"))
        for job in parked:
            await job.result(timeout=WAIT)

        async def lifted() -> bool:
            return bool((await autoscale(worker))["lanes"]["quiet"]["paused"] == 0)

        await eventually(lifted)  # the worker's reader keeps a read for a moment
        view, s = await autoscale(worker), await scrape(worker)
    quiet = view["lanes"]["quiet"]
    assert (quiet["backlog_total"], quiet["backlog_batch"], quiet["paused"]) == (5, 5, 0)
    assert view["lanes"]["render"]["backlog_total"] == 2
    assert value(s, "fairlane_paused_scopes") == 0 and value(s, "fairlane_parked_jobs") == 0
    assert "fairlane_lane_paused_slots" not in s


def _run(plan: Any, answers: list[list[Any]]) -> tuple[Any, list[list[Cmd]]]:
    """Drive a read plan with the given replies, batch by batch; its result and batches."""
    batches = [next(plan)]
    try:
        for reply in answers:
            batches.append(plan.send(reply))
    except StopIteration as done:
        return done.value, batches
    raise AssertionError("the plan asked for more batches")


def test_a_pause_of_every_shard_counts_once_and_the_clock_is_read_only_for_an_end() -> None:
    keys = [AppKeys.for_shard("p", i, 2) for i in range(2)]
    lanes = [{"l": LaneState(4, {}, {"standard": 6})} for _ in keys]
    task = scope_field(Scope(ScopeKind.TASK, task="t"))
    tenant = scope_field(Scope(ScopeKind.TENANT, tenant="a"))
    tables = [{task.encode(): b"0", tenant.encode(): b"5000"}, {task.encode(): b"0"}]
    # shard 0: its clock (a pause with an end), the task's parked set, a's queue; shard 1:
    # the task's parked set
    done, batches = _run(paused_work(keys, lanes), [tables, [4000, 2, 9, 1]])
    assert [c.name for c in batches[1]] == ["time", "zcard", "zcard", "zcard"]
    assert done.scopes == {"tenant": 1, "key": 0, "task": 1, "lane": 0, "refuse": 0}
    assert done.parked == 3
    assert done.held == {("l", "standard"): 6}  # at most the shard's waiting slots
    # past a's end: it holds nothing
    done, _ = _run(paused_work(keys, lanes), [tables, [6000, 2, 9, 1]])
    assert done.held == {} and done.scopes["tenant"] == 0
    # no pause anywhere: one round trip
    done, batches = _run(paused_work(keys, lanes), [[{}, {}]])
    assert len(batches) == 1 and done.parked == 0 and done.held == {}
