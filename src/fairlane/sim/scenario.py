"""What a simulation is about: the typed, validated scenario (lanes, tenants, phases).

This module owns the scenario's data model and its one transformation, time scaling
(:meth:`Scenario.scaled`); reading TOML into it is ``fairlane.sim.parse``. Times are
seconds on the simulator's virtual clock, rates are jobs per second, sizes are seconds
of service on one worker slot. Everything here is frozen and checked on construction
by the parser, so the engine can trust it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from fairlane.config.pools import RetrySettings
from fairlane.policy.admission import EstimationSettings, PoolConfig
from fairlane.policy.ceilings import TenantLimits
from fairlane.policy.classes import ClassTable
from fairlane.policy.rates import Adaptive, Rate

__all__ = [
    "MIN_SIZE",
    "Burst",
    "Charge",
    "Diurnal",
    "KeySpec",
    "LaneSpec",
    "Phase",
    "Scenario",
    "SimSettings",
    "SizeDist",
    "SizeKind",
    "TenantSpec",
    "UpstreamSpec",
]

SizeKind = Literal["fixed", "exponential", "lognormal", "pareto"]
Charge = Literal["time", "jobs", "units"]
"""What a dispatch charges a tenant in its fair queue: the slice's service time (an
exact estimate), one unit per dispatch (the store without estimates), or the tenant's
declared ``units`` per job (the store charging by declared cost)."""

MIN_SIZE = 1e-6
"""Drawn sizes are clamped to at least this many seconds (a fair-queue cost is > 0)."""


@dataclass(frozen=True, slots=True)
class SizeDist:
    """A job size distribution with the given ``mean`` (seconds)."""

    kind: SizeKind
    mean: float
    sigma: float = 0.0
    """lognormal: the standard deviation of the underlying normal."""
    alpha: float = 0.0
    """pareto: the tail index (> 1, so that the mean exists)."""

    def sampler(self, rng: random.Random) -> Callable[[], float]:
        """A function drawing one size from ``rng``."""
        mean = self.mean
        if self.kind == "fixed":
            return lambda: mean
        if self.kind == "exponential":  # random.expovariate(1 / mean), inlined
            uniform, log = rng.random, math.log
            return lambda: max(MIN_SIZE, -log(1.0 - uniform()) * mean)
        if self.kind == "lognormal":
            mu, sigma, logn = math.log(mean) - self.sigma**2 / 2, self.sigma, rng.lognormvariate
            return lambda: max(MIN_SIZE, logn(mu, sigma))
        xm, alpha, par = mean * (self.alpha - 1) / self.alpha, self.alpha, rng.paretovariate
        return lambda: xm * par(alpha)


@dataclass(frozen=True, slots=True)
class Burst:
    """``count`` jobs spread evenly over ``over`` seconds from ``at`` (all at once if 0)."""

    at: float
    count: int
    over: float = 0.0


@dataclass(frozen=True, slots=True)
class Diurnal:
    """A sinusoidal rate: ``rate * (1 + amplitude * sin(2 pi (t - phase) / period))``."""

    amplitude: float
    period: float
    phase: float = 0.0


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """One tenant, or a group of ``count`` alike (names from the ``name`` pattern)."""

    name: str
    group: str
    lane: str
    service_class: str
    count: int = 1
    weight: float = 1.0
    rate: float = 0.0
    diurnal: Diurnal | None = None
    bursts: tuple[Burst, ...] = ()
    size: SizeDist = SizeDist("fixed", 1.0)
    start: float = 0.0
    stop: float = math.inf
    max_concurrency: int | None = None
    """A static per-tenant concurrency cap (the throttle key ``tenant:<name>``)."""
    limits: TenantLimits | None = None
    """Floor/ceiling settings: a dynamic cap from ``fairlane.policy.ceilings``."""
    slots: int = 1
    units: float = 1.0
    """Units each job reserves at the admission gate (and charges with ``charge=units``)."""
    retries: int = 0
    """Resubmissions of a rejected job, each after its Retry-After."""
    keys: tuple[str, ...] = ()
    """Shared throttle keys (declared under ``[[keys]]``) each of its jobs takes a slot on."""
    used: SizeDist | None = None
    """The units a job really uses (drawn per job); None: exactly its declared ``units``.
    A ``cost="units"`` rate key takes the declared units and is corrected by these."""

    def names(self) -> list[str]:
        if self.count == 1 and "{" not in self.name:
            return [self.name]
        return [self.name.format(i=i) for i in range(self.count)]

    @property
    def arrivals_end(self) -> float:
        """When this spec's last arrival can happen (0 without any)."""
        end = 0.0
        if self.rate > 0 and self.stop > self.start:
            end = self.stop
        for b in self.bursts:
            if b.count:
                end = max(end, b.at + b.over)
        return end


@dataclass(frozen=True, slots=True)
class UpstreamSpec:
    """The service behind a key, as its provider limits it: token buckets of requests
    (``rps`` per second, bursting to ``rps_burst``) and of tokens (``tpm`` per minute,
    bursting to ``tpm_burst``), either or both. A call that does not fit both is answered
    429 after ``reject_time`` seconds, with a Retry-After of the time until it would have
    fit, rounded up to a multiple of ``retry_step`` seconds (0: to the millisecond)."""

    rps: Rate | None = None
    tpm: Rate | None = None
    retry_step: float = 1.0
    reject_time: float = 0.01

    @property
    def capacity(self) -> tuple[float | None, float | None]:
        """Sustained (calls per second, tokens per second); None where unlimited."""
        calls = self.rps.limit / self.rps.per if self.rps else None
        tokens = self.tpm.limit / self.tpm.per if self.tpm else None
        return calls, tokens


@dataclass(frozen=True, slots=True)
class KeySpec:
    """A shared key (``model:big``): at most ``limit`` jobs naming it run at once, or an
    ``adaptive`` concurrency limit; and/or a ``rate`` (``fairlane.policy.rates``); and
    optionally the ``upstream`` its jobs call."""

    name: str
    limit: int | None = None
    rate: Rate | None = None
    adaptive: Adaptive | None = None
    upstream: UpstreamSpec | None = None


@dataclass(frozen=True, slots=True)
class LaneSpec:
    """A lane: its workers' slots, its class table and, optionally, an admission pool."""

    name: str
    slots: int
    table: ClassTable
    pool: PoolConfig | None = None


@dataclass(frozen=True, slots=True)
class Phase:
    """A named stretch of time; waits are grouped by the phase their job arrived in."""

    name: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class SimSettings:
    slice: float = math.inf
    """A job longer than this yields after each slice and re-enters its tenant's queue."""
    charge: Charge = "time"
    until: float | None = None
    """Stop the clock here (unfinished work is reported); None: run until drained."""
    window: tuple[float, float] | None = None
    """Where shares, utilisation and backlog are measured; None: [0, end of arrivals]."""
    sample: float | None = None
    """Seconds between queue-length samples; None: 1/200 of the arrival horizon."""


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    source: str
    lanes: tuple[LaneSpec, ...]
    tenants: tuple[TenantSpec, ...]
    description: str = ""
    seed: int = 0
    sim: SimSettings = SimSettings()
    phases: tuple[Phase, ...] = ()
    keys: tuple[KeySpec, ...] = ()
    compare: tuple[str, ...] = ("fair", "fifo")
    estimation: EstimationSettings = field(default_factory=EstimationSettings)
    retry: RetrySettings = field(default_factory=RetrySettings)

    @property
    def horizon(self) -> float:
        """The end of arrivals (latest ``stop`` or burst end over the tenants)."""
        return max((t.arrivals_end for t in self.tenants), default=0.0)

    @property
    def tenant_count(self) -> int:
        return sum(t.count for t in self.tenants)

    def lane(self, name: str) -> LaneSpec:
        for lane in self.lanes:
            if lane.name == name:
                return lane
        raise KeyError(name)

    def expected_jobs(self) -> float:
        """The mean number of arrivals (rates times active time, plus burst counts)."""
        total = 0.0
        for t in self.tenants:
            span = max(0.0, min(t.stop, self.sim.until or math.inf) - t.start)
            total += t.count * (t.rate * (span if math.isfinite(span) else 0.0))
            total += t.count * sum(b.count for b in t.bursts)
        return total

    def scaled(self, factor: float) -> Scenario:
        """Every time and burst count multiplied by ``factor`` (rates, sizes, slots kept),
        so the number of jobs scales by ``factor`` at the same load."""
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"scale must be a finite number > 0, got {factor!r}")
        if factor == 1:
            return self

        def at(x: float) -> float:
            return x * factor

        def tenant(t: TenantSpec) -> TenantSpec:
            bursts = tuple(
                Burst(at(b.at), max(1, round(b.count * factor)) if b.count else 0, at(b.over))
                for b in t.bursts
            )
            diurnal = t.diurnal and replace(
                t.diurnal, period=at(t.diurnal.period), phase=at(t.diurnal.phase)
            )
            return replace(t, start=at(t.start), stop=at(t.stop), bursts=bursts, diurnal=diurnal)

        s = self.sim
        sim = replace(
            s,
            until=None if s.until is None else at(s.until),
            window=None if s.window is None else (at(s.window[0]), at(s.window[1])),
            sample=None if s.sample is None else at(s.sample),
        )
        return replace(
            self,
            tenants=tuple(tenant(t) for t in self.tenants),
            sim=sim,
            phases=tuple(Phase(p.name, at(p.start), at(p.end)) for p in self.phases),
        )
