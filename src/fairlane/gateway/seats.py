"""Seats: how many tenants' requests use the store at once, and who waits for the next.

A gateway process has ``connection.max_connections`` connections to the store, and its
call gate (``fairlane.store.gate``) lets callers wait for them first come first served:
a tenant that floods the gateway fills the gate's queue, and every other tenant's
request waits behind it. The seats sit in front: a tenant's request takes one for as
long as it uses the store, and there are no more seats than connections, so the gate
never makes a seated request wait.

Rules (``SeatBook``, pure; ``FairSeats`` runs it on the event loop):

* **Take.** A seat is free and nobody waits: the request is seated at once.
* **Wait.** Else it waits, in its flow's line (a flow is a tenant; the admin and the
  keys not read yet are a flow each), if the waiting room has space.
* **Next.** A seat given back goes to the head of the line of the flow that holds the
  fewest seats; among those, the line whose head came first. A flow that holds many
  seats waits until every flow holding fewer is served: seats are shared max-min fairly
  between the flows that want them, as Kubernetes' API priority and fairness shares
  its seats between flows, here with every request costing one seat.
* **Full room.** A request that finds the waiting room full makes room: the flow with
  the largest claim (seats held plus requests waiting, the newcomer counted in its own)
  loses its newest waiter, who is refused. On a tie the newcomer is refused, so a
  request never displaces one of a flow that claims no more than its own.
* **Bounded wait.** A waiter still unseated after ``wait`` seconds gives up, refused.

A flow that holds nothing and sends one request is seated after at most one seat is
given back, whatever other flows have waiting: its claim is the smallest there is.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

from fairlane.store.gate import raise_if_cancelling

__all__ = ["FairSeats", "Seat", "SeatBook", "Ticket", "TicketState"]


class TicketState(enum.Enum):
    WAITING = "waiting"
    SEATED = "seated"
    REFUSED = "refused"
    DONE = "done"


@dataclass(eq=False, slots=True)
class Ticket:
    """One request's place: waiting, seated, refused, or done (seat given back, or it
    gave up waiting)."""

    flow: Hashable
    seq: int
    state: TicketState = TicketState.WAITING

    @property
    def seated(self) -> bool:
        return self.state is TicketState.SEATED


@dataclass
class SeatBook:
    """The seats' state and rules, without a clock or an event loop."""

    seats: int
    room: int
    free: int = field(init=False)
    held: dict[Hashable, int] = field(default_factory=dict)
    lines: dict[Hashable, deque[Ticket]] = field(default_factory=dict)
    waiting: int = 0
    _seq: int = 0

    def __post_init__(self) -> None:
        if self.seats < 1 or self.room < 0:
            raise ValueError(f"one seat or more, room >= 0: got {self.seats}, {self.room}")
        self.free = self.seats

    def ask(self, flow: Hashable) -> tuple[Ticket, Ticket | None]:
        """A ticket for a request of ``flow`` (seated, waiting or refused), and the
        waiter refused to make room for it, if one was (the new ticket itself, refused,
        when its own flow claims the most)."""
        self._seq += 1
        ticket = Ticket(flow, self._seq)
        if self.free > 0 and self.waiting == 0:
            self.free -= 1
            self._seat(ticket)
            return ticket, None
        if self.waiting >= self.room:
            victim = self._largest_claim(flow)
            if victim == flow or victim is None:
                ticket.state = TicketState.REFUSED
                return ticket, ticket
            refused = self._pop(victim, newest=True)
            refused.state = TicketState.REFUSED
            self._line(ticket)
            return ticket, refused
        self._line(ticket)
        return ticket, None

    def release(self, ticket: Ticket) -> Ticket | None:
        """Give back ``ticket``'s seat; the ticket seated in its place, if one waited (and
        the seats are not over their number, which ``resize`` may have lowered)."""
        if ticket.state is not TicketState.SEATED:
            raise ValueError(f"not seated: {ticket}")
        ticket.state = TicketState.DONE
        held = self.held[ticket.flow] - 1
        if held:
            self.held[ticket.flow] = held
        else:
            del self.held[ticket.flow]
        if not self.waiting or self.free < 0:
            self.free += 1
            return None
        nxt = self._pop(self._fewest_held(), newest=False)
        self._seat(nxt)
        return nxt

    def resize(self, seats: int) -> list[Ticket]:
        """Make the seats ``seats``: fewer take effect as seats are given back (nobody is
        unseated), more seat waiters at once; returns the tickets seated now."""
        if seats < 1:
            raise ValueError(f"one seat or more: got {seats}")
        self.free += seats - self.seats
        self.seats = seats
        seated = []
        while self.free > 0 and self.waiting:
            self.free -= 1
            nxt = self._pop(self._fewest_held(), newest=False)
            self._seat(nxt)
            seated.append(nxt)
        return seated

    def leave(self, ticket: Ticket) -> None:
        """A waiter gives up (its wait ran out, or its request went away)."""
        if ticket.state is not TicketState.WAITING:
            raise ValueError(f"not waiting: {ticket}")
        line = self.lines[ticket.flow]
        line.remove(ticket)
        self.waiting -= 1
        if not line:
            del self.lines[ticket.flow]
        ticket.state = TicketState.DONE

    def claim(self, flow: Hashable) -> int:
        """Seats ``flow`` holds plus its requests waiting."""
        line = self.lines.get(flow)
        return self.held.get(flow, 0) + (len(line) if line else 0)

    # -- the steps ------------------------------------------------------------------------

    def _seat(self, ticket: Ticket) -> None:
        ticket.state = TicketState.SEATED
        self.held[ticket.flow] = self.held.get(ticket.flow, 0) + 1

    def _line(self, ticket: Ticket) -> None:
        self.lines.setdefault(ticket.flow, deque()).append(ticket)
        self.waiting += 1

    def _pop(self, flow: Hashable, *, newest: bool) -> Ticket:
        line = self.lines[flow]
        ticket = line.pop() if newest else line.popleft()
        self.waiting -= 1
        if not line:
            del self.lines[flow]
        return ticket

    def _fewest_held(self) -> Hashable:
        return min(self.lines, key=lambda f: (self.held.get(f, 0), self.lines[f][0].seq))

    def _largest_claim(self, newcomer: Hashable) -> Hashable | None:
        """The flow that loses a waiter to make room: the newcomer's on a tie, and None
        when no flow waits (a room of none)."""
        if not self.lines:
            return None
        others = max(self.lines, key=lambda f: (self.claim(f), self.lines[f][-1].seq))
        if self.claim(newcomer) + 1 >= self.claim(others):
            return newcomer
        return others


class Seat:
    """A seat held by a request; ``give_back`` is idempotent."""

    def __init__(self, seats: FairSeats, ticket: Ticket) -> None:
        self._seats = seats
        self.ticket = ticket

    def give_back(self) -> None:
        if self.ticket.state is TicketState.SEATED:
            self._seats.hand_over(self.ticket)


class FairSeats:
    """``SeatBook`` on the event loop: ``take`` waits for a seat, at most ``wait`` seconds."""

    def __init__(self, seats: int, room: int, wait: float) -> None:
        self.book = SeatBook(seats, room)
        self.wait = wait
        self._waiters: dict[Ticket, asyncio.Future[None]] = {}

    async def take(self, flow: Hashable) -> Seat | None:
        """A seat for a request of ``flow``, or None if it is refused one (the room was
        full and its flow claims the most, or it waited ``wait`` seconds)."""
        ticket, refused = self.book.ask(flow)
        if refused is not None and refused is not ticket:
            self._wake(refused)
        if ticket.state is TicketState.SEATED:
            return Seat(self, ticket)
        if ticket.state is TicketState.REFUSED:
            return None
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = waiter
        try:
            try:
                async with asyncio.timeout(self.wait):
                    await waiter
            except TimeoutError:
                raise_if_cancelling()  # a cancel that came with the deadline wins
        except BaseException:
            self._abandon(ticket)
            raise
        finally:
            self._waiters.pop(ticket, None)
        if ticket.seated:  # woken, or seated in the turn its wait ran out
            return Seat(self, ticket)
        self._abandon(ticket)
        return None

    def resize(self, seats: int) -> None:
        """Make the seats ``seats`` (``SeatBook.resize``), waking whoever is seated now."""
        for ticket in self.book.resize(seats):
            self._wake(ticket)

    def hand_over(self, ticket: Ticket) -> None:
        """Give back ``ticket``'s seat, waking the waiter it goes to."""
        nxt = self.book.release(ticket)
        if nxt is not None:
            self._wake(nxt)

    def _wake(self, ticket: Ticket) -> None:
        waiter = self._waiters.get(ticket)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _abandon(self, ticket: Ticket) -> None:
        """A waiter that stops waiting: out of line, or its seat passed on if it was
        seated in the same turn of the loop as it stopped."""
        if ticket.state is TicketState.WAITING:
            self.book.leave(ticket)
        elif ticket.state is TicketState.SEATED:
            self.hand_over(ticket)
