"""Pools as users declare them: lanes with an admission gate, and the retry and estimation settings.

This module owns the typed configuration of admission control, read from a Python
mapping (``parse_config``) or a TOML file (``load_config``). A pool *is* a lane: one
declaration gives both the lane's slot ``ClassTable`` (how fair dispatch shares its
workers) and its ``PoolConfig`` (how the admission gate shares its units); the shares,
lending and borrowing are declared once and used by both. A pool's table is a lane's,
in the one shape that ``fairlane.config.classes`` documents and reads; this module adds
the config file's other sections. It is pure -- no Redis; the rules are in
``fairlane.policy.classes`` and ``fairlane.policy.admission``.

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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from fairlane.config.classes import read_pool
from fairlane.config.files import ConfigError, TableReader, join_key, read_toml
from fairlane.config.lanes import check_lane
from fairlane.policy.admission import (
    Coefficients,
    EstimationSettings,
    PoolConfig,
    RetryAfterPolicy,
    unit_table,
)
from fairlane.policy.backoff import Backoff, Jitter
from fairlane.policy.classes import ClassTable

__all__ = [
    "FairlaneConfig",
    "Pool",
    "RetrySettings",
    "check_pools_used",
    "load_config",
    "parse_config",
    "unused_pools",
    "unused_pools_message",
]

_TOP_KEYS = ("pools", "retry", "estimation")
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


class RetrySettings(msgspec.Struct, frozen=True):
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


class Pool(msgspec.Struct, frozen=True):
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


# -- pools against the lanes an app uses ---------------------------------------------------


def unused_pools(config: FairlaneConfig, lanes_used: Iterable[str]) -> list[str]:
    """The pools, sorted, whose lane none of ``lanes_used`` is: their admission gate
    would bound nothing, and the lanes the app does use would stay under the default
    queue bounds only."""
    used = set(lanes_used)
    return sorted(name for name in config.pools if name not in used)


def check_pools_used(config: FairlaneConfig, lanes_used: Iterable[str]) -> None:
    """Raise ``ConfigError`` if a pool names no lane in ``lanes_used`` (the lanes of the
    app's tasks and its default lane), naming the pools and the lanes the app uses."""
    used = sorted(set(lanes_used))
    unused = unused_pools(config, used)
    if unused:
        raise ConfigError(unused_pools_message(unused, used))


def unused_pools_message(unused: Iterable[str], lanes_used: Iterable[str]) -> str:
    pools = ", ".join(repr(name) for name in unused)
    lanes = ", ".join(repr(name) for name in sorted(set(lanes_used)))
    return (
        f"pool(s) {pools} name no lane the app uses, so their admission would bound "
        f"nothing; the app's tasks and default lane use lane(s) {lanes}: a pool is "
        "named by its lane ([pools.<lane>]), so rename the pool or put its tasks on "
        "its lane"
    )


# -- reading ---------------------------------------------------------------------------------


def load_config(path: Path | str) -> FairlaneConfig:
    """Read pools, retry and estimation settings from a TOML file; ``ConfigError`` if invalid."""
    return parse_config(read_toml(path, "config"), source=str(path))


def parse_config(data: Mapping[str, Any], *, source: str = "config") -> FairlaneConfig:
    """The config from parsed TOML or an equivalent Python mapping; errors name the key path."""
    top = TableReader(data, "", source, _TOP_KEYS)
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


def _parse_models(coefficients: TableReader) -> dict[str, float]:
    raw = coefficients.data.get("models", {})
    if not isinstance(raw, Mapping):
        raise coefficients.error(coefficients.at("models"), "must be a table of multipliers")
    keys = tuple(str(k) for k in raw)
    models = TableReader(raw, coefficients.at("models"), coefficients.source, keys)
    return {key: models.number(key, 1.0) for key in keys}


def _parse_pool(name: str, body: object, top: TableReader) -> Pool:
    path = join_key("pools", name)
    try:
        check_lane(name)
    except ValueError as exc:
        raise top.error(path, str(exc)) from None
    table, admission = read_pool(body, path, top.source)
    return top.build(Pool, path, name=name, table=table, admission=admission)
