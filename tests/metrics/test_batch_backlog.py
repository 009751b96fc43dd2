"""Batch work is no signal to scale on: ``/autoscale``'s ``backlog_total`` and the
``fairlane_lane_backlog_slots`` gauge count the slots waiting outside a lane's batch
classes, and batch is reported apart (``backlog_batch``,
``fairlane_lane_batch_backlog_slots``). A real server and a worker serving its metrics
port; the jobs wait on lanes no worker serves, so the backlog holds still."""

from __future__ import annotations

import pytest

from fairlane import App, ServiceClass
from fairlane.metrics import StoreReader, StoreSnapshot
from fairlane.store.views.lanes import LaneState
from tests.e2e.helpers import eventually, fast_settings
from tests.metrics.helpers import scrape_store, store_reader, value
from tests.metrics.test_metrics import autoscale, metrics_worker, scrape

pytestmark = pytest.mark.anyio


def _app(namespace: str, redis_url: str) -> App:
    # a declared table whose batch class is not called "batch", and the default one
    render = [ServiceClass("interactive", nominal_share=1.0), ServiceClass("bulk", batch=True)]
    app = App(namespace, redis_url=redis_url, settings=fast_settings(), lanes={"render": render})

    @app.task(lane="render", service_class="interactive")
    async def frame() -> None:
        return None

    @app.task(lane="render", service_class="bulk")
    async def reel() -> None:
        return None

    @app.task(lane="quiet")
    async def standard() -> None:
        return None

    @app.task(lane="quiet", service_class="batch")
    async def nightly() -> None:
        return None

    @app.task(lane="served")
    async def noop() -> None:
        return None

    return app


async def _enqueue(app: App) -> None:
    tasks = {t.name.rsplit(".", 1)[-1]: t for t in app.tasks.values()}
    for _ in range(5):
        await tasks["nightly"].enqueue(tenant="t")
        await tasks["reel"].enqueue(tenant="t")
    await tasks["standard"].enqueue(tenant="t")
    for _ in range(2):
        await tasks["frame"].enqueue(tenant="t")


async def test_five_batch_and_one_standard_give_a_scale_backlog_of_one(
    redis_url: str, namespace: str
) -> None:
    app = _app(namespace, redis_url)
    async with app, metrics_worker(app, ["served"]) as worker:
        await _enqueue(app)

        async def seen() -> bool:
            s = await scrape(worker)
            return value(s, "fairlane_lane_waiting_slots", lane="quiet") == 6

        await eventually(seen)
        view = await autoscale(worker)
        s = await scrape(worker)
    quiet, render = view["lanes"]["quiet"], view["lanes"]["render"]
    assert quiet["backlog"] == {"batch": 5, "standard": 1}
    assert (quiet["backlog_total"], quiet["backlog_batch"]) == (1, 5)
    assert render["backlog"] == {"bulk": 5, "interactive": 2}
    assert (render["backlog_total"], render["backlog_batch"]) == (2, 5)
    assert view["lanes"]["served"]["backlog_total"] == 0
    assert value(s, "fairlane_lane_backlog_slots", lane="quiet") == 1
    assert value(s, "fairlane_lane_batch_backlog_slots", lane="quiet") == 5
    assert value(s, "fairlane_lane_backlog_slots", lane="render") == 2
    assert value(s, "fairlane_lane_batch_backlog_slots", lane="render") == 5
    # every class is still there, batch included
    assert value(s, "fairlane_lane_waiting_slots", lane="quiet", **{"class": "batch"}) == 5


async def test_a_reader_given_no_tables_takes_the_default_tables_batch(
    redis_url: str, namespace: str
) -> None:
    app = _app(namespace, redis_url)
    async with app:
        await _enqueue(app)
        lanes = [*app.lanes, *(t.options.lane for t in app.tasks.values())]
        reader = StoreReader(redis_url, app.name, lanes, max_age=0.0)
        told = store_reader(app, redis_url)
        try:
            s = await scrape_store(reader)
            t = await scrape_store(told)
        finally:
            reader.close()
            told.close()
    assert value(s, "fairlane_lane_backlog_slots", lane="quiet") == 1
    # without the app's tables, bulk is an ordinary class: the reader is told them
    assert value(s, "fairlane_lane_backlog_slots", lane="render") == 7
    assert value(t, "fairlane_lane_backlog_slots", lane="render") == 2


def test_a_snapshot_splits_the_backlog_by_the_batch_classes_it_was_given() -> None:
    lane = LaneState(4, {"standard": 4}, {"standard": 3, "batch": 9, "bulk": 2})
    assert StoreSnapshot({"l": lane}, {}, 0).backlog("l") == (5, 9)
    told = StoreSnapshot({"l": lane}, {}, 0, batch={"l": frozenset({"bulk", "batch"})})
    assert told.backlog("l") == (3, 11)
    assert StoreSnapshot({"l": lane}, {}, 0, batch={"l": frozenset()}).backlog("l") == (14, 0)
