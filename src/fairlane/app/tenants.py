"""Tenants' run-time settings, kept in the server so every worker sees a change at once.

A tenant has a fair-share weight -- inside a lane, tenants with waiting work share
dispatches in proportion to their weights (start-time fair queuing; see
``fairlane.policy.fairqueue``) -- weights for its fairness keys, which share the
tenant's part the same way (``fairlane.policy.fairkeys``) -- and concurrency settings:
a floor it always gets, a hard cap, and burst room on top of what it earns
(``fairlane.policy.ceilings``). A change applies from the tenant's next dispatch, with
no redeploy and no restart.

A tenant may also be entitled to restricted service classes (``ServiceClass(...,
restricted=True)``; the default ``guaranteed`` class is one): only an entitled tenant's
jobs may be in them, at enqueue and at each retry (``fairlane.policy.classes.Entitlement``),
and its default class is the class of its jobs that name none. These apply from its
next enqueue.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Literal

from fairlane.app.pauses import Pauses, TenantPauses
from fairlane.policy.ceilings import TenantLimits
from fairlane.policy.classes import Entitlement, check_class_name
from fairlane.policy.rates import Rate
from fairlane.registry.calls import check_fairness_key
from fairlane.store.shards import ShardedStores

__all__ = ["MAX_WEIGHT", "TenantSetting", "Tenants"]

#: Weights are relative; a bound keeps a typo from starving everyone else for good.
MAX_WEIGHT = 1_000_000.0
#: Counts travel through Lua numbers and msgpack; this keeps them exact.
_MAX_COUNT = 2**31 - 1
_MAX_BURST_PCT = 1000.0

TenantSetting = Literal[
    "weight",
    "floor",
    "max_concurrency",
    "burst_floor",
    "burst_pct",
    "rate",
    "classes",
    "default_class",
]
_LIMIT_FIELDS: tuple[TenantSetting, ...] = ("floor", "max_concurrency", "burst_floor", "burst_pct")
_CLASS_FIELDS: tuple[TenantSetting, ...] = ("classes", "default_class")
_SETTINGS: tuple[TenantSetting, ...] = ("weight", "rate", *_LIMIT_FIELDS, *_CLASS_FIELDS)
_DEFAULT_LIMITS = TenantLimits()


def _check_tenant(tenant: str) -> None:
    if not isinstance(tenant, str) or not tenant or len(tenant) > 200:
        raise ValueError(f"tenant must be a non-empty string of at most 200 characters: {tenant!r}")


def _check_weight(weight: float) -> float:
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise TypeError(f"weight must be a number, got {weight!r}")
    if not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
        raise ValueError(f"weight must be > 0 and at most {MAX_WEIGHT:g}, got {weight!r}")
    return float(weight)


def _check_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not 0 <= value <= _MAX_COUNT:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _check_pct(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"burst_pct must be a number, got {value!r}")
    if not (math.isfinite(value) and 0 <= value <= _MAX_BURST_PCT):
        raise ValueError(
            f"burst_pct must be >= 0 and at most {_MAX_BURST_PCT:g} (a fraction: 0.5 is 50%), "
            f"got {value!r}"
        )
    return float(value)


def _check_classes(classes: Iterable[str]) -> tuple[str, ...]:
    if isinstance(classes, str) or not isinstance(classes, Iterable):
        raise TypeError(
            f"classes must be a list of class names (classes=[{classes!r}] for one), "
            f"got {classes!r}"
        )
    names: list[str] = []
    for name in classes:
        try:
            check_class_name(name)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"classes: {exc}") from None
        if name not in names:
            names.append(name)
    return tuple(names)


def _check_default_class(name: str) -> str:
    try:
        return check_class_name(name)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"default_class: {exc}") from None


def _is_default(limits: TenantLimits) -> bool:
    return all(getattr(limits, f) == getattr(_DEFAULT_LIMITS, f) for f in _LIMIT_FIELDS)


class Tenants(TenantPauses):
    """``app.tenants``: configure, pause and quarantine tenants while the system runs."""

    def __init__(self, stores: ShardedStores, pauses: Pauses) -> None:
        super().__init__(pauses)
        self._stores = stores

    async def configure(
        self,
        tenant: str,
        *,
        weight: float | None = None,
        floor: int | None = None,
        max_concurrency: int | None = None,
        burst_floor: int | None = None,
        burst_pct: float | None = None,
        rate: Rate | None = None,
        classes: Iterable[str] | None = None,
        default_class: str | None = None,
    ) -> None:
        """Change a tenant's settings; those left as None stay as they are.

        ``rate`` limits how fast the tenant's jobs start, on its own key
        ``tenant:<tenant>`` (a ``Rate`` in jobs or units, as a task's rate keys).
        ``classes`` names the restricted classes the tenant may use (it replaces the
        list it had; ``[]``: none); ``default_class`` is the class of its jobs when
        neither the call nor the task names one (where the lane has it and the tenant
        may use it; else the lane's default, ``standard``). Every value is checked
        before anything is written. To lift a setting (the cap, the rate or the classes
        included) use ``reset(tenant, "max_concurrency")``.
        """
        _check_tenant(tenant)
        if rate is not None and not isinstance(rate, Rate):
            raise TypeError(f"rate must be a fairlane.Rate, got {rate!r}")
        entitled = None if classes is None else _check_classes(classes)
        default = None if default_class is None else _check_default_class(default_class)
        given: dict[str, int | float] = {}
        if floor is not None:
            given["floor"] = _check_count("floor", floor)
        if max_concurrency is not None:
            given["max_concurrency"] = _check_count("max_concurrency", max_concurrency)
        if burst_floor is not None:
            given["burst_floor"] = _check_count("burst_floor", burst_floor)
        if burst_pct is not None:
            given["burst_pct"] = _check_pct(burst_pct)
        new_weight = None if weight is None else _check_weight(weight)
        if given:
            # a merge with the current settings, so that setting one keeps the others;
            # checked (TenantLimits) before it is written, in one atomic step
            def merged(current: TenantLimits | None) -> TenantLimits:
                return dataclasses.replace(current or _DEFAULT_LIMITS, **given)  # type: ignore[arg-type]

            await self._stores.store_for_tenant(tenant).update_tenant_limits(tenant, merged)
        if new_weight is not None:
            await self._stores.store_for_tenant(tenant).configure_tenant(tenant, new_weight)
        if rate is not None:
            await self._stores.store_for_tenant(tenant).configure_tenant_rate(tenant, rate)
        if entitled is not None or default is not None:
            await self._stores.store_for_tenant(tenant).configure_tenant_classes(
                tenant, entitled, set_default=default is not None, default_class=default
            )

    async def reset(self, tenant: str, *settings: TenantSetting) -> None:
        """Put a tenant's settings back on the defaults: those named, or all of them.

        Defaults: weight 1, floor 1, no cap, no burst room, no rate, no restricted
        classes and no default class.
        """
        _check_tenant(tenant)
        unknown = sorted(set(settings) - set(_SETTINGS))
        if unknown:
            raise ValueError(f"unknown tenant settings {unknown}; they are {', '.join(_SETTINGS)}")
        names = set(settings) or set(_SETTINGS)
        store = self._stores.store_for_tenant(tenant)
        if names >= set(_LIMIT_FIELDS):
            await store.configure_tenant_limits(tenant, None)
        elif names & set(_LIMIT_FIELDS):
            back = {name: getattr(_DEFAULT_LIMITS, name) for name in names & set(_LIMIT_FIELDS)}

            def restored(current: TenantLimits | None) -> TenantLimits | None:
                if current is None:
                    return None
                limits = dataclasses.replace(current, **back)
                return None if _is_default(limits) else limits

            await store.update_tenant_limits(tenant, restored)
        if "weight" in names:
            await store.configure_tenant(tenant, None)
        if "rate" in names:
            await store.configure_tenant_rate(tenant, None)
        if names & set(_CLASS_FIELDS):
            await store.configure_tenant_classes(
                tenant,
                () if "classes" in names else None,
                set_default="default_class" in names,
            )

    async def configure_key(self, tenant: str, key: str, *, weight: float) -> None:
        """Set the weight of one of the tenant's fairness keys (1 by default; 1 puts it
        back). Inside the tenant's part, its active keys share by these weights
        (``fairlane.policy.fairkeys``); the key's next enqueued job takes it."""
        _check_tenant(tenant)
        check_fairness_key(key)
        new_weight = _check_weight(weight)
        await self._stores.store_for_tenant(tenant).configure_key_weight(tenant, key, new_weight)

    async def key_weights(self, tenant: str) -> dict[str, float]:
        """The weights set for the tenant's fairness keys (any key not named has 1)."""
        _check_tenant(tenant)
        return await self._stores.store_for_tenant(tenant).key_weights(tenant)

    async def weight(self, tenant: str) -> float:
        """The tenant's current weight (1 unless configured)."""
        _check_tenant(tenant)
        return await self._stores.store_for_tenant(tenant).tenant_weight(tenant)

    async def rate(self, tenant: str) -> Rate | None:
        """The rate of the tenant's own key, or None when it has none."""
        _check_tenant(tenant)
        return await self._stores.store_for_tenant(tenant).tenant_rate(tenant)

    async def limits(self, tenant: str) -> TenantLimits | None:
        """The tenant's concurrency settings, or None when it has none (the defaults apply)."""
        _check_tenant(tenant)
        return await self._stores.store_for_tenant(tenant).tenant_limits(tenant)

    async def entitlement(self, tenant: str) -> Entitlement | None:
        """The restricted classes the tenant may use and its default class, or None when
        it has neither."""
        _check_tenant(tenant)
        return await self._stores.store_for_tenant(tenant).tenant_entitlement(tenant)
