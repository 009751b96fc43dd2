"""The store's payload index and key-space calls on a real server: the ``payloads``
sorted set keeps its layout (member ``<job id>|<name>``, score the next check in ms),
entries come due in score order within a limit, a recheck never revives an entry
dropped meanwhile, and a shard's keys are counted and removed as one. The app's API key
records, read through any shard's store, are the home shard's."""

from __future__ import annotations

import pytest

from fairlane.store.api import Store
from fairlane.store.apikeys import KeyRecord
from fairlane.store.payloadindex import IndexEntry, index_member, split_member

pytestmark = pytest.mark.anyio


async def test_entries_keep_the_index_layout(store: Store) -> None:
    await store.index_payloads([("j1", "j1.args"), ("a|b", "x.result")], 1_000)
    raw = await store.client.zrange(store.keys.payloads, 0, -1, withscores=True)
    assert sorted(raw) == [(b"a|b|x.result", 1000.0), (b"j1|j1.args", 1000.0)]
    await store.index_payloads([], 5)  # nothing asked: nothing sent, nothing changed
    assert await store.client.zcard(store.keys.payloads) == 2


async def test_due_entries_in_score_order_within_the_limit(store: Store) -> None:
    for job_id, score in (("late", 300), ("early", 100), ("middle", 200)):
        await store.index_payloads([(job_id, f"{job_id}.args")], score)
    assert await store.due_payloads(99, 10) == []
    due = await store.due_payloads(250, 10)
    assert due == [
        IndexEntry(b"early|early.args", "early", "early.args"),
        IndexEntry(b"middle|middle.args", "middle", "middle.args"),
    ]
    assert [e.job_id for e in await store.due_payloads(1_000, 2)] == ["early", "middle"]
    assert [e.job_id for e in await store.indexed_payloads(10)] == ["early", "middle", "late"]
    assert len(await store.indexed_payloads(1)) == 1


async def test_a_member_naming_no_job_reads_with_an_empty_job_id(store: Store) -> None:
    await store.client.zadd(store.keys.payloads, {b"orphan": 1})
    assert await store.due_payloads(1, 10) == [IndexEntry(b"orphan", "", "orphan")]
    assert split_member(index_member("", "orphan")) == ("", "orphan")


async def test_recheck_reschedules_but_never_revives(store: Store) -> None:
    await store.index_payloads([("a", "a.args"), ("b", "b.args")], 100)
    due = await store.due_payloads(100, 10)
    await store.drop_payload_entries(due[1:])
    await store.recheck_payloads(due, 5_000)
    raw = await store.client.zrange(store.keys.payloads, 0, -1, withscores=True)
    assert raw == [(b"a|a.args", 5000.0)]
    await store.drop_payload_entries([])
    await store.recheck_payloads([], 1)
    assert await store.client.zcard(store.keys.payloads) == 1


async def test_a_shards_keys_counted_and_removed(store: Store) -> None:
    await store.index_payloads([("a", "a.args")], 1)
    await store.client.set(store.keys.fence, 1)
    other = Store(store.client, store.app + "x")  # another app on the same server
    await other.client.set(other.keys.fence, 1)
    try:
        assert await store.count_keys() == 2
        assert await store.remove_keys() == 2
        assert await store.count_keys() == 0
        assert await other.count_keys() == 1
    finally:
        await other.remove_keys()


async def test_key_records_live_in_the_home_shard(redis_url: str, namespace: str) -> None:
    home = Store.from_url(redis_url, namespace, shards=3)
    await home.connect()
    try:
        other = home.shard_store(2, 3)
        assert other.key_records is other.key_records  # one per store, on its connection
        assert other.key_records.client is home.client
        record = KeyRecord("acme", "0" * 64, 1)
        assert await other.key_records.add("k1", record)
        assert await home.key_records.get("k1") == record
        assert other.key_records.hash == home.keys.gateway_keys
    finally:
        await home.aclose()
