"""The worker: slots, the fetch loop, and settling finished attempts in batches.

One worker process serves the lanes it was started with, in every scheduling shard
of its app (one ``ShardLoop`` each, ``runtime/shardloop.py``, sharing the slots).
Its ``concurrency`` is its number of slots: a running job occupies ``job.slots`` of
them (one unless it asked for more), and the worker leases only what fits in its
free slots. The same number is the worker's contribution to each lane's capacity,
which the server's class policy shares out. The hot path costs one server call per
batch:
``exchange`` settles the attempts that finished since the last call and leases the
next batch of jobs in one atomic step. When there is no work the worker blocks on
the server (BLPOP on its lanes' wake lists) instead of polling; the enqueue script
pushes a wake token, so a job given to an idle worker starts within a round trip.

Under resource pressure (``runtime/pressure.py``: memory near its limit, and CPU or
stalls when asked) the worker fills fewer of its slots, and near its memory limit
none: it then leases nothing new, while its running jobs go on and keep their leases.

Shutdown is graceful: stop fetching, give in-flight attempts ``grace_period`` to
finish, then cancel the rest and hand them back to the queue unstarted (a handed
back attempt does not count against the job's budget).

While the store is unreachable (``runtime/outage.py``) running jobs go on; each loop
retries with a capped, jittered backoff and logs once per outage. Finished attempts
wait to be settled until their leases are known to have ended (``lease.duration``
after the last renewal that got through), and are dropped then: the store reclaims
those jobs. A stopping worker stops within its grace period either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass

from fairlane.codec import encode_error
from fairlane.config.lanes import check_lane
from fairlane.policy.fetch import idle_registration_ms
from fairlane.registry import Registry
from fairlane.runtime.cron import Enqueue, cron_loop
from fairlane.runtime.executors import ProcessExecutor, ThreadExecutor
from fairlane.runtime.health import LoopMonitor
from fairlane.runtime.hooks import Hooks, WorkerHooks
from fairlane.runtime.lease import wait_or_stop
from fairlane.runtime.outage import Outage
from fairlane.runtime.pressure import PressureConfig, Sensor, worker_gauge
from fairlane.runtime.runner import CancelReason, Runner
from fairlane.runtime.services import PressureService, WorkerServices
from fairlane.runtime.shardloop import ShardLoop
from fairlane.runtime.slots import SlotPool
from fairlane.store.shards import ShardedStores
from fairlane.store.wire import FetchedJob, Outcome, StoreUnavailable

__all__ = ["Running", "Worker", "WorkerStats"]

log = logging.getLogger("fairlane.worker")
_BURST_RECHECK = 0.05  # seconds an empty shard's loop waits for the others in burst mode
_UNREADABLE = encode_error(
    ValueError("the job was handed to the worker in a form it cannot read; it was not executed"),
    type_name="MalformedJob",
).decode()


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """A snapshot of a worker's counters."""

    running: int
    fetched: int
    settled: int
    fenced: int
    fetch_calls: int
    ack_calls: int
    slots_in_use: int = 0


@dataclass(slots=True)
class Running:
    """A job running on this worker, and the shard it was leased from."""

    job: FetchedJob
    task: asyncio.Task[None]
    shard: ShardLoop


class Worker:
    """Runs jobs of an app's lanes (its ``registry``, in every shard of ``stores``) until
    stopped; ``hooks`` are told of its jobs (``runtime/hooks.py``), and its cron loop
    enqueues ticks with ``enqueue`` (``App.enqueue``), needed when the app has crons."""

    def __init__(
        self,
        registry: Registry,
        stores: ShardedStores,
        *,
        lanes: Sequence[str],
        concurrency: int,
        burst: bool = False,
        health_port: int | None = None,
        pressure: PressureConfig | None = None,
        sensors: Sequence[Sensor] | None = None,
        hooks: Sequence[WorkerHooks] = (),
        enqueue: Enqueue | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if not lanes:
            raise ValueError("a worker needs at least one lane")
        for lane in lanes:
            check_lane(lane)
        if registry.crons and enqueue is None:
            raise ValueError("a worker of an app with cron entries needs enqueue=")
        settings = registry.settings
        self.registry = registry
        self.stores = stores
        self.hooks = Hooks(hooks)
        self._enqueue = enqueue
        self.lanes = list(dict.fromkeys(lanes))
        self.concurrency = concurrency
        self.burst = burst
        self.lease = settings.lease
        self.batch = settings.worker.fetch_batch
        self.grace = settings.worker.grace_period
        self.idle_block = settings.worker.idle_block
        self.health_port = health_port
        self.id = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        self.running: dict[str, Running] = {}
        self._cancel_reasons: dict[str, str] = {}
        self.stopping = asyncio.Event()
        self.closed = asyncio.Event()
        self._fetched = self._settled = self._fenced = 0
        self.fetch_calls = self.ack_calls = 0
        # resource backpressure (``runtime/pressure.py``): None when turned off
        self.pressure = worker_gauge(
            concurrency, pressure or PressureConfig.from_settings(settings.worker.pressure), sensors
        )
        #: the slots the shards' fetch loops share, and take turns at
        self.slots = SlotPool(concurrency, batch=self.batch, pressure=self.pressure)
        self._pressure = (
            None if self.pressure is None else PressureService(self.pressure, self.slots, self.id)
        )
        self._declare_outage = Outage(f"worker {self.id}: declaring", log)
        self._stop_at: float | None = None
        self._shards: list[ShardLoop] = []
        # burst mode ends once every shard's loop has found its shard empty at once
        self._burst_empty: set[ShardLoop] = set()
        self._burst_over = asyncio.Event()
        #: the error a leased job gets when its row cannot be read
        self.unreadable = _UNREADABLE

    # -- control ---------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop: it stops fetching and drains gracefully."""
        if not self.stopping.is_set():
            log.info("worker %s stopping (grace %.1fs)", self.id, self.grace)
            self._stop_at = time.monotonic()
        self.stopping.set()
        self.slots.notify()  # a worker holding back under pressure waits on it
        for shard in self._shards:
            shard.cancel_idle_wait()

    def running_jobs(self) -> list[FetchedJob]:
        """The jobs running on this worker now."""
        return [r.job for r in list(self.running.values())]

    def statistics(self) -> WorkerStats:
        return WorkerStats(
            running=len(self.running),
            fetched=self._fetched,
            settled=self._settled,
            fenced=self._fenced,
            fetch_calls=self.fetch_calls,
            ack_calls=self.ack_calls,
            slots_in_use=self.slots.used,
        )

    async def run(self, *, handle_signals: bool = False) -> None:
        """Serve until ``stop()`` (or SIGTERM/SIGINT with ``handle_signals``)."""
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        log.info(
            "worker %s serving lanes %s of app %s (concurrency %d slots%s)",
            self.id,
            ",".join(self.lanes),
            self.registry.name,
            self.concurrency,
            f", {self.stores.count} shards" if self.stores.count > 1 else "",
        )
        if self._pressure is not None:
            self._pressure.start(time.monotonic())  # the first fetch asks within the allowance
        try:
            async with AsyncExitStack() as stack:
                runner = await self._start_executors(stack)
                await self._serve(runner)
        finally:
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

    async def _start_executors(self, stack: AsyncExitStack) -> Runner:
        settings = self.registry.settings.worker
        threads = ThreadExecutor(settings.thread_pool_size)
        stack.push_async_callback(threads.aclose)
        processes = None
        if any(t.options.executor == "process" for t in self.registry.tasks.values()):
            size = settings.process_pool_size or os.cpu_count() or 1
            processes = ProcessExecutor(size, "fairlane.runtime.invoke:invoke_sync")
            await processes.start()
            stack.push_async_callback(processes.aclose)
        runner = Runner(self.registry, self.stores, threads, processes, self.id, self.hooks)
        # a pool a workflow's process step started on first use
        stack.push_async_callback(runner.aclose)
        return runner

    async def _serve(self, runner: Runner) -> None:
        self._runner = runner
        monitor = LoopMonitor(self.registry.settings.worker.loop_block_threshold)
        self._shards = [ShardLoop(self, store) for store in self.stores.stores]
        # tasks and lanes declared after the app connected are recorded too, so that
        # sweeps trim every task's records by age and dispatch uses every lane's classes
        self.registry.check_lanes()
        await self._declare(attempts=5)
        side = WorkerServices(monitor, health_port=self.health_port, pressure=self._pressure)
        async with AsyncExitStack() as stack:
            side.open(stack)
            plugged = self.hooks.serving(self, stack)
            async with asyncio.TaskGroup() as services:
                side.start(services, self.closed)
                for shard in self._shards:
                    shard.start_services(services)
                if self._enqueue is not None:
                    services.create_task(
                        cron_loop(
                            self.registry.crons,
                            self.stopping,
                            self.stores.store.server_time_ms,
                            self._enqueue,
                        )
                    )
                for loop in plugged:
                    services.create_task(loop)
                async with asyncio.TaskGroup() as jobs:
                    async with asyncio.TaskGroup() as fetching:
                        for shard in self._shards:
                            fetching.create_task(shard.fetch_loop(jobs))
                    if self.burst and not self.stopping.is_set():
                        log.info("worker %s: no work left (burst)", self.id)
                        self.stopping.set()  # also ends the cron loop, which waits on it
                    await self._drain()
                for shard in self._shards:
                    await shard.flush(final=True)
                self.closed.set()
            # after the renewals have stopped, so no heartbeat follows the goodbye
            for shard in self._shards:
                await shard.leave()
        log.info("worker %s stopped", self.id)

    # -- slots -----------------------------------------------------------------------

    def start(
        self, jobs: asyncio.TaskGroup, shard: ShardLoop, fetched: Sequence[FetchedJob]
    ) -> None:
        for job in fetched:
            task = jobs.create_task(self._run_job(job, shard))
            self.running[job.id] = Running(job, task, shard)
            self.slots.occupy(job.slots)
            shard.running += 1
        self._fetched += len(fetched)
        if fetched:
            self.hooks.started(fetched)

    async def burst_drained(self, shard: ShardLoop) -> bool:
        """In burst mode, ``shard`` found nothing to do: True once every shard has (the
        worker is done), else after a short wait, so that the loop looks again -- work
        may still come to an empty shard from the others' retries or workflows."""
        self._burst_empty.add(shard)
        if len(self._burst_empty) == len(self._shards):
            self._burst_over.set()
        over = await wait_or_stop(self._burst_over, _BURST_RECHECK)
        self._burst_empty.discard(shard)
        return over

    def idle_ms(self) -> int:
        """How long to stay registered idle if given nothing (0: do not register)."""
        return idle_registration_ms(
            self.idle_block, burst=self.burst, stopping=self.stopping.is_set()
        )

    # -- running ---------------------------------------------------------------------

    async def _run_job(self, job: FetchedJob, shard: ShardLoop) -> None:
        outcome: Outcome | None = None
        timer = None
        if self._runner.uses_timer(job):
            loop = asyncio.get_running_loop()
            timer = loop.call_at(
                loop.time() + job.timeout, self._interrupt, [job.id], CancelReason.TIMEOUT
            )
        began = time.monotonic()
        # the attempt's span is current while it runs, so a workflow's steps and the
        # task's own spans are its children (None when tracing is off)
        traced = self.hooks.attempt(job)
        try:
            outcome = await self._runner.run(job)
        except asyncio.CancelledError:
            outcome = self._interrupted(job)
        finally:
            if traced is not None:
                traced.end(outcome)
            if timer is not None:
                timer.cancel()
            # each attempt gives back what it took, even if a newer lease of the same job
            # (lost, then leased to us again) has taken its entry meanwhile
            self.slots.vacate(job.slots)
            shard.running -= 1
            running = self.running.get(job.id)
            if running is not None and running.job is job:
                del self.running[job.id]
        self.hooks.finished(job, outcome, time.monotonic() - began)
        if outcome is not None:
            shard.settle(outcome)

    def _interrupted(self, job: FetchedJob) -> Outcome | None:
        reason = self._cancel_reasons.pop(job.id, CancelReason.SHUTDOWN)
        if reason == CancelReason.LEASE_LOST:
            return None
        if reason == CancelReason.TIMEOUT:
            return self._runner.timed_out(job)
        if reason == CancelReason.CANCELLED:
            err = encode_error(
                asyncio.CancelledError("the job was cancelled while running"), type_name="Cancelled"
            )
            return Outcome(job.id, job.token, "cancel", err.decode())
        return Outcome(job.id, job.token, "release")

    def _interrupt(self, ids: list[str], reason: str) -> None:
        for job_id in ids:
            running = self.running.get(job_id)
            if running is not None:
                self._cancel_reasons[job_id] = reason
                running.task.cancel()

    def lost(self, leases: list[tuple[str, str]]) -> None:
        ids = [
            job_id
            for job_id, token in leases
            if (running := self.running.get(job_id)) is not None and running.job.token == token
        ]
        if ids:
            log.warning("lost the lease of %d job(s); stopping them: %s", len(ids), ids[:5])
            self.hooks.lost(len(ids))
            self._interrupt(ids, CancelReason.LEASE_LOST)

    def cancel_requested(self, ids: list[str]) -> None:
        self._interrupt(ids, CancelReason.CANCELLED)

    async def _drain(self) -> None:
        if self.running:
            log.info("waiting up to %.1fs for %d running job(s)", self.grace, len(self.running))
            deadline = time.monotonic() + self.grace
            while self.running and time.monotonic() < deadline:
                await self.slots.wait_freed(deadline - time.monotonic())
        leftover = list(self.running)
        if leftover:
            log.warning("handing back %d unfinished job(s)", len(leftover))
            self._interrupt(leftover, CancelReason.SHUTDOWN)

    async def _declare(self, attempts: int) -> None:
        """Record tasks and lanes, retrying a call that fails while the server restarts;
        after ``attempts`` the error is raised."""
        for attempt in range(1, attempts + 1):
            try:
                await self.registry.declare(self.stores.stores)
            except StoreUnavailable as exc:
                delay = self._declare_outage.failed(exc)
                if attempt == attempts:
                    raise
                await wait_or_stop(self.stopping, delay)
            else:
                self._declare_outage.recovered()
                return

    def grace_left(self) -> float:
        """Seconds left of a stopping worker's grace period."""
        return (self._stop_at or time.monotonic()) + self.grace - time.monotonic()

    async def redeclare(self) -> None:
        """After an outage, record tasks and lanes again: a server restarted without
        persistence has lost them (and loads the function library on first use). If
        that fails, the next exchange fails too, and comes back here once it succeeds."""
        with contextlib.suppress(StoreUnavailable):
            await self._declare(attempts=1)

    def count_settled(self, outcomes: Sequence[Outcome], codes: Sequence[int]) -> None:
        self.hooks.settled(outcomes, codes)
        stale = sum(1 for c in codes if c == 0)
        self._settled += len(outcomes) - stale
        if stale:
            self._fenced += stale
            log.warning(
                "%d late write(s) rejected: their lease had passed to another worker", stale
            )
