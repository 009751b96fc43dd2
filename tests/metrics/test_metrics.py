"""Worker metrics end to end: a real server, an in-process worker serving /metrics and
/autoscale on a free port, scraped over HTTP like Prometheus and an autoscaler would."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fairlane import App, Backoff, TaskFailed
from fairlane.app.worker import Worker
from fairlane.cli.worker import _metrics_argv
from fairlane.cli.worker_modes import child_argv as _child_argv
from fairlane.gateway.metrics import GatewayMetrics
from fairlane.metrics import (
    OTHER,
    MetricsConfig,
    StoreCollector,
    StoreReader,
    StoreSnapshot,
    TenantLabels,
    WorkerMetrics,
)
from fairlane.store.views.lanes import LaneState as LaneSnapshot
from tests.e2e.helpers import ROOT, WAIT, eventually, make_app

pytestmark = pytest.mark.anyio

FAST = MetricsConfig(top_n=2, host="127.0.0.1", store_max_age=0.1, sample_interval=0.1)
Samples = dict[str, list[tuple[dict[str, str], float]]]


@asynccontextmanager
async def metrics_worker(
    app: App, lanes: list[str], config: MetricsConfig = FAST, concurrency: int = 8
) -> AsyncIterator[Worker]:
    worker = Worker(app, lanes=lanes, concurrency=concurrency, metrics_port=0, metrics=config)
    task = asyncio.create_task(worker.run())
    try:
        await eventually(lambda: _ready(worker))
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, WAIT)


async def _ready(worker: Worker) -> bool:
    return worker.metrics_server is not None


def _get(worker: Worker, path: str) -> bytes:
    assert worker.metrics_server is not None
    url = f"http://127.0.0.1:{worker.metrics_server.port}{path}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


async def scrape(worker: Worker) -> Samples:
    text = (await asyncio.to_thread(_get, worker, "/metrics")).decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


async def autoscale(worker: Worker) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(await asyncio.to_thread(_get, worker, "/autoscale"))
    return data


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        v for got, v in samples.get(name, []) if all(got.get(k) == x for k, x in labels.items())
    )


def label_values(samples: Samples, name: str, label: str) -> set[str]:
    return {got[label] for got, _ in samples.get(name, []) if label in got}


async def test_worker_metrics_count_jobs_and_bound_tenant_labels(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task(lane="light")
    async def noop(n: int) -> int:
        return n

    @app.task(lane="light", attempts=2, backoff=Backoff(base=0.05, cap=0.05, jitter="none"))
    async def flaky() -> None:
        raise RuntimeError("always")

    volumes = {"t1": 12, "t2": 8, "t3": 3, "t4": 2, "t5": 1}
    async with app, metrics_worker(app, ["light"]) as worker:
        jobs = [
            await noop.enqueue(i, tenant=tenant) for tenant, n in volumes.items() for i in range(n)
        ]
        failing = await flaky.enqueue(tenant="t1")
        for job in jobs:
            await job.result(timeout=WAIT)
        with pytest.raises(TaskFailed):
            await failing.result(timeout=WAIT)
        # after the busiest tenants are ranked, one more job each: only t1, t2 keep a label
        await asyncio.sleep(0.3)
        later = [await noop.enqueue(0, tenant=tenant) for tenant in volumes]
        for job in later:
            await job.result(timeout=WAIT)

        async def settled() -> bool:
            s = await scrape(worker)
            return value(s, "fairlane_attempts_total", task=noop.name, outcome="ok") == 31

        await eventually(settled)
        s = await scrape(worker)

    # every attempt timed and counted by outcome
    assert value(s, "fairlane_task_duration_seconds_count", task=noop.name) == 31
    assert value(s, "fairlane_task_duration_seconds_count", task=flaky.name) == 2
    assert value(s, "fairlane_attempts_total", task=flaky.name, outcome="retry") == 1
    assert value(s, "fairlane_attempts_total", task=flaky.name, outcome="dead") == 1
    assert value(s, "fairlane_retry_delay_seconds_count", task=flaky.name) == 1
    assert value(s, "fairlane_retry_delay_seconds_sum", task=flaky.name) == pytest.approx(0.05)
    assert value(s, "fairlane_attempt_units_count", task=noop.name) == 31
    assert value(s, "fairlane_lease_lost_total") == 0
    # queue wait: lane and class from the task, tenants bounded to the 2 busiest + other
    wait = "fairlane_queue_wait_seconds_count"
    assert label_values(s, wait, "tenant") == {"t1", "t2", OTHER}
    assert label_values(s, wait, "lane") == {"light"}
    assert label_values(s, wait, "class") == {"standard"}
    assert value(s, wait, tenant=OTHER) >= 3  # at least the later jobs of t3, t4, t5
    assert value(s, wait, tenant="t1") >= 1
    buckets = {got["le"] for got, _ in s["fairlane_queue_wait_seconds_bucket"]}
    assert {"0.005", "3600.0", "+Inf"} <= buckets
    # slots: sampled gauges and the saturation histogram
    assert value(s, "fairlane_worker_slots") == 8
    assert label_values(s, "fairlane_worker_slots_in_use", "lane") == {"light"}
    assert value(s, "fairlane_worker_slot_utilization_count") >= 1
    sat = {got["le"] for got, _ in s["fairlane_worker_slot_utilization_bucket"]}
    assert {"0.9", "0.95", "0.99", "1.0"} <= sat
    # the server's counters, as counters
    assert value(s, "fairlane_store_events_total", event="completed") == 31
    assert value(s, "fairlane_store_events_total", event="retried") == 1
    assert value(s, "fairlane_store_up") == 1


async def test_store_gauges_and_autoscale_reflect_a_known_state(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task(lane="served")
    async def served() -> None:
        return None

    @app.task(lane="idle")
    async def queued(n: int) -> int:
        return n

    async with app, metrics_worker(app, ["served"], concurrency=6) as worker:
        await (await served.enqueue(tenant="a")).result(timeout=WAIT)
        for i in range(7):
            await queued.enqueue(i, tenant=f"t{i % 3}")
        for i in range(2):
            await queued.enqueue(i, tenant="t0", delay=600)

        async def seen() -> bool:
            s = await scrape(worker)
            return (
                value(s, "fairlane_lane_waiting_slots", lane="idle", **{"class": "standard"}) == 7
            )

        await eventually(seen)
        s = await scrape(worker)
        view = await autoscale(worker)

    assert value(s, "fairlane_lane_capacity_slots", lane="served") == 6
    assert value(s, "fairlane_lane_capacity_slots", lane="idle") == 0
    assert value(s, "fairlane_lane_delayed_jobs", lane="idle") == 2
    assert value(s, "fairlane_lane_in_flight_slots", lane="idle") == 0
    assert value(s, "fairlane_throttle_waiters") == 0
    assert value(s, "fairlane_store_events_total", event="completed") == 1
    assert view["ok"] is True
    assert view["lanes"]["idle"] == {
        "slots_total": 0,
        "slots_used": 0,
        "backlog": {"standard": 7},
        "backlog_total": 7,
        "backlog_batch": 0,
        "paused": 0,
        "delayed": 2,
        "deferred": 0,
        # nothing learned of the lane yet: each waiting job asks for its slot
        "slots_needed": 7,
        "slots_needed_deadlines": 0,
        "slots_needed_horizon": 7,
        "deadlines_waiting": 0,
        "deadlines_unmeetable": 0,
        "deadlines_unread": 0,
        "horizon_seconds": 300.0,
    }
    assert view["lanes"]["served"]["slots_total"] == 6
    assert view["lanes"]["served"]["backlog_total"] == 0


def test_tenant_labels_keep_the_allow_list_and_the_busiest() -> None:
    labels = TenantLabels(top_n=2, allow=["vip"])
    for tenant, n in {"a": 1, "b": 5, "c": 9, "vip": 1}.items():
        labels.count(tenant, n)
    assert labels.label("a") == "a"  # room left before the first ranking
    assert labels.refresh() == {"a"}
    assert [labels.label(t) for t in ("a", "b", "c", "vip", "new")] == [
        OTHER,
        "b",
        "c",
        "vip",
        OTHER,
    ]
    assert labels.labelled == {"b", "c", "vip"}


def test_worker_cli_passes_metrics_options_to_a_reloaded_child() -> None:
    argv = _child_argv(
        "m:app",
        lanes=None,
        concurrency=None,
        health_port=None,
        redis_url=None,
        verbose=False,
        metrics=_metrics_argv(9100, "a,b", 5),
    )
    assert argv[-6:] == [
        "--metrics-port",
        "9100",
        "--metrics-top-n",
        "5",
        "--metrics-tenants",
        "a,b",
    ]


class _FixedReader(StoreReader):
    def __init__(self, snap: StoreSnapshot) -> None:
        self.snap = snap

    def snapshot(self) -> StoreSnapshot | None:
        return self.snap


def test_the_grafana_dashboard_uses_only_exported_metrics() -> None:
    app = App("dash")
    metrics = WorkerMetrics(app, ["light"], 4, MetricsConfig())
    lane = LaneSnapshot(4, {"standard": 1}, {"standard": 2}, {}, {}, {}, 0)
    snap = StoreSnapshot({"light": lane}, {"completed": 1}, 0)
    gateway = GatewayMetrics()
    families = [
        *metrics.collect(),
        *StoreCollector(_FixedReader(snap)).collect(),
        *gateway.registry.collect(),
    ]
    exported: set[str] = set()
    for family in families:
        suffixes = {"histogram": ("_bucket", "_count", "_sum"), "counter": ("_total",)}
        exported |= {family.name + end for end in suffixes.get(family.type, ("",))}
    dashboard = (ROOT / "deploy" / "grafana" / "fairlane.json").read_text()
    used = set(re.findall(r"fairlane_[a-z_]+", dashboard))
    # histograms' families are named without the _bucket/_count/_sum of their samples
    missing = {name for name in used if name not in exported}
    assert not missing
    assert len(json.loads(dashboard)["panels"]) >= 6
    # the series added with admission and gateway metrics have panels of their own
    for name in (
        "fairlane_admission_decisions_total",
        "fairlane_queue_oldest_age_seconds",
        "fairlane_gateway_requests_total",
        "fairlane_gateway_submit_duration_seconds_bucket",
        "fairlane_gateway_admissions_total",
    ):
        assert name in used, name
