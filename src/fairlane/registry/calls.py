"""What one enqueue call asks, and its checks: the call's options, checked once.

``Task.enqueue``, ``submit`` and ``enqueue_many`` keep their keywords for the caller's
editor, and put them in one ``CallOptions`` as the call begins; so do the gateway, a
workflow run starting its children and a retry from the dashboard. From there on the
options travel as that one value: ``JobFactory.plan`` checks them, once per call (a
batch shares them), and job construction reads them.

Here are the checks of what a call names -- a tenant, a fairness key, a priority, a
delay or start time, a deadline, a service class, a width in slots, throttle limits,
rate keys -- which a task's declaration (``TaskOptions``) applies to its own settings
too. ``Placement`` is where and when a call's jobs go, checked.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TypeVar

import msgspec

from fairlane.config.files import MAX_COUNT
from fairlane.config.lanes import LimitValue
from fairlane.config.settings import DurabilitySettings
from fairlane.policy.admission import Estimate
from fairlane.policy.fairkeys import MAX_KEY_LENGTH
from fairlane.policy.globalkeys import POOL_PREFIX
from fairlane.policy.rates import Adaptive, Rate
from fairlane.store.shards import ShardMap

__all__ = [
    "MAX_LIMIT_KEYS",
    "MAX_LIMIT_KEY_LENGTH",
    "PRIORITY_LIMIT",
    "RESERVED_LIMIT_PREFIX",
    "RESERVED_POOL_PREFIX",
    "CallOptions",
    "Placement",
    "Seconds",
    "check_fairness_key",
    "check_key_count",
    "check_limits",
    "check_rates",
    "check_service_class",
    "check_slots",
    "merge_limits",
]

PRIORITY_LIMIT = 1000
MAX_LIMIT_KEYS = 16
MAX_LIMIT_KEY_LENGTH = 200
#: ``tenant:<name>`` is the key of the tenant's own concurrency limit, set by
#: ``app.tenants.configure``; a job naming it could raise or lower another's limit.
RESERVED_LIMIT_PREFIX = "tenant:"
#: ``pool:<lane>`` is the key of a lane's admission pool among an app's global keys
#: (``fairlane.policy.globalkeys``); a job naming it would share the pool's part.
RESERVED_POOL_PREFIX = POOL_PREFIX
Seconds = float | int | timedelta


# a Struct, not a dataclass: built on every enqueue, and a frozen dataclass of this
# many fields costs ten times as much to build
class CallOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The options of one enqueue call, as the caller gave them (``Task.enqueue`` says
    what each means); ``JobFactory.plan`` checks them."""

    tenant: str = "default"
    fairness_key: str | None = None
    delay: Seconds | None = None
    at: datetime | None = None
    deadline: datetime | Seconds | None = None
    idempotency_key: str | None = None
    priority: int = 0
    service_class: str | None = None
    slots: int | None = None
    limits: Mapping[str, LimitValue] | None = None
    rates: Mapping[str, Rate] | None = None
    estimate: Estimate | float | None = None
    trace: bool = True
    durability: DurabilitySettings | None = None


# -- where and when -------------------------------------------------------------------


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


class Placement(msgspec.Struct, frozen=True):
    """Where and when jobs go, checked once per enqueue call (a batch shares it)."""

    tenant: str
    priority: int
    delay_ms: int | None
    at_ms: int | None
    deadline: str
    fairness_key: str = ""
    """Whose share of the tenant's part the jobs take ('' none: FIFO within the tenant)."""
    shard: int = 0
    """The tenant's scheduling shard, hashed once per call: the jobs' ids name it."""

    @classmethod
    def of(cls, call: CallOptions, shards: ShardMap) -> Placement:
        """``call``'s placement, checked, in the tenant's shard of ``shards``."""
        tenant, priority, delay, at = call.tenant, call.priority, call.delay, call.at
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
        key = call.fairness_key
        return cls(
            tenant=tenant,
            priority=priority,
            delay_ms=None if delay is None else round(_seconds(delay, "delay") * 1000),
            at_ms=None if at is None else _epoch_ms(at, "at"),
            deadline=_deadline(call.deadline),
            fairness_key="" if key is None else check_fairness_key(key),
            shard=shards.of_tenant(tenant),
        )


# -- what a job asks of its lane ------------------------------------------------------


def check_service_class(value: object) -> str:
    """The form of a class name (whether the lane has it is ``LaneTables.check_class``)."""
    if not isinstance(value, str) or not value:
        raise TypeError(f"service_class must be a non-empty string, got {value!r}")
    return value


def check_slots(value: object) -> int:
    """A job's width: how many of a worker's slots it occupies while it runs."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"slots must be an int, got {value!r}")
    if not 1 <= value <= MAX_COUNT:
        raise ValueError(f"slots must be at least 1 (and below 2**31), got {value}")
    return value


def check_limits(limits: Mapping[str, LimitValue] | None) -> tuple[tuple[str, LimitValue], ...]:
    """Throttle keys and their limits, checked, sorted by key (the order the store takes)."""
    if limits is None:
        return ()
    if not isinstance(limits, Mapping):
        raise TypeError(f"limits must be a mapping of key to limit, got {limits!r}")
    if len(limits) > MAX_LIMIT_KEYS:
        raise ValueError(f"a job may name at most {MAX_LIMIT_KEYS} limit keys, got {len(limits)}")
    for key, limit in limits.items():
        _check_limit_key(key)
        if isinstance(limit, Adaptive):
            continue
        if not isinstance(limit, int) or isinstance(limit, bool):
            raise TypeError(f"limit of {key!r} must be an int or an Adaptive, got {limit!r}")
        if not 0 <= limit <= MAX_COUNT:
            raise ValueError(f"limit of {key!r} must be >= 0 (and below 2**31), got {limit}")
    return tuple(sorted(limits.items()))


def check_rates(rates: Mapping[str, Rate] | None) -> tuple[tuple[str, Rate], ...]:
    """Rate keys and their rates, checked, sorted by key."""
    if rates is None:
        return ()
    if not isinstance(rates, Mapping):
        raise TypeError(f"rates must be a mapping of key to Rate, got {rates!r}")
    if len(rates) > MAX_LIMIT_KEYS:
        raise ValueError(f"a job may name at most {MAX_LIMIT_KEYS} keys, got {len(rates)} rates")
    for key, rate in rates.items():
        _check_limit_key(key, what="rate")
        if not isinstance(rate, Rate):
            raise TypeError(f"rate of {key!r} must be a fairlane.Rate, got {rate!r}")
    return tuple(sorted(rates.items()))


def check_key_count(*named: Iterable[tuple[str, object]]) -> None:
    """A job's concurrency and rate keys together stay within the bound."""
    keys = {key for pairs in named for key, _ in pairs}
    if len(keys) > MAX_LIMIT_KEYS:
        raise ValueError(
            f"a job may name at most {MAX_LIMIT_KEYS} keys (limits and rates together), "
            f"got {len(keys)}"
        )


def _check_limit_key(key: object, what: str = "limit") -> None:
    if (
        not isinstance(key, str)
        or not key
        or len(key) > MAX_LIMIT_KEY_LENGTH
        or "\n" in key
        or "\0" in key
    ):
        raise ValueError(
            f"{what} keys must be non-empty strings of at most {MAX_LIMIT_KEY_LENGTH} "
            f"characters without newlines or NUL: {key!r}"
        )
    if key.startswith(RESERVED_LIMIT_PREFIX):
        raise ValueError(
            f"{what} key {key!r}: keys starting with {RESERVED_LIMIT_PREFIX!r} are reserved for "
            "tenants' own keys; set those with app.tenants.configure(tenant, "
            "max_concurrency=..., rate=Rate(...))"
        )
    if key.startswith(RESERVED_POOL_PREFIX):
        raise ValueError(
            f"{what} key {key!r}: keys starting with {RESERVED_POOL_PREFIX!r} are reserved for "
            "admission pools; declare a pool in the pools config ([pools.<lane>])"
        )


_V = TypeVar("_V")


def merge_limits(
    base: tuple[tuple[str, _V], ...], extra: tuple[tuple[str, _V], ...]
) -> tuple[tuple[str, _V], ...]:
    """A task's limits (or rates) with a call's added (a key in both takes the call's)."""
    if not extra:
        return base
    if not base:
        return extra
    merged = dict(base) | dict(extra)
    if len(merged) > MAX_LIMIT_KEYS:
        raise ValueError(
            f"a job may name at most {MAX_LIMIT_KEYS} keys; the task's and the call's "
            f"together name {len(merged)}"
        )
    return tuple(sorted(merged.items()))
