"""One worker's service of one scheduling shard: fetching, settling, leases, sweeps.

A worker serves every shard of its app (``App(shards=n)``), one ``ShardLoop`` each.
Every shard is a whole scheduler that counts the worker's full slots in its lanes'
capacity; the worker's own slots are the one pool the loops share, so the worker
never runs more than its slots however the shards' work arrives. The loops take
turns at that pool in order of arrival (``SlotPool.turn``, ``runtime/slots.py``): when
every shard has work each gets an equal part of the worker's slots, and a shard
with no work leaves its part to the others.

Within a loop the hot path is the worker's: ``exchange`` settles the attempts that
finished since the last call and leases the next batch in one atomic step; when the
shard has no work the loop blocks on its wake lists. The outcomes of a shard's jobs
are settled on that shard, and its leases renewed and swept there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fairlane.policy.fetch import Next, Wait, after_reply, idle_timeout
from fairlane.runtime.lease import renew_loop, sweep_loop, wait_or_stop
from fairlane.runtime.outage import Outage
from fairlane.runtime.payload_sweep import payload_sweep_loop
from fairlane.store.api import Store
from fairlane.store.wire import Fetched, FetchedJob, Outcome, StoreUnavailable

if TYPE_CHECKING:
    from fairlane.runtime.worker import Worker

__all__ = ["ShardLoop"]

log = logging.getLogger("fairlane.worker")


class ShardLoop:
    """A worker's fetch loop, settling and lease upkeep on one shard's store."""

    def __init__(self, worker: Worker, store: Store) -> None:
        self.worker = worker
        self.store = store
        where = f"worker {worker.id}" + (f", shard {store.shard}" if store.shards > 1 else "")
        self.outcomes: list[Outcome] = []
        self.flush_needed = asyncio.Event()
        self.idle_waiter: asyncio.Future[FetchedJob | bool] | None = None
        # True while the fetch loop will call `exchange` soon, which carries outcomes
        # along; only an idle fetch loop leaves settling to the ack loop.
        self.carrier_active = True
        # set by an exchange that registered us idle (enqueues may hand us jobs until
        # the next exchange); a worker that starts holding back leaves the idle set first
        self.maybe_idle = False
        #: jobs of this shard running on the worker
        self.running = 0
        # While the store is unreachable: one warning per outage, jittered backoff.
        self.fetch_outage = Outage(f"{where}: fetching", log)
        self.ack_outage = Outage(f"{where}: settling", log)
        # Every lease held on this shard ends by this time (monotonic) unless a renewal
        # or a fetch succeeds again: the time the last successful one was sent, plus
        # the lease length. Outcomes still unsent past it are dropped, as fenced.
        self.leases_end = time.monotonic() + worker.lease.duration

    # -- services --------------------------------------------------------------------

    def start_services(self, services: asyncio.TaskGroup) -> None:
        """Lease renewal, reclaim sweeps, payload sweeps and settling for this shard."""
        worker = self.worker
        services.create_task(
            renew_loop(
                store=self.store,
                worker_id=worker.id,
                lease=worker.lease,
                held=self.held,
                on_lost=worker.lost,
                on_cancel=worker.cancel_requested,
                stop=worker.closed,
                on_renewed=self.renewed,
            )
        )
        services.create_task(sweep_loop(self.store, worker.lease, worker.closed))
        payloads = worker.registry.payloads
        if payloads is not None:  # removes payloads whose records are gone
            services.create_task(
                payload_sweep_loop(self.store, payloads, worker.lease.sweep_interval, worker.closed)
            )
        services.create_task(self.ack_loop())

    def held(self) -> list[tuple[str, str]]:
        return [
            (job_id, r.job.token) for job_id, r in self.worker.running.items() if r.shard is self
        ]

    def renewed(self, sent: float) -> None:
        """A renewal (or a fetch) sent at ``sent`` succeeded: the leases run from then."""
        self.leases_end = max(self.leases_end, sent + self.worker.lease.duration)

    def settle(self, outcome: Outcome) -> None:
        """Queue a finished attempt's outcome to be settled on this shard."""
        self.outcomes.append(outcome)
        if not self.carrier_active:
            self.flush_needed.set()

    # -- fetching --------------------------------------------------------------------

    async def fetch_loop(self, jobs: asyncio.TaskGroup) -> None:
        worker = self.worker
        # Capped budgets keep the worker and the server busy side by side, but a job
        # wider than the cap would never be leased: the first call, and the first
        # after each idle wait, ask for every free slot.
        widen = True
        while not worker.stopping.is_set():
            async with worker.slots.turn():
                plan = worker.slots.plan(widen=widen)
                if plan.wait is Wait.NONE:
                    fetched = await self._exchange(plan.want, jobs)
            if plan.wait is not Wait.NONE:
                await self._wait_for_room(plan.wait)
                continue
            if fetched is None:
                # the backoff is waited out here, not holding the turn: the other
                # shards (perhaps on other servers) go on meanwhile
                await wait_or_stop(worker.stopping, self.fetch_outage.delay())
                continue
            self.maybe_idle = not fetched.jobs and worker.idle_ms() > 0
            if fetched.malformed:
                self.set_aside(fetched.malformed)
            step = after_reply(
                plan,
                got_jobs=bool(fetched.jobs),
                burst=worker.burst,
                shard_busy=bool(self.running or self.outcomes),
            )
            widen = step.widen
            if step is Next.DRAINED and await worker.burst_drained(self):
                return
            if step is not Next.IDLE:
                continue
            handed = await self._idle_wait(fetched.next_due_ms)
            if handed is not None:
                self._take_handed(jobs, handed)
        self.carrier_active = False
        self.flush_needed.set()

    async def _exchange(self, want: int, jobs: asyncio.TaskGroup) -> Fetched | None:
        """Settle what finished, lease up to ``want`` slots' worth and start those jobs;
        None on an outage.

        The slots asked for are reserved while the call is out, so that another
        shard's loop of the same worker cannot count them free meanwhile."""
        worker = self.worker
        outcomes, self.outcomes = self.outcomes, []
        sent = time.monotonic()
        fetched: Fetched | None = None
        with worker.slots.reserving(want):
            try:
                fetched = await self.store.exchange(
                    worker.id,
                    worker.lanes,
                    want,
                    round(worker.lease.duration * 1000),
                    outcomes,
                    idle_ms=worker.idle_ms(),
                    slots=worker.concurrency,
                )
            except StoreUnavailable as exc:
                self.fetch_outage.failed(exc)
        if fetched is not None:
            worker.start(jobs, self, fetched.jobs)  # their slots are held from here on
        worker.slots.notify()  # what this call did not take is free for the others
        if fetched is None:
            self.outcomes[:0] = outcomes
            self.drop_expired_outcomes()
            return None
        if self.fetch_outage.down:
            self.fetch_outage.recovered()
            await worker.redeclare()
        if outcomes and self.ack_outage.down:
            self.ack_outage.recovered()  # settled here, carried by the exchange
        if fetched.jobs:
            self.renewed(sent)
        worker.fetch_calls += 1
        worker.count_settled(outcomes, fetched.ack_codes)
        return fetched

    async def _wait_for_room(self, wait: Wait) -> None:
        if wait is Wait.PRESSURE:  # slots are free, but resource pressure leaves no room
            await self._hold()
            return
        # no free slot (below 0 after a hand-off wider than what was free)
        await self.worker.slots.wait_freed()

    async def _hold(self) -> None:
        """Lease nothing while pressure leaves no room; running jobs go on and settle."""
        worker = self.worker
        assert worker.pressure is not None
        self.carrier_active = False
        try:
            if self.maybe_idle:
                # still in the idle set from before: leave it, so enqueues stop handing
                # us jobs, and hand back (unstarted, not counted) any handed meanwhile
                outcomes, self.outcomes = self.outcomes, []
                try:
                    fetched = await self.store.exchange(
                        worker.id,
                        worker.lanes,
                        0,
                        round(worker.lease.duration * 1000),
                        outcomes,
                        slots=worker.concurrency,
                    )
                except StoreUnavailable as exc:
                    self.outcomes[:0] = outcomes
                    log.debug("leaving the idle set failed (%s); retrying", exc)
                else:
                    self.maybe_idle = False
                    worker.fetch_calls += 1
                    worker.count_settled(outcomes, fetched.ack_codes)
                    self.hand_back(fetched.jobs)
            if self.outcomes:
                self.flush_needed.set()
            await worker.slots.wait_freed(worker.pressure.interval)
        finally:
            self.carrier_active = True

    def hand_back(self, jobs: Sequence[FetchedJob]) -> None:
        if jobs:
            self.outcomes.extend(Outcome(j.id, j.token, "release") for j in jobs)
            self.flush_needed.set()

    def set_aside(self, rows: Sequence[tuple[str, str]]) -> None:
        """Dead-letter leased jobs whose rows this worker cannot read, without running them."""
        log.error("dead-lettering %d job(s) this worker cannot read: %s", len(rows), rows[:5])
        self.outcomes.extend(
            Outcome(job_id, token, "dead", self.worker.unreadable) for job_id, token in rows
        )

    def _take_handed(self, jobs: asyncio.TaskGroup, handed: FetchedJob) -> None:
        """Start a job an enqueue handed to us while idle, unless we now hold back."""
        if not self.worker.slots.takes_handed():
            # holding back, or another shard's loop filled the slots this one was idle
            # with: the job goes back unstarted (not counted), leased again later
            self.hand_back([handed])
            return
        self.worker.start(jobs, self, [handed])

    async def _idle_wait(self, next_due_ms: int | None) -> FetchedJob | None:
        """Block until work arrives; returns a job an enqueue handed straight to us."""
        worker = self.worker
        timeout = idle_timeout(worker.idle_block, next_due_ms, stopping=worker.stopping.is_set())
        if timeout is None:
            return None
        self.carrier_active = False
        if self.outcomes:
            self.flush_needed.set()
        waiter = asyncio.ensure_future(
            self.store.wait_for_work(worker.lanes, timeout, worker.id if worker.idle_ms() else None)
        )
        # `stop()` cancels this wait directly: one future to wake on, not a race of two
        self.idle_waiter = waiter
        try:
            woken = await waiter
        except asyncio.CancelledError:
            if not (worker.stopping.is_set() and waiter.cancelled()):
                raise
            # A job handed over is leased to us; if the wait was cut short after the
            # server sent it, its lease expires and it is reclaimed -- never lost.
            return None
        except StoreUnavailable as exc:
            await wait_or_stop(worker.stopping, self.fetch_outage.failed(exc))
            return None
        finally:
            self.idle_waiter = None
            self.carrier_active = True
        return woken if isinstance(woken, FetchedJob) else None

    # -- settling --------------------------------------------------------------------

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
        closed = asyncio.ensure_future(self.worker.closed.wait())
        needed = asyncio.ensure_future(self.flush_needed.wait())
        try:
            await asyncio.wait({closed, needed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
            needed.cancel()
            await asyncio.gather(closed, needed, return_exceptions=True)
        self.flush_needed.clear()
        return self.worker.closed.is_set()

    async def flush(self, *, final: bool = False) -> None:
        """Settle pending outcomes, retrying while the store is unreachable until they
        are settled or their leases are known to have ended; the final flush of a
        stopping worker also gives up when its grace period is over."""
        worker = self.worker
        while self.outcomes:
            outcomes, self.outcomes = self.outcomes, []
            try:
                codes = await self.store.ack(worker.lanes, outcomes)
            except StoreUnavailable as exc:
                self.outcomes[:0] = outcomes
                delay = self.ack_outage.failed(exc)
                if self.drop_expired_outcomes():
                    return
                if not final:
                    # a stopping worker's last flush takes over, bounded by the grace
                    if await wait_or_stop(worker.stopping, delay):
                        return
                    continue
                if worker.grace_left() <= delay:
                    log.warning(
                        "worker %s: %d outcome(s) not settled by the end of the grace "
                        "period; their jobs are reclaimed when their leases expire",
                        worker.id,
                        len(self.outcomes),
                    )
                    return
                await asyncio.sleep(delay)
                continue
            self.ack_outage.recovered()
            worker.ack_calls += 1
            worker.count_settled(outcomes, codes)

    def drop_expired_outcomes(self) -> bool:
        """Drop the unsent outcomes once every lease they were fenced by has ended; the
        store would reject them (or the jobs are reclaimed and run again). True if so."""
        if not self.outcomes or time.monotonic() < self.leases_end:
            return False
        log.warning(
            "worker %s: dropping %d unsettled outcome(s): the store was unreachable until "
            "their leases ended, so their jobs are reclaimed and run again",
            self.worker.id,
            len(self.outcomes),
        )
        self.outcomes.clear()
        return True

    async def leave(self) -> None:
        """Stop being handed jobs, and hand back any that reached the inbox meanwhile;
        skipped while the store is unreachable (what it would hand back is reclaimed
        when its lease expires)."""
        if self.ack_outage.down:
            return
        worker = self.worker
        lease_ms = round(worker.lease.duration * 1000)
        try:
            handed = await self.store.leave(worker.id, lease_ms, worker.lanes)
            if handed:
                log.info("handing back %d job(s) given while stopping", len(handed))
                await self.store.ack(
                    worker.lanes, [Outcome(j.id, j.token, "release") for j in handed]
                )
        except StoreUnavailable as exc:
            log.warning(
                "could not hand back jobs given while stopping (they will be "
                "reclaimed when their leases expire): %s",
                exc,
            )

    def cancel_idle_wait(self) -> None:
        if self.idle_waiter is not None:
            self.idle_waiter.cancel()
