"""The gateway's ``/metrics`` against a real server: the store-side families (the same
admission decisions a worker exports), and the gateway's own HTTP metrics.

Requests go through ``httpx.ASGITransport`` into a gateway built by ``create_app``, on
which the test mounts the metrics itself (as the factory does when asked to)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from fairlane import App
from fairlane.gateway import ApiKeys, create_app
from fairlane.gateway.metrics import GatewayMetrics, mount_metrics
from fairlane.metrics import StoreReader
from tests.e2e.helpers import fast_settings
from tests.gateway.helpers import ADMIN_KEY, build_app
from tests.metrics.helpers import Samples, parse, scrape_store, series, store_reader, value

pytestmark = pytest.mark.anyio

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
REQUESTS = "fairlane_gateway_requests_total"
ANSWERS = "fairlane_gateway_admissions_total"
SUBMITS = "fairlane_gateway_submit_duration_seconds_count"
DECISIONS = "fairlane_admission_decisions_total"

# a tenant may have one admitted job per class: `standard` refuses the second, `later`
# defers it
CONFIG: dict[str, Any] = {
    "pools": {
        "default": {
            "capacity_units": 10,
            "classes": {
                "standard": {
                    "nominal_share": 0.5,
                    "max_queue": 1,
                    "response_when_full": "reject",
                },
                "later": {
                    "nominal_share": 0.5,
                    "max_queue": 1,
                    "max_deferred": 10,
                    "response_when_full": "defer",
                },
            },
        }
    },
    "estimation": {"safety_multiplier": 1.0},
}


@asynccontextmanager
async def client(api: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    # the lifespan runs as a server would run it: the reader is closed at shutdown
    async with api.router.lifespan_context(api):
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            yield c


def reader_of(metrics: GatewayMetrics) -> StoreReader | None:
    return metrics.reader


async def scrape(c: httpx.AsyncClient, headers: dict[str, str] | None = None) -> Samples:
    r = await c.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return parse(r.text)


async def test_gateway_serves_store_and_http_metrics(redis_url: str, namespace: str) -> None:
    app = build_app(namespace, redis_url, CONFIG)
    async with app:
        api = create_app(app, admin_key=ADMIN_KEY)  # serves /metrics by default
        metrics = api.state.metrics
        minted = await ApiKeys(app.store.key_records).create("acme")
        tenant = {"Authorization": f"Bearer {minted.key}"}
        async with client(api) as c:

            async def submit(cls: str) -> httpx.Response:
                body = {"task": "echo", "service_class": cls, "estimate": 1.0}
                return await c.post("/v1/jobs", json=body, headers=tenant)

            answers = [await submit(cls) for cls in ("standard", "standard", "later", "later")]
            assert [r.status_code for r in answers] == [202, 429, 202, 202]
            assert answers[1].json()["reason"] == "tenant_queue_full"
            assert answers[3].json()["state"] == "deferred"
            job_id = answers[0].json()["id"]
            assert (await c.get(f"/v1/jobs/{job_id}", headers=tenant)).status_code == 200
            assert (
                await c.post("/v1/jobs", json={"task": "nope"}, headers=tenant)
            ).status_code == 422
            assert (await c.post("/v1/jobs", json={"task": "echo"})).status_code == 401
            assert (await c.get("/no/such/page")).status_code == 404
            assert (await c.get("/ui/api/overview")).status_code == 401
            s = await scrape(c)
            assert reader_of(metrics) is not None
        assert reader_of(metrics) is None  # closed with the app's lifespan
        reader = store_reader(app, redis_url)
        try:
            direct = await scrape_store(reader)
        finally:
            reader.close()

    # HTTP answers by route template (never an id), method and status
    post = {"method": "POST", "route": "/v1/jobs"}
    assert value(s, REQUESTS, status="202", **post) == 2 + 1
    assert value(s, REQUESTS, status="429", **post) == 1
    assert value(s, REQUESTS, status="422", **post) == 1
    assert value(s, REQUESTS, status="401", **post) == 1
    assert value(s, REQUESTS, method="GET", route="/v1/jobs/{job_id}", status="200") == 1
    assert value(s, REQUESTS, method="GET", route="unmatched", status="404") == 1
    # a router included under a prefix keeps it in its template
    assert value(s, REQUESTS, method="GET", route="/ui/api/overview", status="401") == 1
    assert {got["route"] for got, _ in s[REQUESTS]} == {
        "/v1/jobs",
        "/v1/jobs/{job_id}",
        "/ui/api/overview",
        "unmatched",
    }
    # admission answers as the callers were told them; refusals of the request are not
    assert series(s, ANSWERS) == {
        (("reason", "none"), ("verdict", "accepted")): 2,
        (("reason", "none"), ("verdict", "deferred")): 1,
        (("reason", "tenant_queue_full"), ("verdict", "rejected")): 1,
    }
    assert value(s, SUBMITS, verdict="accepted") == 2
    assert value(s, SUBMITS, verdict="refused") == 2  # the unknown task and the missing key
    # the store side: the server's own counts, the same a worker (or any reader) exports
    assert value(s, "fairlane_store_up") == 1
    assert value(s, DECISIONS, **{"class": "standard"}, outcome="rejected") == 1
    assert value(s, DECISIONS, **{"class": "later"}, outcome="deferred") == 1
    assert series(s, DECISIONS) == series(direct, DECISIONS)
    assert value(s, "fairlane_lane_deferred_jobs", lane="default", **{"class": "later"}) == 1


async def test_metrics_may_require_the_admin_key(redis_url: str, namespace: str) -> None:
    app = build_app(namespace, redis_url)
    async with app:
        with pytest.raises(ValueError, match="admin key"):
            create_app(app, metrics_require_admin=True)
        api = create_app(app, admin_key=ADMIN_KEY, metrics_require_admin=True)
        async with client(api) as c:
            assert (await c.get("/metrics")).status_code == 401
            wrong = {"Authorization": "Bearer " + "y" * 32}
            assert (await c.get("/metrics", headers=wrong)).status_code == 401
            s = await scrape(c, ADMIN)
    assert value(s, "fairlane_store_up") == 1
    assert value(s, REQUESTS, route="/metrics", status="401") == 2


async def test_metrics_are_served_while_the_store_is_unreachable(namespace: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = App(namespace, redis_url=f"redis://127.0.0.1:{port}/0", settings=fast_settings())

    @app.task(name="echo", gateway=True)
    async def echo() -> None: ...

    api = create_app(app, metrics=False)  # mounted by hand, as a host app would
    metrics = mount_metrics(api)
    async with client(api) as c:
        first = await scrape(c)
        second = await scrape(c)
    assert isinstance(metrics, GatewayMetrics) and metrics.reader is None
    assert value(first, "fairlane_store_up") == 0
    assert value(second, REQUESTS, route="/metrics", status="200") == 1


async def test_gateway_autoscale_leaves_batch_out_of_the_scale_backlog(
    redis_url: str, namespace: str
) -> None:
    app = build_app(namespace, redis_url)

    @app.task(gateway=True, name="nightly", lane="quiet", service_class="batch")
    async def nightly() -> None:
        return None

    @app.task(gateway=True, name="report", lane="quiet")
    async def report() -> None:
        return None

    async with app:
        for _ in range(5):
            await nightly.enqueue(tenant="t")
        await report.enqueue(tenant="t")
        api = create_app(app, admin_key=ADMIN_KEY, metrics_require_admin=True)
        async with client(api) as c:
            assert (await c.get("/autoscale")).status_code == 401
            r = await c.get("/autoscale", headers=ADMIN)
    assert r.status_code == 200, r.text
    view = r.json()
    assert view["ok"] is True
    quiet = view["lanes"]["quiet"]
    assert quiet["backlog"] == {"batch": 5, "standard": 1}
    assert (quiet["backlog_total"], quiet["backlog_batch"]) == (1, 5)


async def test_gateway_autoscale_says_when_the_store_is_unreachable(namespace: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = App(namespace, redis_url=f"redis://127.0.0.1:{port}/0", settings=fast_settings())

    @app.task(name="echo", gateway=True)
    async def echo() -> None: ...

    api = create_app(app)
    async with client(api) as c:
        r = await c.get("/autoscale")
    assert r.status_code == 200
    assert r.json() == {"ok": False, "lanes": {}}
