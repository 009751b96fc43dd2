"""A tenant's settings in the store: its fair-share weight and its concurrency limits;
and the sweep of what tenants leave behind.

Each tenant's settings live in the shard its name hashes to (``weights`` and
``tlimits``, ``fairlane/store/keys.py``); the next dispatch decision uses them. One pass
of the tenant sweep (``lua/tenantsweep.lua``; its rules are ``fairlane.policy.tenantstate``)
is ``sweep_tenants``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fairlane.policy.ceilings import TenantLimits
from fairlane.policy.rates import Rate
from fairlane.store.base import StoreBase
from fairlane.store.connection import slot_client
from fairlane.store.library import FUNCTION_PREFIX
from fairlane.store.wire import (
    TenantSignal,
    decode_limits,
    decode_rate,
    encode_limits,
    encode_rate,
)

__all__ = ["TenantCalls", "TenantSweep"]


@dataclass(frozen=True, slots=True)
class TenantSweep:
    """One pass of the tenant sweep: where the next pass goes on (``"0"``: this pass ended
    a cycle over every key), what it looked at and removed, and whether the server keeps
    key idle times (not under an LFU maxmemory-policy: idle state then stays)."""

    cursor: str
    examined: int
    removed: int
    idle_clock: bool


class TenantCalls(StoreBase):
    """Setting and reading tenants' weights and limits."""

    async def configure_tenant(self, tenant: str, weight: float | None) -> None:
        """Set a tenant's fair-share weight (None: back to the default of 1)."""
        value = "" if weight is None else repr(float(weight))
        await self.fcall("configure_tenant", self._common, [tenant, value])

    async def configure_tenant_limits(self, tenant: str, limits: TenantLimits | None) -> None:
        """Set a tenant's concurrency settings (None: no tenant key at all)."""
        await self.fcall("configure_limits", self._common, [tenant, encode_limits(limits)])

    async def update_tenant_limits(
        self, tenant: str, change: Callable[[TenantLimits | None], TenantLimits | None]
    ) -> TenantLimits | None:
        """Replace a tenant's settings by ``change(current)`` as one atomic step.

        Optimistic: the read and the write run under WATCH, and the whole step is
        retried if any tenant's settings changed in between, so two clients
        configuring different fields of one tenant never lose either change.
        """

        async def step(pipe: Any) -> TenantLimits | None:
            new = change(decode_limits(await pipe.hget(self.keys.tlimits, tenant)))
            pipe.multi()
            pipe.fcall(
                FUNCTION_PREFIX + "configure_limits",
                len(self._common),
                *self._common,
                tenant,
                encode_limits(new),
            )
            return new

        async with slot_client(self.client, self.keys.tlimits) as client:
            result: TenantLimits | None = await self._call(
                client.transaction, step, self.keys.tlimits, value_from_callable=True
            )
        return result

    async def tenant_limits(self, tenant: str) -> TenantLimits | None:
        return decode_limits(await self._call(self.client.hget, self.keys.tlimits, tenant))

    async def configure_tenant_rate(self, tenant: str, rate: Rate | None) -> None:
        """Set the rate of the tenant's own key ``tenant:<tenant>`` (None: no rate); its
        next dispatch applies it."""
        if rate is None:
            await self._call(self.client.hdel, self.keys.tenant_rates, tenant)
        else:
            await self._call(self.client.hset, self.keys.tenant_rates, tenant, encode_rate(rate))

    async def tenant_rate(self, tenant: str) -> Rate | None:
        return decode_rate(await self._call(self.client.hget, self.keys.tenant_rates, tenant))

    async def tenant_weight(self, tenant: str) -> float:
        raw = await self._call(self.client.hget, self.keys.weights, tenant)
        return float(raw) if raw is not None else 1.0

    async def tenant_limit_now(self, lane: str, tenant: str) -> TenantSignal:
        """The tenant's concurrency limit in ``lane`` now, and the signals behind it."""
        limit, rate, mean, cap, load = await self.fcall(
            "tenant_limit_now", self._lane_keys([lane]), [lane, tenant]
        )
        return TenantSignal(
            None if int(limit) < 0 else int(limit), float(rate), float(mean), int(cap), int(load)
        )

    async def sweep_tenants(self, cursor: str, limit: int, idle_ttl: float) -> TenantSweep:
        """One pass of at most about ``limit`` keys and fields from ``cursor`` (``"0"``
        starts a cycle) with learned costs and signals kept ``idle_ttl`` seconds."""
        raw = await self.fcall(
            "tenant_sweep", self._common, [cursor, limit, round(idle_ttl * 1000)]
        )
        cursor_out = raw[0].decode() if isinstance(raw[0], bytes) else str(raw[0])
        return TenantSweep(cursor_out, int(raw[1]), int(raw[2]), bool(int(raw[3])))
