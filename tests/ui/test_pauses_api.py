"""The dashboard's pause endpoints without a browser: only an admin key with the
``operate`` scope changes anything; every change answers what it did and is in the
audit trail under the admin key's id; bad input answers 422 and changes nothing; a
quarantined tenant's submits answer 429 ``tenant_paused`` with a Retry-After.

Requests go through ``httpx.ASGITransport`` into the real gateway app, which talks to
the session's private server; no worker runs (the jobs stay where a pause holds them).
"""

from __future__ import annotations

from typing import Any

import pytest

from fairlane import App
from fairlane.gateway import ApiKeys, create_app
from fairlane.gateway.apikeys import admin_key_id, check_scopes
from tests.ui.helpers import ADMIN, ADMIN_KEY, client, ui_app

pytestmark = pytest.mark.anyio

OPERATE = ("read", "operate")


async def _pause_entries(app: App) -> list[tuple[str, str]]:
    return [(e.action, e.outcome) for e in await app.store.key_records.audit.read(50)]


WRITES: list[tuple[str, dict[str, Any]]] = [
    ("tenants/acme/pause", {"reason": "r"}),
    ("tenants/acme/quarantine", {}),
    ("tenants/acme/resume", {}),
    ("tasks/later/pause", {}),
    ("tasks/later/resume", {}),
    ("lanes/parked/pause", {"class": "standard"}),
    ("lanes/parked/resume", {}),
]


async def test_an_admin_key_without_operate_reads_but_changes_nothing(
    redis_url: str, namespace: str
) -> None:
    async with client(namespace, redis_url) as (app, http):
        await app.get_task("later").enqueue(1, tenant="acme")
        session = (await http.get("/ui/api/session", headers=ADMIN)).json()
        assert session["operate"] is False
        listed = await http.get("/ui/api/pauses", headers=ADMIN)
        assert listed.status_code == 200 and listed.json()["operate"] is False
        tenant = {
            "Authorization": f"Bearer {(await ApiKeys(app.store.key_records).create('acme')).key}"
        }
        for path, body in WRITES:
            r = await http.post(f"/ui/api/{path}", json=body, headers=ADMIN)
            assert r.status_code == 403 and "'operate' scope" in r.json()["detail"], path
            # a tenant's key is no admin key at all
            assert (
                await http.post(f"/ui/api/{path}", json=body, headers=tenant)
            ).status_code == 401
        assert await app.pauses.list() == []
        assert ("pause", "paused") not in await _pause_entries(app)
    with pytest.raises(ValueError, match="admin key's scope"):
        check_scopes(["read", "operate"])
    with pytest.raises(ValueError, match="always reads"):
        create_app(ui_app(namespace, redis_url), admin_key=ADMIN_KEY, admin_scopes=["operate"])
    with pytest.raises(ValueError, match="unknown admin scope"):
        create_app(ui_app(namespace, redis_url), admin_key=ADMIN_KEY, admin_scopes=["submit"])


async def test_a_tenant_paused_and_quarantined_then_resumed(redis_url: str, namespace: str) -> None:
    async with client(namespace, redis_url, admin_scopes=OPERATE) as (app, http):
        waiting = await app.get_task("later").enqueue(1, tenant="acme")
        key = await ApiKeys(app.store.key_records).create("acme")
        tenant = {"Authorization": f"Bearer {key.key}"}
        assert (await http.get("/ui/api/session", headers=ADMIN)).json()["operate"] is True
        body = {"reason": "runaway loop", "for": 600, "refuse_submissions": True}
        r = await http.post("/ui/api/tenants/acme/pause", json=body, headers=ADMIN)
        assert r.status_code == 200, r.text
        paused = r.json()
        assert paused["scope"] == {"kind": "tenant", "tenant": "acme"}
        assert paused["result"] == "paused" and paused["refuse_submissions"] is True
        now = await app.store.server_time_ms()
        assert now + 590_000 <= paused["until_ms"] <= now + 600_000
        listed = (await http.get("/ui/api/pauses", headers=ADMIN)).json()
        rows = {p["scope"]["kind"]: p for p in listed["pauses"]}
        assert set(rows) == {"tenant", "refuse"}
        assert (
            rows["tenant"]["reason"] == "runaway loop" and rows["tenant"]["text"] == "tenant acme"
        )
        assert rows["tenant"]["by"] == admin_key_id(ADMIN_KEY)
        # a quarantined tenant's submits: 429 tenant_paused with a Retry-After, twice (the
        # second with the key the gateway has read: the one-round-trip path), nothing stored
        submit = {"task": "echo", "args": ["x"]}
        for _ in range(2):
            refused = await http.post("/v1/jobs", json=submit, headers=tenant)
            assert refused.status_code == 429, refused.text
            assert refused.json()["reason"] == "tenant_paused"
            assert 590 <= int(refused.headers["Retry-After"]) <= 600
            assert 590 <= refused.json()["retry_after_seconds"] <= 600
        assert await waiting.status() == "queued"
        r = await http.post("/ui/api/tenants/acme/resume", headers=ADMIN)
        assert r.status_code == 200 and r.json()["result"] == "resumed"
        assert await app.pauses.list() == []
        assert (await http.post("/v1/jobs", json=submit, headers=tenant)).status_code == 202
        again = await http.post("/ui/api/tenants/acme/resume", headers=ADMIN)
        assert again.status_code == 404 and "not paused" in again.json()["detail"]
        # a quarantine alone, until resumed
        q = await http.post(
            "/ui/api/tenants/acme/quarantine", json={"reason": "abuse"}, headers=ADMIN
        )
        assert q.status_code == 200 and q.json()["scope"]["kind"] == "refuse"
        assert q.json()["until_ms"] is None
        assert (await http.post("/v1/jobs", json=submit, headers=tenant)).status_code == 429
        entries = await app.store.key_records.audit.read(50, action="pause")
        assert {e.key_id for e in entries} == {admin_key_id(ADMIN_KEY)}
        assert [e.outcome for e in entries] == ["quarantined", "quarantined", "paused"]
        assert "runaway loop" in entries[-1].detail
        resumed = await app.store.key_records.audit.read(50, action="resume")
        assert [e.key_id for e in resumed] == [admin_key_id(ADMIN_KEY)] * 2


async def test_a_task_and_a_lane_class_paused_and_resumed(redis_url: str, namespace: str) -> None:
    async with client(namespace, redis_url, admin_scopes=OPERATE) as (app, http):
        await app.get_task("later").enqueue(1, tenant="acme")
        r = await http.post(
            "/ui/api/tasks/later/pause", json={"reason": "bad deploy", "for": 30}, headers=ADMIN
        )
        assert r.status_code == 200 and r.json()["scope"] == {"kind": "task", "task": "later"}
        r = await http.post(
            "/ui/api/lanes/parked/pause",
            json={"class": "standard", "cancel_running": True},
            headers=ADMIN,
        )
        assert r.status_code == 200, r.text
        assert r.json()["scope"] == {"kind": "lane", "lane": "parked", "class": "standard"}
        assert r.json()["text"] == "lane parked/standard" and r.json()["running_asked"] == 0
        again = await http.post(
            "/ui/api/tasks/later/pause", json={"reason": "still"}, headers=ADMIN
        )
        assert again.json()["already"] is True and again.json()["until_ms"] is None
        listed = (await http.get("/ui/api/pauses", headers=ADMIN)).json()["pauses"]
        assert sorted(p["text"] for p in listed) == ["lane parked/standard", "task later"]
        # the whole lane is another scope than its class: resuming it leaves the class paused
        whole = await http.post("/ui/api/lanes/parked/resume", headers=ADMIN)
        assert whole.status_code == 404
        r = await http.post(
            "/ui/api/lanes/parked/resume", json={"class": "standard"}, headers=ADMIN
        )
        assert r.status_code == 200 and r.json()["result"] == "resumed"
        r = await http.post("/ui/api/tasks/later/resume", headers=ADMIN)
        assert r.status_code == 200 and r.json()["moved_back"] == 0
        assert await app.pauses.list() == []


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("tenants/nobody/pause", {}, "unknown tenant 'nobody'"),
    ("tenants/nobody/quarantine", {}, "unknown tenant 'nobody'"),
    ("tenants/acme/pause", {"for": 0}, "in the future"),
    ("tenants/acme/pause", {"for": -5}, "in the future"),
    ("tenants/acme/quarantine", {"for": -1}, "in the future"),
    ("tasks/no.such.task/pause", {}, "unknown task"),
    ("tasks/no.such.task/resume", {}, "unknown task"),
    ("lanes/nowhere/pause", {}, "unknown lane"),
    ("lanes/parked/pause", {"class": "gold"}, "has no class 'gold'"),
    ("lanes/parked/resume", {"class": "gold"}, "has no class 'gold'"),
]


async def test_bad_input_answers_422_and_changes_nothing(redis_url: str, namespace: str) -> None:
    async with client(namespace, redis_url, admin_scopes=OPERATE) as (app, http):
        await app.get_task("later").enqueue(1, tenant="acme")
        for path, body, said in BAD:
            r = await http.post(f"/ui/api/{path}", json=body, headers=ADMIN)
            assert r.status_code == 422 and said in r.json()["detail"], (path, r.text)
        odd = await http.post("/ui/api/tasks/later/pause", json={"until": 5}, headers=ADMIN)
        assert odd.status_code == 422  # a field it does not know is no silent default
        assert await app.pauses.list() == []
        assert await app.store.key_records.audit.read(50, action="pause") == []


async def test_a_session_pauses_with_its_token_and_a_read_only_dashboard_never(
    redis_url: str, namespace: str
) -> None:
    async with client(namespace, redis_url, admin_scopes=OPERATE) as (app, http):
        await app.get_task("later").enqueue(1, tenant="acme")
        assert (await http.post("/ui/login", data={"key": ADMIN_KEY})).status_code == 303
        csrf = (await http.get("/ui/api/session")).json()["csrf"]
        assert (await http.post("/ui/api/tasks/later/pause", json={})).status_code == 403
        evil = {"X-CSRF-Token": csrf, "Origin": "http://evil.example"}
        assert (
            await http.post("/ui/api/tasks/later/pause", json={}, headers=evil)
        ).status_code == 403
        assert await app.pauses.list() == []
        mine = {"X-CSRF-Token": csrf, "Origin": "http://gw"}
        assert (
            await http.post("/ui/api/tasks/later/pause", json={}, headers=mine)
        ).status_code == 200
        assert [e.scope.task for e in await app.pauses.list()] == ["later"]
    async with client(namespace, redis_url, admin_scopes=OPERATE, ui_read_only=True) as (app, http):
        assert (await http.get("/ui/api/pauses", headers=ADMIN)).json()["operate"] is False
        r = await http.post("/ui/api/tasks/later/resume", headers=ADMIN)
        assert r.status_code == 403 and "read-only" in r.json()["detail"]
        assert [e.scope.task for e in await app.pauses.list()] == ["later"]
