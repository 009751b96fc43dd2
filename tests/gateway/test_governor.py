"""The front door governed by the loop's lag (``gateway/governor.py``): the seats' number
and the shed rate after each reading, and what resizing does to seats held and waiting."""

from __future__ import annotations

from fairlane.gateway.governor import MIN_SHED, SeatGovernor
from fairlane.gateway.seats import SeatBook, TicketState

TARGET = 0.004
OVER, UNDER, BETWEEN = 0.010, 0.001, 0.003


def test_a_lagging_loop_takes_seats_away_one_at_a_time_then_sheds_the_rate() -> None:
    rule = SeatGovernor(most=4, target=TARGET)
    assert [rule.step(OVER, 800.0)[0] for _ in range(3)] == [3, 2, 1]
    assert rule.shed is None
    assert rule.step(OVER, 800.0) == (1, 400.0 * 0.8)  # half what the door saw, cut
    assert rule.step(OVER, 300.0) == (1, 400.0 * 0.8 * 0.8)
    for _ in range(100):
        rule.step(OVER, 10.0)
    assert rule.shed == MIN_SHED  # never below the floor
    # between half the target and the target: nothing moves
    assert rule.step(BETWEEN, 10.0) == (1, MIN_SHED)


def test_a_quiet_loop_lifts_the_rate_first_then_gives_the_seats_back() -> None:
    rule = SeatGovernor(most=3, target=TARGET, seats=1, shed=100.0)
    seats, shed = rule.step(UNDER, 80.0)
    assert seats == 1 and shed is not None and abs(shed - 110.0) < 1e-9
    assert rule.step(UNDER, 50.0) == (1, None)  # above twice what the door sees: lifted
    assert [rule.step(UNDER, 50.0)[0] for _ in range(3)] == [2, 3, 3]


def test_fewer_seats_unseat_nobody_and_more_seat_the_waiters() -> None:
    book = SeatBook(seats=2, room=10)
    a1, _ = book.ask("a")
    a2, _ = book.ask("a")
    b1, _ = book.ask("b")
    assert (a1.state, a2.state, b1.state) == (
        TicketState.SEATED,
        TicketState.SEATED,
        TicketState.WAITING,
    )
    assert book.resize(1) == []
    assert book.release(a1) is None  # one seat now, still held by a2: b waits on
    assert b1.state is TicketState.WAITING
    assert book.release(a2) is b1  # the one seat goes to b
    a3, _ = book.ask("a")
    assert a3.state is TicketState.WAITING
    assert book.resize(3) == [a3]
    assert book.free == 1
