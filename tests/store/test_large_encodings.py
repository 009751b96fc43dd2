"""Keys the hot path reads and writes per job are kept in the server's large encodings.

A sorted set or hash of up to 128 entries is a listpack to the server, where each lookup
walks the entries (``core.keep_large``). A dispatch that finds two tenants in a class's
fair set converts the set to a skiplist; one that passes a job through throttle or rate
keys converts their hash to a hash table. The conversion changes nothing a reader sees:
the same members and fields, with the values the dispatch gave them, and nothing of its
own left behind.
"""

from __future__ import annotations

from typing import Any

import pytest

from fairlane.store.api import Store
from fairlane.store.wire import NewJob

pytestmark = pytest.mark.anyio

HOUR = 3_600_000
CLASS = "standard"


def _jobs(tenant: str, n: int, **fields: Any) -> list[NewJob]:
    return [
        NewJob(f"{tenant}-{i}", tenant, 0, "fe.job", "[]", 3, "", 0, "0,0", "0,0", **fields)
        for i in range(n)
    ]


async def _encoding(store: Store, key: str | None = None) -> str:
    raw = await store.client.object("encoding", key or store.keys.class_key("a", CLASS, "fair"))
    return raw.decode() if isinstance(raw, bytes) else str(raw)


async def _tags(store: Store) -> dict[str, float]:
    rows = await store.client.zrange(
        store.keys.class_key("a", CLASS, "fair"), 0, -1, withscores=True
    )
    return {member.decode(): score for member, score in rows}


async def test_a_fair_set_of_several_tenants_becomes_a_skiplist(store: Store) -> None:
    tenants = [f"t{n}" for n in range(5)]
    for tenant in tenants:
        await store.enqueue("a", _jobs(tenant, 3))
    assert await _encoding(store) == "listpack"
    got = await store.exchange("w", ["a"], 5, HOUR, slots=5)
    # one job of each tenant, as fair dispatch gives them
    assert sorted(j.tenant for j in got.jobs) == tenants
    assert await _encoding(store) == "skiplist"
    tags = await _tags(store)
    assert sorted(tags) == tenants
    # each tenant charged one job's units over weight 1, nothing else moved
    assert len(set(tags.values())) == 1 and next(iter(tags.values())) > 0


async def test_the_skiplist_outlives_the_tenants_that_made_it(store: Store) -> None:
    await store.enqueue("a", _jobs("short", 1))
    await store.enqueue("a", _jobs("long", 4))
    got = await store.exchange("w", ["a"], 2, HOUR, slots=2)
    assert sorted(j.tenant for j in got.jobs) == ["long", "short"]
    # one tenant left: the set keeps the encoding while it lives
    assert list(await _tags(store)) == ["long"]
    assert await _encoding(store) == "skiplist"


async def test_a_lone_tenants_fair_set_is_left_as_the_server_made_it(store: Store) -> None:
    await store.enqueue("a", _jobs("solo", 6))
    got = await store.exchange("w", ["a"], 3, HOUR, slots=3)
    assert [j.tenant for j in got.jobs] == ["solo"] * 3
    assert await _encoding(store) == "listpack"
    assert list(await _tags(store)) == ["solo"]


async def test_the_throttle_keys_hash_becomes_a_hash_table(store: Store) -> None:
    await store.enqueue("a", _jobs("k", 4, limits=[["upstream", 10]]))
    # the first call's grants make the hash when the call returns (lua/writeback.lua);
    # the next converts it
    first = await store.exchange("w", ["a"], 1, HOUR, slots=2)
    got = await store.exchange("w", ["a"], 1, HOUR, slots=2)
    assert len(first.jobs) + len(got.jobs) == 2
    throttles = store.keys.throttles
    assert await _encoding(store, throttles) == "hashtable"
    fields = {f.decode(): v.decode() for f, v in (await store.client.hgetall(throttles)).items()}
    # the two grants are held, and no field of the conversion's is left
    assert fields["u:upstream"] == "2"
    assert all(f.isascii() for f in fields)
