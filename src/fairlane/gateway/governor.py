"""The front door governed by the event loop's lag: its seats, then a rate per tenant.

A gateway process is bound by its one event loop: every request in progress takes turns
on it, so with the loop saturated each request -- a quiet tenant's too -- waits behind
all the work that came before it. Fair seats give a quiet tenant the next seat, but the
loop it then runs on is the flood's too. So the door follows the loop's lag, read every
``PERIOD``:

1. The seats: over ``lag_target`` one fewer, under half of it one more, between one and
   the configured number. A flood then holds few seats, and the room shrinks with them
   (``ROOM_PER_SEAT``), so what cannot be served soon is answered 429 at once, to the
   tenant claiming the most.
2. At one seat and still over the target, a rate every tenant is held to (``shed``):
   started at half the submits the door saw in the last period (per second), cut by a
   fifth each period the loop still lags, grown by a tenth each period it is under half
   the target, and lifted once it is above twice what the door sees. A quiet tenant under
   the shed rate is untouched; the flood is refused with 429 ``tenant_rate``.

Additive steps for the seats (a reading of one period is noisy; halving would swing
them), multiplicative for the rate (it must fall by orders of magnitude within a second).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from fairlane.gateway.frontdoor import FrontDoor

__all__ = ["PERIOD", "ROOM_PER_SEAT", "SeatGovernor", "govern"]

#: seconds between two readings of the loop's lag
PERIOD: Final = 0.05
#: requests that may wait per seat while the seats are governed
ROOM_PER_SEAT: Final = 4
#: the shed rate's floor (submits per second per tenant)
MIN_SHED: Final = 5.0


@dataclass
class SeatGovernor:
    """The rule, without a clock: the seats and the shed rate after a reading of the
    lag (seconds) and of the submits per second the door saw."""

    most: int
    target: float
    seats: int = 0
    shed: float | None = None

    def __post_init__(self) -> None:
        self.seats = self.seats or self.most

    def step(self, lag: float, submits_per_s: float) -> tuple[int, float | None]:
        over, under = lag > self.target, lag < self.target / 2
        if over and self.seats > 1:
            self.seats -= 1
        elif over:
            base = self.shed if self.shed is not None else submits_per_s / 2
            self.shed = max(MIN_SHED, base * 0.8)
        elif under and self.shed is not None:
            self.shed *= 1.1
            if self.shed > 2 * submits_per_s:
                self.shed = None
        elif under:
            self.seats = min(self.most, self.seats + 1)
        return self.seats, self.shed


async def govern(door: FrontDoor, rule: SeatGovernor) -> None:
    """Read the loop's lag every ``PERIOD`` (how late a sleep of that long wakes) and the
    door's submits, and set its seats, room and shed rate by ``rule``; until cancelled."""
    loop = asyncio.get_running_loop()
    seats = door.seats
    room = seats.book.room
    while True:
        began, counted = loop.time(), door.submits
        await asyncio.sleep(PERIOD)
        took = loop.time() - began
        rate = (door.submits - counted) / took
        now, door.shed = rule.step(max(0.0, took - PERIOD), rate)
        if now != seats.book.seats:
            seats.resize(now)
            seats.book.room = min(room, now * ROOM_PER_SEAT)
