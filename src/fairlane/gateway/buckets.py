"""Each tenant's submission rate in one gateway process: a token bucket per tenant.

The bucket is the policy core's (``fairlane.policy.rates``: ``Rate``, ``Bucket``,
``fits``, ``take``, ``due_at``, ``correct``), the one the store's rate keys follow, held
here in the process's memory on its monotonic clock (ms, passed in), so a tenant past
its rate is refused without a call to the store. A tenant seen for the first time
starts with a full bucket; a bucket that has refilled to full holds nothing a new one
would not, and is dropped when the map grows (``PRUNE_AT``), so idle tenants cost
nothing.
"""

from __future__ import annotations

from fairlane.policy.rates import Bucket, Rate, correct, due_at, fits, level, take

__all__ = ["PRUNE_AT", "TenantBuckets"]

#: buckets held before the full ones are dropped (the bound doubles while none is full)
PRUNE_AT = 10_000

_ONE = 1.0  # a submit takes one token


class TenantBuckets:
    """Token buckets by tenant, each under the ``Rate`` its caller passes."""

    def __init__(self) -> None:
        self._buckets: dict[str, tuple[Rate, Bucket]] = {}
        self._prune_at = PRUNE_AT

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, tenant: str, rate: Rate, now_ms: int) -> float | None:
        """Take a token for one submit of ``tenant``: None if it had one, else the
        seconds until it will (nothing taken)."""
        held = self._buckets.get(tenant)
        if held is None:
            bucket = Bucket.full(rate, now_ms)
            if len(self._buckets) >= self._prune_at:
                self._prune(now_ms)
        else:
            bucket = held[1]
        if not fits(rate, bucket, _ONE, now_ms):
            return (due_at(rate, bucket, _ONE, now_ms) - now_ms) / 1000.0
        self._buckets[tenant] = (rate, take(rate, bucket, _ONE, now_ms))
        return None

    def give_back(self, tenant: str, now_ms: int) -> None:
        """Return the token of a submit refused after it was taken (nothing was stored)."""
        held = self._buckets.get(tenant)
        if held is not None:
            rate, bucket = held
            self._buckets[tenant] = (rate, correct(rate, bucket, _ONE, now_ms))

    def _prune(self, now_ms: int) -> None:
        full = [
            tenant
            for tenant, (rate, bucket) in self._buckets.items()
            if level(rate, bucket, now_ms) >= rate.capacity
        ]
        for tenant in full:
            del self._buckets[tenant]
        if len(self._buckets) >= self._prune_at:
            self._prune_at *= 2
