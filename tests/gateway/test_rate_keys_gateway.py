"""The gateway's ``/metrics`` exports the rate keys' families as a worker's port does:
the store's own counts, read from the same read model, after real jobs on a real server."""

from __future__ import annotations

import httpx
import pytest

from fairlane import Rate
from fairlane.gateway import create_app
from tests.e2e.helpers import WAIT, running_worker
from tests.gateway.helpers import ADMIN_KEY, build_app
from tests.metrics.helpers import parse, value

pytestmark = pytest.mark.anyio


async def test_the_gateway_exports_rate_keys_per_key(redis_url: str, namespace: str) -> None:
    app = build_app(namespace, redis_url)

    @app.task(gateway=True, name="limited", rates={"model:gw": Rate(20, per=1.0, burst=1)})
    async def limited(n: int) -> int:
        return n

    async with app:
        jobs = [await limited.enqueue(i, tenant="acme") for i in range(3)]
        async with running_worker(app, concurrency=3):
            assert [await j.result(timeout=WAIT) for j in jobs] == [0, 1, 2]
        api = create_app(app, admin_key=ADMIN_KEY)  # serves /metrics by default
        async with api.router.lifespan_context(api):
            transport = httpx.ASGITransport(app=api)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
                r = await c.get("/metrics")
    assert r.status_code == 200, r.text
    got = parse(r.text)
    assert value(got, "fairlane_rate_tokens_admitted_total", key="model:gw") == 3.0
    assert value(got, "fairlane_rate_woken_total", key="model:gw") == 2.0
    assert value(got, "fairlane_rate_wait_seconds_total", key="model:gw") > 0.0
    assert value(got, "fairlane_rate_keys") == 1.0
