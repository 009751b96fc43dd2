"""The front door governed by the loop's lag (``gateway/governor.py``): the seats' number
and the shed rate after each reading, the max-min level, and what resizing does to seats
held and waiting."""

from __future__ import annotations

import math

from fairlane.gateway.seats import SeatBook, TicketState
from fairlane.policy.frontdoor import SeatGovernor, fair_level

TARGET = 0.004
OVER, UNDER, BETWEEN = 0.010, 0.001, 0.003
FLOOD = {"a": 900.0, "b": 50.0}


def test_the_fair_level_cuts_only_the_largest() -> None:
    assert math.isinf(fair_level(FLOOD, 1000.0))
    assert fair_level(FLOOD, 500.0) == 450.0
    assert fair_level({"a": 900.0, "b": 300.0, "c": 10.0}, 400.0) == 300.0  # never below b
    assert fair_level({"a": 900.0}, 100.0) == 100.0


def test_a_lagging_loop_takes_seats_away_one_at_a_time_then_sheds_the_flood() -> None:
    rule = SeatGovernor(most=4, target=TARGET)
    for _ in range(30):  # the smoothed rates settle near the readings
        rule.rates = dict(FLOOD)
    assert [rule.step(OVER, FLOOD)[0] for _ in range(3)] == [3, 2, 1]
    seats, shed = rule.step(OVER, FLOOD)
    assert seats == 1 and shed is not None and abs(shed - (0.8 * 950 - 50)) < 1e-6
    for _ in range(50):
        seats, shed = rule.step(OVER, FLOOD)
    assert shed == 50.0  # the quiet tenant's rate: it is never cut
    assert rule.step(BETWEEN, FLOOD) == (1, 50.0)  # between: nothing moves
    # one tenant alone: nobody to protect, no shed
    assert rule.step(OVER, {"a": 900.0})[1] is None


def test_a_quiet_loop_lifts_the_rate_first_then_gives_the_seats_back() -> None:
    rule = SeatGovernor(most=3, target=TARGET, seats=1, capacity=500.0, rates=dict(FLOOD))
    seats, shed = rule.step(UNDER, FLOOD)
    assert seats == 1 and shed is not None and abs(shed - (550.0 - 50.0)) < 1e-6
    sheds = [rule.step(UNDER, FLOOD)[1] for _ in range(14)]
    # no one is cut once the capacity covers the rates (550 * 1.1**6 > 950), and the
    # capacity is lifted once it is twice what the door sees (550 * 1.1**14 > 1900)
    assert sheds[4] is not None and sheds[5] is None and sheds[-1] is None
    assert rule.capacity is None
    assert [rule.step(UNDER, FLOOD)[0] for _ in range(3)] == [2, 3, 3]


def test_fewer_seats_unseat_nobody_and_more_seat_the_waiters() -> None:
    book = SeatBook(seats=2, room=10)
    a1, _ = book.ask("a")
    a2, _ = book.ask("a")
    b1, _ = book.ask("b")
    assert (a1.state, a2.state) == (TicketState.SEATED, TicketState.SEATED)
    assert b1.state is TicketState.WAITING
    assert book.resize(1) == []
    assert book.release(a1) is None  # one seat now, still held by a2: b waits on
    assert b1.state is TicketState.WAITING
    assert book.release(a2) is b1  # the one seat goes to b
    a3, _ = book.ask("a")
    assert a3.state is TicketState.WAITING
    assert book.resize(3) == [a3]
    assert book.free == 1
