"""An app's admin operations, over every shard: dead letters, redrive, stats, purge.

Each reads or changes every shard's store and merges the answers, so an operator sees
one app whatever its shard count.
"""

from __future__ import annotations

from collections.abc import Sequence

from fairlane.payloads.offload import Payloads
from fairlane.payloads.sweep import remove_all as remove_all_payloads
from fairlane.store.shards import ShardedStores

__all__ = ["dead_letters", "purge", "redrive", "stats"]


async def dead_letters(stores: ShardedStores, limit: int) -> list[tuple[str, float]]:
    """Dead-lettered job ids with the time (epoch seconds) they died, oldest first
    (the oldest ``limit`` of every shard, merged)."""
    found: list[tuple[str, float]] = []
    for store in stores.stores:
        found.extend(await store.dead_letters(limit))
    found.sort(key=lambda item: (item[1], item[0]))
    return [(job_id, ms / 1000) for job_id, ms in found[:limit]]


async def redrive(stores: ShardedStores, job_ids: Sequence[str], limit: int) -> list[str]:
    """Send dead-lettered jobs back to their queues with a fresh attempt budget:
    those named, else up to ``limit`` of them, the home shard's first."""
    done: list[str] = []
    if job_ids:
        shard_stores = stores.stores
        for shard, ids in stores.by_shard(job_ids).items():
            done.extend(await shard_stores[shard].redrive(ids, limit))
        return done
    for store in stores.stores:
        if len(done) >= limit:
            break
        done.extend(await store.redrive((), limit - len(done)))
    return done


async def stats(stores: ShardedStores) -> dict[str, int]:
    """The store's counters, summed over the shards."""
    total: dict[str, int] = {}
    for store in stores.stores:
        for name, value in (await store.stats()).items():
            total[name] = total.get(name, 0) + value
    return total


async def purge(stores: ShardedStores, payloads: Payloads | None) -> int:
    """Delete every key of the app, in every shard, and the large payloads its records
    kept in the payload store. Returns the number of keys removed."""
    removed = 0
    for store in stores.stores:
        if payloads is not None:
            await remove_all_payloads(store, payloads)
        removed += await store.remove_keys()
    return removed
