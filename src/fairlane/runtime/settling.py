"""Settling one shard's finished attempts: carried by the next exchange, or flushed.

The outcomes of a shard's attempts are settled on that shard, in batches. While the
shard's fetch loop is busy its next ``exchange`` carries them along (one call settles
and leases); while it is idle -- blocked on the wake lists, holding back under pressure,
or done -- the ack loop here flushes them with ``ack``. Through an outage the batch is
kept and retried with backoff until it is settled or every lease it was fenced by is
known to have ended (then the store reclaims those jobs anyway, and the outcomes are
dropped); a stopping worker's last flush also gives up at the end of its grace period.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from fairlane.codec import encode_error
from fairlane.runtime.lease import wait_or_stop
from fairlane.runtime.outage import Outage
from fairlane.runtime.shardlink import LoopSettings, WorkerLink
from fairlane.store.api import Store
from fairlane.store.wire import FetchedJob, Outcome, OutcomeKind, StoreError

__all__ = ["Settler"]

log = logging.getLogger("fairlane.worker")
#: the error a leased job gets when its row cannot be read
UNREADABLE = encode_error(
    ValueError("the job was handed to the worker in a form it cannot read; it was not executed"),
    type_name="MalformedJob",
).decode()


class Settler:
    """One shard's outcomes waiting to be settled, and the loop that flushes them."""

    def __init__(self, store: Store, settings: LoopSettings, link: WorkerLink, where: str) -> None:
        self.store = store
        self.settings = settings
        self.link = link
        self.outcomes: list[Outcome] = []
        self.flush_needed = asyncio.Event()
        # True while the fetch loop will call `exchange` soon, which carries outcomes
        # along; only an idle fetch loop leaves settling to the ack loop.
        self.carrier_active = True
        self.ack_outage = Outage(f"{where}: settling", log)
        # Every lease held on this shard ends by this time (monotonic) unless a renewal
        # or a fetch succeeds again: the time the last successful one was sent, plus
        # the lease length. Outcomes still unsent past it are dropped, as fenced.
        self.leases_end = time.monotonic() + settings.lease.duration

    def renewed(self, sent: float) -> None:
        """A renewal (or a fetch) sent at ``sent`` succeeded: the leases run from then."""
        self.leases_end = max(self.leases_end, sent + self.settings.lease.duration)

    def settle(self, outcome: Outcome) -> None:
        """Queue a finished attempt's outcome to be settled on this shard."""
        self.outcomes.append(outcome)
        if not self.carrier_active:
            self.flush_needed.set()

    def take(self) -> list[Outcome]:
        """The outcomes queued so far, for a call to carry; ``put_back`` if it fails."""
        outcomes, self.outcomes = self.outcomes, []
        return outcomes

    def put_back(self, outcomes: Sequence[Outcome]) -> None:
        self.outcomes[:0] = outcomes

    def carried(self, outcomes: Sequence[Outcome], codes: Sequence[int]) -> None:
        """An exchange settled ``outcomes`` (answered ``codes``)."""
        if outcomes and self.ack_outage.down:
            self.ack_outage.recovered()
        self.link.settled(outcomes, codes)

    def idle(self) -> None:
        """The fetch loop stops carrying: what is queued, and what comes, is flushed here."""
        self.carrier_active = False
        if self.outcomes:
            self.flush_needed.set()

    def hand_back(self, jobs: Sequence[FetchedJob]) -> None:
        if jobs:
            self.outcomes.extend(Outcome(j.id, j.token, OutcomeKind.RELEASE) for j in jobs)
            self.flush_needed.set()

    def set_aside(self, rows: Sequence[tuple[str, str]]) -> None:
        """Dead-letter leased jobs whose rows this worker cannot read, without running them."""
        log.error("dead-lettering %d job(s) this worker cannot read: %s", len(rows), rows[:5])
        self.outcomes.extend(
            Outcome(job_id, token, OutcomeKind.DEAD, UNREADABLE) for job_id, token in rows
        )

    async def ack_loop(self) -> None:
        """Settles outcomes while the fetch loop is idle (otherwise `exchange` carries them)."""
        while True:
            if await self._wait_flush_needed():
                return
            # let attempts finishing in this same loop turn join the batch
            await asyncio.sleep(0)
            if not self.carrier_active:
                await self.flush()

    async def _wait_flush_needed(self) -> bool:
        """Wait until outcomes need settling here; True when the worker has closed."""
        closed = asyncio.ensure_future(self.link.closed.wait())
        needed = asyncio.ensure_future(self.flush_needed.wait())
        try:
            await asyncio.wait({closed, needed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
            needed.cancel()
            await asyncio.gather(closed, needed, return_exceptions=True)
        self.flush_needed.clear()
        return self.link.closed.is_set()

    async def flush(self, *, final: bool = False) -> None:
        """Settle pending outcomes, retrying while the store is unreachable until they
        are settled or their leases are known to have ended; the final flush of a
        stopping worker also gives up when its grace period is over."""
        link = self.link
        while self.outcomes:
            outcomes = self.take()
            try:
                codes = await self.store.ack(self.settings.lanes, outcomes, self.settings.worker_id)
            except StoreError as exc:
                self.put_back(outcomes)
                delay = self.ack_outage.failed(exc)
                if self.drop_expired_outcomes():
                    return
                if not final:
                    # a stopping worker's last flush takes over, bounded by the grace
                    if await wait_or_stop(link.stopping, delay):
                        return
                    continue
                if link.grace_left() <= delay:
                    log.warning(
                        "worker %s: %d outcome(s) not settled by the end of the grace "
                        "period; their jobs are reclaimed when their leases expire",
                        self.settings.worker_id,
                        len(self.outcomes),
                    )
                    return
                await asyncio.sleep(delay)
                continue
            self.ack_outage.recovered()
            link.tally.ack_calls += 1
            link.settled(outcomes, codes)

    def drop_expired_outcomes(self) -> bool:
        """Drop the unsent outcomes once every lease they were fenced by has ended; the
        store would reject them (or the jobs are reclaimed and run again). True if so."""
        if not self.outcomes or time.monotonic() < self.leases_end:
            return False
        log.warning(
            "worker %s: dropping %d unsettled outcome(s): the store was unreachable until "
            "their leases ended, so their jobs are reclaimed and run again",
            self.settings.worker_id,
            len(self.outcomes),
        )
        self.outcomes.clear()
        return True
