"""A real Prometheus scrapes a live worker's and a live gateway's ``/metrics``, and every
PromQL expression of the shipped Grafana dashboard (``deploy/grafana/fairlane.json``)
is evaluated through Prometheus's HTTP API: each must parse and return series.

The workload makes every series the dashboard reads exist: jobs of several tenants
reporting usage (tokens, tool and model seconds) in a lane with an admission pool (so
the store counts estimated against used units), a retry and a dead letter, admission
answers (accepted, rejected ``too_wide`` through the gateway, ``deadline_unmeetable``,
deferred), a rate key with a pushback, an adaptive concurrency key, jobs of weighted
tenants left waiting on a lane no worker serves (backlog, deferrals, oldest age,
entitled shares) and one job running for the whole scrape (the oldest lease's age,
and the keys' rate and bounds in force, known while a running job names them). One
expression reads a series that only a fenced write makes, which this workload cannot
cause without a lost lease; the dashboard writes it ``... or vector(0)``, so it returns
a series anyway.

``/usr/bin/prometheus`` comes from the system's package (``scripts/test`` installs it
where it may); without it the test is skipped, unless FAIRLANE_REQUIRE_SYSTEM_PACKAGES=1
(CI) makes that a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

import fairlane
from fairlane import App, Backoff, Throttled
from fairlane.config.pools import parse_config
from fairlane.gateway import ApiKeys, create_app
from fairlane.metrics import MetricsConfig
from fairlane.policy.rates import Adaptive, Rate
from tests.e2e.helpers import ROOT, WAIT, eventually, fast_settings
from tests.metrics.test_metrics import metrics_worker

PROMETHEUS = Path(shutil.which("prometheus") or "/usr/bin/prometheus")
if os.environ.get("FAIRLANE_REQUIRE_SYSTEM_PACKAGES") == "1":
    assert PROMETHEUS.exists(), f"FAIRLANE_REQUIRE_SYSTEM_PACKAGES=1 but {PROMETHEUS} is missing"

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.embedded_only,
    pytest.mark.skipif(not PROMETHEUS.exists(), reason="no prometheus binary"),
]

DASHBOARD = ROOT / "deploy" / "grafana" / "fairlane.json"
ADMIN_KEY = "admin-" + "p" * 32
WEIGHTS = {"acme": 3.0, "globex": 1.0}
# the dashboard's template variables: every lane, every rate key, a rate window that
# holds several 1 s scrapes
VARIABLES = {"$__rate_interval": "30s", "$lane": ".*", "$rate_key": ".*"}

CONFIG: dict[str, Any] = {
    "pools": {
        "default": {
            "capacity_units": 100,
            "classes": {"standard": {"nominal_share": 1.0, "max_queue": 100}},
        },
        # two admitted jobs at most: the third and fourth are deferred
        "parked": {
            "capacity_units": 100,
            "classes": {
                "standard": {
                    "nominal_share": 1.0,
                    "max_queue": 2,
                    "max_deferred": 10,
                    "response_when_full": "defer",
                }
            },
        },
    },
}


def build(namespace: str, redis_url: str, hold: asyncio.Event | None = None) -> App:
    """The app of the worker and of the gateway (which only enqueues)."""
    app = App(
        namespace,
        redis_url=redis_url,
        settings=fast_settings(),
        config=parse_config(CONFIG),
    )

    @app.task(gateway=True, name="work", attempts=1)
    async def work(n: int) -> int:
        fairlane.context().report_usage(
            input_tokens=1000 * n, output_tokens=100, tool_calls=1, tool_seconds=0.25
        )
        fairlane.context().report_usage(model_seconds=0.5, model="m")
        return n

    @app.task(
        gateway=True, name="flaky", attempts=2, backoff=Backoff(base=0.05, cap=0.05, jitter="none")
    )
    async def flaky() -> None:
        raise RuntimeError("always")

    pushed: list[int] = []

    @app.task(gateway=True, name="call", lane="io", rates={"model:x": Rate(20, per=1.0, burst=1)})
    async def call(n: int) -> int:
        if not pushed:
            pushed.append(n)
            raise Throttled("model:x", retry_after=0.2, message="429 from the upstream")
        return n

    @app.task(gateway=True, name="adaptive", lane="io", limits={"model:ad": Adaptive(8, 2)})
    async def adaptive(n: int) -> int:
        return n

    @app.task(gateway=True, name="parked", lane="parked")
    async def parked(n: int) -> int:
        return n

    # runs until the test ends, holding both keys: the store keeps a key's rate and
    # bounds in force only while a running job names it
    @app.task(
        gateway=True,
        name="hold",
        attempts=1,
        rates={"model:x": Rate(20, per=1.0, burst=1)},
        limits={"model:ad": Adaptive(8, 2)},
    )
    async def hold_on() -> None:
        if hold is not None:
            await asyncio.wait_for(hold.wait(), WAIT)

    return app


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def gateway(namespace: str, redis_url: str) -> Iterator[str]:
    """The real gateway (``/metrics`` mounted) under uvicorn in a thread; its base URL."""
    api = create_app(build(namespace, redis_url), admin_key=ADMIN_KEY)
    port = _free_port()
    config = uvicorn.Config(
        api, host="127.0.0.1", port=port, log_level="warning", ws="none", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="prom-gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the gateway did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(WAIT)


@contextmanager
def prometheus(tmp: Path, targets: dict[str, str]) -> Iterator[str]:
    """A Prometheus scraping ``targets`` (job -> host:port) every second; its base URL."""
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [target]}]}
            for job, target in targets.items()
        ],
    }
    path = tmp / "prometheus.yml"
    path.write_text(json.dumps(config))  # JSON is YAML
    port = _free_port()
    log = (tmp / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={path}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(WAIT)
        log.close()


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


async def api(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}"
    return await asyncio.to_thread(_get, url)


async def query(base: str, expr: str) -> list[dict[str, Any]]:
    """An instant query's result; the answer must be a success."""
    got = await api(base, "/api/v1/query", query=expr)
    assert got["status"] == "success", (expr, got)
    result: list[dict[str, Any]] = got["data"]["result"]
    return result


async def scalar(base: str, expr: str) -> float:
    result = await query(base, expr)
    assert len(result) == 1, (expr, result)
    return float(result[0]["value"][1])


async def targets_up(base: str) -> bool:
    try:
        got = await api(base, "/api/v1/targets")
    except OSError:
        return False  # not listening yet
    active = got["data"]["activeTargets"]
    return len(active) == 2 and all(t["health"] == "up" for t in active)


def dashboard_expressions() -> list[tuple[str, str]]:
    """(panel title and refId, expression with the template variables filled in)."""
    out = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            assert "$" not in expr, expr
            out.append((f"{panel['title']} [{target['refId']}]", expr))
    return out


async def workload(app: App, base: str) -> None:
    tasks = app.tasks
    for tenant, weight in WEIGHTS.items():
        await app.tenants.configure(tenant, weight=weight)
    # left waiting (no worker serves the lane): one job of each tenant, and one each
    # deferred
    for tenant in (*WEIGHTS, *WEIGHTS):
        await tasks["parked"].enqueue(0, tenant=tenant)
    held = await tasks["hold"].enqueue(tenant="initech")
    jobs = [
        await tasks["work"].enqueue(n, tenant=tenant, estimate=2.0)
        for n, tenant in enumerate(["acme", "acme", "acme", "globex", "initech"], start=1)
    ]
    jobs += [await tasks["call"].enqueue(n, tenant="acme") for n in range(3)]
    jobs.append(await tasks["adaptive"].enqueue(9, tenant="globex"))
    failing = await tasks["flaky"].enqueue(tenant="globex")
    late = await tasks["work"].submit(1, tenant="acme", delay=30, deadline=1)
    assert late.reason == "deadline_unmeetable"
    minted = await ApiKeys(app.store.key_records).create("globex")
    headers = {"Authorization": f"Bearer {minted.key}"}
    async with httpx.AsyncClient(base_url=base, timeout=WAIT) as client:
        ok = await client.post("/v1/jobs", json={"task": "work", "args": [2]}, headers=headers)
        assert ok.status_code == 202, ok.text
        wide = {"task": "work", "args": [1], "estimate": 50.0}  # over 40 units: too_wide
        refused = await client.post("/v1/jobs", json=wide, headers=headers)
        assert refused.json()["reason"] == "too_wide", refused.text
        for job in jobs:
            await job.result(timeout=WAIT)
        with pytest.raises(fairlane.TaskFailed):
            await failing.result(timeout=WAIT)
        info = await client.get(ok.json()["status_url"], headers=headers)
        assert info.status_code == 200
    # the held job runs until the test sets the event: the oldest lease keeps ageing
    assert (await held.info()).status == "running"


async def test_prometheus_reads_every_dashboard_expression(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    hold = asyncio.Event()
    app = build(namespace, redis_url, hold)
    expressions = dashboard_expressions()
    config = MetricsConfig(top_n=5, host="127.0.0.1", store_max_age=0.2, sample_interval=0.2)
    async with app, metrics_worker(app, ["default", "io"], config) as worker:
        assert worker.metrics_server is not None
        with (
            gateway(namespace, redis_url) as base,
            prometheus(
                tmp_path,
                {
                    "fairlane-worker": f"127.0.0.1:{worker.metrics_server.port}",
                    "fairlane-gateway": base.removeprefix("http://"),
                },
            ) as prom,
        ):
            await workload(app, base)
            await eventually(lambda: targets_up(prom), timeout=WAIT, every=0.2)
            empty: list[str] = []

            async def all_answer() -> bool:
                empty.clear()
                for where, expr in expressions:
                    if not await query(prom, expr):
                        empty.append(f"{where}: {expr}")
                return not empty

            try:
                await eventually(all_answer, timeout=WAIT, every=0.5)
            except AssertionError:
                raise AssertionError("expressions without series:\n" + "\n".join(empty)) from None
            await check_values(prom)
            await check_autoscale(prom, worker.metrics_server.port)
            hold.set()


# What the workload did, as Prometheus must read it. Store-side series come from every
# scraping process (worker and gateway) and are checked with both min and max: every
# process's latest scrape must say the same.
STORE_SIDE = {
    'fairlane_admission_decisions_total{reason="deadline_unmeetable"}': 1,
    'fairlane_admission_decisions_total{reason="too_wide"}': 1,
    'fairlane_tenant_entitled_share{lane="parked",tenant="acme"}': 0.75,
    'fairlane_tenant_entitled_share{lane="parked",tenant="globex"}': 0.25,
    'fairlane_lane_backlog_slots{lane="parked"}': 2,
    'fairlane_lane_deferred_jobs{lane="parked",class="standard"}': 2,
    'fairlane_lane_capacity_slots{lane="default"}': 8,
}
# the worker's own: work(n) reports 1000 n input tokens, 100 output, 0.25 tool s and
# 0.5 model s; globex's dispatches are work x2 (one through the gateway), adaptive and
# flaky x2 (a retry is dispatched again)
WORKER_SIDE = {
    "fairlane_usage_input_tokens_total{tenant='acme'}": 6000,
    "fairlane_usage_model_seconds_total{tenant='acme'}": 1.5,
    "fairlane_usage_tool_seconds_total{tenant='globex'}": 0.5,
    "fairlane_usage_output_tokens_total{tenant='globex'}": 200,
    "fairlane_dispatched_jobs_total{tenant='globex'}": 5,
}


async def mismatches(prom: str) -> list[str]:
    wrong = []
    for expr, want in STORE_SIDE.items():
        for agg in ("min", "max"):
            result = await query(prom, f"{agg}({expr})")
            got = float(result[0]["value"][1]) if result else None
            if got != want:
                wrong.append(f"{agg}({expr}) = {got}, not {want}")
    for expr, want in WORKER_SIDE.items():
        result = await query(prom, f"sum({expr})")
        got = float(result[0]["value"][1]) if result else None
        if got != want:
            wrong.append(f"sum({expr}) = {got}, not {want}")
    # the pool lane learns costs: the store counted estimate and use of its attempts
    for name in ("fairlane_work_units_estimated_total", "fairlane_work_units_used_total"):
        if not await query(prom, f'{name}{{lane="default"}} > 0'):
            wrong.append(f"{name} is not above 0")
    age = 'fairlane_worker_oldest_attempt_age_seconds{lane="default"} > 0'
    if not await query(prom, age):  # the held job's lease ages
        wrong.append(f"no {age}")
    return wrong


async def check_values(prom: str) -> None:
    """The new series hold what the workload did, once every scrape has seen it."""
    # the template variables' queries answer too
    match = {"match[]": "fairlane_lane_capacity_slots"}
    lanes = await api(prom, "/api/v1/label/lane/values", **match)
    assert {"default", "io", "parked"} <= set(lanes["data"])
    wrong: list[str] = []

    async def agree() -> bool:
        wrong[:] = await mismatches(prom)
        return not wrong

    try:
        await eventually(agree, timeout=WAIT, every=0.5)
    except AssertionError:
        raise AssertionError("\n".join(wrong)) from None


async def check_autoscale(prom: str, port: int) -> None:
    """``/autoscale`` says what the scraped gauges say (both read the same store)."""
    autoscale = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/autoscale")
    assert autoscale["ok"]
    parked, default = autoscale["lanes"]["parked"], autoscale["lanes"]["default"]
    assert parked["backlog_total"] == await scalar(
        prom, 'max(fairlane_lane_backlog_slots{lane="parked"})'
    )
    assert parked["deferred"] == await scalar(
        prom, 'sum(max by (class) (fairlane_lane_deferred_jobs{lane="parked"}))'
    )
    assert default["slots_total"] == await scalar(
        prom, 'max(fairlane_lane_capacity_slots{lane="default"})'
    )
    assert default["slots_used"] == 1  # the held job
