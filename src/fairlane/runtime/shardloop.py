"""One worker's service of one scheduling shard: fetching, settling, leases, sweeps.

A worker serves every shard of its app (``App(shards=n)``), one ``ShardLoop`` each.
Every shard is a whole scheduler that counts the worker's full slots in its lanes'
capacity; the worker's own slots are the one pool the loops share, so the worker
never runs more than its slots however the shards' work arrives. The loops take
turns at that pool (``SlotPool.turn``, ``runtime/slots.py``), each recording the waiting
weight its shard's replies carry: when several shards have work each gets the part of
the worker's slots its waiting weight gives it (``policy/shardshare.py``), and a shard
with no work, or whose loop waits on its wake lists, leaves its part to the others.
What each turn asks for, and what the loop does after the reply, is decided by
``policy/fetch.py``.

Within a loop the hot path is the worker's: ``exchange`` settles the attempts that
finished since the last call and leases the next batch in one atomic step; when the
shard has no work the loop blocks on its wake lists. The jobs a reply leased hold their
slots at once, but while the loop asks again at once their tasks are made just after
the next exchange is sent, not before: the server prepares the next batch meanwhile
instead of waiting on the worker. A job handed to the loop while it was idle starts
before anything else is sent. The outcomes of a shard's jobs are settled on that shard
(``runtime/settling.py``), and its leases renewed and swept there. A loop is given the
parts of its worker it uses (``runtime/shardlink.py``), never the worker itself.
"""

from __future__ import annotations

import asyncio
import logging
import time

from fairlane.policy.fetch import (
    FetchPlan,
    Next,
    Wait,
    after_reply,
    idle_registration_ms,
    idle_timeout,
)
from fairlane.runtime.attempts import Attempts
from fairlane.runtime.deadlines import ServerClock
from fairlane.runtime.lease import renew_loop, sweep_loop, wait_or_stop
from fairlane.runtime.outage import Outage
from fairlane.runtime.payload_sweep import payload_sweep_loop
from fairlane.runtime.settling import Settler
from fairlane.runtime.shardlink import LoopSettings, WorkerLink
from fairlane.runtime.slots import SlotPool
from fairlane.runtime.tenant_sweep import TenantSweeper
from fairlane.store.api import Store
from fairlane.store.wire import Fetched, FetchedJob, Outcome, OutcomeKind, StoreError

__all__ = ["ShardLoop"]

#: The server's clock tick at its default hz (10): how late it may end a blocked read.
SERVER_TICK = 0.1

log = logging.getLogger("fairlane.worker")


class ShardLoop:
    """A worker's fetch loop, settling and lease upkeep on one shard's store."""

    def __init__(
        self,
        store: Store,
        settings: LoopSettings,
        slots: SlotPool,
        attempts: Attempts,
        link: WorkerLink,
    ) -> None:
        self.store = store
        self.settings = settings
        self.slots = slots
        self.attempts = attempts
        self.link = link
        where = f"worker {settings.worker_id}" + (
            f", shard {store.shard}" if store.shards > 1 else ""
        )
        self.settler = Settler(store, settings, link, where)
        self.idle_waiter: asyncio.Future[FetchedJob | bool] | None = None
        # set by an exchange that registered us idle (enqueues may hand us jobs until
        # the next exchange); a worker that starts holding back leaves the idle set first
        self.maybe_idle = False
        #: jobs of this shard running on the worker
        self.running = 0
        #: the shard's server's clock, on which its jobs' deadlines are
        self.clock = ServerClock()
        # While the store is unreachable: one warning per outage, jittered backoff.
        self.fetch_outage = Outage(f"{where}: fetching", log)

    # -- services --------------------------------------------------------------------

    def start_services(self, services: asyncio.TaskGroup) -> None:
        """Lease renewal, reclaim, payload and tenant sweeps, settling and reading the
        server's clock (its jobs' deadlines are on it) for this shard."""
        settings, closed = self.settings, self.link.closed
        services.create_task(
            renew_loop(
                store=self.store,
                worker_id=settings.worker_id,
                lease=settings.lease,
                held=self.held,
                on_lost=self.attempts.lost,
                on_cancel=self.attempts.cancel_requested,
                stop=closed,
                on_renewed=self.settler.renewed,
            )
        )
        services.create_task(sweep_loop(self.store, settings.lease, closed))
        payloads = settings.payloads
        if payloads is not None:  # removes payloads whose records are gone
            services.create_task(
                payload_sweep_loop(self.store, payloads, settings.lease.sweep_interval, closed)
            )
        services.create_task(TenantSweeper(self.store, settings.tenants).run(closed))
        services.create_task(self.clock.keep(self.store.server_time_ms, closed))
        services.create_task(self.settler.ack_loop())

    def held(self) -> list[tuple[str, str]]:
        return self.attempts.held(self)

    def live_until(self) -> float:
        """Until when (monotonic) the worker's leases in this shard can be live: a lease
        after the last renewal or fetch that got through. Read by the beat thread."""
        return self.settler.leases_end

    def settle(self, outcome: Outcome) -> None:
        """Queue a finished attempt's outcome to be settled on this shard."""
        self.settler.settle(outcome)

    def idle_ms(self) -> int:
        """How long to stay registered idle if given nothing (0: do not register)."""
        settings = self.settings
        return idle_registration_ms(
            settings.idle_block, burst=settings.burst, stopping=self.link.stopping.is_set()
        )

    # -- fetching --------------------------------------------------------------------

    async def fetch_loop(self, jobs: asyncio.TaskGroup) -> None:
        stopping = self.link.stopping
        # read before the first lease, so that the first jobs' deadlines are timed too
        await self.clock.sync(self.store.server_time_ms)
        # Capped budgets keep the worker and the server busy side by side, but a job
        # wider than the cap would never be leased: the first call, and the first
        # after each idle wait, ask for every free slot.
        widen = True
        # leased by the last exchange, slots held: launched once the next one is sent
        leased: list[FetchedJob] = []
        while not stopping.is_set():
            async with self.slots.turn(self):
                plan = self.slots.plan(widen=widen, shard=self)
                if plan.wait is Wait.NONE:
                    fetched = await self._exchange(plan.want, jobs, leased)
                    leased = []
            if leased:  # no exchange was sent: they start now
                self.attempts.launch(jobs, self, leased)
                leased = []
            if plan.wait is not Wait.NONE:
                await self._wait_for_room(plan.wait)
                continue
            if fetched is None:
                # the backoff is waited out here, not holding the turn: the other
                # shards (perhaps on other servers) go on meanwhile
                await wait_or_stop(stopping, self.fetch_outage.delay())
                continue
            if fetched.jobs:
                self.link.burst.busy()
            step = self._after(plan, fetched)
            widen = step.widen
            if step is Next.FETCH and not stopping.is_set() and self.slots.turn_free():
                leased = fetched.jobs  # the next turn is ours at once: launched in it
                continue
            self.attempts.launch(jobs, self, fetched.jobs)
            if step is Next.DRAINED and await self.link.burst.drained(self):
                self.slots.rest(self)
                return
            if step is not Next.IDLE:
                continue
            self.slots.rest(self)  # waiting on the wake lists: its part is the others'
            handed = await self._idle_wait(fetched.next_due_ms)
            if handed is not None and self._take_handed(jobs, handed):
                await asyncio.sleep(0)  # it starts before the next exchange is sent
        self.slots.rest(self)
        self.settler.carrier_active = False
        self.settler.flush_needed.set()

    def _after(self, plan: FetchPlan, fetched: Fetched) -> Next:
        """Take in an answered exchange; what the loop does next (``policy.fetch``)."""
        self.maybe_idle = not fetched.jobs and self.idle_ms() > 0
        self.slots.weigh(self, fetched.waiting)
        if fetched.malformed:
            self.settler.set_aside(fetched.malformed)
        return after_reply(
            plan,
            got_jobs=bool(fetched.jobs),
            burst=self.settings.burst,
            shard_busy=bool(self.running or self.settler.outcomes),
        )

    async def _exchange(
        self, want: int, jobs: asyncio.TaskGroup, leased: list[FetchedJob]
    ) -> Fetched | None:
        """Settle what finished, lease up to ``want`` slots' worth and hold their slots
        (their tasks are the caller's to launch); None on an outage. ``leased`` (held
        by the last call) are launched as soon as this call is sent.

        The slots asked for are reserved while the call is out, so that another
        shard's loop of the same worker cannot count them free meanwhile."""
        settings, settler = self.settings, self.settler
        outcomes = settler.take()
        sent = time.monotonic()
        fetched: Fetched | None = None
        with self.slots.reserving(want):
            try:
                call = self.store.exchange(
                    settings.worker_id,
                    settings.lanes,
                    want,
                    settings.lease_ms,
                    outcomes,
                    idle_ms=self.idle_ms(),
                    slots=settings.concurrency,
                )
                if leased:
                    # queued for the loop's next turn: the call runs here until it
                    # waits for its reply, the request written, so the server works
                    # on it while the jobs run
                    asyncio.get_running_loop().call_soon(self.attempts.launch, jobs, self, leased)
                fetched = await call
            except StoreError as exc:
                self.fetch_outage.failed(exc)
        if fetched is not None:
            self.attempts.claim(self, fetched.jobs)  # their slots are held from here on
        self.slots.notify()  # what this call did not take is free for the others
        if fetched is None:
            settler.put_back(outcomes)
            settler.drop_expired_outcomes()
            return None
        if self.fetch_outage.down:
            self.fetch_outage.recovered()
            await self.link.redeclare()
        if fetched.jobs:
            settler.renewed(sent)
        self.link.tally.fetch_calls += 1
        settler.carried(outcomes, fetched.ack_codes)
        return fetched

    async def _wait_for_room(self, wait: Wait) -> None:
        if wait is Wait.PRESSURE:  # slots are free, but resource pressure leaves no room
            await self._hold()
            return
        # no free slot (below 0 after a hand-off wider than what was free)
        await self.slots.wait_freed()

    async def _hold(self) -> None:
        """Lease nothing while pressure leaves no room; running jobs go on and settle."""
        pressure = self.slots.pressure
        assert pressure is not None
        settler = self.settler
        settler.carrier_active = False
        try:
            if self.maybe_idle:
                # still in the idle set from before: leave it, so enqueues stop handing
                # us jobs, and hand back (unstarted, not counted) any handed meanwhile
                await self._leave_idle_set()
            settler.idle()
            await self.slots.wait_freed(pressure.interval)
        finally:
            settler.carrier_active = True

    async def _leave_idle_set(self) -> None:
        settings, settler = self.settings, self.settler
        outcomes = settler.take()
        try:
            fetched = await self.store.exchange(
                settings.worker_id,
                settings.lanes,
                0,
                settings.lease_ms,
                outcomes,
                slots=settings.concurrency,
            )
        except StoreError as exc:
            settler.put_back(outcomes)
            log.debug("leaving the idle set failed (%s); retrying", exc)
        else:
            self.maybe_idle = False
            self.link.tally.fetch_calls += 1
            self.link.settled(outcomes, fetched.ack_codes)
            settler.hand_back(fetched.jobs)

    def _take_handed(self, jobs: asyncio.TaskGroup, handed: FetchedJob) -> bool:
        """Start a job an enqueue handed to us while idle, unless we now hold back;
        True if it started."""
        if not self.slots.takes_handed():
            # holding back, or another shard's loop filled the slots this one was idle
            # with: the job goes back unstarted (not counted), leased again later
            self.settler.hand_back([handed])
            return False
        self.attempts.start(jobs, self, [handed])
        return True

    async def _idle_wait(self, next_due_ms: int | None) -> FetchedJob | None:
        """Block until work arrives; returns a job an enqueue handed straight to us."""
        settings, stopping = self.settings, self.link.stopping
        timeout = idle_timeout(settings.idle_block, next_due_ms, stopping=stopping.is_set())
        if timeout is None:
            return None
        self.settler.idle()
        loop = asyncio.get_running_loop()
        # The server ends a blocked read's timeout only on its clock tick (1/hz, 100 ms by
        # default): a wait that ends at a due time (a rate key's next tokens, a scheduled
        # job) blocks until a tick before it and sleeps the rest here, so it ends on time.
        due_at = loop.time() + timeout if timeout < settings.idle_block else None
        if due_at is not None:
            timeout -= SERVER_TICK
            if timeout <= 0:
                await wait_or_stop(stopping, due_at - loop.time())
                return None
        registered = settings.worker_id if self.idle_ms() else None
        waiter = asyncio.ensure_future(
            self.store.wait_for_work(settings.lanes, timeout, registered)
        )
        # `stop()` cancels this wait directly: one future to wake on, not a race of two
        self.idle_waiter = waiter
        try:
            woken = await waiter
        except asyncio.CancelledError:
            # only `stop()` cutting the wait short ends it quietly; the task's own
            # cancellation (its worker cancelled, even while stopping) goes on up
            task = asyncio.current_task()
            if (task is not None and task.cancelling()) or not (
                stopping.is_set() and waiter.cancelled()
            ):
                raise
            # A job handed over is leased to us; if the wait was cut short after the
            # server sent it, its lease expires and it is reclaimed -- never lost.
            return None
        except StoreError as exc:
            await wait_or_stop(stopping, self.fetch_outage.failed(exc))
            return None
        finally:
            self.idle_waiter = None
            self.settler.carrier_active = True
        if woken is False and due_at is not None and due_at > loop.time():
            await wait_or_stop(stopping, due_at - loop.time())
        return woken if isinstance(woken, FetchedJob) else None

    # -- ending ----------------------------------------------------------------------

    async def flush(self, *, final: bool = False) -> None:
        await self.settler.flush(final=final)

    async def leave(self) -> None:
        """Stop being handed jobs, and hand back any that reached the inbox meanwhile;
        skipped while the store is unreachable (what it would hand back is reclaimed
        when its lease expires)."""
        if self.settler.ack_outage.down:
            return
        settings = self.settings
        try:
            handed = await self.store.leave(settings.worker_id, settings.lease_ms, settings.lanes)
            if handed:
                log.info("handing back %d job(s) given while stopping", len(handed))
                await self.store.ack(
                    settings.lanes, [Outcome(j.id, j.token, OutcomeKind.RELEASE) for j in handed]
                )
        except StoreError as exc:
            log.warning(
                "could not hand back jobs given while stopping (they will be "
                "reclaimed when their leases expire): %s",
                exc,
            )

    def cancel_idle_wait(self) -> None:
        if self.idle_waiter is not None:
            self.idle_waiter.cancel()
