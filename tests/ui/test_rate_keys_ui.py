"""The dashboard shows rate keys beside throttle keys: the live view's rate keys (rate in
force, tokens, waiters and when they are due, counters) and a job's rate keys in its
detail, with the explanation naming the key it waits on. Real jobs through a real
worker on a real server; the JSON read through the real gateway app."""

from __future__ import annotations

import httpx
import pytest

from fairlane import Adaptive, Rate
from fairlane.gateway import create_app
from tests.e2e.helpers import WAIT, eventually, running_worker
from tests.ui.helpers import ADMIN, ADMIN_KEY, ui_app

pytestmark = pytest.mark.anyio


async def test_rate_keys_are_shown_beside_throttle_keys(redis_url: str, namespace: str) -> None:
    app = ui_app(namespace, redis_url)

    @app.task(
        gateway=True,
        name="slow",
        rates={"model:slow": Rate(1, per=60.0)},
        limits={"model:slow": Adaptive(6, 1)},
    )
    async def slow(n: int) -> int:
        return n

    async with app:
        first = await slow.enqueue(1, tenant="acme")
        second = await slow.enqueue(2, tenant="beta", rates={"user:beta": Rate(100, per=1.0)})
        async with running_worker(app, concurrency=2):
            await first.result(timeout=WAIT)

            async def parked() -> bool:
                events = await app.store.job_events(second.id)
                return any(e.kind == "parked" for e in events)

            await eventually(parked)
        api = create_app(app, admin_key=ADMIN_KEY)
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            overview = (await http.get("/ui/api/overview", headers=ADMIN)).json()
            detail = (await http.get(f"/ui/api/jobs/{second.id}", headers=ADMIN)).json()
            page = (await http.get("/ui/static/app.js")).text
    rates = {r["key"]: r for r in overview["rates"]["keys"]}
    row = rates["model:slow"]
    assert row["rate"] == {"limit": 1.0, "per": 60.0, "burst": 1.0, "cost": "jobs"}
    assert (row["taken"], row["waiters"], row["head"]) == (1.0, 1, [second.id])
    assert row["tokens"] < 1.0 and row["due_ms"] > overview["now_ms"]
    assert row["adaptive"] == {"value": 6.0, "limit": 6, "max": 6, "min": 1}
    # the key is a throttle key too (its adaptive concurrency limit), in the table beside
    throttles = {t["key"]: t for t in overview["throttles"]}
    assert throttles["model:slow"]["adaptive"] == row["adaptive"]
    assert (throttles["model:slow"]["limit"], throttles["model:slow"]["rate_key"]) == (6, True)
    # a key named only as a rate key has no concurrency limit to show
    assert (throttles["user:beta"]["limit"], throttles["user:beta"]["rate_key"]) == (None, True)
    assert rates["user:beta"]["rate"]["limit"] == 100.0
    assert rates["user:beta"]["tokens"] == 100.0  # no job took from it yet: full
    mine = {r["key"]: r for r in detail["rate_keys"]}
    assert set(mine) == {"model:slow", "user:beta"}  # the task's key and the call's
    assert mine["model:slow"]["cost"] == 1.0 and mine["model:slow"]["tokens"] < 1.0
    last = detail["explanation"]["segments"][-1]
    assert last["what"] == "parked" and last["cause"] == "rate"
    assert "its next tokens are due in" in last["why"]
    assert 'h("h2", {}, "Rate keys")' in page  # the live view's table
