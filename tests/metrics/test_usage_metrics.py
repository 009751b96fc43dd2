"""Seed 002's metrics: raw usage and model time by tenant, dispatches by tenant next to
the entitled share, estimated against used work units, the oldest lease's age, and
``deadline_unmeetable`` among the admission decisions.

The store-side reads are checked as plans handed replies (no server) and against a real
server whose counters real jobs wrote; the worker side on a ``WorkerMetrics`` fed the
points the worker calls, and through a worker's own endpoint.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import fairlane
from fairlane import App
from fairlane.config.pools import parse_config
from fairlane.metrics import OTHER, MetricsConfig, StoreSnapshot, WorkerMetrics
from fairlane.metrics.store import StoreCollector, StoreReader
from fairlane.runtime.usage import JobContext
from fairlane.store.keys import AppKeys
from fairlane.store.views.lanes import LaneState
from fairlane.store.views.shares import UNREAD, entitled_shares
from fairlane.store.views.totals import split_stats, work_units
from fairlane.store.wire import FetchedJob, Outcome
from tests.e2e.helpers import WAIT, fast_settings, running_worker
from tests.metrics.helpers import Samples, parse, scrape_store, series, store_reader, value


def _report(ctx: JobContext) -> None:
    """What each task here reports: 3.5 units of tokens, 0.5 of calls, 0.1 of tool time."""
    ctx.report_usage(input_tokens=3000, output_tokens=500, tool_calls=2, tool_seconds=1.0)


def _job(job_id: str, tenant: str, attempt: int = 1, cls: str = "standard") -> FetchedJob:
    return FetchedJob(
        job_id, "tok", attempt, "work", "[]", 0.0, 0, tenant, 3, "", 0, service_class=cls
    )


# -- the entitled share: a plan handed its replies ----------------------------------------


def test_entitled_shares_are_weights_over_the_waiting_tenants() -> None:
    keys = [AppKeys.for_shard("app", 0, 1)]
    lanes = [
        {
            "light": LaneState(4, {}, {"standard": 3, "batch": 0}),
            "heavy": LaneState(4, {}, {"standard": 2}),
        }
    ]
    plan = entitled_shares(keys, lanes, tenants=2)
    batch = next(plan)
    # busy classes only: ZCARD and ZRANGE of light/standard and heavy/standard
    assert [c.name for c in batch] == ["zcard", "zrange", "zcard", "zrange"]
    assert batch[1].args[1:] == (0, 1)
    # light has 3 active tenants, 2 read; heavy has 1
    weights = plan.send([3, [b"acme", b"globex"], 1, [b"acme"]])
    assert [c.name for c in weights] == ["hmget"]
    assert weights[0].args[1] == ["acme", "globex", "acme"]
    with pytest.raises(StopIteration) as done:
        plan.send([[b"3", None, b"junk"]])
    shares = done.value.value
    # light: acme 3, globex 1 (default), one unread tenant counted at weight 1
    assert shares[("light", "standard")] == {"acme": 0.6, "globex": 0.2, UNREAD: 0.2}
    # a weight that does not parse is the default; alone, a tenant is entitled to all
    assert shares[("heavy", "standard")] == {"acme": 1.0}


def test_no_class_waits_no_read() -> None:
    keys = [AppKeys.for_shard("app", 0, 1)]
    plan = entitled_shares(keys, [{"light": LaneState(4, {}, {"standard": 0})}], 5)
    with pytest.raises(StopIteration) as done:
        next(plan)
    assert done.value.value == {}


class _Fixed(StoreReader):
    def __init__(self, snap: StoreSnapshot) -> None:
        self.snap = snap

    def snapshot(self) -> StoreSnapshot | None:
        return self.snap


def _collect(snap: StoreSnapshot, tenant_top_n: int) -> Samples:
    registry = CollectorRegistry()
    registry.register(StoreCollector(_Fixed(snap), tenant_top_n=tenant_top_n))
    return parse(generate_latest(registry).decode())


def test_entitled_share_labels_are_bounded_and_units_exported() -> None:
    shares = {("light", "standard"): {"a": 0.5, "b": 0.3, "c": 0.15, UNREAD: 0.05}}
    units = {("light", "standard", "est"): 12.5, ("light", "standard", "used"): 10.0}
    snap = StoreSnapshot({}, {}, 0, shares=shares, units=units)
    got = _collect(snap, tenant_top_n=2)
    assert series(got, "fairlane_tenant_entitled_share") == {
        (("class", "standard"), ("lane", "light"), ("tenant", "a")): 0.5,
        (("class", "standard"), ("lane", "light"), ("tenant", "b")): 0.3,
        (("class", "standard"), ("lane", "light"), ("tenant", OTHER)): pytest.approx(0.2),
    }
    assert value(got, "fairlane_work_units_estimated_total", lane="light") == 12.5
    assert value(got, "fairlane_work_units_used_total", lane="light") == 10.0


def test_units_fields_are_apart_from_the_counters() -> None:
    raw = {
        "completed": 2,
        "units:est:light:standard": 2500,
        "units:used:light:standard": 3100,
        "units:odd": 1,  # not three parts: ignored
    }
    assert split_stats(raw) == ({"completed": 2}, {})
    assert work_units(raw) == {
        ("light", "standard", "est"): 2.5,
        ("light", "standard", "used"): 3.1,
    }


# -- the worker side ------------------------------------------------------------------------


def test_usage_dispatches_and_lease_age_by_tenant_bounded() -> None:
    metrics = WorkerMetrics(App("m"), ["default"], 4, MetricsConfig(top_n=1))
    a1, a2, b1 = _job("a1", "acme"), _job("a2", "acme", attempt=2), _job("b1", "globex")
    metrics.started([a1, a2])
    metrics.sample([a1, a2])  # ranks acme the busiest: globex is other from now
    metrics.started([b1])
    ctx = JobContext("a1", "acme", 1)
    _report(ctx)
    ctx.report_usage(model_seconds=0.5, model="m")
    metrics.used(a1, ctx, 3.45)
    metrics.used(b1, JobContext("b1", "globex", 1), 0.01)  # reported nothing
    metrics.finished(a1, Outcome("a1", "tok", "ok", cost=3.45), 0.2)
    metrics.sample([a2, b1])
    got = parse(generate_latest(metrics.registry).decode())
    acme = {"lane": "default", "class": "standard", "tenant": "acme"}
    other = {**acme, "tenant": OTHER}
    assert value(got, "fairlane_dispatched_jobs_total", **acme) == 2  # retries count
    assert value(got, "fairlane_dispatched_jobs_total", **other) == 1
    assert value(got, "fairlane_usage_input_tokens_total", **acme) == 3000
    assert value(got, "fairlane_usage_output_tokens_total", **acme) == 500
    assert value(got, "fairlane_usage_tool_calls_total", **acme) == 2
    assert value(got, "fairlane_usage_tool_seconds_total", **acme) == 1.0
    assert value(got, "fairlane_usage_model_seconds_total", **acme) == 0.5
    assert value(got, "fairlane_usage_units_total", **acme) == 3.45
    assert value(got, "fairlane_usage_units_total", **other) == 0.01
    # one attempt reported model and tool time; the other none, and is not observed
    assert value(got, "fairlane_model_seconds_count", task="work") == 1
    assert value(got, "fairlane_tool_seconds_sum", task="work") == 1.0
    # a2 and b1 still run
    assert value(got, "fairlane_worker_oldest_attempt_age_seconds", lane="default") > 0


def test_a_tenant_that_loses_its_label_moves_its_counters_to_other() -> None:
    metrics = WorkerMetrics(App("m"), ["default"], 4, MetricsConfig(top_n=1))
    first = _job("a", "acme")
    metrics.started([first])
    metrics.used(first, JobContext("a", "acme", 1), 1.0)
    busier = [_job(f"g{i}", "globex") for i in range(3)]
    metrics.started(busier)  # globex is other while acme holds the one label
    metrics.sample([])  # globex is the busiest now: acme's counts go to other
    got = parse(generate_latest(metrics.registry).decode())
    tenants = {dict(k)["tenant"] for k in series(got, "fairlane_dispatched_jobs_total")}
    assert tenants == {OTHER}
    assert value(got, "fairlane_dispatched_jobs_total", tenant=OTHER) == 4
    assert value(got, "fairlane_usage_units_total", tenant=OTHER) == 1.0
    # none runs: the oldest lease is 0
    assert value(got, "fairlane_worker_oldest_attempt_age_seconds", lane="default") == 0


def test_model_seconds_are_checked_like_tool_seconds() -> None:
    ctx = JobContext("j", "t", 1)
    for bad in (-1.0, float("nan"), True, "1"):
        with pytest.raises(ValueError, match="model_seconds"):
            ctx.report_usage(model_seconds=bad)  # type: ignore[arg-type]
    ctx.report_usage(model_seconds=1)
    ctx.report_usage(model_seconds=0.5)
    assert ctx.model_seconds == 1.5
    # model time is recorded, not priced: the tokens price the model's work
    assert ctx.units(fairlane.Coefficients(), 0.0) == 0.0


# -- a real server -------------------------------------------------------------------------

POOL: dict[str, Any] = {
    "pools": {
        "default": {
            "capacity_units": 100,
            "classes": {"standard": {"nominal_share": 1.0, "max_queue": 100}},
        }
    },
    "estimation": {"safety_multiplier": 1.0},
}


@pytest.mark.anyio
async def test_the_server_counts_estimates_uses_and_unmeetable_deadlines(
    redis_url: str, namespace: str
) -> None:
    app = App(namespace, redis_url=redis_url, settings=fast_settings(), config=parse_config(POOL))

    @app.task(attempts=1)
    async def work() -> None:
        _report(fairlane.context())

    @app.task(lane="plain", attempts=1)
    async def plain() -> None:
        _report(fairlane.context())

    async with app:
        late = await work.submit(delay=30, deadline=1, tenant="acme")
        assert late.reason == "deadline_unmeetable"
        # declared 2 units each; each used 3.5 (tokens) + 0.5 (calls) + 0.1 (tool seconds)
        jobs = [await work.enqueue(tenant="acme", estimate=2.0) for _ in range(2)]
        # a lane without a pool of an app with admission config learns costs too
        jobs.append(await plain.enqueue(tenant="acme", estimate=2.0))
        async with running_worker(app, lanes=["default", "plain"]):
            for job in jobs:
                await asyncio.wait_for(job.result(), WAIT)
        reader = store_reader(app, redis_url)
        try:
            got = await scrape_store(reader)
        finally:
            reader.close()
    decisions = "fairlane_admission_decisions_total"
    assert value(got, decisions, lane="default", reason="deadline_unmeetable") == 1
    assert value(got, decisions, lane="default", outcome="accepted") == 2
    assert series(got, "fairlane_work_units_estimated_total") == {
        (("class", "standard"), ("lane", "default")): 4.0,
        (("class", "standard"), ("lane", "plain")): 2.0,
    }
    assert series(got, "fairlane_work_units_used_total") == {
        (("class", "standard"), ("lane", "default")): pytest.approx(8.2),
        (("class", "standard"), ("lane", "plain")): pytest.approx(4.1),
    }
    # the units are not store events
    assert not any("units" in dict(k)["event"] for k in series(got, "fairlane_store_events_total"))
