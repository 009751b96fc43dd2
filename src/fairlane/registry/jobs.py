"""Making jobs: ids, what a job asks of its lane, the factory every task makes them with.

Every enqueue path -- a producer's ``enqueue`` and ``submit``, the gateway, a workflow
run starting its children, a cron tick -- builds its jobs here, from one
``CallOptions`` per call (``fairlane.registry.calls``), so that each is checked the
same way, once, before one byte is written: a bad call never leaves a half-stored job.

- ``new_job_id``: time-ordered ids, unique without coordination;
- ``Demand``: the service class, width in slots, throttle limits and declared cost;
- ``JobFactory``: what every task of an app makes its jobs with (its lanes' class
  tables, pricing, shard map, payload store and size limit); ``plan`` checks a call.
"""

from __future__ import annotations

import base64
import itertools
import os
import random
import time
from typing import Final

import msgspec

from fairlane.config.lanes import LaneTables, LimitValue
from fairlane.payloads.offload import Payloads
from fairlane.policy.rates import Adaptive, Rate
from fairlane.registry.calls import (
    CallOptions,
    Placement,
    check_key_count,
    check_limits,
    check_rates,
    check_service_class,
    check_slots,
    merge_limits,
)
from fairlane.registry.options import TaskOptions
from fairlane.registry.pricing import Pricing, cost_key
from fairlane.store.shards import ShardMap
from fairlane.store.wire import limit_entry, rate_entry

__all__ = ["Demand", "JobFactory", "new_job_id"]


#: Job ids are 12 bytes written as 16 characters of base64 over an alphabet in ASCII
#: order, so that ids compare as text in the order of their bytes. Each id is a key and
#: a queue entry on the server: 16 characters are 11 fewer than the 27 of hexadecimal,
#: which took 16 B off a waiting job (``benchmarks/README.md``, memory per waiting job).
_STANDARD_B64: Final = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_SORTED_B64: Final = b"-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"
_TO_SORTED: Final = bytes.maketrans(_STANDARD_B64, _SORTED_B64)
_TIME_BITS: Final = 44  # milliseconds since 1970: enough until the year 2527
_ORIGIN_BITS: Final = 32
_COUNTER_BITS: Final = 20


class _IdSource:
    """This process's part of job ids: 32 random bits, and a counter after them."""

    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        self.origin = random.getrandbits(_ORIGIN_BITS) << _COUNTER_BITS
        self.counter = itertools.count(random.getrandbits(_COUNTER_BITS - 4))


_ids = _IdSource()
os.register_at_fork(after_in_child=_ids.reseed)


def new_job_id() -> str:
    """Time-ordered, unique without coordination: 44 bits of milliseconds, then 32 bits
    random per process, then a 20-bit counter -- so that the ids one process makes in one
    millisecond sort in the order they were made (retention breaks ties of finish time
    by id). 16 characters of ``-0-9A-Z_a-z``."""
    count = next(_ids.counter) & ((1 << _COUNTER_BITS) - 1)
    ms = (time.time_ns() // 1_000_000) & ((1 << _TIME_BITS) - 1)
    raw = ((ms << (_ORIGIN_BITS + _COUNTER_BITS)) | _ids.origin | count).to_bytes(12, "big")
    return base64.b64encode(raw).translate(_TO_SORTED).decode()


class Demand(msgspec.Struct, frozen=True):
    """What jobs ask of their lane: a service class, a width in slots, throttle limits,
    rate keys and the declared cost."""

    service_class: str
    slots: int
    limits: list[tuple[str, LimitValue]]
    declared_mu: int
    """The caller's estimate in milli-units (the store may raise it to the learned cost)."""
    cost_key: str
    declared: bool
    rates: list[tuple[str, Rate]] = msgspec.field(default_factory=list)
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
            limit_entry(key, v.max, v.min) if isinstance(v, Adaptive) else limit_entry(key, v)
            for key, v in self.limits
        ]

    def wire_rates(self) -> list[tuple[str, float, float, float, int]]:
        """Rates as the store takes them: ``(key, limit, per_ms, burst, units 0/1)``."""
        return [rate_entry(key, r) for key, r in self.rates]


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


class JobFactory(msgspec.Struct, eq=False):
    """What every task of one app makes its jobs with."""

    lane_tables: LaneTables
    pricing: Pricing
    shards: ShardMap
    """The app's scheduling shards: a new job's id names its tenant's."""
    payloads: Payloads | None
    """Large arguments and results go here; None keeps them in the server."""
    max_payload_bytes: int

    def plan(self, options: TaskOptions, call: CallOptions) -> tuple[Placement, Demand]:
        """Where ``call``'s jobs of ``options``' task go and what they ask: every option
        of the call checked, once (a batch's jobs share the answer)."""
        when = Placement.of(call, self.shards)
        return when, self.demand(options, call, when.tenant)

    def demand(self, options: TaskOptions, call: CallOptions, tenant: str) -> Demand:
        """What a job of ``options``' task asks, with ``call``'s choices on top."""
        service_class, estimate = call.service_class, call.estimate
        name = (
            options.service_class if service_class is None else check_service_class(service_class)
        )
        # checked here, not only by the store: a refused job must leave nothing behind
        self.lane_tables.check_class(options.lane, name)
        merged_limits = merge_limits(_tenant_cap(options, tenant), check_limits(call.limits))
        merged_rates = list(merge_limits(options.rates, check_rates(call.rates)))
        check_key_count(merged_limits, merged_rates)
        declared_mu = self.pricing.declared_milli(estimate)
        _check_fits(merged_rates, declared_mu)
        return Demand(
            service_class=name,
            slots=options.slots if call.slots is None else check_slots(call.slots),
            limits=list(merged_limits),
            declared_mu=declared_mu,
            cost_key=cost_key(tenant, options.name, estimate),
            declared=estimate is not None,
            rates=merged_rates,
            class_named=service_class is not None or "service_class" not in options.defaults,
        )
