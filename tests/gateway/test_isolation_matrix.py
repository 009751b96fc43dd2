"""Who may do what over HTTP: every endpoint against every kind of caller.

The callers: the job's own tenant (a key of every scope), another tenant, a key of the
same tenant without the endpoint's scope, an expired key, a revoked key, and the admin
key. Each row gets a fresh job and workflow run of its own, so a cancel in one row
changes nothing another row reads. The table below is the rule; the test prints what it
saw in the same shape.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from fairlane.gateway.apikeys import SCOPES
from tests.gateway.helpers import ADMIN_KEY, Gateway, gateway

pytestmark = pytest.mark.anyio

ENDPOINTS = ("submit", "read", "result", "cancel", "signal")
#: the scope each endpoint needs
NEEDS = {"submit": "submit", "read": "read", "result": "read", "cancel": "cancel"}
NEEDS["signal"] = "signal"
#: the expected status, by caller and endpoint
MATRIX: dict[str, dict[str, int]] = {
    # a queued job: read 200, its result 202 (not finished), a cancel 200, a signal 200
    "own key": {"submit": 202, "read": 200, "result": 202, "cancel": 200, "signal": 200},
    # its own submit is its own job; another tenant's job or run is one that does not exist
    "other tenant": {"submit": 202, "read": 404, "result": 404, "cancel": 404, "signal": 404},
    "wrong scope": {"submit": 403, "read": 403, "result": 403, "cancel": 403, "signal": 403},
    "expired": {"submit": 401, "read": 401, "result": 401, "cancel": 401, "signal": 401},
    "revoked": {"submit": 401, "read": 401, "result": 401, "cancel": 401, "signal": 401},
    # the admin reads any job and changes none
    "admin": {"submit": 403, "read": 200, "result": 202, "cancel": 403, "signal": 403},
}


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _keys(gw: Gateway) -> dict[str, dict[str, str] | dict[str, dict[str, str]]]:
    """The headers of each caller; for "wrong scope", one key per endpoint lacking its scope."""
    own = await gw.keys.create("acme")
    other = await gw.keys.create("globex")
    expired = await gw.keys.create("acme", expires=timedelta(milliseconds=300))
    revoked = await gw.keys.create("acme")
    lacking = {
        endpoint: _bearer(
            (await gw.keys.create("acme", scopes=[s for s in SCOPES if s != NEEDS[endpoint]])).key
        )
        for endpoint in ENDPOINTS
    }
    # both were good keys the gateway had used (so held) before they stopped being good
    for key in (expired.key, revoked.key):
        used = await gw.client.post("/v1/jobs", json={"task": "echo"}, headers=_bearer(key))
        assert used.status_code == 202, used.text
    await gw.keys.revoke(revoked.key_id)
    await asyncio.sleep(0.35)  # past the expiry, by the server's clock too
    return {
        "own key": _bearer(own.key),
        "other tenant": _bearer(other.key),
        "wrong scope": lacking,
        "expired": _bearer(expired.key),
        "revoked": _bearer(revoked.key),
        "admin": _bearer(ADMIN_KEY),
    }


async def _row(
    gw: Gateway, owner: dict[str, str], headers: dict[str, dict[str, str]]
) -> dict[str, int]:
    """The statuses one caller gets, on a job and a run of the owner made for this row."""
    client = gw.client
    job = (await client.post("/v1/jobs", json={"task": "echo"}, headers=owner)).json()["id"]
    run = (
        await client.post("/v1/jobs", json={"task": "approval", "args": ["doc"]}, headers=owner)
    ).json()["id"]
    calls = {
        "submit": lambda h: client.post("/v1/jobs", json={"task": "echo"}, headers=h),
        "read": lambda h: client.get(f"/v1/jobs/{job}", headers=h),
        "result": lambda h: client.get(f"/v1/jobs/{job}/result", headers=h),
        "signal": lambda h: client.post(
            f"/v1/runs/{run}/signals/approve", json={"payload": "yes"}, headers=h
        ),
        "cancel": lambda h: client.delete(f"/v1/jobs/{job}", headers=h),
    }
    return {
        endpoint: (await call(headers[endpoint])).status_code for endpoint, call in calls.items()
    }


async def test_every_endpoint_against_every_caller(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url) as gw:
        callers = await _keys(gw)
        owner = callers["own key"]
        assert isinstance(owner, dict) and "Authorization" in owner
        seen: dict[str, dict[str, int]] = {}
        for caller, headers in callers.items():
            per_endpoint = headers if caller == "wrong scope" else dict.fromkeys(ENDPOINTS, headers)
            seen[caller] = await _row(gw, owner, per_endpoint)  # type: ignore[arg-type]
    width = max(map(len, MATRIX))
    print("\n" + " " * width + "".join(f"{e:>8}" for e in ENDPOINTS))
    for caller, row in seen.items():
        print(f"{caller:<{width}}" + "".join(f"{row[e]:>8}" for e in ENDPOINTS))
    assert seen == MATRIX
