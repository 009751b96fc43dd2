"""The front door's seats (``fairlane.gateway.seats``): who gets a seat given back, who
is refused when the waiting room is full, and how a waiter stops waiting. Pure: the
book's rules without a clock, then ``FairSeats`` on an event loop; no server."""

from __future__ import annotations

import asyncio

import pytest

from fairlane.gateway.seats import FairSeats, Seat, SeatBook, Ticket, TicketState

SEATED, WAITING, REFUSED, DONE = (
    TicketState.SEATED,
    TicketState.WAITING,
    TicketState.REFUSED,
    TicketState.DONE,
)


def _ask(book: SeatBook, flow: str) -> Ticket:
    ticket, refused = book.ask(flow)
    assert refused is None, refused
    return ticket


def test_a_free_seat_is_taken_at_once_and_the_rest_wait() -> None:
    book = SeatBook(seats=2, room=5)
    a1, a2, a3 = (_ask(book, "a") for _ in range(3))
    assert [t.state for t in (a1, a2, a3)] == [SEATED, SEATED, WAITING]
    assert (book.free, book.waiting, book.claim("a")) == (0, 1, 3)
    assert book.release(a1) is a3 and a3.state is SEATED
    assert book.release(a2) is None and book.free == 1
    assert book.release(a3) is None and (book.free, book.held) == (2, {})


def test_a_seat_given_back_goes_to_the_flow_holding_the_fewest() -> None:
    book = SeatBook(seats=3, room=10)
    a = [_ask(book, "a") for _ in range(3)]  # a holds every seat
    a_waiting = [_ask(book, "a") for _ in range(3)]
    b1, b2 = _ask(book, "b"), _ask(book, "b")
    c1 = _ask(book, "c")
    # b and c came after a's waiters, yet each holds none: they are seated first, the
    # older head (b) before c, then a flow holding one (b) waits while c holds none
    assert book.release(a[0]) is b1
    assert book.release(a[1]) is c1
    assert book.release(a[2]) is a_waiting[0]  # a, b, c hold one each: a's head is oldest
    assert book.release(b1) is b2
    assert [t.state for t in a_waiting] == [SEATED, WAITING, WAITING]
    assert book.held == {"a": 1, "b": 1, "c": 1}


def test_a_full_room_refuses_a_waiter_of_the_largest_claim() -> None:
    book = SeatBook(seats=2, room=3)
    for _ in range(2):
        _ask(book, "a")
    a3, a4, a5 = (_ask(book, "a") for _ in range(3))  # the room is full: a claims 5
    b1, refused = book.ask("b")
    # b claims nothing yet: a's newest waiter makes room for it
    assert refused is a5 and a5.state is REFUSED and b1.state is WAITING
    assert list(book.lines["a"]) == [a3, a4] and book.waiting == 3
    # a newcomer of the flow with the largest claim is itself refused
    a6, refused = book.ask("a")
    assert refused is a6 and a6.state is REFUSED and book.waiting == 3
    b2, refused = book.ask("b")  # b claims 1 (+1), a 4: a loses another
    assert refused is a4 and b2.state is WAITING
    # b now claims 2, a 3: the next b would tie with a, and a tie refuses the newcomer
    b3, refused = book.ask("b")
    assert refused is b3 and b3.state is REFUSED


def test_without_a_room_a_request_finding_no_seat_is_refused() -> None:
    book = SeatBook(seats=1, room=0)
    seated = _ask(book, "a")
    b, refused = book.ask("b")
    assert refused is b and b.state is REFUSED
    book.release(seated)
    assert _ask(book, "b").state is SEATED


def test_a_waiter_that_leaves_is_out_of_line() -> None:
    book = SeatBook(seats=1, room=4)
    seated = _ask(book, "a")
    a2, b1 = _ask(book, "a"), _ask(book, "b")
    book.leave(b1)
    assert b1.state is DONE and "b" not in book.lines and book.waiting == 1
    assert book.release(seated) is a2
    with pytest.raises(ValueError, match="not waiting"):
        book.leave(a2)
    with pytest.raises(ValueError, match="not seated"):
        book.release(b1)


def test_no_seats_is_refused() -> None:
    with pytest.raises(ValueError, match="one seat or more, room >= 0"):
        SeatBook(seats=0, room=1)


async def _one_seat_held(room: int, wait: float) -> tuple[FairSeats, Seat]:
    """One seat, held by a request of flow ``a``."""
    seats = FairSeats(1, room, wait)
    held = await seats.take("a")
    assert held is not None
    return seats, held


@pytest.mark.anyio
async def test_a_waiter_is_seated_when_a_seat_comes_back() -> None:
    seats, first = await _one_seat_held(4, wait=5.0)
    waiting = asyncio.create_task(seats.take("b"))
    await asyncio.sleep(0)
    assert not waiting.done() and seats.book.waiting == 1
    first.give_back()
    second = await waiting
    assert second is not None and second.ticket.flow == "b"
    first.give_back()  # again: nothing more happens
    second.give_back()
    assert (seats.book.free, seats.book.held) == (1, {})


@pytest.mark.anyio
async def test_a_wait_that_runs_out_is_refused_and_leaves_the_line() -> None:
    seats, held = await _one_seat_held(4, wait=0.05)
    assert await seats.take("b") is None
    assert seats.book.waiting == 0 and not seats.book.lines
    held.give_back()
    assert seats.book.free == 1


@pytest.mark.anyio
async def test_a_waiter_refused_to_make_room_is_answered_at_once() -> None:
    seats, held = await _one_seat_held(1, wait=30.0)
    a_waiting = asyncio.create_task(seats.take("a"))
    await asyncio.sleep(0)
    b_waiting = asyncio.create_task(seats.take("b"))
    assert await a_waiting is None  # not after its 30 s: b took its place
    held.give_back()
    b_seat = await b_waiting
    assert b_seat is not None and b_seat.ticket.flow == "b"


@pytest.mark.anyio
async def test_a_cancelled_waiter_leaves_the_line() -> None:
    seats, held = await _one_seat_held(4, wait=30.0)
    waiting = asyncio.create_task(seats.take("b"))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert seats.book.waiting == 0
    held.give_back()
    assert seats.book.free == 1
