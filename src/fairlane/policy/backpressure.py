"""Resource backpressure: how much of its capacity a worker may fill under pressure.

A worker's sensors turn what they measure into readings (``Reading``): a value and
the thresholds at which it starts to matter. Each reading with thresholds caps the
share of the worker's slots it may hold:

* below ``soft`` it does not limit the worker (``max_fraction``);
* between ``soft`` and ``hard`` the cap falls linearly to ``min_fraction``;
* at or above ``hard`` the cap is ``min_fraction``, or, for a reading marked ``stop``
  (memory near the worker's limit), nothing: the worker takes no new work until the
  value falls back below its resume point (``Bounds.resume_band`` of the way from
  hard down to soft), so it does not flap around the hard threshold.

The tightest cap wins. Tightening applies at once -- the point is to stop before the
kernel's OOM killer does -- while loosening is gradual, at most ``recovery`` of the
slots per second, so the worker does not swing between empty and full on a noisy
signal. Everything here is pure: the caller passes the time and keeps the state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

__all__ = ["Bounds", "Decision", "PressureState", "Reading", "allowance", "decide", "reading_cap"]


@dataclass(frozen=True, slots=True)
class Reading:
    """One measured value. Without ``soft``/``hard`` it is reported, never acted on."""

    name: str
    value: float
    soft: float | None = None
    hard: float | None = None
    stop: bool = False

    def __post_init__(self) -> None:
        if (self.soft is None) != (self.hard is None):
            raise ValueError(f"reading {self.name!r}: give both soft and hard, or neither")
        if self.soft is not None and self.hard is not None and not self.soft < self.hard:
            raise ValueError(f"reading {self.name!r}: soft ({self.soft}) must be below hard")
        if math.isnan(self.value):
            raise ValueError(f"reading {self.name!r}: value is NaN")

    @property
    def acts(self) -> bool:
        return self.soft is not None

    def resume_at(self, band: float) -> float:
        """The value a stopped reading must fall below before the worker takes work again."""
        assert self.soft is not None and self.hard is not None
        return self.hard - band * (self.hard - self.soft)


class Bounds(msgspec.Struct, frozen=True):
    """The range a worker's fill may move in, and how fast it recovers."""

    min_fraction: float = 0.25
    max_fraction: float = 1.0
    # share of the slots regained per second once pressure eases
    recovery: float = 0.5
    # a stopped reading resumes below hard - resume_band * (hard - soft)
    resume_band: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_fraction <= self.max_fraction <= 1.0:
            raise ValueError(
                "need 0 <= min_fraction <= max_fraction <= 1, got "
                f"{self.min_fraction} and {self.max_fraction}"
            )
        if self.max_fraction <= 0:
            raise ValueError("max_fraction must be above 0")
        if self.recovery <= 0:
            raise ValueError(f"recovery must be above 0, got {self.recovery}")
        if not 0.0 <= self.resume_band <= 1.0:
            raise ValueError(f"resume_band must be in [0, 1], got {self.resume_band}")


class PressureState(msgspec.Struct, frozen=True):
    """What the policy remembers between decisions."""

    fraction: float | None = None  # the smoothed cap; None before the first decision
    at: float | None = None  # time of the last decision (caller's clock, seconds)
    stopped: frozenset[str] = msgspec.field(default_factory=frozenset)


class Decision(msgspec.Struct, frozen=True):
    """The share of its slots a worker may hold now, and why."""

    fraction: float  # 0 while stopped
    stopped: tuple[str, ...]  # readings at their hard threshold that stop new work
    limiting: str | None  # the reading whose cap is tightest, if any is below max
    state: PressureState

    @property
    def holding(self) -> bool:
        """True while the worker must take no new work at all."""
        return bool(self.stopped)

    def target(self, concurrency: int) -> int:
        """Slots the worker may hold in all: at least one unless it is holding."""
        if self.holding:
            return 0
        return max(1, min(concurrency, math.floor(self.fraction * concurrency + 1e-9)))


def reading_cap(reading: Reading, bounds: Bounds) -> float:
    """The share of slots one reading allows, ignoring hysteresis and smoothing."""
    if reading.soft is None or reading.hard is None or reading.value < reading.soft:
        return bounds.max_fraction
    if reading.value >= reading.hard:
        return 0.0 if reading.stop else bounds.min_fraction
    t = (reading.value - reading.soft) / (reading.hard - reading.soft)
    return bounds.max_fraction - t * (bounds.max_fraction - bounds.min_fraction)


def decide(
    readings: Iterable[Reading], state: PressureState, bounds: Bounds, now: float
) -> Decision:
    """The worker's cap after ``readings`` taken at ``now``, given the previous ``state``."""
    stopped: set[str] = set()
    raw, limiting = bounds.max_fraction, None
    for r in readings:
        if not r.acts:
            continue
        cap = reading_cap(r, bounds)
        held = r.name in state.stopped and r.value >= r.resume_at(bounds.resume_band)
        if r.stop and (cap == 0.0 or held):
            stopped.add(r.name)
            cap = 0.0
        if cap < raw:
            raw, limiting = cap, r.name
    if stopped:
        fraction = 0.0
    elif state.fraction is None or state.at is None or raw <= state.fraction:
        fraction = raw
    else:
        elapsed = max(0.0, now - state.at)
        fraction = min(raw, state.fraction + bounds.recovery * elapsed)
    new_state = PressureState(fraction=fraction, at=now, stopped=frozenset(stopped))
    return Decision(fraction, tuple(sorted(stopped)), limiting, new_state)


def allowance(decision: Decision, concurrency: int, used: int) -> int:
    """Slots the worker may lease now: never more than are free, none while holding."""
    free = max(0, concurrency - used)
    return max(0, min(free, decision.target(concurrency) - used))
