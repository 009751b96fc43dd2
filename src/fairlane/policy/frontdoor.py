"""The front door's rule under a lagging event loop: how many seats, and the max-min fair
rate the largest tenant is held to (``fairlane.gateway.governor`` reads the loop's lag
and the door's submits, and applies what this decides).

1. The seats: over the lag target one fewer, under half of it one more, between one and
   the configured number (additive: one period's reading is noisy).
2. At one seat and still over the target, with two tenants or more submitting, a
   capacity cut by a fifth each period the loop still lags and grown by a tenth each
   period it is under half the target (multiplicative: it must fall by orders of
   magnitude within a second); every tenant is held to its max-min fair level
   (``fair_level``), which never falls below the second-largest tenant's rate, so only
   the largest is cut. It is lifted once the capacity is twice what the door sees, or
   when one tenant alone submits (there is nobody to protect).

Tenants' rates are smoothed over about half a second (``SMOOTHING`` per period). Pure:
no clock, no event loop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

__all__ = ["SMOOTHING", "SeatGovernor", "fair_level"]

#: the weight of one period's reading in a tenant's smoothed rate
SMOOTHING: Final = 0.2


def fair_level(rates: Mapping[str, float], capacity: float) -> float:
    """The max-min fair level: the rate ``c`` at which ``sum(min(r, c)) == capacity``
    (infinite when the rates fit), never below the second-largest rate."""
    ordered = sorted(rates.values())
    if sum(ordered) <= capacity:
        return math.inf
    left, n = capacity, len(ordered)
    level = 0.0
    for i, r in enumerate(ordered):
        level = left / (n - i)
        if r > level:
            break
        left -= r
    second = ordered[-2] if n > 1 else 0.0
    return max(level, second)


@dataclass
class SeatGovernor:
    """The rule, without a clock: the seats and the shed rate after a reading of the
    lag (seconds) and of each tenant's submits per second in the period."""

    most: int
    target: float
    seats: int = 0
    capacity: float | None = None
    rates: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.seats = self.seats or self.most

    def step(self, lag: float, period_rates: Mapping[str, float]) -> tuple[int, float | None]:
        self._smooth(period_rates)
        total = sum(self.rates.values())
        over, under = lag > self.target, lag < self.target / 2
        busy = sum(1 for r in period_rates.values() if r > 0) > 1
        if over and self.seats > 1:
            self.seats -= 1
        elif over and busy:
            self.capacity = 0.8 * (self.capacity if self.capacity is not None else total)
        elif under and self.capacity is not None:
            self.capacity *= 1.1
            if self.capacity > 2 * total:
                self.capacity = None
        elif under:
            self.seats = min(self.most, self.seats + 1)
        if not busy:
            self.capacity = None
        if self.capacity is None:
            return self.seats, None
        level = fair_level(self.rates, self.capacity)
        return self.seats, None if math.isinf(level) else level

    def _smooth(self, period_rates: Mapping[str, float]) -> None:
        for tenant in set(self.rates) | set(period_rates):
            old = self.rates.get(tenant, 0.0)
            new = old + SMOOTHING * (period_rates.get(tenant, 0.0) - old)
            if new < 0.01:
                self.rates.pop(tenant, None)
            else:
                self.rates[tenant] = new
