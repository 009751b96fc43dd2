"""The slot pool one worker's shard loops share: slots held, reserved, freed, and the turn.

A worker's ``concurrency`` is its number of slots, and every shard it serves counts all
of them in its lanes' capacity; the pool is what keeps the worker itself within them
however the shards' work arrives. It owns:

- the count: slots held by running jobs (a job holds its width) and slots *reserved*
  by exchanges still under way, so that while one shard's call is out another shard's
  loop cannot count the same slots free;
- the fetch turn, weighted: each shard's loop tells the pool its shard's *waiting
  weight* (the weights of the tenants with work waiting there, from every exchange's
  reply). Loops waiting for the turn are served lowest ``used / weight`` first, and while
  other shards with waiting weight contend, a turn asks for no more than its shard's
  part of the slots (``policy/shardshare.py`` derives the parts and the bound they give
  a tenant's share of the fleet). A shard with nothing waiting, or whose loop waits on
  its wake lists, has no part: its slots are the others' at once;
- the budget: what a turn may ask for, decided by ``policy/fetch.py`` from the count and
  the resource-pressure gauge's latest decision;
- the "slot freed" signal that wakes loops waiting for room, and a stopping worker's drain.

The pool never talks to the store and knows nothing of jobs beyond their widths.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import msgspec

from fairlane.policy.backpressure import Decision
from fairlane.policy.fetch import (
    FetchPlan,
    SlotCount,
    accept_handed,
    plan_fetch,
    room,
    within_share,
)
from fairlane.policy.shardshare import ShardShare, cap, turn_key
from fairlane.runtime.pressure import PressureGauge

__all__ = ["SlotPool", "SlotStats"]


class SlotStats(msgspec.Struct, frozen=True):
    """A snapshot of a slot pool."""

    concurrency: int
    used: int
    reserved: int
    free: int
    waiting: int  # loops queued for the fetch turn
    turns: int  # turns granted so far
    # each shard's standing, in the order the shards first took a turn
    shares: tuple[ShardShare, ...] = ()


class _Standing(msgspec.Struct):
    """What the pool knows of one shard: its waiting weight, slots held, and whether its
    loop is fetching."""

    weight: float = 0.0
    used: int = 0
    contending: bool = False

    def share(self) -> ShardShare:
        return ShardShare(self.weight, self.used, self.contending)


@dataclass(slots=True)
class _Waiter:
    shard: object | None
    order: int
    granted: asyncio.Future[None] = field(repr=False)


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
        self._held = False  # a loop holds the turn, or is woken to take it
        self._queue: list[_Waiter] = []
        self._arrivals = itertools.count()
        self._shards: dict[object, _Standing] = {}
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

    def plan(self, *, widen: bool, shard: object | None = None) -> FetchPlan:
        """What this turn asks for (``policy.fetch.plan_fetch``), held to ``shard``'s part
        while other shards wait for theirs (``policy.shardshare.cap``)."""
        plan = plan_fetch(self.count(), self._decision(), batch=self.batch, widen=widen)
        if shard is None or len(self._shards) < 2:
            return plan
        shares = {k: st.share() for k, st in self._shards.items()}
        return within_share(plan, cap(self.concurrency, shares, shard))

    # -- the shards' standing --------------------------------------------------------

    def _standing(self, shard: object) -> _Standing:
        standing = self._shards.get(shard)
        if standing is None:
            standing = self._shards[shard] = _Standing()
        return standing

    def weigh(self, shard: object, waiting: float | None) -> None:
        """``shard``'s waiting weight, as its last exchange's reply gave it (None: that
        exchange made no fetch, the weight known before stands)."""
        if waiting is not None:
            self._standing(shard).weight = waiting

    def rest(self, shard: object) -> None:
        """``shard``'s loop waits on its wake lists (or has stopped): it leaves its part
        to the others, and the loops held to theirs look again."""
        standing = self._shards.get(shard)
        if standing is not None and standing.contending:
            standing.contending = False
            self.notify()

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

    def occupy(self, width: int, shard: object | None = None) -> None:
        """A job of ``width`` slots (leased from ``shard``) starts."""
        self._used += width
        if shard is not None:
            self._standing(shard).used += width

    def vacate(self, width: int, shard: object | None = None) -> None:
        """A job of ``width`` slots (leased from ``shard``) has ended (each attempt gives
        back what it took)."""
        self._used -= width
        if shard is not None:
            self._standing(shard).used -= width
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
    async def turn(self, shard: object | None = None) -> AsyncIterator[None]:
        """This loop's turn at the pool. Waiting loops are served lowest ``used / weight``
        of their shards first (``policy.shardshare.turn_key``), in order of arrival
        among equals (and among loops that name no shard)."""
        if shard is not None:
            self._standing(shard).contending = True
        self._waiting += 1
        try:
            await self._acquire(shard)
        finally:
            self._waiting -= 1
        self._turns += 1
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, shard: object | None) -> None:
        if not self._held and not self._queue:
            self._held = True
            return
        waiter = _Waiter(shard, next(self._arrivals), asyncio.get_running_loop().create_future())
        self._queue.append(waiter)
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter in self._queue:
                self._queue.remove(waiter)
            elif waiter.granted.done() and not waiter.granted.cancelled():
                self._release()  # granted, then cancelled before it ran: pass it on
            raise

    def _release(self) -> None:
        """Hand the turn to the waiting loop whose shard is furthest below its part."""
        # a loop cancelled while it waited is gone already, though its task has not yet
        # run to take itself out of the queue
        self._queue = [w for w in self._queue if not w.granted.done()]
        if not self._queue:
            self._held = False
            return
        chosen = min(self._queue, key=self._rank)
        self._queue.remove(chosen)
        chosen.granted.set_result(None)  # the turn stays held: it is the chosen one's

    def _rank(self, waiter: _Waiter) -> tuple[float, int]:
        standing = None if waiter.shard is None else self._shards.get(waiter.shard)
        key = 0.0 if standing is None else turn_key(standing.share())
        return key, waiter.order

    def turn_free(self) -> bool:
        """Whether a loop asking for the turn now would have it at once (no loop holds
        it, nor is woken to take it)."""
        return not self._held and self._waiting == 0

    def statistics(self) -> SlotStats:
        return SlotStats(
            concurrency=self.concurrency,
            used=self._used,
            reserved=self._reserved,
            free=self.free(),
            waiting=self._waiting,
            turns=self._turns,
            shares=tuple(st.share() for st in self._shards.values()),
        )
