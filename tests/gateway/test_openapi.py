"""Property-based conformance of the gateway to its own OpenAPI spec (schemathesis).

The spec is loaded from the ASGI app (``schemathesis.openapi.from_asgi``), and each
generated request goes through it in-process. Schemathesis enters the app's lifespan
around every call, each in a fresh event loop, so the gateway connects on first use and
closes its connection at shutdown, every time: a real exercise of the lazy connection.
Every operation gets a couple dozen requests, each sent with a key of every scope (all
four, and each one alone); every answer must be a documented status whose body and
headers match the spec, and never a server error. A key without an operation's scope is
answered 403 (or 400 or 422 for a request its shape refuses), never with what it lacks.
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from fairlane.gateway import ApiKeys, create_app
from fairlane.store.apikeys import SCOPES, KeyRecords
from tests.gateway.helpers import ADMIN_KEY, build_app

NAME = "t_" + secrets.token_hex(4)
APP = build_app(NAME, "redis://unset.invalid:1/0")  # the session's URL is set by `tenant_keys`
schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(APP, admin_key=ADMIN_KEY))

#: the statuses seen, by the key's scopes ("all" or one scope) and operation
SEEN: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
KINDS = ("all", *SCOPES)
#: the scope each operation needs
NEEDS = {
    "POST /v1/jobs": "submit",
    "GET /v1/jobs/{job_id}": "read",
    "GET /v1/jobs/{job_id}/result": "read",
    "DELETE /v1/jobs/{job_id}": "cancel",
    "POST /v1/runs/{run_id}/signals/{name}": "signal",
}
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
]


async def _mint(redis_url: str) -> dict[str, str]:
    client = aioredis.Redis.from_url(redis_url)
    keys = ApiKeys(KeyRecords(client, NAME))
    try:
        minted = {"all": (await keys.create("acme")).key}
        for scope in SCOPES:
            minted[scope] = (await keys.create("acme", scopes=[scope])).key
        return minted
    finally:
        await client.aclose()


async def _purge(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        async for key in client.scan_iter(match=f"*{{fl:{NAME}}}*", count=500):
            await client.unlink(key)
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def tenant_keys(redis_url: str) -> Iterator[dict[str, str]]:
    APP.redis_url = redis_url
    try:
        yield anyio.run(_mint, redis_url)
    finally:
        anyio.run(_purge, redis_url)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_conforms_to_its_spec(case: Any, tenant_keys: dict[str, str]) -> None:
    for kind in KINDS:
        response = case.call_and_validate(
            headers={"Authorization": f"Bearer {tenant_keys[kind]}"}, checks=CHECKS
        )
        SEEN[kind, f"{case.method} {case.path}"].add(response.status_code)


def test_generated_requests_got_past_authentication() -> None:
    """A sanity check of the run above: the key worked, so answers were not all 401."""
    assert SEEN, "no request was generated"
    for (kind, operation), statuses in SEEN.items():
        assert statuses - {401}, f"{kind} {operation}: only {statuses}"
    assert 202 in SEEN["all", "POST /v1/jobs"] or 422 in SEEN["all", "POST /v1/jobs"]


def test_a_key_outside_its_scope_is_refused() -> None:
    """Of the run above: each single-scope key got 403 wherever it lacks the scope."""
    for (kind, operation), statuses in SEEN.items():
        if operation not in NEEDS:  # a method the spec does not name (405)
            continue
        if kind == "all" or NEEDS[operation] == kind:
            assert statuses - {403}, f"{kind} key on {operation}: only {statuses}"
        else:
            # (401: a case whose own Authorization header replaced the key)
            assert 403 in statuses and statuses <= {400, 401, 403, 422}, (kind, operation, statuses)
