"""``TenantLabels``: keeps the ``tenant`` label of worker metrics bounded.

A tenant gets its own label if it is in the allow-list or among the ``top_n`` busiest
tenants (by jobs started on this worker); every other tenant is ``other``. So a
worker's metrics hold at most ``len(allow) + top_n + 1`` tenant values, however many
tenants there are. The busiest set is recomputed periodically (``refresh``); a tenant
that drops out of it is returned so its series can be removed.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

__all__ = ["OTHER", "TenantLabels"]

OTHER = "other"
_MAX_TRACKED = 10_000  # tenants whose volume is remembered; pruned to half past this


class TenantLabels:
    """Maps tenants to bounded label values. Not thread-safe: use from the worker's loop."""

    def __init__(self, top_n: int = 20, allow: Iterable[str] = ()) -> None:
        self.top_n = top_n
        self.allow = frozenset(allow)
        self._volume: dict[str, int] = {}
        self._top: set[str] = set()

    def count(self, tenant: str, n: int = 1) -> None:
        self._volume[tenant] = self._volume.get(tenant, 0) + n

    def label(self, tenant: str) -> str:
        if tenant in self._top or tenant in self.allow:
            return tenant
        if len(self._top) < self.top_n:  # room left: admit now, refresh re-ranks later
            self._top.add(tenant)
            return tenant
        return OTHER

    @property
    def labelled(self) -> frozenset[str]:
        """Tenants that currently have a label of their own."""
        return frozenset(self._top | self.allow)

    def refresh(self) -> set[str]:
        """Re-rank the busiest tenants; returns those that lost their own label."""
        if len(self._volume) > _MAX_TRACKED:
            kept = heapq.nlargest(_MAX_TRACKED // 2, self._volume.items(), key=lambda kv: kv[1])
            self._volume = dict(kept)
        ranked = heapq.nlargest(
            self.top_n,
            ((v, t) for t, v in self._volume.items() if t not in self.allow),
        )
        top = {t for _, t in ranked}
        dropped = self._top - top
        self._top = top
        return dropped
