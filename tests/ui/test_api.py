"""The dashboard's JSON API without a browser: auth, sessions, CSRF, read-only, filters,
actions. Requests go through ``httpx.ASGITransport`` into the real gateway app, which
talks to the session's private server; a real worker runs the workload."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from fairlane.config.lanes import DEFAULT_CLASS
from fairlane.gateway.state import GatewayState
from fairlane.gateway.ui import UiSettings, mount_ui, ui_router, ui_settings, ui_state
from fairlane.store.durations import class_field, task_field, tenant_field
from tests.e2e.helpers import eventually, running_worker
from tests.ui.helpers import ADMIN, ADMIN_KEY, client, ui_app

pytestmark = pytest.mark.anyio


async def login(http: httpx.AsyncClient) -> str:
    r = await http.post("/ui/login", data={"key": ADMIN_KEY})
    assert r.status_code == 303 and r.headers["location"] == "/ui/"
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    csrf: str = (await http.get("/ui/api/session")).json()["csrf"]
    return csrf


async def test_unauthenticated_refused(redis_url: str, namespace: str) -> None:
    async with client(namespace, redis_url) as (_, http):
        assert (await http.get("/ui/api/overview")).status_code == 401
        wrong = {"Authorization": "Bearer not-the-admin-key-at-all"}
        assert (await http.get("/ui/api/jobs", headers=wrong)).status_code == 401
        page = await http.get("/ui/")
        assert page.status_code == 303 and page.headers["location"] == "/ui/login"
        assert (await http.get("/ui/login")).status_code == 200
        bad = await http.post("/ui/login", data={"key": "guess-guess-guess"})
        assert bad.headers["location"] == "/ui/login?failed=1" and "set-cookie" not in bad.headers
        http.cookies.set("fairlane_ui", "9999999999.nonce.forged", path="/ui")
        assert (await http.get("/ui/api/session")).status_code == 401
        assert (await http.get("/ui/static/../auth.py")).status_code == 404


async def test_session_csrf_and_origin(redis_url: str, namespace: str) -> None:
    async with client(namespace, redis_url) as (app, http):
        job = await app.get_task("later").enqueue(1, tenant="acme")
        csrf = await login(http)
        assert (await http.get("/ui/")).status_code == 200
        url = f"/ui/api/jobs/{job.id}/cancel"
        refused = await http.post(url)
        assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
        assert (await http.post(url, headers={"X-CSRF-Token": "0" * 64})).status_code == 403
        evil = {"X-CSRF-Token": csrf, "Origin": "http://evil.example"}
        assert (await http.post(url, headers=evil)).status_code == 403
        assert await job.status() == "queued"
        done = await http.post(url, headers={"X-CSRF-Token": csrf, "Origin": "http://gw"})
        assert done.status_code == 200 and done.json()["result"] == "cancelled"
        # a bearer call carries no ambient credential: no token needed
        again = await http.post(f"/ui/api/jobs/{job.id}/retry", headers=ADMIN)
        assert again.json()["result"] == "accepted" and again.json()["new_id"] != job.id
        out = await http.post("/ui/logout", headers={"Origin": "http://gw"})
        assert out.status_code == 303
        http.cookies.clear()
        assert (await http.get("/ui/api/session")).status_code == 401


async def test_read_only_and_permissions(redis_url: str, namespace: str) -> None:
    async with client(namespace, redis_url, ui_read_only=True) as (app, http):
        job = await app.get_task("later").enqueue(1, tenant="acme")
        assert (await http.get(f"/ui/api/jobs/{job.id}", headers=ADMIN)).status_code == 200
        r = await http.post(f"/ui/api/jobs/{job.id}/cancel", headers=ADMIN)
        assert r.status_code == 403 and "read-only" in r.json()["detail"]
        bulk = await http.post("/ui/api/bulk", json={"action": "cancel"}, headers=ADMIN)
        assert bulk.status_code == 403
        session = (await http.get("/ui/api/session", headers=ADMIN)).json()
        assert session["read_only"] is True and session["actions"] == []
        assert await job.status() == "queued"
    async with client(namespace + "n", redis_url, ui=False) as (_, http):
        assert (await http.get("/ui/api/session", headers=ADMIN)).status_code == 404


async def test_filters_detail_and_bulk(redis_url: str, namespace: str) -> None:
    async with client(namespace, redis_url) as (app, http):
        echo, boom, later = app.get_task("echo"), app.get_task("boom"), app.get_task("later")
        done = await echo.enqueue("x", tenant="acme")
        dead = await boom.enqueue("no", tenant="zeta")
        async with running_worker(app):
            await done.result(timeout=10)

            async def is_dead() -> bool:
                return await dead.status() == "failed"

            await eventually(is_dead)
        queued = [await later.enqueue(i, tenant="acme" if i < 3 else "beta") for i in range(5)]

        async def get(query: str) -> list[str]:
            r = await http.get(f"/ui/api/jobs?{query}", headers=ADMIN)
            assert r.status_code == 200, r.text
            return [j["id"] for j in r.json()["jobs"]]

        assert set(await get("state=queued")) == {j.id for j in queued}
        assert set(await get("state=queued&tenant=acme")) == {j.id for j in queued[:3]}
        assert await get("state=dead") == [dead.id]
        assert await get("state=completed,dead&task=echo") == [done.id]
        assert await get("state=completed&class=standard") == [done.id]
        assert await get("tenant=zeta") == [dead.id]
        assert len(await get("limit=2")) == 2
        assert (await http.get("/ui/api/jobs?state=lost", headers=ADMIN)).status_code == 422
        assert (await http.get("/ui/api/jobs?limit=9999", headers=ADMIN)).status_code == 422
        assert (await http.get("/ui/api/jobs/nope", headers=ADMIN)).status_code == 404

        detail = (await http.get(f"/ui/api/jobs/{done.id}", headers=ADMIN)).json()
        assert detail["explanation"]["summary"].endswith("completed.")
        assert [seg["what"] for seg in detail["explanation"]["segments"]][-1] == "running"
        assert detail["result"] == "x" and detail["run"] is None
        overview = (await http.get("/ui/api/overview", headers=ADMIN)).json()
        parked = next(lane for lane in overview["lanes"] if lane["name"] == "parked")
        queued_by = {t["tenant"]: t["queued"] for t in parked["tenants"]}
        assert queued_by == {"acme": 3, "beta": 2}
        assert overview["counts"]["dead"] == 1
        assert any(w["n"] >= 1 for w in overview["waits"]["by_class"])

        body = {"action": "cancel", "states": ["queued"], "tenant": "acme"}
        probe = (await http.post("/ui/api/bulk", json=body, headers=ADMIN)).json()
        assert probe == {"action": "cancel", "count": 3, "done": False}
        stale = await http.post("/ui/api/bulk", json={**body, "confirm": 2}, headers=ADMIN)
        assert stale.status_code == 409
        ok = await http.post("/ui/api/bulk", json={**body, "confirm": 3}, headers=ADMIN)
        assert ok.json()["done"] is True and len(ok.json()["results"]) == 3
        assert [await j.status() for j in queued] == ["cancelled"] * 3 + ["queued"] * 2
        bad = await http.post("/ui/api/bulk", json={"action": "explode"}, headers=ADMIN)
        assert bad.status_code == 422

        moved = await http.post(f"/ui/api/jobs/{dead.id}/redrive", headers=ADMIN)
        assert moved.json()["result"] == "redriven"
        assert await dead.status() == "queued"
        again = (await http.get(f"/ui/api/jobs/{dead.id}", headers=ADMIN)).json()
        assert "redriven" in [e["kind"] for e in again["events"]]


async def test_a_waiting_jobs_page_says_when_it_is_expected_to_start(
    redis_url: str, namespace: str
) -> None:
    """Its jobs learned to take 10 s, the lane's one slot held by the first (the one
    exchange of a worker of one slot): the second's page says when it should start and
    why; before any worker it says why nothing can be said."""
    async with client(namespace, redis_url) as (app, http):
        later = app.get_task("later")  # on the lane "parked", which no test worker serves
        store = app.sharded.store_for_tenant("acme")
        await store.learn_durations(
            [
                (task_field("later", "acme"), 1, 10_000.0),
                (tenant_field("parked", DEFAULT_CLASS, "acme"), 1, 10_000.0),
                (class_field("parked", DEFAULT_CLASS), 1, 10_000.0),
            ]
        )
        held, waiting = [await later.enqueue(i, tenant="acme") for i in range(2)]

        async def estimate(job_id: str) -> dict[str, Any] | None:
            r = await http.get(f"/ui/api/jobs/{job_id}", headers=ADMIN)
            assert r.status_code == 200, r.text
            said: dict[str, Any] | None = r.json()["start_estimate"]
            return said

        before = await estimate(waiting.id)
        assert before is not None and before["at_ms"] is None
        assert before["line"] == "no start estimate: no live worker serves its lane"
        got = await store.exchange("w1", ["parked"], 1, 60_000, slots=1)
        assert [j.id for j in got.jobs] == [held.id]
        now = await store.server_time_ms()
        said = await estimate(waiting.id)
        assert said is not None and said["at_ms"] > now and said["why_none"] is None
        assert said["line"].startswith("expected to start in about ")
        assert "ahead of it in parked/standard (1 slots)" in said["line"]
        assert said["line"].endswith("it is expected to run 10 s (an estimate, not a promise)")
        assert said["slots"] == 1 and said["jobs_ahead"] == 0
        assert await estimate(held.id) is None  # running: its start is behind it


async def test_mounted_in_a_host_app(redis_url: str, namespace: str) -> None:
    app = ui_app(namespace, redis_url)
    async with app:
        job = await app.get_task("later").enqueue(1, tenant="acme")
        host = FastAPI()
        mount_ui(host, GatewayState(app, admin_key=ADMIN_KEY), actions=frozenset({"redrive"}))
        other = FastAPI()
        other.include_router(ui_router(), prefix="/ops")
        other.dependency_overrides[ui_state] = lambda: GatewayState(app, admin_key=ADMIN_KEY)
        other.dependency_overrides[ui_settings] = lambda: UiSettings(read_only=True)
        for api, base in ((host, "/ui"), (other, "/ops/ui")):
            transport = httpx.ASGITransport(app=api)
            async with httpx.AsyncClient(transport=transport, base_url="http://host") as http:
                r = await http.get(f"{base}/api/jobs/{job.id}", headers=ADMIN)
                assert r.status_code == 200 and r.json()["state"] == "queued"
                r = await http.post(f"{base}/api/jobs/{job.id}/cancel", headers=ADMIN)
                assert r.status_code == 403
                assert (await http.get(f"{base}/static/app.js")).status_code == 200
        assert await job.status() == "queued"
        keyless = FastAPI()
        mount_ui(keyless, GatewayState(app))
        transport = httpx.ASGITransport(app=keyless)
        async with httpx.AsyncClient(transport=transport, base_url="http://host") as http:
            r = await http.get("/ui/api/session", headers=ADMIN)
            assert r.status_code == 403 and "admin key" in r.json()["detail"]


async def test_workflow_runs(redis_url: str, namespace: str) -> None:
    async with client(namespace, redis_url) as (app, http):
        run = await app.get_task("approval").enqueue("doc-1", tenant="acme")
        async with running_worker(app):

            async def suspended() -> bool:
                (wait,) = await app.store.job_fields(run.id, "wf")
                return wait == b"signal:approve"

            await eventually(suspended)
        runs = (await http.get("/ui/api/runs", headers=ADMIN)).json()
        assert runs["workflows"] == ["approval"] and [r["id"] for r in runs["jobs"]] == [run.id]
        detail = (await http.get(f"/ui/api/jobs/{run.id}", headers=ADMIN)).json()
        assert detail["waiting_for"] == "signal:approve"
        slices = detail["run"]["slices"]
        assert [(s["outcome"], s["wait"]) for s in slices] == [("suspended", "signal:approve")]
        assert detail["run"]["waits"][-1]["status"] == "waiting"
        assert "suspended" in detail["explanation"]["summary"]
