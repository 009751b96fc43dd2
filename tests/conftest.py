"""Shared pytest fixtures: the Redis backends tests run against, per-test namespaces, anyio.

``redis_url`` is session-scoped and parametrized: ``embedded`` is a private
:class:`fairlane.testing.RedisServer` started once per session; ``external`` is added when
``FAIRLANE_TEST_REDIS_URL`` is set, so the same tests also run against that server.
``namespace`` gives each test its own app name and deletes that test's keys afterwards.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest
import redis

from fairlane.testing import RedisServer

EXTERNAL_URL_ENV = "FAIRLANE_TEST_REDIS_URL"


def _backends() -> list[str]:
    return ["embedded", "external"] if os.environ.get(EXTERNAL_URL_ENV) else ["embedded"]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session", params=_backends())
def redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of a Redis/Valkey server for this session (one per backend)."""
    if request.param == "external":
        yield os.environ[EXTERNAL_URL_ENV]
        return
    with RedisServer() as server:
        yield server.url


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    """A fresh app name for one test; its ``{fl:<name>}`` keys are deleted afterwards."""
    name = "t_" + secrets.token_hex(4)
    yield name
    client = redis.Redis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=10)
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"*{{fl:{name}}}*", count=500):
            batch.append(key)
            if len(batch) >= 500:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
    finally:
        client.close()
