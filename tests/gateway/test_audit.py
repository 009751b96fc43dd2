"""The gateway's audit trail: each decision that changes state leaves one entry.

Requests go through ``httpx.ASGITransport`` into the real gateway, which talks to the
session's private server. A key's first submit is recorded by the gateway (it read the
key's record just then); later ones by the enqueue script, in the same step
(``enqueue_as``): both must leave exactly one entry per submit.
"""

from __future__ import annotations

import json
import time

import anyio
import pytest
from typer.testing import CliRunner, Result

from fairlane import App
from fairlane.cli import tenants_cli
from fairlane.gateway import ApiKeys
from fairlane.registry import CallOptions
from fairlane.store.apikeys import KeyRecords
from fairlane.store.audit import AuditEntry
from fairlane.store.connection import create_client
from fairlane.store.wire import NewJob
from tests.e2e.helpers import fast_settings
from tests.gateway.helpers import ADMIN_KEY, gateway, pool

pytestmark = pytest.mark.anyio

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _key_id(headers: dict[str, str]) -> str:
    return headers["Authorization"].split("_")[1]


def _fresh(entry: AuditEntry) -> bool:
    # the entry's id carries the server's ms; the server runs on this machine
    return abs(entry.at_ms - time.time() * 1000) < 60_000


async def test_submits_leave_one_entry_each(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url, pool(2, "reject")) as gw:
        auth = await gw.key("acme")
        job = {"task": "echo", "estimate": 1}
        first = await gw.client.post("/v1/jobs", json=job, headers=auth)  # the gateway's write
        keyed = {**job, "idempotency_key": "k1"}
        second = await gw.client.post("/v1/jobs", json=keyed, headers=auth)  # the script's
        full = await gw.client.post("/v1/jobs", json=job, headers=auth)
        again = await gw.client.post("/v1/jobs", json=keyed, headers=auth)
        unknown = await gw.client.post("/v1/jobs", json={"task": "nope"}, headers=auth)
        answers = [r.status_code for r in (first, second, full, again, unknown)]
        assert answers == [202, 202, 429, 202, 422]
        await gw.client.post("/v1/jobs", json=job)  # no key: 401, nothing recorded
        entries = await gw.keys.records.audit.read(10, action="submit")
    seen = [(e.outcome, e.detail, e.job_id) for e in reversed(entries)]
    assert seen == [
        ("accepted", "", first.json()["id"]),
        ("accepted", "", second.json()["id"]),
        ("rejected", "class_full", ""),
        ("accepted", "existing", second.json()["id"]),
        ("refused", "unknown_task", ""),
    ]
    assert {(e.key_id, e.tenant) for e in entries} == {(_key_id(auth), "acme")}
    assert all(_fresh(e) for e in entries)


async def test_cancel_and_signal(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url) as gw:
        auth, other = await gw.key("acme"), await gw.key("zeta")
        job = (await gw.client.post("/v1/jobs", json={"task": "echo"}, headers=auth)).json()
        run = (
            await gw.client.post("/v1/jobs", json={"task": "approval", "args": ["d"]}, headers=auth)
        ).json()
        # another tenant's probe answers 404 and changes nothing: no entry
        assert (await gw.client.delete(f"/v1/jobs/{job['id']}", headers=other)).status_code == 404
        assert (await gw.client.delete(f"/v1/jobs/{job['id']}", headers=auth)).status_code == 200
        sent = await gw.client.post(
            f"/v1/runs/{run['id']}/signals/approve", json={"payload": 1}, headers=auth
        )
        assert sent.json() == {"result": "delivered"}
        audit = gw.keys.records.audit
        cancels = await audit.read(10, action="cancel")
        signals = await audit.read(10, action="signal")
    assert [(e.outcome, e.job_id, e.tenant) for e in cancels] == [("cancelled", job["id"], "acme")]
    assert [(e.outcome, e.detail, e.job_id) for e in signals] == [
        ("delivered", "approve", run["id"])
    ]
    assert {e.key_id for e in cancels + signals} == {_key_id(auth)}
    assert all(_fresh(e) for e in cancels + signals)


@pytest.mark.contract  # the key records' transactions and the script, on a cluster too
async def test_key_created_rotated_revoked(redis_url: str, namespace: str) -> None:
    client = create_client(redis_url)
    try:
        keys = ApiKeys(KeyRecords(client, namespace))
        minted = await keys.create("acme")
        await keys.rotate(minted.key_id)
        await keys.revoke(minted.key_id)
        with pytest.raises(LookupError):
            await keys.revoke(minted.key_id)  # no such key any more: nothing recorded
        entries = await keys.records.audit.read(10)
    finally:
        await client.aclose()
    assert [(e.action, e.key_id, e.tenant, e.outcome) for e in reversed(entries)] == [
        ("key_created", minted.key_id, "acme", "ok"),
        ("key_rotated", minted.key_id, "acme", "ok"),
        ("key_revoked", minted.key_id, "acme", "ok"),
    ]
    assert all(_fresh(e) for e in entries)


@pytest.mark.contract  # the key records' transactions and the script, on a cluster too
async def test_the_trail_is_bounded(redis_url: str, namespace: str) -> None:
    cap, written = 100, 400
    app = App(namespace, redis_url=redis_url, settings=fast_settings(audit_entries=cap))
    echo = app.task(name="echo")(_echo)
    async with app:
        records = app.store.key_records
        trail = records.audit
        for i in range(written):
            await trail.record("cancel", "k" * 12, "acme", "cancelled", job_id=f"j{i}")
        # whole blocks are trimmed: at most one block (<= 100 entries) over the cap
        assert cap <= await trail.length() <= cap + 100
        assert (await trail.read(1))[0].job_id == f"j{written - 1}"
        # the enqueue script trims with the same cap, given it with the caller's key
        minted = await ApiKeys(records).create("acme")
        record = await records.get(minted.key_id)
        assert record is not None
        blob = echo.encode_args((), {})
        jobs = [
            _renamed(echo.new_job(blob, CallOptions(tenant="acme")), f"n{i}")
            for i in range(written)
        ]
        replies = await app.store.submit("default", jobs, records.guard(minted.key_id, record))
        assert {r.code for r in replies} == {1}
        assert cap <= await trail.length() <= cap + 100
        newest = await trail.read(3)
    assert [e.job_id for e in newest] == ["n399", "n398", "n397"]
    assert {e.action for e in newest} == {"submit"}


async def _echo(text: str = "") -> str:
    return text


def _renamed(job: NewJob, job_id: str) -> NewJob:
    job.id = job_id
    return job


async def test_cli_and_dashboard_list_entries(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with gateway(namespace, redis_url) as gw:
        auth = await gw.key("acme")
        await gw.key("zeta")
        r = await gw.client.post("/v1/jobs", json={"task": "echo"}, headers=auth)
        job_id = r.json()["id"]
        shown = await gw.client.get("/ui/api/audit?tenant=acme", headers=ADMIN)
        assert shown.status_code == 200
        rows = shown.json()["entries"]
        assert [(e["action"], e["tenant"]) for e in rows] == [
            ("submit", "acme"),
            ("key_created", "acme"),
        ]
        assert rows[0]["job_id"] == job_id and rows[0]["key_id"] == _key_id(auth)
        assert (await gw.client.get("/ui/api/audit", headers=auth)).status_code == 401
        assert (await gw.client.get("/ui/api/audit")).status_code == 401
        bad = await gw.client.get("/ui/api/audit?action=nope", headers=ADMIN)
        assert bad.status_code == 422

    # the command runs its own loop: in a thread, as from a shell
    cli_app = App(namespace, redis_url=redis_url, settings=fast_settings())
    monkeypatch.setattr(tenants_cli, "load_app", lambda spec, url=None: cli_app)
    monkeypatch.setenv("COLUMNS", "200")  # one line per entry
    table = await _invoke("audit", "x:app", "--limit", "5")
    assert table.exit_code == 0, table.stderr
    assert job_id in table.stdout and "zeta" in table.stdout and "accepted" in table.stdout
    as_json = await _invoke("audit", "x:app", "--tenant", "zeta", "--json")
    assert as_json.exit_code == 0, as_json.stderr
    assert [(e["action"], e["tenant"]) for e in json.loads(as_json.stdout)] == [
        ("key_created", "zeta")
    ]
    assert (await _invoke("audit", "x:app", "--action", "x")).exit_code != 0


async def _invoke(*args: str) -> Result:
    return await anyio.to_thread.run_sync(
        lambda: CliRunner().invoke(tenants_cli.tenants_app, list(args))
    )
