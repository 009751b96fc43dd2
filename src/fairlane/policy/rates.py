"""Rate keys: token buckets in jobs or work units, corrections, pauses, adaptive limits.

A rate key (``model:gpt``, ``tenant:acme``, ``user:acme/42``) admits at most ``limit``
per ``per`` seconds sustained and ``burst`` at once. Its state is a token bucket on the
server's clock (milliseconds, passed in): ``tokens`` as of ``stamp``, refilled at
``limit / per`` and never above ``burst``; and a pause until a moment the upstream named.
These are the rules alone; :class:`fairlane.policy.throttle.Throttles` applies them
together with concurrency keys and tenant-fair waiting, and ``store/lua/rates.lua`` is
their twin.

Rules
-----
* **Level.** ``level(now) = min(burst, tokens + (now - stamp) * limit / per_ms)`` for
  ``now > stamp``, else ``min(burst, tokens)``. ``tokens`` may be negative: a debt.
* **Fit.** A job of cost ``c`` (1 for ``cost="jobs"``, its reserved units for
  ``cost="units"``) fits iff the key is not paused (``now >= paused_until``) and
  ``level(now) >= c``. Taking it leaves ``tokens = level(now) - c``, ``stamp = now``.
  A cost above ``burst`` can never fit: it is refused when the job is enqueued.
* **Correction** (``cost="units"`` only). When an attempt ends having used ``u`` units
  after taking ``c``, the key gets ``c - u`` back: a refund, the level capped at
  ``burst``; or a debt, the level going below zero, paid back by the refill before
  anything else fits.
* **Pause.** An upstream's ``Retry-After`` pauses the key until ``now + after``; a later
  pause only lengthens it. Tokens keep refilling through a pause.
* **Due.** A job that does not fit is due at ``max(paused_until, now + ceil((c -
  level(now)) * per_ms / limit))``, at least ``now + 1``: the moment the server wakes
  the key's waiters. Nothing polls.

Guarantee: takes net of refunds in any window of length ``per`` are at most ``burst +
limit`` (the level is at most ``burst`` when the window opens, and the refill adds at
most ``limit`` in it); backlogged, the long-run rate is ``limit / per``.

Adaptive concurrency limits
---------------------------
``Adaptive(max, min)`` is a concurrency limit that listens to pushback: its value starts
at ``max``, is multiplied by :data:`ADAPTIVE_CUT` on each pushback (each is a call the
upstream refused: a limit far above the upstream's is cut as often as its calls in flight
are refused), and grows by ``1 / value`` on each success, never outside ``[min, max]``;
the limit in force is ``floor(value)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import msgspec

__all__ = [
    "ADAPTIVE_CUT",
    "MAX_PUSHBACKS",
    "Adaptive",
    "Bucket",
    "Rate",
    "RateCost",
    "adaptive_cut",
    "adaptive_grow",
    "adaptive_limit",
    "correct",
    "due_at",
    "fits",
    "job_cost",
    "level",
    "pause",
    "take",
]

RateCost = Literal["jobs", "units"]

#: A pushback multiplies an adaptive limit's value by this.
ADAPTIVE_CUT = 0.5

#: Pushbacks (``Throttled``) a job may take without spending an attempt; past this, each
#: counts as a failed attempt.
MAX_PUSHBACKS = 20

#: Longest period and largest limit, burst or limit of an adaptive key accepted.
MAX_PERIOD_SECONDS = 366 * 86400.0
MAX_RATE_VALUE = 1e15


def _positive(label: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{label} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{label} must be a finite number > 0, got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``limit`` per ``per`` seconds sustained, bursting to ``burst`` (default
    ``limit``). ``cost="jobs"`` takes 1 per job; ``cost="units"`` takes the job's
    reserved work units and is corrected by what the job really used."""

    limit: float
    per: float = 1.0
    burst: float | None = None
    cost: RateCost = "jobs"

    def __post_init__(self) -> None:
        limit = _positive("Rate limit", self.limit)
        per = _positive("Rate per (seconds)", self.per)
        burst = limit if self.burst is None else _positive("Rate burst", self.burst)
        if self.cost not in ("jobs", "units"):
            raise ValueError(f"Rate cost must be 'jobs' or 'units', got {self.cost!r}")
        if per > MAX_PERIOD_SECONDS or per * 1000.0 < 1.0:
            raise ValueError(f"Rate per must be within [0.001, {MAX_PERIOD_SECONDS:.0f}] seconds")
        if limit > MAX_RATE_VALUE or burst > MAX_RATE_VALUE:
            raise ValueError(f"Rate limit and burst must be at most {MAX_RATE_VALUE:g}")
        if self.cost == "jobs" and burst < 1:
            raise ValueError(f"a Rate counting jobs needs burst >= 1 (one job), got {burst!r}")
        object.__setattr__(self, "limit", limit)
        object.__setattr__(self, "per", per)
        object.__setattr__(self, "burst", burst)

    @property
    def per_ms(self) -> float:
        return self.per * 1000.0

    @property
    def capacity(self) -> float:
        """The burst, resolved (``burst`` is never ``None`` after construction)."""
        assert self.burst is not None
        return self.burst

    @property
    def units(self) -> bool:
        return self.cost == "units"


@dataclass(frozen=True, slots=True)
class Adaptive:
    """A concurrency limit that starts at ``max``, is cut on pushback and grows back with
    successes, never outside ``[min, max]``."""

    max: int
    min: int = 1

    def __post_init__(self) -> None:
        for label, value in (("max", self.max), ("min", self.min)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Adaptive {label} must be an int, got {value!r}")
        if not 1 <= self.min <= self.max <= 2**31 - 1:
            raise ValueError(
                f"Adaptive needs 1 <= min <= max < 2**31, got min={self.min}, max={self.max}"
            )


class Bucket(msgspec.Struct, frozen=True):
    """A rate key's state: ``tokens`` as of ``stamp`` (ms), paused until ``paused_until``."""

    tokens: float
    stamp: int
    paused_until: int = 0

    @classmethod
    def full(cls, rate: Rate, now: int) -> Bucket:
        return cls(rate.capacity, now)


def job_cost(rate: Rate, units: float) -> float:
    """What a job takes from ``rate``: 1, or its reserved ``units``."""
    return units if rate.units else 1.0


def level(rate: Rate, bucket: Bucket, now: int) -> float:
    if now <= bucket.stamp:
        return min(rate.capacity, bucket.tokens)
    return min(rate.capacity, bucket.tokens + (now - bucket.stamp) * rate.limit / rate.per_ms)


def fits(rate: Rate, bucket: Bucket, cost: float, now: int) -> bool:
    return now >= bucket.paused_until and level(rate, bucket, now) >= cost


def take(rate: Rate, bucket: Bucket, cost: float, now: int) -> Bucket:
    return Bucket(level(rate, bucket, now) - cost, max(now, bucket.stamp), bucket.paused_until)


def correct(rate: Rate, bucket: Bucket, delta: float, now: int) -> Bucket:
    """Give ``delta`` back (a refund, capped at the burst) or, negative, charge a debt."""
    after = level(rate, bucket, now) + delta
    if delta > 0:
        after = min(rate.capacity, after)
    return Bucket(after, max(now, bucket.stamp), bucket.paused_until)


def pause(bucket: Bucket, until: int) -> Bucket:
    return Bucket(bucket.tokens, bucket.stamp, max(bucket.paused_until, until))


def due_at(rate: Rate, bucket: Bucket, cost: float, now: int) -> int:
    """The first moment a job of ``cost`` may fit, for one that does not fit at ``now``."""
    short = cost - level(rate, bucket, now)
    due = now + 1
    if short > 0:
        due = max(due, now + math.ceil(short * rate.per_ms / rate.limit))
    return max(due, bucket.paused_until)


def adaptive_cut(value: float, spec: Adaptive) -> float:
    return max(float(spec.min), value * ADAPTIVE_CUT)


def adaptive_grow(value: float, spec: Adaptive) -> float:
    return min(float(spec.max), value + 1.0 / value)


def adaptive_limit(value: float) -> int:
    return math.floor(value)
