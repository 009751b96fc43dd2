"""The attempts running on a worker: started, timed, interrupted, drained.

Every job a worker leased, from whichever shard, runs here as one task of the worker's
job group, by job id. An attempt holds its width of the worker's slots
(``runtime/slots.py``) from its start to its end, and its outcome goes to the shard it
was leased from, to be settled there. An attempt is stopped by the worker for one of
five reasons (``CancelReason``), each ending differently: past its timeout it fails as
timed out; past its job's deadline the job expires (counted as expired, not as a
failure, and never retried); asked to cancel, it ends cancelled; its lease lost, it
ends with no outcome (the store has given the job to another attempt); at shutdown,
past the grace period, it is handed back unstarted, not counted against the job's
attempts.

An attempt is stopped the way its executor can be: an async one is cancelled where it
awaits; a thread one is let go (the thread cannot be stopped: it runs on, its result
discarded, as at its timeout) while the attempt ends at once; a process one has its
child killed and replaced. Either way its slots are free as it ends.

Starting a batch is two steps, so that a shard loop can send its next exchange between
them (``runtime/shardloop.py``): ``claim`` holds the jobs' slots at once, ``launch``
makes their tasks (the larger part of a no-op job's cost on the worker). Attempts with
a timeout or a deadline share one loop timer (``runtime/deadlines.py``), each due at
the earlier of the two; a deadline is on the clock of the shard it was leased from
(``Shard.clock``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Protocol

import msgspec

from fairlane.codec import encode_error
from fairlane.runtime.deadlines import Deadlines, ServerClock
from fairlane.runtime.hooks import Hooks
from fairlane.runtime.runner import CancelReason, Runner
from fairlane.runtime.shardlink import Tally
from fairlane.runtime.slots import SlotPool
from fairlane.store.wire import FetchedJob, Outcome, OutcomeKind

__all__ = ["Attempts", "Running", "Shard"]

log = logging.getLogger("fairlane.worker")


class Shard(Protocol):
    """Where an attempt was leased from: counts its jobs running here, settles outcomes;
    its deadlines are on its server's ``clock``."""

    running: int
    clock: ServerClock

    def settle(self, outcome: Outcome) -> None: ...


class Running(msgspec.Struct):
    """A job running on this worker, and the shard it was leased from."""

    job: FetchedJob
    task: asyncio.Task[None]
    shard: Shard
    #: timed to its job's deadline (earlier than its timeout, if it has one)
    expires: bool = False


class Attempts:
    """The attempts running on one worker (see the module docstring)."""

    def __init__(self, slots: SlotPool, hooks: Hooks, tally: Tally) -> None:
        self.slots = slots
        self.hooks = hooks
        self.tally = tally
        self.running: dict[str, Running] = {}
        #: runs each attempt; given once the worker's executors have started
        self.runner: Runner | None = None
        self._cancel_reasons: dict[str, str] = {}
        self._deadlines = Deadlines(self._timed_out)

    def jobs(self) -> list[FetchedJob]:
        return [r.job for r in list(self.running.values())]

    def held(self, shard: Shard) -> list[tuple[str, str]]:
        """The leases of ``shard``'s jobs running here, as (job id, token)."""
        return [(job_id, r.job.token) for job_id, r in self.running.items() if r.shard is shard]

    def start(self, group: asyncio.TaskGroup, shard: Shard, fetched: Sequence[FetchedJob]) -> None:
        """Run ``fetched`` (leased from ``shard``) in ``group``; their slots are held from now."""
        self.claim(shard, fetched)
        self.launch(group, shard, fetched)

    def claim(self, shard: Shard, fetched: Sequence[FetchedJob]) -> None:
        """Hold the slots of ``fetched`` (leased from ``shard``) from now; ``launch``
        must follow, in the same turn of the loop or the next."""
        slots = self.slots
        for job in fetched:
            slots.occupy(job.slots, shard)
        shard.running += len(fetched)
        self.tally.fetched += len(fetched)

    def launch(self, group: asyncio.TaskGroup, shard: Shard, fetched: Sequence[FetchedJob]) -> None:
        """Run the ``claim``-ed ``fetched`` in ``group``."""
        if not fetched:
            return
        running, run, runner = self.running, self._run, self.runner
        assert runner is not None, "attempts start once the executors have"
        deadlines, clock = self._deadlines, shard.clock
        started = 0
        try:
            for job in fetched:
                # timed from here, under the job object's identity (a newer lease of the
                # same job is another object, timed on its own); 0: not timed here
                due = deadlines.due(job.timeout) if runner.uses_timer(job) else 0
                expires = False
                if job.deadline_ms > 0:  # stopped at the earlier of timeout and deadline
                    at = clock.due(job.deadline_ms)
                    if at is not None and (not due or at < due):
                        due, expires = at, True
                task = group.create_task(run(job, shard, due))
                running[job.id] = Running(job, task, shard, expires)
                if due:
                    deadlines.put(due, id(job), task, job.id)
                started += 1
        except RuntimeError:
            # the group is shutting down (the worker is failing): what did not start
            # gives its slots back, and its lease expires and it is reclaimed
            unstarted = fetched[started:]
            for job in unstarted:
                self.slots.vacate(job.slots, shard)
            shard.running -= len(unstarted)
            log.warning("%d leased job(s) not started: the worker is stopping", len(unstarted))
            if started:
                self.hooks.started(fetched[:started])
            return
        self.hooks.started(fetched)

    async def _run(self, job: FetchedJob, shard: Shard, due: int) -> None:
        runner = self.runner
        assert runner is not None, "attempts start once the executors have"
        outcome: Outcome | None = None
        began = time.monotonic()
        # the attempt's span is current while it runs, so a workflow's steps and the
        # task's own spans are its children (None when tracing is off)
        traced = self.hooks.attempt(job)
        try:
            outcome = await runner.run(job)
        except asyncio.CancelledError:
            outcome = self._interrupted(runner, job)
        finally:
            if traced is not None:
                traced.end(outcome)
            if due:
                self._deadlines.discard(id(job), due)
            # each attempt gives back what it took, even if a newer lease of the same job
            # (lost, then leased to us again) has taken its entry meanwhile
            self.slots.vacate(job.slots, shard)
            shard.running -= 1
            running = self.running.get(job.id)
            if running is not None and running.job is job:
                del self.running[job.id]
        self.hooks.finished(job, outcome, time.monotonic() - began)
        if outcome is not None:
            shard.settle(outcome)

    def _interrupted(self, runner: Runner, job: FetchedJob) -> Outcome | None:
        reason = self._cancel_reasons.pop(job.id, CancelReason.SHUTDOWN)
        if reason == CancelReason.LEASE_LOST:
            return None
        if reason == CancelReason.TIMEOUT:
            return runner.timed_out(job)
        if reason == CancelReason.DEADLINE:
            return runner.expired(job)
        if reason == CancelReason.CANCELLED:
            err = encode_error(
                asyncio.CancelledError("the job was cancelled while running"), type_name="Cancelled"
            )
            return Outcome(job.id, job.token, OutcomeKind.CANCEL, err.decode())
        return Outcome(job.id, job.token, OutcomeKind.RELEASE)

    def _timed_out(self, due: list[tuple[asyncio.Task[None], str]]) -> None:
        running = self.running
        for task, job_id in due:
            if not task.done():
                entry = running.get(job_id)
                expires = entry is not None and entry.task is task and entry.expires
                self._cancel_reasons[job_id] = (
                    CancelReason.DEADLINE if expires else CancelReason.TIMEOUT
                )
                task.cancel()

    def interrupt(self, ids: list[str], reason: str) -> None:
        for job_id in ids:
            running = self.running.get(job_id)
            if running is not None:
                self._cancel_reasons[job_id] = reason
                running.task.cancel()

    def lost(self, leases: list[tuple[str, str]]) -> None:
        """Stop the attempts whose leases (job id, token) the store says are gone."""
        ids = [
            job_id
            for job_id, token in leases
            if (running := self.running.get(job_id)) is not None and running.job.token == token
        ]
        if ids:
            log.warning("lost the lease of %d job(s); stopping them: %s", len(ids), ids[:5])
            self.hooks.lost(len(ids))
            self.interrupt(ids, CancelReason.LEASE_LOST)

    def cancel_requested(self, ids: list[str]) -> None:
        self.interrupt(ids, CancelReason.CANCELLED)

    async def drain(self, grace: float) -> None:
        """Give the running attempts ``grace`` seconds to finish, then hand back the rest."""
        if self.running:
            log.info("waiting up to %.1fs for %d running job(s)", grace, len(self.running))
            deadline = time.monotonic() + grace
            while self.running and time.monotonic() < deadline:
                await self.slots.wait_freed(deadline - time.monotonic())
        leftover = list(self.running)
        if leftover:
            log.warning("handing back %d unfinished job(s)", len(leftover))
            self.interrupt(leftover, CancelReason.SHUTDOWN)
