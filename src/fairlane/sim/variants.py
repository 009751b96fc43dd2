"""Policies and variants: what is compared on the same arrivals, and the grammar naming them.

A **variant** is a base policy with overrides, written as ``+``-joined tokens; a list of
variants is comma-separated (``--compare`` and ``[compare] variants`` take the same):

* ``fair`` -- per lane, the lane's service classes (``fairlane.policy.classes``) decide
  which class starts; inside a class, tenants share by start-time fair queuing
  (``fairlane.policy.fairqueue``); the admission gate (``fairlane.policy.admission``)
  runs if the lane has a pool; tenant concurrency caps and floors/ceilings
  (``fairlane.policy.throttle`` / ``ceilings``) apply.
* ``fifo`` -- one global FIFO per lane: no classes, no admission, no caps.
* ``key=value`` overrides (the first token may be one, the policy is then ``fair``):
  ``slice=<seconds>|inf``, ``admission=on|off``, ``throttles=on|off``,
  ``classes=on|off`` (off: every tenant of the lane in one fair queue),
  ``charge=time|jobs|units``, ``waiters=fair|fifo`` (how throttle keys are waited on,
  see ``fairlane.sim.keys``: ``fair`` -- a key is taken only at dispatch with a lane
  slot, waiters are grouped by tenant and woken start-time fairly, a woken job goes
  back into its tenant's queue; ``fifo`` -- the store's rule before issue 16: one FIFO
  of waiters per key, and a hand-off grant held while its job waits for a lane slot),
  ``rate=none|static|adaptive|both`` (which facets of the ``[[keys]]`` with a ``rate``
  or ``adaptive`` limit are in force: ``none`` -- neither, so jobs call the upstream
  unthrottled and retry a 429 with backoff; ``static`` -- the rate, without the
  adaptive limit; ``adaptive`` -- the adaptive limit, without the rate; ``both`` --
  both; default: as declared). Rate keys wait tenant-fair only (``waiters=fifo`` is
  refused with one in force).

Examples: ``fair,fifo``; ``slice=0.5,slice=inf``; ``fair,fair+admission=off,fifo``;
``rate=none,rate=static,rate=adaptive``.
The label of a variant is its text as written.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, cast

from fairlane.policy.rates import Adaptive, Rate
from fairlane.sim.scenario import Charge, KeySpec, Scenario

__all__ = ["Policy", "RateMode", "Settings", "Variant", "Waiters", "facets", "parse_variant",
           "parse_variants", "rated", "resolve"]  # fmt: skip

Policy = Literal["fair", "fifo"]
Waiters = Literal["fair", "fifo"]
RateMode = Literal["declared", "none", "static", "adaptive", "both"]
_POLICIES = ("fair", "fifo")
_KEYS = ("policy", "slice", "admission", "throttles", "classes", "charge", "waiters", "rate")
_RATES = ("none", "static", "adaptive", "both")
_WAITERS = ("fair", "fifo")
_CHARGES = ("time", "jobs", "units")
_SWITCH = {"on": True, "off": False, "true": True, "false": False}


@dataclass(frozen=True, slots=True)
class Variant:
    """A policy with the overrides given (None: the policy's or scenario's default)."""

    label: str
    policy: Policy = "fair"
    slice: float | None = None
    admission: bool | None = None
    throttles: bool | None = None
    classes: bool | None = None
    charge: Charge | None = None
    waiters: Waiters | None = None
    rate: RateMode | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    """A variant resolved against its scenario: everything the engine needs to know."""

    label: str
    policy: Policy
    slice: float
    admission: bool
    throttles: bool
    classes: bool
    charge: Charge
    waiters: Waiters = "fair"
    rate: RateMode = "declared"


def _switch(key: str, value: str, text: str) -> bool:
    if value.lower() not in _SWITCH:
        raise ValueError(f"variant {text!r}: {key} must be on or off, got {value!r}")
    return _SWITCH[value.lower()]


def _value(key: str, value: str, text: str) -> object:
    """One override's value, checked."""
    if key == "policy":
        if value not in _POLICIES:
            raise ValueError(f"variant {text!r}: policy must be fair or fifo, got {value!r}")
        return value
    if key == "slice":
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if not seconds > 0:  # rejects nan too
            raise ValueError(f"variant {text!r}: slice must be seconds > 0 or inf")
        return seconds
    if key == "waiters":
        if value not in _WAITERS:
            raise ValueError(f"variant {text!r}: waiters must be fair or fifo, got {value!r}")
        return value
    if key == "rate":
        if value not in _RATES:
            raise ValueError(f"variant {text!r}: rate must be one of {'|'.join(_RATES)}")
        return value
    if key == "charge":
        if value not in _CHARGES:
            raise ValueError(f"variant {text!r}: charge must be one of {', '.join(_CHARGES)}")
        return value
    return _switch(key, value, text)


def parse_variant(text: str) -> Variant:
    """One variant, e.g. ``fair+slice=0.5`` or ``fifo``; ``ValueError`` if malformed."""
    tokens = [t.strip() for t in text.strip().split("+")]
    if not text.strip() or any(not t for t in tokens):
        raise ValueError(f"empty variant in {text!r}")
    fields: dict[str, object] = {}
    for i, token in enumerate(tokens):
        key, eq, value = token.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not eq:
            if i or key not in _POLICIES:
                raise ValueError(
                    f"variant {text!r}: {token!r} is not a policy (fair, fifo) "
                    "or a key=value override"
                )
            key, value = "policy", key
        if key not in _KEYS:
            raise ValueError(f"variant {text!r}: unknown key {key!r} (keys: {', '.join(_KEYS)})")
        if key in fields:
            raise ValueError(f"variant {text!r}: {key} given twice")
        fields[key] = _value(key, value, text)
    return Variant(
        label=text.strip(),
        policy=cast(Policy, fields.get("policy", "fair")),
        slice=cast("float | None", fields.get("slice")),
        admission=cast("bool | None", fields.get("admission")),
        throttles=cast("bool | None", fields.get("throttles")),
        classes=cast("bool | None", fields.get("classes")),
        charge=cast("Charge | None", fields.get("charge")),
        waiters=cast("Waiters | None", fields.get("waiters")),
        rate=cast("RateMode | None", fields.get("rate")),
    )


def parse_variants(texts: Iterable[str]) -> list[Variant]:
    """Variants from strings that may each hold a comma-separated list; labels unique."""
    variants = [parse_variant(part) for text in texts for part in text.split(",") if part.strip()]
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise ValueError(f"variants must differ: {labels}")
    return variants


def resolve(variant: Variant, scenario: Scenario) -> Settings:
    """The variant's settings in ``scenario``; ``ValueError`` if it asks for the impossible."""
    fair = variant.policy == "fair"
    has_pool = any(lane.pool is not None for lane in scenario.lanes)
    if variant.admission and not has_pool:
        raise ValueError(
            f"variant {variant.label!r}: admission=on, but no lane has a [pools.<lane>] table"
        )
    if variant.classes and not fair:
        raise ValueError(f"variant {variant.label!r}: fifo has no classes (classes=on)")
    rate: RateMode = "declared" if variant.rate is None else variant.rate
    if rate in ("static", "both") and not any(k.rate for k in scenario.keys):
        raise ValueError(f"variant {variant.label!r}: rate={rate}, but no [[keys]] has a rate")
    if rate in ("adaptive", "both") and not any(k.adaptive for k in scenario.keys):
        raise ValueError(
            f"variant {variant.label!r}: rate={rate}, but no [[keys]] has an adaptive limit"
        )
    throttles = fair if variant.throttles is None else variant.throttles
    if variant.waiters == "fifo" and throttles and any(rated(k, rate) for k in scenario.keys):
        raise ValueError(
            f"variant {variant.label!r}: rate keys wait tenant-fair only (waiters=fifo is the "
            "rule before them); add rate=none"
        )
    return Settings(
        label=variant.label,
        policy=variant.policy,
        slice=scenario.sim.slice if variant.slice is None else variant.slice,
        admission=has_pool and (fair if variant.admission is None else variant.admission),
        throttles=throttles,
        classes=fair if variant.classes is None else variant.classes,
        charge=scenario.sim.charge if variant.charge is None else variant.charge,
        waiters="fair" if variant.waiters is None else variant.waiters,
        rate=rate,
    )


def facets(key: KeySpec, mode: RateMode) -> tuple[Rate | None, Adaptive | None]:
    """The rate and the adaptive limit of ``key`` in force under ``rate=mode``."""
    rate = key.rate if mode in ("declared", "static", "both") else None
    adaptive = key.adaptive if mode in ("declared", "adaptive", "both") else None
    return rate, adaptive


def rated(key: KeySpec, mode: RateMode) -> bool:
    """Whether ``key`` needs the rate rules under ``rate=mode``: a rate or an adaptive
    limit in force, or a concurrency limit with an upstream (a 429 pauses it)."""
    rate, adaptive = facets(key, mode)
    held = key.limit is not None and key.upstream is not None
    return rate is not None or adaptive is not None or held
