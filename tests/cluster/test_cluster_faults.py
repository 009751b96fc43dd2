"""A cluster that cannot serve the app's slot makes the store unavailable (the error callers
already wait out), not a raw cluster error; and the slot serves again once it is back."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisClusterException

from fairlane.store.api import Store
from fairlane.store.connection import cluster_url
from fairlane.store.wire import StoreUnavailable
from fairlane.testing import RedisCluster, RedisServer

pytestmark = pytest.mark.anyio


async def _state(client: aioredis.Redis) -> str:
    raw = await client.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.split(":", 1) for line in text.split() if ":" in line)["cluster_state"]


async def _until(client: aioredis.Redis, state: str) -> None:
    for _ in range(200):  # 10 s
        if await _state(client) == state:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"cluster_state never became {state}")


async def test_a_slot_without_a_node_is_unavailable_then_serves_again() -> None:
    with RedisCluster(masters=1) as cluster:
        store = Store.from_url(cluster.url, "slotless")
        (host, port) = cluster.startup_nodes[0]
        node = aioredis.Redis(host=host, port=port)
        try:
            await store.connect()
            assert await store.cancel("nothing") == "missing"
            slot = int(await node.execute_command("CLUSTER", "KEYSLOT", store.keys.stats))  # type: ignore[no-untyped-call]
            await node.execute_command("CLUSTER", "DELSLOTS", slot)  # type: ignore[no-untyped-call]
            await _until(node, "fail")
            with pytest.raises(StoreUnavailable, match="cluster"):
                await store.cancel("nothing")
            await node.execute_command("CLUSTER", "ADDSLOTS", slot)  # type: ignore[no-untyped-call]
            await _until(node, "ok")
            assert await store.cancel("nothing") == "missing"
        finally:
            await node.aclose()
            await store.aclose()


async def test_a_cluster_none_of_whose_nodes_answers_is_unavailable() -> None:
    store = Store.from_url(cluster_url([("127.0.0.1", 1)]), "nodeless")
    try:
        with pytest.raises(StoreUnavailable, match="cluster"):
            await store.connect()
    finally:
        await store.aclose()


async def test_a_server_not_in_cluster_mode_is_a_mistake_not_an_outage() -> None:
    # the client says both with the same exception type; only an outage is waited out
    with RedisServer() as server:
        store = Store.from_url(cluster_url([(server.host, server.port)]), "not_a_cluster")
        try:
            with pytest.raises(RedisClusterException):
                await store.connect()
        finally:
            await store.aclose()
