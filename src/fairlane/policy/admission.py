"""Admission: what a job is expected to cost, and whether a pool takes it now.

This module owns the reference rules of the admission gate; the Lua store carries out
the same rules (``/tmp/notes/admission_spec.md`` is the shared contract). It is pure: no
I/O, no clock (times are int milliseconds passed in), no randomness (draws passed in).

**Cost.** An :class:`Estimate` declares a job's tokens and tool use; its
:meth:`Estimate.units` under :class:`Coefficients` is ``(input + output) / 1000 *
model_multiplier * per_1k_tokens + tool_calls * per_tool_call + tool_seconds *
per_tool_second`` (an unknown model multiplies by 1). Absurd estimates are refused at
construction: at most ``10**9`` tokens each way, ``10**6`` tool calls and ``10**7`` tool
seconds, so one job's units stay far below ``2**53`` milli-units.

**Learned cost.** :class:`LearnedCost` follows one (tenant, workflow, model)'s actual
units per job; it rises by half the gap on a sample above the mean and falls by
``alpha = 2 / (update_window + 1)`` of it below. The reservation is
``max(declared, learned) * safety_multiplier`` (:func:`reservation_units`), so a caller
that under-declares is charged what its jobs really cost after a few jobs (the bound is
in :class:`LearnedCost`); one cheap job barely lowers the mean.

**Milli-units.** The store counts integer milli-units, ``to_milli(u) = floor(u * 1000 +
0.5)`` (half up, as Lua's ``math.floor(x + 0.5)``), so the integer class rules of
``fairlane.policy.classes`` apply with ``C = to_milli(capacity_units)`` slots and
``min_slots = ceil(min_units * 1000)`` (with a 1e-9 tolerance, so that ``0.07 * 1000``
is 70) in :func:`unit_table`.

**Decision** (:func:`decide`, in this order; ``mu`` the request's milli-units):

1. ``mu > max_reservation_milli`` -> rejected ``too_wide``;
2. a deadline at or before now -> rejected ``deadline_unmeetable``;
3. the tenant's admitted unfinished jobs in the class ``>= tenant_max_queue``, or its
   reserved milli-units plus ``mu`` above ``tenant_max_queue_units`` ->
   full(``tenant_queue_full``);
4. the class's admitted unfinished jobs ``>= max_queue``, or its reserved milli-units
   plus ``mu`` above ``max_queue_units`` -> full(``class_queue_full``);
5. the class rules let the class start a head of width ``mu`` (demand ``mu``) with the
   reserved milli-units as in-flight, and a fresh request leaves the recovery reserve
   free (``C - sum(reserved) - mu >= reserve``) -> accepted; else full(``class_full``).

full(reason) defers (reason kept) if the class's ``when_full`` is ``defer`` and its
deferred queue is below ``max_deferred``, else rejects. A retry (``fresh=False``) is
already durable and is never rejected by full(): it is deferred whatever the class says.
A zero-unit request is judged as one milli-unit wide (the class rules need widths >= 1)
but reserves nothing. Bounds: reserved milli-units never exceed ``C`` (the class rules
never start beyond the free slots) and a class never has more than ``max_queue``
admitted jobs.

**Retry-After.** :func:`retry_after` for a tenant's ``n`` rejections in the last minute:
``raw = min(max, base * 2**min(n, 16))``, then ``min(max, max(1, raw * (0.7 + 0.6 u)))``
for a draw ``u`` in ``[0, 1)``: it grows with ``n``, spreads clients by +-30 %, and
stays within ``[1, max_seconds]``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from fairlane.policy.classes import ClassTable, ServiceClass, may_start

__all__ = [
    "MAX_TOKENS",
    "MAX_TOOL_CALLS",
    "MAX_TOOL_SECONDS",
    "MIN_CHARGE_MILLI",
    "AdmissionClass",
    "Coefficients",
    "Decision",
    "DeferredJob",
    "Estimate",
    "EstimationSettings",
    "FullReason",
    "LearnedCost",
    "PoolConfig",
    "PoolState",
    "Reason",
    "RetryAfterPolicy",
    "WhenFull",
    "charge_milli",
    "decide",
    "drain",
    "fits",
    "reservation_units",
    "retry_after",
    "to_milli",
    "too_wide",
    "unit_table",
    "work_units",
]

MAX_TOKENS = 10**9
MAX_TOOL_CALLS = 10**6
MAX_TOOL_SECONDS = 10**7
_EPS = 1e-9
# 2**16 already exceeds any sane cap; bounding the exponent keeps the float finite.
_MAX_EXPONENT = 16

WhenFull = Literal["reject", "defer"]
FullReason = Literal["tenant_queue_full", "class_queue_full", "class_full"]
Reason = Literal[
    "too_wide", "deadline_unmeetable", "tenant_queue_full", "class_queue_full", "class_full"
]
_WHEN_FULL: tuple[str, ...] = ("reject", "defer")


def _number(label: str, value: object, *, low: float = 0.0, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{label} must be a number, got {value!r}")
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{label} must be finite and within [{low}, {high}], got {value!r}")
    return float(value)


def _count(label: str, value: object, *, low: int = 0, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{label} must be an int, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"within [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{label} must be {bound}, got {value}")
    return value


def to_milli(units: float) -> int:
    """``units`` as integer milli-units, rounded half up (the store counts these)."""
    _number("units", units)
    return math.floor(units * 1000 + 0.5)


# -- cost ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Coefficients:
    """Units per 1k tokens, per tool call and per tool second; per-model token multipliers."""

    per_1k_tokens: float = 1.0
    per_tool_call: float = 0.25
    per_tool_second: float = 0.1
    models: Mapping[str, float] = field(default_factory=dict)
    """A model's multiplier on the token part; a model not listed multiplies by 1."""

    def __post_init__(self) -> None:
        for label in ("per_1k_tokens", "per_tool_call", "per_tool_second"):
            _number(label, getattr(self, label))
        if not isinstance(self.models, Mapping):
            raise TypeError(
                f"models must be a mapping of model name to multiplier: {self.models!r}"
            )
        for name, multiplier in self.models.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"model names must be non-empty strings, got {name!r}")
            _number(f"models[{name!r}]", multiplier)
        # A private read-only copy: the caller's dict may change, these coefficients may not.
        frozen = MappingProxyType({name: float(m) for name, m in self.models.items()})
        object.__setattr__(self, "models", frozen)

    def __hash__(self) -> int:
        return hash(
            (
                self.per_1k_tokens,
                self.per_tool_call,
                self.per_tool_second,
                tuple(sorted(self.models.items())),
            )
        )

    def multiplier(self, model: str | None) -> float:
        return self.models.get(model, 1.0) if model is not None else 1.0


@dataclass(frozen=True, slots=True)
class Estimate:
    """What a caller declares a job will use; ``units`` prices it."""

    input_tokens: int = 0
    max_output_tokens: int = 0
    tool_calls: int = 0
    tool_seconds: float = 0.0
    model: str | None = None
    workflow: str | None = None

    def __post_init__(self) -> None:
        _count("input_tokens", self.input_tokens, high=MAX_TOKENS)
        _count("max_output_tokens", self.max_output_tokens, high=MAX_TOKENS)
        _count("tool_calls", self.tool_calls, high=MAX_TOOL_CALLS)
        _number("tool_seconds", self.tool_seconds, high=MAX_TOOL_SECONDS)
        for label in ("model", "workflow"):
            value = getattr(self, label)
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"{label} must be a non-empty string or None, got {value!r}")

    def units(self, coefficients: Coefficients) -> float:
        return work_units(
            coefficients,
            tokens=self.input_tokens + self.max_output_tokens,
            tool_calls=self.tool_calls,
            tool_seconds=self.tool_seconds,
            model=self.model,
        )


def work_units(
    coefficients: Coefficients,
    *,
    tokens: int,
    tool_calls: int,
    tool_seconds: float,
    model: str | None = None,
) -> float:
    """The price of work in units: what an estimate declares and what usage reports."""
    return (
        tokens / 1000 * coefficients.multiplier(model) * coefficients.per_1k_tokens
        + tool_calls * coefficients.per_tool_call
        + tool_seconds * coefficients.per_tool_second
    )


#: The least a job is charged in its tenant's fair share, in milli-units, so that jobs
#: too cheap to measure are still shared fairly by count.
MIN_CHARGE_MILLI = 1


def charge_milli(declared_milli: int | None, learned_milli: float | None) -> float:
    """What dispatch charges a job's tenant when tenants are charged by cost (the store's
    ``charge_mu``): what its kind was learned to cost, or what the caller declared if
    more; a job nobody knows anything about is charged the least, and corrected by
    what it used when it ends (``fairqueue`` rule 4) -- so guesses never outweigh
    measurements, and a refund never puts a tenant ahead of the present."""
    charge = 0.0 if declared_milli is None else float(declared_milli)
    if learned_milli is not None:
        charge = max(charge, learned_milli)
    return max(float(MIN_CHARGE_MILLI), charge)


@dataclass(frozen=True, slots=True)
class EstimationSettings:
    """Bounds of a reservation and how the learned cost moves."""

    max_reservation_units: float = 40.0
    """A request reserving more is refused (``too_wide``)."""
    update_window: int = 500
    """The learned cost falls by ``2 / (update_window + 1)`` of the gap per cheaper job."""
    safety_multiplier: float = 1.25
    """A reservation is the larger of declared and learned cost, times this (>= 1)."""
    default_units: float = 1.0
    """The cost of a job that declares no estimate."""

    def __post_init__(self) -> None:
        _number("max_reservation_units", self.max_reservation_units)
        _count("update_window", self.update_window, low=1)
        _number("safety_multiplier", self.safety_multiplier, low=1.0)
        _number("default_units", self.default_units)

    @property
    def alpha(self) -> float:
        return 2 / (self.update_window + 1)


class LearnedCost:
    """A bounded moving estimate of one (tenant, workflow, model)'s actual units per job.

    The first sample is taken as is. A sample above the mean moves it half way up
    (``mean += 0.5 * (sample - mean)``); one below moves it by ``alpha = 2 /
    (update_window + 1)`` of the gap (``mean += alpha * (sample - mean)``). Rising fast
    and decaying slowly means under-declaring does not pay: after ``k`` jobs of a
    constant true cost ``x`` from a mean ``m0 < x`` the gap is exactly ``(x - m0) /
    2**k``, so the mean is within ``eps`` of ``x`` after ``ceil(log2((x - m0) / eps))``
    jobs (10 jobs: under 0.1 % of the gap). A lone expensive job raises the mean by half
    its excess, and it takes about ``0.35 * update_window`` cheap jobs to halve that.
    The state is two numbers (``mean``, ``samples``), kept by the store in a hash.
    """

    __slots__ = ("_mean", "alpha", "samples")

    def __init__(self, update_window: int = 500, *, mean: float = 0.0, samples: int = 0) -> None:
        _count("update_window", update_window, low=1)
        _count("samples", samples)
        _number("mean", mean)
        self.alpha = 2 / (update_window + 1)
        self.samples = samples
        self._mean = float(mean)

    def observe(self, units: float) -> float:
        """Fold in one job's actual units; returns the new mean."""
        sample = _number("units", units)
        if self.samples == 0:
            self._mean = sample
        else:
            rate = 0.5 if sample > self._mean else self.alpha
            self._mean += rate * (sample - self._mean)
        self.samples += 1
        return self._mean

    @property
    def value(self) -> float | None:
        """The learned units per job, or None before the first sample."""
        return self._mean if self.samples else None

    @property
    def state(self) -> tuple[float, int]:
        """``(mean, samples)``: everything the store keeps."""
        return self._mean, self.samples


def reservation_units(
    declared: float, learned: float | None, settings: EstimationSettings
) -> float:
    """``max(declared, learned) * safety_multiplier``: the caller cannot under-declare."""
    _number("declared", declared)
    base = max(declared, _number("learned", learned) if learned is not None else 0.0)
    return base * settings.safety_multiplier


def too_wide(units: float, settings: EstimationSettings) -> bool:
    """Whether a reservation of ``units`` is more than any one job may reserve."""
    return units > settings.max_reservation_units


# -- Retry-After -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryAfterPolicy:
    """Retry-After for rejected submissions: ``base_seconds`` doubling per recent rejection."""

    base_seconds: float = 2.0
    max_seconds: float = 120.0

    def __post_init__(self) -> None:
        _number("base_seconds", self.base_seconds)
        _number("max_seconds", self.max_seconds, low=1.0)


def retry_after(rejections: int, u: float, policy: RetryAfterPolicy) -> float:
    """Seconds a client should wait after ``rejections`` rejections in the last 60 s."""
    n = _count("rejections", rejections)
    if not 0.0 <= _number("u", u) < 1.0:
        raise ValueError(f"u must be within [0, 1), got {u!r}")
    raw = min(policy.max_seconds, policy.base_seconds * float(2 ** min(n, _MAX_EXPONENT)))
    return min(policy.max_seconds, max(1.0, raw * (0.7 + 0.6 * u)))


# -- the pool and its gate -------------------------------------------------------------------


def _milli_floor(units: float) -> int:
    return math.ceil(units * 1000 - _EPS)


@dataclass(frozen=True, slots=True)
class AdmissionClass:
    """A class's queue bounds and floor in a pool (the shares are the lane table's)."""

    name: str
    min_units: float = 0.0
    max_queue: int = 1000
    """Most jobs of the class admitted and not finished."""
    max_queue_units: float | None = None
    """Most units of the class admitted and not finished; None: no bound."""
    tenant_max_queue: int | None = None
    """Most jobs of one tenant admitted and not finished in the class; None: ``max_queue``."""
    max_deferred: int | None = None
    """Most deferred jobs of the class; None: ``max_queue``."""
    when_full: WhenFull = "reject"
    tenant_max_queue_units: float | None = None
    """Most units of one tenant admitted and not finished in the class; None: no bound."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"class name must be a non-empty string, got {self.name!r}")
        _number("min_units", self.min_units)
        _count("max_queue", self.max_queue)
        for units in ("max_queue_units", "tenant_max_queue_units"):
            if getattr(self, units) is not None:
                _number(units, getattr(self, units))
        for label in ("tenant_max_queue", "max_deferred"):
            if getattr(self, label) is not None:
                _count(label, getattr(self, label))
        if self.when_full not in _WHEN_FULL:
            raise ValueError(f"when_full must be one of {_WHEN_FULL}, got {self.when_full!r}")

    @property
    def tenant_limit(self) -> int:
        return self.max_queue if self.tenant_max_queue is None else self.tenant_max_queue

    @property
    def deferred_limit(self) -> int:
        return self.max_queue if self.max_deferred is None else self.max_deferred

    @property
    def min_milli(self) -> int:
        return _milli_floor(self.min_units)

    @property
    def max_queue_milli(self) -> int | None:
        return None if self.max_queue_units is None else to_milli(self.max_queue_units)

    @property
    def tenant_queue_milli(self) -> int | None:
        units = self.tenant_max_queue_units
        return None if units is None else to_milli(units)


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """A lane's admission settings: its capacity in units and its classes' bounds."""

    capacity_units: float
    classes: tuple[AdmissionClass, ...] = ()
    recovery_reserve_units: float = 0.0
    """Left free by fresh submissions, so retries of admitted work can come back."""

    def __post_init__(self) -> None:
        if _number("capacity_units", self.capacity_units) <= 0:
            raise ValueError(f"capacity_units must be > 0, got {self.capacity_units!r}")
        _number("recovery_reserve_units", self.recovery_reserve_units, high=self.capacity_units)
        items = tuple(self.classes)
        for item in items:
            if not isinstance(item, AdmissionClass):
                raise TypeError(f"classes must be AdmissionClass objects, got {item!r}")
        names = [c.name for c in items]
        if len(set(names)) != len(names):
            raise ValueError(f"class names must be unique: {names}")
        object.__setattr__(self, "classes", items)

    @property
    def capacity_milli(self) -> int:
        return to_milli(self.capacity_units)

    @property
    def reserve_milli(self) -> int:
        return to_milli(self.recovery_reserve_units)

    def admission(self, name: str) -> AdmissionClass:
        """The class's settings; a class the pool does not list gets the defaults."""
        for c in self.classes:
            if c.name == name:
                return c
        return AdmissionClass(name)


def unit_table(table: ClassTable, pool: PoolConfig) -> ClassTable:
    """The lane's class table in milli-units: ``min_slots = ceil(min_units * 1000)``."""
    unknown = [c.name for c in pool.classes if c.name not in table]
    if unknown:
        raise ValueError(f"pool classes {unknown} are not classes of the lane ({table.names})")
    classes = []
    for c in table:
        floor = pool.admission(c.name).min_milli
        if c.batch and floor:
            raise ValueError(
                f"batch class {c.name!r} cannot have min_units (it is assured nothing)"
            )
        classes.append(
            ServiceClass(c.name, c.nominal_share, floor, c.lendable, c.borrowable, c.batch)
        )
    return ClassTable(classes)


@dataclass(slots=True)
class PoolState:
    """What the store keeps per lane: reservations, admitted and deferred counts."""

    reserved: dict[str, int] = field(default_factory=dict)
    """Reserved milli-units of admitted unfinished jobs, per class."""
    admitted: dict[str, int] = field(default_factory=dict)
    """Admitted unfinished jobs, per class."""
    tenant_admitted: dict[tuple[str, str], int] = field(default_factory=dict)
    """Admitted unfinished jobs, per (class, tenant)."""
    tenant_reserved: dict[tuple[str, str], int] = field(default_factory=dict)
    """Reserved milli-units of admitted unfinished jobs, per (class, tenant)."""
    deferred: dict[str, int] = field(default_factory=dict)
    """Deferred jobs, per class."""

    @property
    def total_reserved(self) -> int:
        return sum(self.reserved.values())

    def accept(self, service_class: str, tenant: str, milli_units: int) -> None:
        self.reserved[service_class] = self.reserved.get(service_class, 0) + milli_units
        self.admitted[service_class] = self.admitted.get(service_class, 0) + 1
        key = (service_class, tenant)
        self.tenant_admitted[key] = self.tenant_admitted.get(key, 0) + 1
        self.tenant_reserved[key] = self.tenant_reserved.get(key, 0) + milli_units

    def release(self, service_class: str, tenant: str, milli_units: int) -> None:
        """A job finished or left for its backoff: give back what ``accept`` took."""
        key = (service_class, tenant)
        if (
            self.reserved.get(service_class, 0) < milli_units
            or self.admitted.get(service_class, 0) < 1
            or self.tenant_admitted.get(key, 0) < 1
        ):
            raise ValueError(f"release of {service_class}/{tenant} ({milli_units}) never admitted")
        self.reserved[service_class] -= milli_units
        self.admitted[service_class] -= 1
        self.tenant_admitted[key] -= 1
        self.tenant_reserved[key] = self.tenant_reserved.get(key, 0) - milli_units

    def defer(self, service_class: str) -> None:
        self.deferred[service_class] = self.deferred.get(service_class, 0) + 1

    def undefer(self, service_class: str) -> None:
        if self.deferred.get(service_class, 0) < 1:
            raise ValueError(f"class {service_class!r} has no deferred job")
        self.deferred[service_class] -= 1


@dataclass(frozen=True, slots=True)
class Decision:
    status: Literal["accepted", "deferred", "rejected"]
    reason: Reason | None = None


def fits(
    table: ClassTable,
    pool: PoolConfig,
    state: PoolState,
    *,
    service_class: str,
    tenant: str,
    milli_units: int,
    fresh: bool,
) -> FullReason | None:
    """Rules 3-5: None if the request may be admitted now, else why not."""
    mu = _count("milli_units", milli_units)
    spec = pool.admission(service_class)
    key = (service_class, tenant)
    tenant_milli = spec.tenant_queue_milli
    if state.tenant_admitted.get(key, 0) >= spec.tenant_limit or (
        tenant_milli is not None and state.tenant_reserved.get(key, 0) + mu > tenant_milli
    ):
        return "tenant_queue_full"
    queue_milli = spec.max_queue_milli
    if state.admitted.get(service_class, 0) >= spec.max_queue or (
        queue_milli is not None and state.reserved.get(service_class, 0) + mu > queue_milli
    ):
        return "class_queue_full"
    capacity = pool.capacity_milli
    units = unit_table(table, pool)
    # The class rules need a width >= 1; a free job is judged as the narrowest one.
    width = max(mu, 1)
    room = may_start(
        units,
        capacity,
        state.reserved,
        {service_class: width},
        service_class,
        demand={service_class: width},
    )
    if room and (not fresh or capacity - state.total_reserved - mu >= pool.reserve_milli):
        return None
    return "class_full"


def decide(
    table: ClassTable,
    pool: PoolConfig,
    state: PoolState,
    *,
    service_class: str,
    tenant: str,
    milli_units: int,
    fresh: bool,
    deadline_ms: int | None,
    now_ms: int,
    max_reservation_milli: int,
) -> Decision:
    """The gate's answer to one submission (rules 1-5 of the module docstring); pure."""
    if service_class not in table:
        raise ValueError(f"unknown service class: {service_class!r}")
    if _count("milli_units", milli_units) > max_reservation_milli:
        return Decision("rejected", "too_wide")
    if deadline_ms is not None and deadline_ms <= now_ms:
        return Decision("rejected", "deadline_unmeetable")
    reason = fits(
        table,
        pool,
        state,
        service_class=service_class,
        tenant=tenant,
        milli_units=milli_units,
        fresh=fresh,
    )
    if reason is None:
        return Decision("accepted")
    spec = pool.admission(service_class)
    if not fresh or (
        spec.when_full == "defer" and state.deferred.get(service_class, 0) < spec.deferred_limit
    ):
        return Decision("deferred", reason)
    return Decision("rejected", reason)


@dataclass(frozen=True, slots=True)
class DeferredJob:
    """One entry of a class's deferred queue."""

    tenant: str
    milli_units: int
    fresh: bool = True


def drain(
    table: ClassTable,
    pool: PoolConfig,
    state: PoolState,
    queues: Mapping[str, deque[DeferredJob]],
) -> list[tuple[str, DeferredJob]]:
    """After a release: admit deferred heads, classes in table order, each FIFO until
    its head does not fit (rules 3-5). Mutates ``state`` and ``queues``; returns the
    admitted jobs with their class, in admission order."""
    admitted: list[tuple[str, DeferredJob]] = []
    for name in table.names:
        queue = queues.get(name)
        while queue:
            head = queue[0]
            reason = fits(
                table,
                pool,
                state,
                service_class=name,
                tenant=head.tenant,
                milli_units=head.milli_units,
                fresh=head.fresh,
            )
            if reason is not None:
                break
            queue.popleft()
            state.undefer(name)
            state.accept(name, head.tenant, head.milli_units)
            admitted.append((name, head))
    return admitted
