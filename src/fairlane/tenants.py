"""Tenants' run-time settings, kept in the server so every worker sees a change at once.

Today a tenant has one setting, its fair-share weight: inside a lane, tenants with
waiting work share dispatches in proportion to their weights (start-time fair
queuing; see ``fairlane.policy.fairqueue``). A change applies from the tenant's next
dispatch, with no redeploy and no restart.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fairlane.app import App

__all__ = ["MAX_WEIGHT", "Tenants"]

#: Weights are relative; a bound keeps a typo from starving everyone else for good.
MAX_WEIGHT = 1_000_000.0


def _check_tenant(tenant: str) -> None:
    if not isinstance(tenant, str) or not tenant or len(tenant) > 200:
        raise ValueError(f"tenant must be a non-empty string of at most 200 characters: {tenant!r}")


class Tenants:
    """``app.tenants``: configure tenants while the system runs."""

    def __init__(self, app: App) -> None:
        self._app = app

    async def configure(self, tenant: str, *, weight: float | None = None) -> None:
        """Change a tenant's settings; those left as None stay as they are."""
        _check_tenant(tenant)
        if weight is None:
            return
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise TypeError(f"weight must be a number, got {weight!r}")
        if not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
            raise ValueError(f"weight must be > 0 and at most {MAX_WEIGHT:g}, got {weight!r}")
        await self._app.store.configure_tenant(tenant, float(weight))

    async def reset(self, tenant: str) -> None:
        """Put a tenant back on the defaults (weight 1)."""
        _check_tenant(tenant)
        await self._app.store.configure_tenant(tenant, None)

    async def weight(self, tenant: str) -> float:
        """The tenant's current weight (1 unless configured)."""
        _check_tenant(tenant)
        return await self._app.store.tenant_weight(tenant)
