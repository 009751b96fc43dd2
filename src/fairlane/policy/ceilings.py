"""Per-tenant floors and ceilings: Little's law, bursts, and compression under pressure.

How many jobs may a tenant run at once *right now*? Not a constant: it follows the
tenant's recent behaviour and the live fleet. Little's law says a tenant sustaining
``R`` submissions per minute, each taking ``D`` seconds, has ``R * D / 60`` jobs in
flight on average. That is what it earns, never less than its configured floor:

* earned base: ``base = max(floor, ceil(R * D / 60))``;
* ceiling, room for bursts on top: ``ceiling = base + max(burst_floor, floor(base *
  burst_pct))`` (the burst is whole slots, rounded down, and at least ``burst_floor``);
* pressure factor, shared by every tenant of a pool: ``factor = clamp(pool_target /
  in_flight, f_min, f_max)``, and ``f_max`` when nothing is in flight;
* effective limit: ``limit = min(max_concurrency, max(floor, floor(ceiling * factor)))``
  (no cap when ``max_concurrency`` is ``None``; it is never below ``floor``).

Products are rounded with a tolerance of ``1e-9`` (``ceil(x - 1e-9)``, ``floor(x +
1e-9)``) so that a product that is whole on paper (``9.3 * 200 / 60 = 31``) is not
pushed a slot off by binary floating point; the Lua mirror rounds the same way.

Fair shedding. When the pool is saturated (``in_flight > pool_target``) the factor is
below 1 and the *same* factor applies to every tenant, so each keeps at least the
fraction ``factor`` of its ceiling, rounded down -- or its floor, whichever is more.
Load is shed in proportion to each ceiling: a spiky tenant, whose ceiling grew with its
burst, gives up the most slots, while a steady tenant whose need is covered by its
floor gives up nothing. A tenant's limit depends on other tenants only through the
shared factor. When the pool has room the factor rises (up to ``f_max``), letting
bursty tenants use the spare capacity.

The signals are fixed-size so the store can read them in one step: :class:`RateWindow`
(submissions per minute from a ring of ``B`` buckets) and :class:`DurationMean` (an
exponentially weighted mean of job durations). Time is passed in as int milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "DURATION_ALPHA",
    "F_MAX",
    "F_MIN",
    "RATE_BUCKETS",
    "RATE_WIDTH_MS",
    "DurationMean",
    "RateWindow",
    "TenantLimits",
    "ceiling",
    "earned_base",
    "pressure_factor",
    "tenant_limit",
]

_EPS = 1e-9

#: The store's signal windows and pressure bounds (written into its scripts).
RATE_BUCKETS = 6
RATE_WIDTH_MS = 10_000
DURATION_ALPHA = 0.1
F_MIN = 0.25
"""Under pressure a ceiling shrinks to at most this fraction (never below the floor)."""
F_MAX = 2.0
"""With the pool idle a ceiling stretches to this multiple, so bursts use spare slots."""


def _ceil(x: float) -> int:
    return math.ceil(x - _EPS)


def _floor(x: float) -> int:
    return math.floor(x + _EPS)


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """A tenant's concurrency settings."""

    floor: int = 1
    """Guaranteed concurrency, whatever the pressure."""
    max_concurrency: int | None = None
    """A hard cap over everything else (``None``: no cap); must be ``>= floor``."""
    burst_floor: int = 0
    """The least burst room on top of the earned base, in slots."""
    burst_pct: float = 0.0
    """Burst room as a fraction of the earned base (0.5 = 50 %)."""
    weight: float = 1.0
    """The tenant's share in the fair queue (carried here, not used here)."""

    def __post_init__(self) -> None:
        if self.floor < 0 or self.burst_floor < 0 or self.burst_pct < 0:
            raise ValueError("floor, burst_floor and burst_pct must be >= 0")
        if self.max_concurrency is not None and self.max_concurrency < self.floor:
            raise ValueError(
                f"max_concurrency {self.max_concurrency} is below the floor {self.floor}"
            )
        if self.weight <= 0:
            raise ValueError(f"weight must be > 0, got {self.weight}")


def earned_base(floor: int, rate_per_min: float, mean_duration_s: float) -> int:
    """``max(floor, ceil(R * D / 60))``: Little's law, never below the floor."""
    if rate_per_min < 0 or mean_duration_s < 0:
        raise ValueError("rate and duration must be >= 0")
    return max(floor, _ceil(rate_per_min * mean_duration_s / 60.0))


def ceiling(base: int, burst_floor: int, burst_pct: float) -> int:
    """``base + max(burst_floor, floor(base * burst_pct))``."""
    return base + max(burst_floor, _floor(base * burst_pct))


def pressure_factor(pool_target: float, in_flight: float, f_min: float, f_max: float) -> float:
    """``clamp(pool_target / in_flight, f_min, f_max)``; ``f_max`` when idle."""
    if not 0 <= f_min <= f_max:
        raise ValueError(f"need 0 <= f_min <= f_max, got {f_min}, {f_max}")
    if in_flight <= 0:
        return f_max
    return min(f_max, max(f_min, pool_target / in_flight))


def tenant_limit(
    settings: TenantLimits,
    rate_per_min: float,
    mean_duration_s: float,
    pool_target: float,
    in_flight: float,
    *,
    f_min: float = 0.0,
    f_max: float = 1.0,
) -> int:
    """The tenant's concurrency limit now: its compressed ceiling, within floor and cap."""
    base = earned_base(settings.floor, rate_per_min, mean_duration_s)
    top = ceiling(base, settings.burst_floor, settings.burst_pct)
    factor = pressure_factor(pool_target, in_flight, f_min, f_max)
    limit = max(settings.floor, _floor(top * factor))
    if settings.max_concurrency is not None:
        limit = min(limit, settings.max_concurrency)
    return limit


class RateWindow:
    """Recent submissions per minute, from a ring of ``buckets`` buckets of ``width_ms``.

    A submission at ``t`` counts in bucket ``t // width_ms``, stored in slot ``index %
    buckets`` together with that index; a slot holding an older index is reset before
    use. The window at ``now`` is the current bucket so far plus the ``buckets - 1``
    whole buckets before it, spanning ``(buckets - 1) * width_ms + now % width_ms + 1``
    ms, and the rate is ``count * 60_000 / span``. ``add`` is ``O(1)``, a read ``O(B)``;
    memory is fixed. A submission too old for the window (its slot already holds a
    newer bucket) is dropped.
    """

    __slots__ = ("_counts", "_stamps", "buckets", "width_ms")

    def __init__(self, buckets: int = 6, width_ms: int = 10_000) -> None:
        if buckets < 1 or width_ms < 1:
            raise ValueError("need at least one bucket of at least 1 ms")
        self.buckets = buckets
        self.width_ms = width_ms
        self._counts = [0] * buckets
        self._stamps = [-1] * buckets  # bucket index held by each slot; -1 = empty

    def add(self, now_ms: int, count: int = 1) -> None:
        """Record ``count`` submissions at ``now_ms``."""
        index = self._index(now_ms)
        slot = index % self.buckets
        if self._stamps[slot] > index:
            return
        if self._stamps[slot] < index:
            self._stamps[slot] = index
            self._counts[slot] = 0
        self._counts[slot] += count

    def count(self, now_ms: int) -> int:
        """Submissions in the window ending at ``now_ms``."""
        index = self._index(now_ms)
        return sum(
            n
            for n, stamp in zip(self._counts, self._stamps, strict=True)
            if index - self.buckets < stamp <= index
        )

    def per_minute(self, now_ms: int) -> float:
        """The recent submission rate, per minute."""
        span = (self.buckets - 1) * self.width_ms + now_ms % self.width_ms + 1
        return self.count(now_ms) * 60_000 / span

    def _index(self, now_ms: int) -> int:
        if now_ms < 0:
            raise ValueError(f"time must be >= 0 ms, got {now_ms}")
        return now_ms // self.width_ms


class DurationMean:
    """An exponentially weighted mean of job durations (seconds).

    The first sample is taken as is; each later one moves the mean by ``alpha`` of the
    difference: ``mean += alpha * (sample - mean)``. With the default ``alpha = 0.1`` a
    sample's weight halves after about 6.6 further samples (``ln 0.5 / ln 0.9``), so a
    change in job size shows within a few dozen jobs while one outlier moves the mean by
    a tenth of its excess.
    """

    __slots__ = ("_mean", "alpha", "samples")

    def __init__(self, alpha: float = 0.1) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.samples = 0
        self._mean = 0.0

    def observe(self, seconds: float) -> float:
        """Fold in one duration; returns the new mean."""
        if seconds < 0:
            raise ValueError(f"duration must be >= 0, got {seconds}")
        self._mean = (
            seconds if self.samples == 0 else self._mean + self.alpha * (seconds - self._mean)
        )
        self.samples += 1
        return self._mean

    def value(self, default: float = 0.0) -> float:
        """The mean so far, or ``default`` before the first sample."""
        return self._mean if self.samples else default
