"""Scoped keys with an expiry: each endpoint needs its scope, and an expired key is refused.

A key outside its scope answers 403 (reason ``scope``) before anything about the job is
looked at; an expired key answers 401 as a revoked one does. A submit vouched for from
the record the gateway holds is checked again by the enqueue script, so a key narrowed
or expired since stores nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from datetime import datetime, timedelta
from typing import Any

import anyio
import httpx
import pytest
import redis.asyncio as aioredis
from typer.testing import CliRunner

from fairlane.cli import tenants_cli
from fairlane.gateway import ApiKeys
from fairlane.gateway.apikeys import SCOPES, MintedKey
from fairlane.registry import CallOptions
from fairlane.store.apikeys import KeyOutOfScope, KeyRecord, KeyRecords, KeyRefused
from tests.gateway.helpers import Gateway, build_app, gateway

pytestmark = pytest.mark.anyio

MISSING = "ffffffffffffffffffffffffff"


def _auth(minted: MintedKey) -> dict[str, str]:
    return {"Authorization": f"Bearer {minted.key}"}


async def _stored_jobs(gw: Gateway) -> list[bytes]:
    client, pattern = gw.app.store.client, gw.app.store.keys.job("*")
    return sorted([k async for k in client.scan_iter(match=pattern)])


async def _wait_past(gw: Gateway, key_id: str) -> None:
    """Until the server's clock passes the key's expiry (bounded: it was set ~1 s ahead)."""
    record = await gw.keys.records.get(key_id)
    assert record is not None and record.expires_ms is not None
    left = record.expires_ms - await gw.keys.records.server_ms()
    assert left < 5_000
    await asyncio.sleep(max(0, left) / 1000 + 0.05)


def _refused_for(r: httpx.Response, scope: str) -> bool:
    return r.status_code == 403 and r.json()["reason"] == "scope" and scope in r.json()["detail"]


#: endpoint -> (the scope it needs, what it answers a key that has it)
ENDPOINTS = {
    "submit": ("submit", 202),
    "read": ("read", 200),
    "result": ("read", 202),
    "cancel": ("cancel", 200),
    "signal": ("signal", 200),
}


async def _call(gw: Gateway, endpoint: str, ids: dict[str, str], auth: dict[str, str]) -> Any:
    get, post = gw.client.get, gw.client.post
    if endpoint == "submit":
        return await post("/v1/jobs", json={"task": "echo"}, headers=auth)
    if endpoint == "read":
        return await get(f"/v1/jobs/{ids['job']}", headers=auth)
    if endpoint == "result":
        return await get(f"/v1/jobs/{ids['job']}/result", headers=auth)
    if endpoint == "cancel":
        return await gw.client.delete(f"/v1/jobs/{ids['doomed']}", headers=auth)
    return await post(f"/v1/runs/{ids['run']}/signals/approve", json={}, headers=auth)


async def _submit(gw: Gateway, auth: dict[str, str], task: str, *args: str) -> str:
    r = await gw.client.post("/v1/jobs", json={"task": task, "args": list(args)}, headers=auth)
    assert r.status_code == 202, r.text
    job_id: str = r.json()["id"]
    return job_id


async def test_each_endpoint_needs_its_scope(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url) as gw:
        full = _auth(await gw.keys.create("acme"))
        ids = {
            "job": await _submit(gw, full, "echo"),
            "run": await _submit(gw, full, "approval", "d"),
        }
        other = await _submit(gw, _auth(await gw.keys.create("b")), "echo")
        for scope in SCOPES:
            auth = _auth(await gw.keys.create("acme", scopes=[scope]))
            ids["doomed"] = await _submit(gw, full, "echo")
            for endpoint, (needed, allowed) in ENDPOINTS.items():
                # twice: the second submit finds the key's record held by the gateway
                for _ in range(2 if endpoint == "submit" else 1):
                    r = await _call(gw, endpoint, ids, auth)
                    if needed == scope:
                        assert r.status_code == allowed, (scope, endpoint, r.text)
                    else:
                        assert _refused_for(r, needed), (scope, endpoint, r.text)
            # the scope is checked before the job: no 404 to learn from without it
            for job_id in (MISSING, other):
                if scope != "read":
                    r = await gw.client.get(f"/v1/jobs/{job_id}", headers=auth)
                    assert _refused_for(r, "read"), r.text
                if scope != "cancel":
                    r = await gw.client.delete(f"/v1/jobs/{job_id}", headers=auth)
                    assert _refused_for(r, "cancel"), r.text
                if scope != "signal":
                    sent = f"/v1/runs/{job_id}/signals/approve"
                    r = await gw.client.post(sent, json={}, headers=auth)
                    assert _refused_for(r, "signal"), r.text
        # 3 jobs, one to cancel per key, and the submit-scoped key's two
        assert len(await _stored_jobs(gw)) == 3 + len(SCOPES) + 2


async def test_an_expired_key_is_refused_like_a_revoked_one(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url) as gw:
        job = {"task": "echo"}
        # connected first, so that the key's second of life is spent on its requests
        await _submit(gw, _auth(await gw.keys.create("acme")), "echo")
        minted = await gw.keys.create("acme", expires=timedelta(seconds=1))
        auth = _auth(minted)
        jid = (await gw.client.post("/v1/jobs", json=job, headers=auth)).json()["id"]
        assert (await gw.client.post("/v1/jobs", json=job, headers=auth)).status_code == 202
        assert (await gw.client.get(f"/v1/jobs/{jid}", headers=auth)).status_code == 200
        stored = await _stored_jobs(gw)
        await _wait_past(gw, minted.key_id)
        for r in (
            await gw.client.post("/v1/jobs", json=job, headers=auth),
            await gw.client.get(f"/v1/jobs/{jid}", headers=auth),
            await gw.client.delete(f"/v1/jobs/{jid}", headers=auth),
        ):
            assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", r.text
            assert "expired" in r.json()["detail"]
        assert await _stored_jobs(gw) == stored
        assert await gw.keys.authenticate(minted.key) is None


async def test_the_enqueue_refuses_a_key_changed_since_it_was_held(
    redis_url: str, namespace: str
) -> None:
    async with gateway(namespace, redis_url) as gw:
        minted = await gw.keys.create("acme")
        auth, job = _auth(minted), {"task": "echo"}
        for _ in range(2):  # the second is vouched for from the record the gateway read
            assert (await gw.client.post("/v1/jobs", json=job, headers=auth)).status_code == 202
        stored = await _stored_jobs(gw)
        # narrowed elsewhere (as the CLI would): the gateway still holds the old record
        narrowed = await ApiKeys(gw.keys.records).update(minted.key_id, scopes=["read"])
        assert narrowed.scopes == ("read",)
        for _ in range(2):  # refused by the script, then on a fresh lookup
            r = await gw.client.post("/v1/jobs", json=job, headers=auth)
            assert _refused_for(r, "submit"), r.text
        assert await _stored_jobs(gw) == stored
        # the script holds the record to the server's clock, and to its scopes
        task = gw.app.tasks["echo"]
        new = task.new_job(task.encode_args((), {}), CallOptions(tenant="acme"))
        with pytest.raises(KeyOutOfScope):
            await task.submit_job(new, guard=gw.keys.records.guard(minted.key_id, narrowed))
        short = await gw.keys.create("acme", expires=timedelta(seconds=1))
        record = await gw.keys.records.get(short.key_id)
        assert record is not None
        guard = gw.keys.records.guard(short.key_id, record)
        await _wait_past(gw, short.key_id)
        with pytest.raises(KeyRefused, match="expired"):
            await task.submit_job(new, guard=guard)
        assert await _stored_jobs(gw) == stored


async def test_rotate_keeps_scopes_and_expiry(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url) as gw:
        minted = await gw.keys.create("acme", scopes=["read", "cancel"], expires=timedelta(hours=1))
        before = await gw.keys.records.get(minted.key_id)
        assert before is not None and before.scopes == ("read", "cancel")
        assert before.expires_ms is not None
        assert before.expires_ms - before.created_ms == 3_600_000  # one clock reading
        await gw.keys.rotate(minted.key_id)
        kept = await gw.keys.records.get(minted.key_id)
        assert kept is not None
        assert (kept.scopes, kept.expires_ms) == (("read", "cancel"), before.expires_ms)
        rotated = await gw.keys.rotate(minted.key_id, scopes=["submit"])
        now = await gw.keys.records.get(minted.key_id)
        assert now is not None and (now.scopes, now.expires_ms) == (("submit",), before.expires_ms)
        assert (
            await gw.client.get(f"/v1/jobs/{MISSING}", headers=_auth(rotated))
        ).status_code == 403
        # an expired key is renewed only with a new expiry
        await gw.keys.records.add("0123456789ab", KeyRecord("acme", "d" * 64, 0, expires_ms=1))
        with pytest.raises(ValueError, match="new expiry"):
            await gw.keys.rotate("0123456789ab")
        renewed = await gw.keys.rotate("0123456789ab", expires=timedelta(minutes=1))
        r = await gw.client.get(f"/v1/jobs/{MISSING}", headers=_auth(renewed))
        assert r.status_code == 404, r.text


async def test_bad_scopes_and_expiries_are_refused(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url) as gw:
        for bad in ([], ["admin"], "read"):
            with pytest.raises(ValueError, match="scope"):
                await gw.keys.create("acme", scopes=bad)
        for expires in (timedelta(0), timedelta(seconds=-5), 30):
            with pytest.raises(ValueError, match="expires"):
                await gw.keys.create("acme", expires=expires)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="nothing to update"):
            await gw.keys.update((await gw.keys.create("acme")).key_id)
        assert len(await gw.keys.list()) == 1


async def test_a_record_without_scopes_or_expiry_has_every_scope(
    redis_url: str, namespace: str
) -> None:
    async with gateway(namespace, redis_url) as gw:
        key = "flk_0123456789ab_" + "s" * 43
        old = {
            "tenant": "acme",
            "sha256": hashlib.sha256(key.encode()).hexdigest(),
            "created_ms": 1,
        }
        client, records = gw.app.store.client, gw.keys.records.hash
        await client.hset(records, "0123456789ab", json.dumps(old))
        auth = {"Authorization": f"Bearer {key}"}
        for _ in range(2):  # looked up, then vouched for and checked by the script
            r = await gw.client.post("/v1/jobs", json={"task": "echo"}, headers=auth)
            assert r.status_code == 202, r.text
        jid = r.json()["id"]
        assert (await gw.client.get(f"/v1/jobs/{jid}", headers=auth)).status_code == 200
        assert (await gw.client.delete(f"/v1/jobs/{jid}", headers=auth)).status_code == 200
        listed = (await gw.keys.list())["0123456789ab"]
        assert listed.scopes == SCOPES and listed.expires_ms is None
        # and a key of every scope, never expiring, is still written in that form
        minted = await gw.keys.create("acme")
        written = await client.hget(records, minted.key_id)
        assert written is not None and set(json.loads(written)) == set(old)


def test_every_endpoint_documents_the_scope_refusal(namespace: str) -> None:
    from fairlane.gateway import create_app  # noqa: PLC0415 - as the gateway's extra

    spec = create_app(build_app(namespace, "redis://unset.invalid:1/0")).openapi()
    operations = [
        op for path, ops in spec["paths"].items() if path.startswith("/v1/") for op in ops.values()
    ]
    assert len(operations) == 5
    for op in operations:
        assert "403" in op["responses"] and "401" in op["responses"], op["summary"]


async def _add_expired(redis_url: str, namespace: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        expired = KeyRecord("old", "d" * 64, 0, expires_ms=1)
        assert await KeyRecords(client, namespace).add("0123456789ab", expired)
    finally:
        await client.aclose()


def test_cli_scopes_and_expiry(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = build_app(namespace, redis_url)
    monkeypatch.setattr(tenants_cli, "load_app", lambda spec, url=None: app)
    runner = CliRunner()

    def invoke(*args: str) -> tuple[int, str, str]:
        result = runner.invoke(tenants_cli.tenants_app, list(args))
        return result.exit_code, result.stdout, result.stderr

    code, out, err = invoke(
        "create", "x:app", "acme", "--scopes", "read,submit", "--expires", "30d"
    )
    assert code == 0, err
    key_id = out.strip().split("_")[1]
    code, out, _ = invoke("list", "x:app")
    line = next(row for row in out.splitlines() if key_id in row)
    _, tenant, *created, scopes, expires_day, expires_time = line.split()
    assert (tenant, scopes) == ("acme", "submit,read")
    lifetime = datetime.fromisoformat(f"{expires_day} {expires_time}") - datetime.fromisoformat(
        " ".join(created)
    )
    assert lifetime == timedelta(days=30)
    code, out, err = invoke("rotate", "x:app", key_id, "--scopes", "read")
    assert code == 0, err
    code, out, _ = invoke("list", "x:app")
    line = next(row for row in out.splitlines() if key_id in row)
    assert " read " in f" {line} " and "submit" not in line and "never" not in line
    code, _, _ = invoke("create", "x:app", "plain")
    code, out, _ = invoke("list", "x:app")
    line = next(row for row in out.splitlines() if "plain" in row)
    assert " all " in line and "never" in line
    anyio.run(_add_expired, redis_url, namespace)
    code, out, _ = invoke("list", "x:app")
    assert "(expired)" in next(row for row in out.splitlines() if "0123456789ab" in row)
    code, _, err = invoke("rotate", "x:app", "0123456789ab")
    assert code == 2 and "new expiry" in err
    for bad in (
        ("--scopes", "read,admin"),
        ("--scopes", ","),
        ("--expires", "soon"),
        ("--expires", "0s"),
    ):
        code, _, err = invoke("create", "x:app", "acme", *bad)
        assert code == 2, (bad, err)
