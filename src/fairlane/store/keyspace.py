"""Every key of an app at once: counting and deleting the keys a SCAN pattern matches.

For ``purge`` and the demo's cleanup (``AppKeys.match_all`` gives an app's pattern;
``KeyspaceCalls`` applies it to a store's own shard). On a cluster, SCAN runs on every
primary and UNLINK is split by slot. Deleting goes in batches of ``_BATCH`` keys, so
that no single command holds the server for long.
"""

from __future__ import annotations

import itertools

from fairlane.store.base import StoreBase
from fairlane.store.connection import AsyncClient, SyncClient

__all__ = ["KeyspaceCalls", "count_matching", "unlink_matching", "unlink_matching_sync"]

_BATCH = 500
_SCAN_COUNT = 1000


async def count_matching(client: AsyncClient, pattern: str) -> int:
    """How many keys match ``pattern``."""
    return sum([1 async for _ in client.scan_iter(match=pattern, count=_SCAN_COUNT)])


async def unlink_matching(client: AsyncClient, pattern: str) -> int:
    """Delete every key matching ``pattern``, in batches; returns how many."""
    removed = 0
    batch: list[bytes] = []
    async for key in client.scan_iter(match=pattern, count=_SCAN_COUNT):
        batch.append(key)
        if len(batch) >= _BATCH:
            removed += await client.unlink(*batch)
            batch.clear()
    if batch:
        removed += await client.unlink(*batch)
    return removed


def unlink_matching_sync(client: SyncClient, pattern: str) -> int:
    """``unlink_matching`` on a synchronous client (for cleanup outside an event loop)."""
    removed = 0
    keys = iter(client.scan_iter(match=pattern, count=_SCAN_COUNT))
    while batch := list(itertools.islice(keys, _BATCH)):
        removed += int(client.unlink(*batch))
    return removed


class KeyspaceCalls(StoreBase):
    """Every key of this shard of the app, at once."""

    async def count_keys(self) -> int:
        """How many keys this shard of the app holds."""
        return await count_matching(self.client, self.keys.match_all())

    async def remove_keys(self) -> int:
        """Delete every key of this shard of the app, in batches; returns how many."""
        return await unlink_matching(self.client, self.keys.match_all())
