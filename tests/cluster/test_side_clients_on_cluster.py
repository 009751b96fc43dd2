"""The clients beside the store, on a Redis Cluster: what a cluster client refuses (TIME in a
pipeline, WATCH transactions on its async client) must not reach them.

The metrics reader reads queue ages with the server's clock, the gateway's API keys
rotate under WATCH, and the CLI's liveness check reads heartbeats and the clock, all
through the URL a deployment gives.
"""

from __future__ import annotations

import asyncio

import pytest

from fairlane.cli._common import live_workers
from fairlane.gateway.apikeys import ApiKeys
from fairlane.metrics.store import StoreReader
from fairlane.store.api import Store
from fairlane.store.apikeys import KeyRecords
from fairlane.store.connection import create_client, create_sync_client
from fairlane.store.wire import NewJob

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.contract,
    pytest.mark.parametrize("redis_url", ["cluster"], indirect=True),
]


def _job(n: int, deadline: str = "") -> NewJob:
    return NewJob(f"j{n}", "acme", 0, "t", "[]", 1, "", 0.0, "", "", deadline=deadline)


async def test_metrics_read_queue_ages_on_the_slots_clock(redis_url: str, namespace: str) -> None:
    store = Store.from_url(redis_url, namespace)
    try:
        await store.connect()
        await store.enqueue("default", [_job(1), _job(2, deadline="+600000")])
        before = await store.server_time_ms()
        # a worker that leaves at once still counts: the heartbeat is written on exchange
        await store.exchange("w1", ["default"], 0, 5000)
    finally:
        await store.aclose()
    await asyncio.sleep(0.05)
    reader = StoreReader(redis_url, namespace, ["default"], max_age=0.0)
    try:
        snap = reader.snapshot()
    finally:
        reader.close()
    assert snap is not None
    assert snap.lanes["default"].waiting == {"standard": 2}
    age = snap.oldest_age[("default", "standard")]
    assert 0.05 <= age < 10, age
    # the deadline index and the records it names, read through the same pipelines
    assert snap.needs["default"].deadlines.jobs == 1
    client = create_sync_client(redis_url)
    try:
        workers = live_workers(client, namespace, 10.0)
    finally:
        client.close()
    assert [name for name, _ in workers] == ["w1"]
    assert before > 0


async def test_api_keys_rotate_under_watch(redis_url: str, namespace: str) -> None:
    client = create_client(redis_url)
    try:
        keys = ApiKeys(KeyRecords(client, namespace))
        minted = await keys.create("acme")
        assert await keys.authenticate(minted.key) == (minted.key_id, "acme")
        rotated = await keys.rotate(minted.key_id)
        assert await keys.authenticate(minted.key) is None
        assert await keys.authenticate(rotated.key) == (minted.key_id, "acme")
        assert (await keys.revoke(minted.key_id)).tenant == "acme"
        assert await keys.list() == {}
    finally:
        await client.aclose()
