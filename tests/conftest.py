"""Shared pytest fixtures: the Redis backends tests run against, per-test namespaces, anyio.

``redis_url`` is session-scoped and parametrized: ``embedded`` is a private
:class:`fairlane.testing.RedisServer` started once per session, and every test runs on
it; ``external`` is added when ``FAIRLANE_TEST_REDIS_URL`` is set, and runs the tests
that hold the store to the server's semantics -- those marked ``contract`` and the
script-agreement suites in ``tests/store`` -- on that server too (another server
version or flavour); ``FAIRLANE_TEST_EXTERNAL_ALL=1`` runs every test there but those
marked ``embedded_only`` (processes, a browser or a benchmark harness).
``namespace`` gives each test its own app name and deletes that test's keys afterwards;
``store`` is a connected ``Store`` of that app.

``cluster`` is a private 3-master :class:`fairlane.testing.RedisCluster` from the same
binary (skipped with ``FAIRLANE_TEST_CLUSTER=0``). Only tests marked ``contract`` run on
it: they hold the store to what every deployment must give (each script, on a cluster,
with no CROSSSLOT error), while the rest of the suite runs once, on a single server.
Tests marked ``cluster_only`` need several primaries and run there alone.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from fairlane.store.api import Store
from fairlane.store.connection import create_sync_client
from fairlane.testing import RedisCluster, RedisServer

EXTERNAL_URL_ENV = "FAIRLANE_TEST_REDIS_URL"
CLUSTER_ENV = "FAIRLANE_TEST_CLUSTER"
EXTERNAL_ALL_ENV = "FAIRLANE_TEST_EXTERNAL_ALL"
STORE_SUITE = Path(__file__).resolve().parent / "store"


def _backends() -> list[str]:
    backends = ["embedded", "external"] if os.environ.get(EXTERNAL_URL_ENV) else ["embedded"]
    if os.environ.get(CLUSTER_ENV, "1") != "0":
        backends.append("cluster")
    return backends


def _deselected(item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    backend = params.get("redis_url")
    if item.get_closest_marker("cluster_only") is not None:
        return backend != "cluster"
    if backend == "external":
        if item.get_closest_marker("embedded_only") is not None:
            return True
        if os.environ.get(EXTERNAL_ALL_ENV) == "1":
            return False
        in_store_suite = item.path.is_relative_to(STORE_SUITE)
        return not in_store_suite and item.get_closest_marker("contract") is None
    if backend == "cluster":
        return item.get_closest_marker("contract") is None
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped = [], []
    for item in items:
        (dropped if _deselected(item) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session", params=_backends())
def redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of a Redis/Valkey server for this session (one per backend)."""
    if request.param == "external":
        yield os.environ[EXTERNAL_URL_ENV]
        return
    if request.param == "cluster":
        if os.environ.get(CLUSTER_ENV, "1") == "0":  # tests/cluster ask for it by name
            pytest.skip(f"{CLUSTER_ENV}=0: no cluster backend")
        with RedisCluster() as cluster:
            yield cluster.url
        return
    with RedisServer() as server:
        yield server.url


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    """A fresh app name for one test; its keys (``{fl:<name>}``, and ``{fl:<name>:...}``
    of its shards) are deleted afterwards."""
    name = "t_" + secrets.token_hex(4)
    yield name
    client = create_sync_client(redis_url, socket_timeout=10, socket_connect_timeout=10)
    try:
        for pattern in (f"*{{fl:{name}}}*", f"*{{fl:{name}:*"):
            batch: list[bytes] = []
            for key in client.scan_iter(match=pattern, count=500):
                batch.append(key)
                if len(batch) >= 500:
                    client.delete(*batch)
                    batch.clear()
            if batch:
                client.delete(*batch)
    finally:
        client.close()


@pytest.fixture
async def store(redis_url: str, namespace: str) -> AsyncIterator[Store]:
    """A connected ``Store`` of the test's app on the session's server; its keys go with
    the ``namespace``."""
    store = Store.from_url(redis_url, namespace)
    await store.connect()
    try:
        yield store
    finally:
        await store.aclose()
