"""Pools as users declare them: one lane's classes, its admission bounds, retry and estimation.

This module owns the typed configuration of admission control, read from a Python
mapping (``parse_config``) or a TOML file (``load_config``). A pool *is* a lane: one
declaration gives both the lane's slot ``ClassTable`` (how fair dispatch shares its
workers) and its ``PoolConfig`` (how the admission gate shares its units); the shares,
lending and borrowing are declared once and used by both. It is pure -- no Redis; the
rules are in ``fairlane.policy.classes`` and ``fairlane.policy.admission``.

TOML layout (classes in declared order, the rank tie-break)::

    [pools.agent-shared]
    capacity_units = 100
    recovery_reserve_units = 5          # optional, default 0

    [pools.agent-shared.classes.guaranteed]
    nominal_share = 0.50                # as in lanes; default 0
    min_units = 30                      # admission floor in units; default 0
    max_queue = 200                     # default 1000
    response_when_full = "reject"       # or "defer"; default "reject"
    # optional: max_queue_units, tenant_max_queue, max_deferred (admission),
    #           min_slots, lendable, borrowable, batch (the lane's slot table)

    [retry]                             # max_attempts, base_seconds, max_seconds, jitter
    [estimation]                        # max_reservation_units, update_window,
                                        # safety_multiplier, default_units
    [estimation.coefficients]           # per_1k_tokens, per_tool_call, per_tool_second
    [estimation.coefficients.models]    # "model-name" = token multiplier

**Batch.** ``batch = true`` makes the class a batch class for slots *and* units: it
runs only on spare, is assured nothing, and so must leave ``nominal_share``,
``min_slots``, ``min_units`` and ``borrowable`` out (or zero). Without ``batch`` a class
is an ordinary one whatever its name: the seed's ``batch`` class with a share of 0.15
and 5 units is assured its share like the others. The nominal shares of the non-batch
classes sum to at most 1.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fairlane.config.lanes import check_lane, read_toml
from fairlane.config.settings import ConfigError
from fairlane.policy.admission import (
    AdmissionClass,
    Coefficients,
    EstimationSettings,
    PoolConfig,
    RetryAfterPolicy,
    unit_table,
)
from fairlane.policy.backoff import Backoff, Jitter
from fairlane.policy.classes import ClassTable, ServiceClass

__all__ = [
    "FairlaneConfig",
    "Pool",
    "RetrySettings",
    "load_config",
    "parse_config",
]

_TOP_KEYS = ("pools", "retry", "estimation")
_POOL_KEYS = ("capacity_units", "recovery_reserve_units", "classes")
_CLASS_KEYS = (
    "nominal_share",
    "min_units",
    "max_queue",
    "max_queue_units",
    "tenant_max_queue",
    "tenant_max_queue_units",
    "max_deferred",
    "response_when_full",
    "min_slots",
    "lendable",
    "borrowable",
    "batch",
)
_RETRY_KEYS = ("max_attempts", "base_seconds", "max_seconds", "jitter")
_ESTIMATION_KEYS = (
    "max_reservation_units",
    "update_window",
    "safety_multiplier",
    "default_units",
    "coefficients",
)
_COEFFICIENT_KEYS = ("per_1k_tokens", "per_tool_call", "per_tool_second", "models")
_JITTERS = ("full", "equal", "none")
_WHEN_FULL = ("reject", "defer")
_MAX_COUNT = 2**31 - 1
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class RetrySettings:
    """Retries of failed attempts, and the Retry-After of rejected submissions."""

    max_attempts: int = 6
    base_seconds: float = 2.0
    max_seconds: float = 120.0
    jitter: Jitter = "full"

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise TypeError(f"max_attempts must be an int, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        self.backoff  # noqa: B018 -- validates base, cap and jitter
        self.retry_after_policy  # noqa: B018 -- validates max_seconds >= 1

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.base_seconds, self.max_seconds, self.jitter)

    @property
    def retry_after_policy(self) -> RetryAfterPolicy:
        return RetryAfterPolicy(self.base_seconds, self.max_seconds)


@dataclass(frozen=True, slots=True)
class Pool:
    """One lane: its slot class table and its admission config, declared together."""

    name: str
    table: ClassTable
    admission: PoolConfig

    def __post_init__(self) -> None:
        check_lane(self.name)
        self.unit_table  # noqa: B018 -- the pool's classes must be the table's

    @property
    def unit_table(self) -> ClassTable:
        """The class table the admission gate uses, in milli-units."""
        return unit_table(self.table, self.admission)


@dataclass(frozen=True, slots=True)
class FairlaneConfig:
    """Everything ``load_config`` reads: pools by lane, retry and estimation settings."""

    pools: Mapping[str, Pool] = field(default_factory=dict)
    retry: RetrySettings = field(default_factory=RetrySettings)
    estimation: EstimationSettings = field(default_factory=EstimationSettings)
    coefficients: Coefficients = field(default_factory=Coefficients)

    def __post_init__(self) -> None:
        for name, pool in self.pools.items():
            if not isinstance(pool, Pool) or pool.name != name:
                raise ValueError(f"pools[{name!r}] must be a Pool named {name!r}, got {pool!r}")

    def lane_tables(self) -> dict[str, ClassTable]:
        """The slot class table of each pool's lane (to declare the lanes with)."""
        return {name: pool.table for name, pool in self.pools.items()}


# -- reading ---------------------------------------------------------------------------------


def _join(path: str, key: str) -> str:
    # TOML quotes keys that are not bare; do the same so the path can be pasted back.
    bare = bool(key) and all(c.isalnum() or c in "-_" for c in key)
    part = key if bare else f'"{key}"'
    return f"{path}.{part}" if path else part


class _Reader:
    """Typed reads from one table, naming ``source`` and the key path in every error."""

    def __init__(self, data: object, path: str, source: str, keys: tuple[str, ...]) -> None:
        self.source = source
        self.path = path
        if not isinstance(data, Mapping):
            raise self.error(path, f"must be a table, got {data!r}")
        for key in data:
            if key not in keys:
                close = difflib.get_close_matches(str(key), list(keys), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise self.error(self.at(str(key)), f"unknown key{hint} (keys: {', '.join(keys)})")
        self.data: Mapping[str, Any] = data

    def at(self, key: str) -> str:
        return _join(self.path, key)

    def error(self, path: str, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {path}: {message}")

    def number(self, key: str, default: float, *, positive: bool = False) -> float:
        value = self.data.get(key, default)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value < 0 or (positive and value == 0):
            wanted = "> 0" if positive else ">= 0"
            raise self.error(self.at(key), f"must be a finite number {wanted}, got {value!r}")
        return float(value)

    def optional_number(self, key: str) -> float | None:
        return self.number(key, 0.0) if key in self.data else None

    def count(self, key: str, default: int, *, low: int = 0) -> int:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= _MAX_COUNT:
            raise self.error(self.at(key), f"must be an int >= {low}, got {value!r}")
        return value

    def optional_count(self, key: str) -> int | None:
        return self.count(key, 0) if key in self.data else None

    def flag(self, key: str) -> bool:
        value = self.data.get(key, False)
        if not isinstance(value, bool):
            raise self.error(self.at(key), f"must be true or false, got {value!r}")
        return value

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.data.get(key, default)
        if value not in choices:
            raise self.error(self.at(key), f"must be one of {', '.join(choices)}, got {value!r}")
        return str(value)

    def table(self, key: str, keys: tuple[str, ...]) -> _Reader:
        return _Reader(self.data.get(key, {}), self.at(key), self.source, keys)

    def build(self, make: Callable[..., _T], path: str, **kwargs: Any) -> _T:
        """``make(**kwargs)``, its own checks reported at ``path``."""
        try:
            return make(**kwargs)
        except (TypeError, ValueError) as exc:
            raise self.error(path, str(exc)) from None


def load_config(path: Path | str) -> FairlaneConfig:
    """Read pools, retry and estimation settings from a TOML file; ``ConfigError`` if invalid."""
    return parse_config(read_toml(path, "config"), source=str(path))


def parse_config(data: Mapping[str, Any], *, source: str = "config") -> FairlaneConfig:
    """The config from parsed TOML or an equivalent Python mapping; errors name the key path."""
    top = _Reader(data, "", source, _TOP_KEYS)
    pools_table = top.data.get("pools", {})
    if not isinstance(pools_table, Mapping):
        raise top.error("pools", "must be a table of pools ([pools.<lane>])")
    pools = {str(name): _parse_pool(str(name), body, top) for name, body in pools_table.items()}
    retry = top.table("retry", _RETRY_KEYS)
    estimation = top.table("estimation", _ESTIMATION_KEYS)
    coefficients = estimation.table("coefficients", _COEFFICIENT_KEYS)
    return FairlaneConfig(
        pools=pools,
        retry=retry.build(
            RetrySettings,
            retry.path,
            max_attempts=retry.count("max_attempts", 6, low=1),
            base_seconds=retry.number("base_seconds", 2.0),
            max_seconds=retry.number("max_seconds", 120.0),
            jitter=retry.choice("jitter", "full", _JITTERS),
        ),
        estimation=estimation.build(
            EstimationSettings,
            estimation.path,
            max_reservation_units=estimation.number("max_reservation_units", 40.0),
            update_window=estimation.count("update_window", 500, low=1),
            safety_multiplier=estimation.number("safety_multiplier", 1.25),
            default_units=estimation.number("default_units", 1.0),
        ),
        coefficients=coefficients.build(
            Coefficients,
            coefficients.path,
            per_1k_tokens=coefficients.number("per_1k_tokens", 1.0),
            per_tool_call=coefficients.number("per_tool_call", 0.25),
            per_tool_second=coefficients.number("per_tool_second", 0.1),
            models=_parse_models(coefficients),
        ),
    )


def _parse_models(coefficients: _Reader) -> dict[str, float]:
    raw = coefficients.data.get("models", {})
    if not isinstance(raw, Mapping):
        raise coefficients.error(coefficients.at("models"), "must be a table of multipliers")
    keys = tuple(str(k) for k in raw)
    models = _Reader(raw, coefficients.at("models"), coefficients.source, keys)
    return {key: models.number(key, 1.0) for key in keys}


def _parse_pool(name: str, body: object, top: _Reader) -> Pool:
    pool = _join("pools", name)
    try:
        check_lane(name)
    except ValueError as exc:
        raise top.error(pool, str(exc)) from None
    reader = _Reader(body, pool, top.source, _POOL_KEYS)
    if "capacity_units" not in reader.data:
        raise reader.error(reader.at("capacity_units"), "is required")
    capacity = reader.number("capacity_units", 0.0, positive=True)
    reserve = reader.number("recovery_reserve_units", 0.0)
    if reserve > capacity:
        raise reader.error(
            reader.at("recovery_reserve_units"),
            f"must be at most capacity_units ({capacity:g}), got {reserve:g}",
        )
    classes_table = reader.data.get("classes")
    if not isinstance(classes_table, Mapping) or not classes_table:
        raise reader.error(
            reader.at("classes"), f"needs at least one class ([{pool}.classes.<name>])"
        )
    slots: list[ServiceClass] = []
    admission: list[AdmissionClass] = []
    for class_name, class_body in classes_table.items():
        where = _join(reader.at("classes"), str(class_name))
        entry = _Reader(class_body, where, top.source, _CLASS_KEYS)
        service, limits = _parse_class(str(class_name), entry)
        slots.append(service)
        admission.append(limits)
    table = reader.build(ClassTable, reader.at("classes"), classes=slots)
    config = PoolConfig(capacity, tuple(admission), reserve)
    return reader.build(Pool, pool, name=name, table=table, admission=config)


def _parse_class(name: str, entry: _Reader) -> tuple[ServiceClass, AdmissionClass]:
    batch = entry.flag("batch")
    if batch:
        for key in ("nominal_share", "min_slots", "min_units", "borrowable"):
            if entry.data.get(key, 0):
                raise entry.error(
                    entry.at(key),
                    "a batch class is assured nothing and borrows without bound; leave "
                    f"{key} out (or drop batch = true for an ordinary class with a share)",
                )
    share = entry.number("nominal_share", 0.0)
    lendable = entry.number("lendable", 1.0)
    for key, value in (("nominal_share", share), ("lendable", lendable)):
        if value > 1:
            raise entry.error(entry.at(key), f"must be within [0, 1], got {value!r}")
    borrowable = entry.optional_number("borrowable")
    service = entry.build(
        ServiceClass,
        entry.path,
        name=name,
        nominal_share=share,
        min_slots=entry.count("min_slots", 0),
        lendable=lendable,
        borrowable=borrowable,
        batch=batch,
    )
    limits = entry.build(
        AdmissionClass,
        entry.path,
        name=name,
        min_units=entry.number("min_units", 0.0),
        max_queue=entry.count("max_queue", 1000),
        max_queue_units=entry.optional_number("max_queue_units"),
        tenant_max_queue=entry.optional_count("tenant_max_queue"),
        tenant_max_queue_units=entry.optional_number("tenant_max_queue_units"),
        max_deferred=entry.optional_count("max_deferred"),
        when_full=entry.choice("response_when_full", "reject", _WHEN_FULL),
    )
    return service, limits
