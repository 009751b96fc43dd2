"""Making jobs: ids, where and when a job goes, what it asks of its lane, the ``NewJob``.

Every enqueue path -- a producer's ``enqueue`` and ``submit``, the gateway, a workflow
run starting its children, a cron tick -- builds its jobs here, so that each is checked
the same way before one byte is written: a bad call never leaves a half-stored job.

- ``new_job_id``: time-ordered ids, unique without coordination;
- ``Placement``: tenant, fairness key, priority, delay or start time, deadline (a batch
  shares one);
- ``Demand``: the service class, width in slots, throttle limits and declared cost;
- ``JobFactory``: what every task of an app makes its jobs with (its lanes' class
  tables, pricing, shard count, payload store and size limit).
"""

from __future__ import annotations

import itertools
import os
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from fairlane.config.lanes import (
    LaneTables,
    LimitValue,
    check_key_count,
    check_limits,
    check_rates,
    check_service_class,
    check_slots,
    merge_limits,
)
from fairlane.payloads.offload import Payloads
from fairlane.policy.admission import Estimate
from fairlane.policy.fairkeys import MAX_KEY_LENGTH
from fairlane.policy.rates import Adaptive, Rate
from fairlane.policy.shards import shard_of_tenant
from fairlane.registry.options import TaskOptions
from fairlane.registry.pricing import Pricing, cost_key

__all__ = [
    "PRIORITY_LIMIT",
    "Demand",
    "JobFactory",
    "Placement",
    "Seconds",
    "check_fairness_key",
    "new_job_id",
]

PRIORITY_LIMIT = 1000
Seconds = float | int | timedelta


class _IdSource:
    """This process's part of job ids: 32 random bits, and a counter after them."""

    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        self.origin = random.getrandbits(32)
        self.counter = itertools.count(random.getrandbits(16))


_ids = _IdSource()
os.register_at_fork(after_in_child=_ids.reseed)


def new_job_id() -> str:
    """Time-ordered, unique without coordination: milliseconds, then 32 bits random per
    process, then a counter -- so that the ids one process makes in one millisecond
    sort in the order they were made (retention breaks ties of finish time by id)."""
    count = next(_ids.counter) & 0xFFFFFFFF
    return f"{time.time_ns() // 1_000_000:011x}{_ids.origin:08x}{count:08x}"


def _seconds(value: Seconds, what: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 0:
        raise ValueError(f"{what} cannot be negative: {value!r}")
    return seconds


def _epoch_ms(moment: datetime, what: str) -> int:
    if moment.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware (e.g. datetime.now(UTC)): {moment!r}")
    return int(moment.timestamp() * 1000)


def _deadline(deadline: datetime | Seconds | None) -> str:
    if deadline is None:
        return ""
    if isinstance(deadline, datetime):
        ms = _epoch_ms(deadline, "deadline")
        if ms <= time.time() * 1000:
            raise ValueError(f"the deadline is in the past: {deadline.isoformat()}")
        return str(ms)
    seconds = _seconds(deadline, "deadline")
    if seconds == 0:
        raise ValueError("a deadline of 0 seconds has already passed")
    return f"+{round(seconds * 1000)}"


def check_fairness_key(key: object) -> str:
    """A fairness key as the store takes it: a name of printable characters, at most
    ``MAX_KEY_LENGTH`` long (the end user a job is fair between, inside its tenant)."""
    if not isinstance(key, str):
        raise TypeError(f"fairness_key must be a string, got {key!r}")
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise ValueError(
            f"fairness_key must be a non-empty string of at most {MAX_KEY_LENGTH} printable "
            f"characters: {key!r}"
        )
    return key


@dataclass(frozen=True, slots=True)
class Placement:
    """Where and when jobs go, validated once per enqueue call (a batch shares it)."""

    tenant: str
    priority: int
    delay_ms: int | None
    at_ms: int | None
    deadline: str
    fairness_key: str = ""
    """Whose share of the tenant's part the jobs take ('' none: FIFO within the tenant)."""

    @classmethod
    def of(
        cls,
        tenant: str,
        delay: Seconds | None,
        at: datetime | None,
        deadline: datetime | Seconds | None,
        priority: int,
        *,
        fairness_key: str | None = None,
    ) -> Placement:
        if not isinstance(tenant, str):
            raise TypeError(f"tenant must be a string, got {tenant!r}")
        if not tenant or len(tenant) > 200:
            raise ValueError(
                f"tenant must be a non-empty string of at most 200 characters: {tenant!r}"
            )
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an int, got {priority!r}")
        if not -PRIORITY_LIMIT <= priority <= PRIORITY_LIMIT:
            raise ValueError(f"priority must be within +-{PRIORITY_LIMIT}, got {priority}")
        if delay is not None and at is not None:
            raise ValueError("give either delay= or at=, not both")
        return cls(
            tenant=tenant,
            priority=priority,
            delay_ms=None if delay is None else round(_seconds(delay, "delay") * 1000),
            at_ms=None if at is None else _epoch_ms(at, "at"),
            deadline=_deadline(deadline),
            fairness_key="" if fairness_key is None else check_fairness_key(fairness_key),
        )


@dataclass(frozen=True, slots=True)
class Demand:
    """What jobs ask of their lane: a service class, a width in slots, throttle limits,
    rate keys and the declared cost."""

    service_class: str
    slots: int
    limits: list[tuple[str, LimitValue]]
    declared_mu: int
    """The caller's estimate in milli-units (the store may raise it to the learned cost)."""
    cost_key: str
    declared: bool
    rates: list[tuple[str, Rate]] = field(default_factory=list)
    class_named: bool = True
    """Whether the call or the task named the class; if not, the store gives the job its
    tenant's default class where it has one (``app.tenants.configure``)."""

    @property
    def rate_mu(self) -> int:
        """What the job's rate keys counting units take, in milli-units (0: it has none)."""
        return self.declared_mu if any(r.units for _, r in self.rates) else 0

    def wire_limits(self) -> list[list[str | int]]:
        """Limits as the store takes them: ``[key, limit]``, or ``[key, max, min]`` when
        adaptive."""
        return [
            [key, v.max, v.min] if isinstance(v, Adaptive) else [key, v] for key, v in self.limits
        ]

    def wire_rates(self) -> list[tuple[str, float, float, float, int]]:
        """Rates as the store takes them: ``(key, limit, per_ms, burst, units 0/1)``."""
        return [(key, r.limit, r.per_ms, r.capacity, int(r.units)) for key, r in self.rates]


def _tenant_cap(options: TaskOptions, tenant: str) -> tuple[tuple[str, LimitValue], ...]:
    """The task's limits, with its per-tenant cap on the lane when it has one."""
    if options.tenant_slots is None:
        return options.limits
    cap: dict[str, LimitValue] = {f"lane:{options.lane}:tenant:{tenant}": options.tenant_slots}
    return merge_limits(tuple(sorted(cap.items())), options.limits)


def _check_fits(rates: list[tuple[str, Rate]], declared_mu: int) -> None:
    """A job whose cost on a key exceeds the key's burst could never start: refused now."""
    units = declared_mu / 1000
    for key, rate in rates:
        if rate.units and units > rate.capacity:
            raise ValueError(
                f"rate key {key!r}: the job's estimate ({units:g} units) exceeds the key's "
                f"burst ({rate.capacity:g}); it could never start. Raise the burst or split the job"
            )


@dataclass(eq=False, slots=True)
class JobFactory:
    """What every task of one app makes its jobs with."""

    lane_tables: LaneTables
    pricing: Pricing
    shards: int
    """The app's scheduling shards: a new job's id names its tenant's."""
    payloads: Payloads | None
    """Large arguments and results go here; None keeps them in the server."""
    max_payload_bytes: int

    def demand(  # noqa: PLR0917 - the demand's own parts
        self,
        options: TaskOptions,
        service_class: str | None,
        slots: int | None,
        limits: Mapping[str, LimitValue] | None,
        tenant: str,
        estimate: Estimate | float | None = None,
        rates: Mapping[str, Rate] | None = None,
    ) -> Demand:
        """What a job of ``options``' task asks, with this call's choices on top."""
        name = (
            options.service_class if service_class is None else check_service_class(service_class)
        )
        # checked here, not only by the store: a refused job must leave nothing behind
        self.lane_tables.check_class(options.lane, name)
        merged_limits = merge_limits(_tenant_cap(options, tenant), check_limits(limits))
        merged_rates = list(merge_limits(options.rates, check_rates(rates)))
        check_key_count(merged_limits, merged_rates)
        declared_mu = self.pricing.declared_milli(estimate)
        _check_fits(merged_rates, declared_mu)
        return Demand(
            service_class=name,
            slots=options.slots if slots is None else check_slots(slots),
            limits=list(merged_limits),
            declared_mu=declared_mu,
            cost_key=cost_key(tenant, options.name, estimate),
            declared=estimate is not None,
            rates=merged_rates,
            class_named=service_class is not None or "service_class" not in options.defaults,
        )

    def shard_of(self, tenant: str) -> int:
        return shard_of_tenant(tenant, self.shards)
