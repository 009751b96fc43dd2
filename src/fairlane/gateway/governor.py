"""The front door governed by the event loop's lag: its seats, then a rate per tenant.

A gateway process is bound by its one event loop: every request in progress takes turns
on it, so each step of a quiet tenant's request waits behind a step of every other
request in progress. Fair seats give a quiet tenant the next seat, but the loop it then
runs on is the flood's too. So the door follows the loop's lag, read every ``PERIOD``:

1. The seats: over ``lag_target`` one fewer, under half of it one more, between one and
   the configured number. A flood then holds few seats, and the room shrinks with them
   (``ROOM_PER_SEAT``), so what cannot be served soon is answered 429 at once, to the
   tenant claiming the most.
2. At one seat and still over the target, with two tenants or more submitting: a rate
   every tenant is held to (``shed``), the max-min fair level of a capacity that is cut
   by a fifth each period the loop still lags (from what the door saw) and grown by a
   tenth each period it is under half the target. The level never falls below the
   second-largest tenant's rate, so only the largest is cut, and a quiet tenant is never
   refused for the flood's sake. It is lifted once the capacity is twice what the door
   sees, or when one tenant alone submits (there is nobody to protect).

Tenants' rates are smoothed over about half a second (``SMOOTHING`` per period). Additive
steps for the seats (a reading of one period is noisy; halving would swing them),
multiplicative for the capacity (it must fall by orders of magnitude within a second).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from fairlane.gateway.seats import FairSeats

__all__ = [
    "PERIOD",
    "ROOM_PER_SEAT",
    "SMOOTHING",
    "Governed",
    "SeatGovernor",
    "fair_level",
    "govern",
]

#: seconds between two readings of the loop's lag
PERIOD: Final = 0.05
#: requests that may wait per seat while the seats are governed
ROOM_PER_SEAT: Final = 4
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


class Governed(Protocol):
    """What the governor reads and sets of the door."""

    seats: FairSeats
    submits: dict[str, int]  # by tenant since the last reading; the governor empties it
    shed: float | None


async def govern(door: Governed, rule: SeatGovernor) -> None:
    """Read the loop's lag every ``PERIOD`` (how late a sleep of that long wakes) and the
    door's submits by tenant, and set its seats, room and shed rate by ``rule``; until
    cancelled."""
    loop = asyncio.get_running_loop()
    seats = door.seats
    room = seats.book.room
    while True:
        began = loop.time()
        await asyncio.sleep(PERIOD)
        took = loop.time() - began
        counted, door.submits = door.submits, {}
        rates = {tenant: n / took for tenant, n in counted.items()}
        now, door.shed = rule.step(max(0.0, took - PERIOD), rates)
        if now != seats.book.seats:
            seats.resize(now)
            seats.book.room = min(room, now * ROOM_PER_SEAT)
