"""Deadline order as an app declares it: on a task (``@app.task(deadline_order=True)``)
or on a service class (``ServiceClass(..., deadline_order=True)``, ``deadline_order =
true`` in a lanes or config file), off by default, checked where it is declared; and,
through the app's own enqueue on the real server, a tenant's jobs starting earliest
deadline first (the store's rule: ``tests/store/test_deadline_order_lua.py``)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from fairlane import App, ServiceClass
from fairlane.config.files import ConfigError
from fairlane.config.lanes import parse_lanes
from fairlane.config.legacy import array_classes
from fairlane.config.pools import parse_config
from fairlane.registry import CallOptions, TaskDefinition
from tests.e2e.helpers import make_app

pytestmark = pytest.mark.anyio


def test_off_by_default_and_checked_where_declared() -> None:
    app = App("edf")

    @app.task
    async def plain() -> None: ...

    @app.task(deadline_order=True)
    async def urgent() -> None: ...

    assert not plain.options.deadline_order and urgent.options.deadline_order
    blob = urgent.encode_args((), {})
    assert urgent.new_job(blob, CallOptions(deadline=60)).deadline_order == 1
    assert plain.new_job(blob, CallOptions(deadline=60)).deadline_order == 0
    with pytest.raises(TypeError, match="deadline_order must be True or False"):

        @app.task(deadline_order="yes")  # type: ignore[call-overload]
        async def bad() -> None: ...

    for bad_flag in ("yes", 1, None):
        with pytest.raises(TypeError, match="deadline_order must be True or False"):
            ServiceClass("gold", deadline_order=bad_flag)  # type: ignore[arg-type]


@pytest.mark.parametrize("source", ["lanes file", "pool", "array shape"])
def test_a_class_declares_deadline_order_in_toml(source: str) -> None:
    rt = {"nominal_share": 0.5, "deadline_order": True}
    if source == "lanes file":
        table = parse_lanes({"lanes": {"x": {"classes": {"rt": rt, "std": {}}}}})["x"]
    elif source == "pool":
        pool = {"capacity_units": 10, "classes": {"rt": rt, "std": {}}}
        table = parse_config({"pools": {"x": pool}}).lane_tables()["x"]
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            table = array_classes([{"name": "rt", **rt}, {"name": "std"}], "f: lanes.x")
    assert {c.name: c.deadline_order for c in table} == {"rt": True, "std": False}


def test_a_wrong_deadline_order_names_its_key() -> None:
    with pytest.raises(ConfigError, match=r"lanes\.x\.classes\.rt\.deadline_order: must be true"):
        parse_lanes({"lanes": {"x": {"classes": {"rt": {"deadline_order": "yes"}}}}})


async def _started(app: App, task: TaskDefinition[Any, Any], lane: str) -> list[int | None]:
    """Submit one tenant's jobs (deadlines in s, None: none) and return the deadlines in
    the order one fetch starts them."""
    deadlines: list[int | None] = [None, 300, 100, None, 200]
    jobs = [task.new_job(task.encode_args((), {}), CallOptions(tenant="acme", deadline=d))
            for d in deadlines]  # fmt: skip
    store = app.sharded.store_for_job(jobs[0].id)
    assert [s.code for s in await store.submit(lane, jobs)] == [1] * len(jobs)
    by_id = dict(zip([j.id for j in jobs], deadlines, strict=True))
    fetched = await store.exchange("w1", [lane], len(jobs), 30_000, slots=len(jobs))
    return [by_id[j.id] for j in fetched.jobs]


@pytest.mark.parametrize("way", ["task", "class", "off"])
async def test_a_tenants_jobs_start_by_deadline_when_asked(
    redis_url: str, namespace: str, way: str
) -> None:
    app = make_app(namespace, redis_url)
    app.lane("rt", classes=[ServiceClass("standard", nominal_share=1.0,
                                         deadline_order=way == "class")])  # fmt: skip

    @app.task(lane="rt", deadline_order=way == "task")
    async def work() -> None: ...

    async with app:
        started = await _started(app, work, "rt")
    if way == "off":
        assert started == [None, 300, 100, None, 200]
    else:
        assert started == [100, 200, 300, None, None]
