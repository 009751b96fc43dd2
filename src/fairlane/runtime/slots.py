"""The slot pool one worker's shard loops share: slots held, reserved, freed, and the turn.

A worker's ``concurrency`` is its number of slots, and every shard it serves counts all
of them in its lanes' capacity; the pool is what keeps the worker itself within them
however the shards' work arrives. It owns:

- the count: slots held by running jobs (a job holds its width) and slots *reserved*
  by exchanges still under way, so that while one shard's call is out another shard's
  loop cannot count the same slots free;
- the fetch turn: the loops take turns at the pool in order of arrival (a FIFO lock),
  so when every shard has work each gets an equal part of the slots, and a shard with
  no work leaves its part to the others;
- the budget: what a turn may ask for, decided by ``policy/fetch.py`` from the count and
  the resource-pressure gauge's latest decision;
- the "slot freed" signal that wakes loops waiting for room, and a stopping worker's drain.

The pool never talks to the store and knows nothing of jobs beyond their widths.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from fairlane.policy.backpressure import Decision
from fairlane.policy.fetch import FetchPlan, SlotCount, accept_handed, plan_fetch, room
from fairlane.runtime.pressure import PressureGauge

__all__ = ["SlotPool", "SlotStats"]


@dataclass(frozen=True, slots=True)
class SlotStats:
    """A snapshot of a slot pool."""

    concurrency: int
    used: int
    reserved: int
    free: int
    waiting: int  # loops queued for the fetch turn
    turns: int  # turns granted so far


class SlotPool:
    """``concurrency`` slots shared by a worker's shard loops (see the module docstring)."""

    def __init__(
        self, concurrency: int, *, batch: int, pressure: PressureGauge | None = None
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.concurrency = concurrency
        self.batch = batch
        self.pressure = pressure
        #: set when slots may have become free (a job ended, a call took less than it
        #: reserved, pressure eased, the worker is stopping)
        self.freed = asyncio.Event()
        # above `concurrency` only briefly, after a hand-off wider than what was free
        self._used = 0
        self._reserved = 0
        self._turn = asyncio.Lock()  # FIFO: waiters are woken in order of arrival
        self._waiting = 0
        self._turns = 0

    # -- the count -------------------------------------------------------------------

    @property
    def used(self) -> int:
        """Slots held by running jobs."""
        return self._used

    @property
    def reserved(self) -> int:
        """Slots asked for by exchanges still under way."""
        return self._reserved

    def count(self) -> SlotCount:
        return SlotCount(self.concurrency, self._used, self._reserved)

    def free(self) -> int:
        return self.concurrency - self._used - self._reserved

    def room(self) -> int:
        """Slots the next call may fill: the free ones, fewer under resource pressure."""
        return room(self.count(), self._decision())

    def plan(self, *, widen: bool) -> FetchPlan:
        """What this turn asks for (``policy.fetch.plan_fetch``)."""
        return plan_fetch(self.count(), self._decision(), batch=self.batch, widen=widen)

    @property
    def holding(self) -> bool:
        """True while resource pressure lets the worker take no new work at all."""
        return self.pressure is not None and self.pressure.holding

    def _decision(self) -> Decision | None:
        return None if self.pressure is None else self.pressure.decision

    # -- taking and giving back ------------------------------------------------------

    @contextlib.contextmanager
    def reserving(self, slots: int) -> Iterator[None]:
        """Hold ``slots`` reserved for the exchange made inside the block; the jobs it
        leased are then ``occupy``-ed, and ``notify`` frees what it did not take."""
        if slots < 0:
            raise ValueError(f"cannot reserve {slots} slots")
        self._reserved += slots
        try:
            yield
        finally:
            self._reserved -= slots

    def occupy(self, width: int) -> None:
        """A job of ``width`` slots starts."""
        self._used += width

    def vacate(self, width: int) -> None:
        """A job of ``width`` slots has ended (each attempt gives back what it took)."""
        self._used -= width
        self.freed.set()

    def takes_handed(self) -> bool:
        """Whether a job an enqueue handed to an idle loop starts now (and is then
        ``occupy``-ed like any other); False: it goes back unstarted, holding nothing."""
        return accept_handed(holding=self.holding, free=self.free())

    def notify(self) -> None:
        """Wake the loops waiting for room (and a draining worker)."""
        self.freed.set()

    async def wait_freed(self, timeout: float | None = None) -> bool:
        """Wait until a slot may have been freed since this call, at most ``timeout``
        seconds (None: without limit); True if one was."""
        self.freed.clear()
        if timeout is None:
            await self.freed.wait()
            return True
        try:
            async with asyncio.timeout(timeout):
                await self.freed.wait()
        except TimeoutError:
            return False
        return True

    # -- the turn --------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """This loop's turn at the pool; loops are served in order of arrival."""
        self._waiting += 1
        try:
            await self._turn.acquire()
        finally:
            self._waiting -= 1
        self._turns += 1
        try:
            yield
        finally:
            self._turn.release()

    def turn_free(self) -> bool:
        """Whether a loop asking for the turn now would have it at once (no loop holds
        it, nor is woken to take it)."""
        return not self._turn.locked() and self._waiting == 0

    def statistics(self) -> SlotStats:
        return SlotStats(
            concurrency=self.concurrency,
            used=self._used,
            reserved=self._reserved,
            free=self.free(),
            waiting=self._waiting,
            turns=self._turns,
        )
