"""Property-based conformance of the gateway to its own OpenAPI spec (schemathesis).

The spec is loaded from the ASGI app (``schemathesis.openapi.from_asgi``), and each
generated request goes through it in-process. Schemathesis enters the app's lifespan
around every call, each in a fresh event loop, so the gateway connects on first use and
closes its connection at shutdown, every time: a real exercise of the lazy connection.
Every operation gets a couple dozen requests with a valid tenant key; every answer must
be a documented status whose body and headers match the spec, and never a server error.
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
from fairlane.store.apikeys import KeyRecords
from tests.gateway.helpers import ADMIN_KEY, build_app

NAME = "t_" + secrets.token_hex(4)
APP = build_app(NAME, "redis://unset.invalid:1/0")  # the session's URL is set by `tenant_key`
schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(APP, admin_key=ADMIN_KEY))

SEEN: defaultdict[str, set[int]] = defaultdict(set)
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
]


async def _mint(redis_url: str) -> str:
    client = aioredis.Redis.from_url(redis_url)
    try:
        return (await ApiKeys(KeyRecords(client, NAME)).create("acme")).key
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
def tenant_key(redis_url: str) -> Iterator[str]:
    APP.redis_url = redis_url
    try:
        yield anyio.run(_mint, redis_url)
    finally:
        anyio.run(_purge, redis_url)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_conforms_to_its_spec(case: Any, tenant_key: str) -> None:
    response = case.call_and_validate(
        headers={"Authorization": f"Bearer {tenant_key}"}, checks=CHECKS
    )
    SEEN[f"{case.method} {case.path}"].add(response.status_code)


def test_generated_requests_got_past_authentication() -> None:
    """A sanity check of the run above: the key worked, so answers were not all 401."""
    assert SEEN, "no request was generated"
    for operation, statuses in SEEN.items():
        assert statuses - {401}, f"{operation}: only {statuses}"
    assert 202 in SEEN["POST /v1/jobs"] or 422 in SEEN["POST /v1/jobs"]
