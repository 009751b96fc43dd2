"""Which scheduling shard a tenant belongs to.

An app's scheduling state may be split into ``count`` shards, each a complete
scheduler under its own hash tag (``fairlane.store.keys``), so that a Redis Cluster
spreads one app's load over its primaries. Every job, queue, limit and weight of a
tenant lives in that tenant's shard, so everything the policy decides about one
tenant against the others of its shard is decided exactly, in one atomic script.

The mapping is a jump consistent hash of the tenant's name: stable across processes,
hosts and Python versions (no ``hash()``, which is salted per process), uniform, and
minimal in movement -- going from ``n`` to ``n + 1`` shards moves only about
``1 / (n + 1)`` of the tenants, all of them to the new shard.
"""

from __future__ import annotations

import hashlib

__all__ = ["MAX_SHARDS", "check_shard_count", "shard_of_tenant"]

#: more shards than a cluster has slots' worth of sense; a typo guard, not a tuning knob
MAX_SHARDS = 1024

_MASK64 = (1 << 64) - 1
_JUMP_MULTIPLIER = 2862933555777941757


def check_shard_count(count: int) -> int:
    """``count`` if it is a usable number of shards, else ``ValueError``."""
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_SHARDS:
        raise ValueError(f"shards must be an integer from 1 to {MAX_SHARDS}, got {count!r}")
    return count


def shard_of_tenant(tenant: str, count: int) -> int:
    """The shard (``0 <= shard < count``) that holds ``tenant``'s work."""
    if count == 1:
        return 0
    digest = hashlib.blake2b(tenant.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return _jump(int.from_bytes(digest, "big"), count)


def _jump(key: int, buckets: int) -> int:
    """Jump consistent hash: a bucket for a 64-bit key, moving a key only when the
    bucket count grows past the bucket it would jump to."""
    bucket, candidate = -1, 0
    while candidate < buckets:
        bucket = candidate
        key = (key * _JUMP_MULTIPLIER + 1) & _MASK64
        candidate = int((bucket + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return bucket
