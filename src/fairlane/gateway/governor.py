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

The rule itself, its steps and the fair level, is ``fairlane.policy.frontdoor``'s; this
module reads the loop and the door and applies it.
"""

from __future__ import annotations

import asyncio
from typing import Final, Protocol

from fairlane.gateway.seats import FairSeats
from fairlane.policy.frontdoor import SeatGovernor

__all__ = ["PERIOD", "ROOM_PER_SEAT", "Governed", "govern"]

#: seconds between two readings of the loop's lag
PERIOD: Final = 0.05
#: requests that may wait per seat while the seats are governed
ROOM_PER_SEAT: Final = 4


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
