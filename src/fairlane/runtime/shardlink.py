"""What a worker hands each of its shard loops in place of itself.

A ``ShardLoop`` (``runtime/shardloop.py``) serves one shard for one worker; it is not
given the worker, only the parts it uses, each defined here or beside it:

- ``LoopSettings``: who the loop fetches for and how (the worker's id, lanes and size,
  the lease, the idle block, burst mode, the payload store to sweep, the tenant sweep's
  settings);
- ``WorkerLink``: the worker's side -- its stopping and closed signals, the counters
  every loop adds to (``Tally``), the burst's end the loops agree on (``BurstWatch``),
  and the calls back it answers: outcomes settled, declarations to record again after
  an outage, and what is left of a stopping worker's grace;
- the slots (``runtime/slots.py``) and the running attempts (``runtime/attempts.py``),
  which the loops share with the worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from fairlane.config.settings import LeaseSettings, TenantSettings
from fairlane.payloads.offload import Payloads
from fairlane.runtime.lease import wait_or_stop
from fairlane.store.wire import Outcome

__all__ = ["BurstWatch", "LoopSettings", "Tally", "WorkerLink"]

log = logging.getLogger("fairlane.worker")
_BURST_RECHECK = 0.05  # seconds an empty shard's loop waits for the others in burst mode


class LoopSettings(msgspec.Struct, frozen=True):
    """Who a shard loop fetches for, and how: the same for every shard of a worker."""

    worker_id: str
    lanes: list[str]
    concurrency: int
    lease: LeaseSettings
    idle_block: float
    burst: bool = False
    payloads: Payloads | None = None  # whose sweep removes payloads of records gone
    # the tenant sweep's ttl and pace
    tenants: TenantSettings = msgspec.field(default_factory=TenantSettings)

    @property
    def lease_ms(self) -> int:
        return round(self.lease.duration * 1000)


class Tally(msgspec.Struct):
    """A worker's counters, added to by its shard loops and its attempts."""

    fetched: int = 0
    settled: int = 0
    fenced: int = 0  # late writes: the job's lease had passed to another worker
    #: server calls: exchanges (each settles and leases) and acks (settling alone)
    fetch_calls: int = 0
    ack_calls: int = 0

    def count_settled(self, outcomes: Sequence[Outcome], codes: Sequence[int]) -> None:
        """Count what the server settled; a code of 0 is a late write it rejected."""
        stale = sum(1 for c in codes if c == 0)
        self.settled += len(outcomes) - stale
        if stale:
            self.fenced += stale
            log.warning(
                "%d late write(s) rejected: their lease had passed to another worker", stale
            )


class BurstWatch:
    """In burst mode the worker is done once every one of its ``loops`` has found its
    shard empty at the same time, and ``settle`` (when given) answers that nothing is
    left elsewhere: jobs parked on a global key wait for their shard's part, which only
    the balancer's next pass gives (``KeyBalancer.quiet``). A pass that answers so may
    itself have put jobs back in their queues (the parts it gave woke them) after the
    loops looked: so once it has, every loop looks once more, and the worker is done
    when they all find their shard empty again."""

    def __init__(self, loops: int, settle: Callable[[], Awaitable[bool]] | None = None) -> None:
        self.loops = loops
        self.settle = settle
        self._empty: set[object] = set()
        self._over = asyncio.Event()
        self._settled = False  # a quiet pass came after the loops' last look

    async def drained(self, loop: object) -> bool:
        """``loop`` found nothing to do: True once every loop has (the worker is done),
        else after a short wait, so that the loop looks again -- work may still come to
        an empty shard from the others' retries or workflows."""
        self._empty.add(loop)
        if len(self._empty) == self.loops:
            if self.settle is None or self._settled:
                self._over.set()
            elif await self.settle():
                self._settled = True
                self._empty.clear()  # every loop looks again, after the pass
        over = await wait_or_stop(self._over, _BURST_RECHECK)
        self._empty.discard(loop)
        return over

    def busy(self) -> None:
        """A loop found work: a quiet pass before it no longer says the worker is done."""
        self._settled = False


class WorkerLink(msgspec.Struct, frozen=True):
    """The worker's side of its shard loops (see the module docstring)."""

    stopping: asyncio.Event
    closed: asyncio.Event
    tally: Tally
    burst: BurstWatch
    #: told of every settled batch before it is counted (the worker's hooks)
    on_settled: Callable[[Sequence[Outcome], Sequence[int]], None]
    #: records tasks and lanes again; a failure is left to the next exchange
    redeclare: Callable[[], Awaitable[None]]
    #: seconds left of a stopping worker's grace period
    grace_left: Callable[[], float]

    def settled(self, outcomes: Sequence[Outcome], codes: Sequence[int]) -> None:
        self.on_settled(outcomes, codes)
        self.tally.count_settled(outcomes, codes)
