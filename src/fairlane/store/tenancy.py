"""A tenant's settings in the store: its fair-share weight, its fairness keys' weights,
its concurrency limits and its class entitlement; and the sweep of what tenants leave
behind.

Each tenant's settings live in the shard its name hashes to (``weights``, ``fkw:<t>``,
``tlimits`` and ``tclasses``, ``fairlane/store/keys.py``); the next dispatch decision
(for an entitlement, the next enqueue and the next retry; for a key's weight, the
key's next enqueued job) uses them. One pass
of the tenant sweep (``lua/tenantsweep.lua``; its rules are ``fairlane.policy.tenantstate``)
is ``sweep_tenants``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from fairlane.policy.ceilings import TenantLimits
from fairlane.policy.classes import Entitlement
from fairlane.policy.rates import Rate
from fairlane.store.argv import (
    ConfigureClassesArg,
    ConfigureLimitsArg,
    ConfigureTenantArg,
    TenantLimitNowArg,
    TenantSweepArg,
    argv,
)
from fairlane.store.base import StoreBase
from fairlane.store.connection import slot_client
from fairlane.store.library import FUNCTION_PREFIX
from fairlane.store.wire import (
    TenantSignal,
    as_text,
    decode_limits,
    decode_rate,
    encode_limits,
    encode_rate,
)

__all__ = ["TenantCalls", "TenantSweep", "decode_entitlement"]


def decode_entitlement(raw: bytes | str | None) -> Entitlement | None:
    """An entitlement as ``configure_classes`` writes it (None when absent or unreadable;
    the scripts write an empty list of classes as ``{}``)."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        names = data.get("c") or []
        default = data.get("d")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return None
        return Entitlement(frozenset(names), default if isinstance(default, str) else None)
    except (ValueError, AttributeError):
        return None


class TenantSweep(msgspec.Struct, frozen=True):
    """One pass of the tenant sweep: where the next pass goes on (``"0"``: this pass ended
    a cycle over every key), what it looked at and removed, and whether the server keeps
    key idle times (not under an LFU maxmemory-policy: idle state then stays)."""

    cursor: str
    examined: int
    removed: int
    idle_clock: bool


class TenantCalls(StoreBase):
    """Setting and reading tenants' weights (their own and their fairness keys') and
    limits."""

    async def configure_tenant(self, tenant: str, weight: float | None) -> None:
        """Set a tenant's fair-share weight (None: back to the default of 1)."""
        value = "" if weight is None else repr(float(weight))
        args = argv(ConfigureTenantArg, tenant=tenant, weight=value)
        await self.fcall("configure_tenant", self._common, args)

    async def configure_tenant_limits(self, tenant: str, limits: TenantLimits | None) -> None:
        """Set a tenant's concurrency settings (None: no tenant key at all)."""
        args = argv(ConfigureLimitsArg, tenant=tenant, limits=encode_limits(limits))
        await self.fcall("configure_limits", self._common, args)

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
                *argv(ConfigureLimitsArg, tenant=tenant, limits=encode_limits(new)),
            )
            return new

        async with slot_client(self.client, self.keys.tlimits) as client:
            result: TenantLimits | None = await self._call(
                client.transaction, step, self.keys.tlimits, value_from_callable=True
            )
        return result

    async def tenant_limits(self, tenant: str) -> TenantLimits | None:
        return decode_limits(await self._call(self.client.hget, self.keys.tlimits, tenant))

    async def configure_tenant_classes(
        self,
        tenant: str,
        classes: Sequence[str] | None = None,
        *,
        set_default: bool = False,
        default_class: str | None = None,
    ) -> None:
        """Set the restricted classes a tenant may use (None: kept as they are; empty:
        none) and, with ``set_default``, its default class (None: none), in one step;
        its next enqueue applies them."""
        await self.fcall(
            "configure_classes",
            self._common,
            argv(
                ConfigureClassesArg,
                tenant=tenant,
                set_classes="0" if classes is None else "1",
                classes=json.dumps(list(classes or ())),
                set_default="1" if set_default else "0",
                default=default_class or "",
            ),
        )

    async def tenant_entitlement(self, tenant: str) -> Entitlement | None:
        """The tenant's class entitlement, or None when it has none."""
        raw = await self._call(self.client.hget, self.keys.tenant_classes, tenant)
        return decode_entitlement(raw)

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

    async def configure_key_weight(self, tenant: str, key: str, weight: float) -> None:
        """Set the weight of one of a tenant's fairness keys (1, the default, keeps no
        field); the key's next enqueued job is tagged with it (``lua/fairkeys.lua``)."""
        name = self.keys.key_weights(tenant)
        if weight == 1:
            await self._call(self.client.hdel, name, key)
        else:
            await self._call(self.client.hset, name, key, repr(float(weight)))

    async def key_weights(self, tenant: str) -> dict[str, float]:
        """The weights set for a tenant's fairness keys (those not named are 1)."""
        raw = await self._call(self.client.hgetall, self.keys.key_weights(tenant))
        return {as_text(k): float(v) for k, v in raw.items()}

    async def tenant_limit_now(self, lane: str, tenant: str) -> TenantSignal:
        """The tenant's concurrency limit in ``lane`` now, and the signals behind it."""
        limit, rate, mean, cap, load = await self.fcall(
            "tenant_limit_now",
            self._lane_keys([lane]),
            argv(TenantLimitNowArg, lane=lane, tenant=tenant),
        )
        return TenantSignal(
            None if int(limit) < 0 else int(limit), float(rate), float(mean), int(cap), int(load)
        )

    async def sweep_tenants(self, cursor: str, limit: int, idle_ttl: float) -> TenantSweep:
        """One pass of at most about ``limit`` keys and fields from ``cursor`` (``"0"``
        starts a cycle) with learned costs and signals kept ``idle_ttl`` seconds."""
        raw = await self.fcall(
            "tenant_sweep",
            self._common,
            argv(TenantSweepArg, cursor=cursor, limit=limit, idle_ttl_ms=round(idle_ttl * 1000)),
        )
        cursor_out = raw[0].decode() if isinstance(raw[0], bytes) else str(raw[0])
        return TenantSweep(cursor_out, int(raw[1]), int(raw[2]), bool(int(raw[3])))
