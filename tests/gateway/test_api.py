"""The HTTP gateway against a real server: submission answers, results, auth, isolation.

Requests go through ``httpx.ASGITransport`` into the FastAPI app, which talks to the
session's private Redis/Valkey server; workers run in the test's loop where a job must
finish.
"""

from __future__ import annotations

import socket

import httpx
import pytest

from fairlane import App
from fairlane.gateway import ApiKeys, create_app
from fairlane.store.apikeys import KeyRecords
from tests.e2e.helpers import fast_settings, running_worker
from tests.gateway.helpers import ADMIN_KEY, gateway, pool

pytestmark = pytest.mark.anyio

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


async def test_submit_accepted_then_result(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url) as gw:
        auth = await gw.key("acme")
        r = await gw.client.post("/v1/jobs", json={"task": "add", "args": [1, 2]}, headers=auth)
        assert r.status_code == 202, r.text
        body = r.json()
        assert body["state"] == "accepted" and body["created"] is True
        assert body["status_url"] == f"/v1/jobs/{body['id']}"
        status = await gw.client.get(body["status_url"], headers=auth)
        assert status.status_code == 200
        assert status.json()["tenant"] == "acme" and status.json()["status"] == "queued"
        pending = await gw.client.get(f"/v1/jobs/{body['id']}/result?wait=0.1", headers=auth)
        assert pending.status_code == 202 and pending.json()["status"] == "queued"
        async with running_worker(gw.app):
            done = await gw.client.get(f"/v1/jobs/{body['id']}/result?wait=10", headers=auth)
        assert done.status_code == 200, done.text
        assert done.json() == {"id": body["id"], "status": "completed", "result": 3}


async def test_failed_and_cancelled_results(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url) as gw:
        auth = await gw.key("acme")
        fail = await gw.client.post(
            "/v1/jobs", json={"task": "boom", "kwargs": {"message": "no"}}, headers=auth
        )
        async with running_worker(gw.app):
            r = await gw.client.get(f"/v1/jobs/{fail.json()['id']}/result?wait=10", headers=auth)
        assert r.status_code == 200
        assert r.json()["status"] == "failed"
        assert r.json()["error"] == {"type": "LookupError", "message": "no"}
        job = (await gw.client.post("/v1/jobs", json={"task": "echo"}, headers=auth)).json()
        cancelled = await gw.client.delete(f"/v1/jobs/{job['id']}", headers=auth)
        assert cancelled.json() == {"id": job["id"], "status": "cancelled"}
        r = await gw.client.get(f"/v1/jobs/{job['id']}/result", headers=auth)
        assert r.json()["status"] == "cancelled" and r.json()["error"]["type"] == "Cancelled"


async def test_idempotency_key_returns_the_first_job(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url) as gw:
        auth = await gw.key("acme")
        body = {"task": "echo", "args": ["x"], "idempotency_key": "k1", "priority": 5}
        first = (await gw.client.post("/v1/jobs", json=body, headers=auth)).json()
        second = (await gw.client.post("/v1/jobs", json=body, headers=auth)).json()
        assert second["id"] == first["id"] and second["created"] is False


async def test_deferred_and_rejected(redis_url: str, namespace: str) -> None:
    async with gateway(f"{namespace}d", redis_url, pool(2, "defer")) as gw:
        auth = await gw.key("acme")
        job = {"task": "echo", "estimate": 1.5}
        first = await gw.client.post("/v1/jobs", json=job, headers=auth)
        second = await gw.client.post("/v1/jobs", json=job, headers=auth)
        assert first.json()["state"] == "accepted"
        assert second.status_code == 202 and second.json()["state"] == "deferred"
        await gw.app.purge()
    async with gateway(namespace, redis_url, pool(2, "reject")) as gw:
        auth = await gw.key("acme")
        job = {"task": "echo", "estimate": 1.5}
        assert (await gw.client.post("/v1/jobs", json=job, headers=auth)).status_code == 202
        r = await gw.client.post("/v1/jobs", json=job, headers=auth)
        assert r.status_code == 429, r.text
        assert int(r.headers["Retry-After"]) >= 1
        assert r.json()["reason"] == "class_full"
        assert r.json()["retry_after_seconds"] > 0


async def test_bad_submissions(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url, max_payload_bytes=1000) as gw:
        auth = await gw.key("acme")

        async def post(body: object) -> httpx.Response:
            return await gw.client.post("/v1/jobs", json=body, headers=auth)

        unknown = await post({"task": "nope"})
        assert unknown.status_code == 422 and unknown.json()["reason"] == "unknown_task"
        assert "nope" in unknown.json()["detail"]
        wrong_type = await post({"task": "add", "args": ["one", 2]})
        assert wrong_type.status_code == 422 and wrong_type.json()["reason"] == "bad_arguments"
        assert "wrong type" in wrong_type.json()["detail"]
        missing = await post({"task": "add", "args": [1]})
        assert missing.status_code == 422 and "signature" in missing.json()["detail"]
        # the tenant is the key's: a body naming one does not validate, and a kwarg named
        # `tenant` is an argument of the task (refused here: `add` takes no such parameter)
        assert (await post({"task": "add", "args": [1, 2], "tenant": "evil"})).status_code == 422
        as_kwarg = await post({"task": "add", "args": [1, 2], "kwargs": {"tenant": "evil"}})
        assert as_kwarg.status_code == 422
        too_big_args = await post({"task": "echo", "args": ["x" * 1500]})
        assert too_big_args.status_code == 413 and too_big_args.json()["reason"] == "too_large"
        too_big_body = await post({"task": "echo", "args": ["x" * 3000]})
        assert too_big_body.status_code == 413
        bad_class = await post({"task": "echo", "service_class": "gold"})
        assert bad_class.status_code == 422
        assert (await post({"task": "echo", "priority": 5000})).status_code == 422
        assert (await post({"task": "echo", "estimate": -1})).status_code == 422


async def test_store_unreachable_is_503(namespace: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = App(namespace, redis_url=f"redis://127.0.0.1:{port}/0", settings=fast_settings())

    @app.task(name="echo", gateway=True)
    async def echo() -> None: ...

    api = create_app(app)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://gw") as c:
        r = await c.post(
            "/v1/jobs", json={"task": "echo"}, headers={"Authorization": "Bearer flk_x"}
        )
        # an ill-formed key is refused without a lookup; a well-formed one needs the store
        assert r.status_code == 401
        key = "flk_0123456789ab_" + "s" * 43
        r = await c.post(
            "/v1/jobs", json={"task": "echo"}, headers={"Authorization": f"Bearer {key}"}
        )
    assert r.status_code == 503, r.text
    assert r.json()["reason"] == "store_unavailable"
    assert int(r.headers["Retry-After"]) >= 1


async def test_auth_missing_invalid_revoked_rotated(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url) as gw:
        job = {"task": "echo"}
        assert (await gw.client.post("/v1/jobs", json=job)).status_code == 401
        bad = {"Authorization": "Bearer flk_0123456789ab_nothing"}
        r = await gw.client.post("/v1/jobs", json=job, headers=bad)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        minted = await gw.keys.create("acme")
        old = {"Authorization": f"Bearer {minted.key}"}
        assert (await gw.client.post("/v1/jobs", json=job, headers=old)).status_code == 202
        # a key with the right id and a wrong secret is refused
        forged = {"Authorization": f"Bearer {minted.key[:-4]}AAAA"}
        assert (await gw.client.post("/v1/jobs", json=job, headers=forged)).status_code == 401
        rotated = await gw.keys.rotate(minted.key_id)
        assert rotated.key_id == minted.key_id and rotated.key != minted.key
        assert (await gw.client.post("/v1/jobs", json=job, headers=old)).status_code == 401
        new = {"Authorization": f"Bearer {rotated.key}"}
        assert (await gw.client.post("/v1/jobs", json=job, headers=new)).status_code == 202
        await gw.keys.revoke(minted.key_id)
        assert (await gw.client.post("/v1/jobs", json=job, headers=new)).status_code == 401
        stored = await gw.app.store.client.hgetall(gw.app.store.keys.gateway_keys)
        assert rotated.key.encode() not in b"".join(stored.values())  # hashed at rest


async def test_a_key_revoked_elsewhere_stores_nothing(redis_url: str, namespace: str) -> None:
    # the gateway keeps the records it read and lets the enqueue check them: a key
    # revoked by another process (the CLI) is refused by that check, with nothing stored
    async with gateway(namespace, redis_url) as gw:
        minted = await gw.keys.create("acme")
        auth = {"Authorization": f"Bearer {minted.key}"}
        job = {"task": "echo", "args": ["kept"]}
        assert (await gw.client.post("/v1/jobs", json=job, headers=auth)).status_code == 202
        assert (await gw.client.post("/v1/jobs", json=job, headers=auth)).status_code == 202
        client, jobs = gw.app.store.client, gw.app.store.keys.job("*")
        stored = [k async for k in client.scan_iter(match=jobs)]
        await ApiKeys(KeyRecords(client, namespace)).revoke(minted.key_id)
        r = await gw.client.post("/v1/jobs", json=job, headers=auth)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", r.text
        assert [k async for k in client.scan_iter(match=jobs)] == stored
        # and stays refused, now looked up afresh
        assert (await gw.client.post("/v1/jobs", json=job, headers=auth)).status_code == 401


async def test_tenants_are_isolated(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url) as gw:
        a, b = await gw.key("a"), await gw.key("b")
        job = (await gw.client.post("/v1/jobs", json={"task": "echo"}, headers=a)).json()
        run = (
            await gw.client.post("/v1/jobs", json={"task": "approval", "args": ["d"]}, headers=a)
        ).json()
        jid, rid = job["id"], run["id"]
        missing = await gw.client.get("/v1/jobs/ffffffffffffffffffffffffff", headers=b)
        assert missing.status_code == 404
        probes = [
            gw.client.get(f"/v1/jobs/{jid}", headers=b),
            gw.client.get(f"/v1/jobs/{jid}/result?wait=0.2", headers=b),
            gw.client.delete(f"/v1/jobs/{jid}", headers=b),
            gw.client.post(f"/v1/runs/{rid}/signals/approve", json={"payload": 1}, headers=b),
        ]
        for probe in probes:
            r = await probe
            assert r.status_code == 404, r.text
            assert r.json()["reason"] == "not_found"
        # the job is untouched, its tenant can still use it, and the admin reads it
        assert (await gw.client.get(f"/v1/jobs/{jid}", headers=a)).json()["status"] == "queued"
        admin = await gw.client.get(f"/v1/jobs/{jid}", headers=ADMIN)
        assert admin.status_code == 200 and admin.json()["tenant"] == "a"
        assert (await gw.client.get(f"/v1/jobs/{jid}/result", headers=ADMIN)).status_code == 202
        assert (await gw.client.delete(f"/v1/jobs/{jid}", headers=ADMIN)).status_code == 403
        assert (
            await gw.client.post("/v1/jobs", json={"task": "echo"}, headers=ADMIN)
        ).status_code == 403
        sent = await gw.client.post(
            f"/v1/runs/{rid}/signals/approve",
            json={"payload": {"ok": True}, "signal_id": "s1"},
            headers=a,
        )
        assert sent.json() == {"result": "delivered"}
        again = await gw.client.post(
            f"/v1/runs/{rid}/signals/approve", json={"signal_id": "s1"}, headers=a
        )
        assert again.json() == {"result": "duplicate"}
        # a plain job is not a run
        r = await gw.client.post(f"/v1/runs/{jid}/signals/approve", json={}, headers=a)
        assert r.status_code == 404
