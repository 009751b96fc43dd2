"""The worker: slots, the fetch loop, and settling finished attempts in batches.

One worker process serves the lanes it was started with. Its ``concurrency`` is its
number of slots: a running job occupies ``job.slots`` of them (one unless it asked for
more), and the worker leases only what fits in its free slots. The same number is the
worker's contribution to each lane's capacity, which the server's class policy shares
out. The hot path costs one server call per batch:
``exchange`` settles the attempts that finished since the last call and leases the
next batch of jobs in one atomic step. When there is no work the worker blocks on
the server (BLPOP on its lanes' wake lists) instead of polling; the enqueue script
pushes a wake token, so a job given to an idle worker starts within a round trip.

Shutdown is graceful: stop fetching, give in-flight attempts ``grace_period`` to
finish, then cancel the rest and hand them back to the queue unstarted (a handed
back attempt does not count against the job's budget).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fairlane import tracing
from fairlane.codec import encode_error
from fairlane.lanes import check_lane
from fairlane.metrics import (
    MetricsConfig,
    MetricsServer,
    StoreCollector,
    StoreReader,
    WorkerMetrics,
)
from fairlane.runtime.cron import cron_loop
from fairlane.runtime.executors import ProcessExecutor, ThreadExecutor
from fairlane.runtime.health import HealthServer, LoopMonitor
from fairlane.runtime.lease import renew_loop, sweep_loop, wait_or_stop
from fairlane.runtime.runner import CancelReason, Runner
from fairlane.store.redis import FetchedJob, Outcome, StoreUnavailable

if TYPE_CHECKING:
    from fairlane.app import App

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("fairlane.worker")
_RECONNECT_CAP = 5.0


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
class _Running:
    job: FetchedJob
    task: asyncio.Task[None]


class Worker:
    """Runs jobs of an app's lanes until stopped."""

    def __init__(
        self,
        app: App,
        *,
        lanes: Sequence[str],
        concurrency: int,
        burst: bool = False,
        health_port: int | None = None,
        metrics_port: int | None = None,
        metrics: MetricsConfig | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if not lanes:
            raise ValueError("a worker needs at least one lane")
        for lane in lanes:
            check_lane(lane)
        settings = app.settings
        self.app = app
        self.lanes = list(dict.fromkeys(lanes))
        self.concurrency = concurrency
        self.burst = burst
        self.lease = settings.lease
        self.batch = settings.worker.fetch_batch
        self.grace = settings.worker.grace_period
        self.idle_block = settings.worker.idle_block
        self.health_port = health_port
        # metrics (``fairlane.metrics``): recorded only when served, on --metrics-port
        self.metrics_port = metrics_port
        self.metrics_config = metrics or MetricsConfig()
        self.metrics_server: MetricsServer | None = None
        self._metrics: WorkerMetrics | None = None
        self.id = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        self._running: dict[str, _Running] = {}
        # slots held by running jobs; above `concurrency` only briefly, after inbox hand-offs
        self._used = 0
        self._outcomes: list[Outcome] = []
        self._cancel_reasons: dict[str, str] = {}
        self._stopping = asyncio.Event()
        self._closed = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._flush_needed = asyncio.Event()
        self._idle_waiter: asyncio.Future[FetchedJob | bool] | None = None
        # True while the fetch loop will call `exchange` soon, which carries outcomes
        # along; only an idle fetch loop leaves settling to the ack loop.
        self._carrier_active = True
        self._fetched = self._settled = self._fenced = 0
        self._fetch_calls = self._ack_calls = 0

    # -- control ---------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop: it stops fetching and drains gracefully."""
        if not self._stopping.is_set():
            log.info("worker %s stopping (grace %.1fs)", self.id, self.grace)
        self._stopping.set()
        if self._idle_waiter is not None:
            self._idle_waiter.cancel()

    def statistics(self) -> WorkerStats:
        return WorkerStats(
            running=len(self._running),
            fetched=self._fetched,
            settled=self._settled,
            fenced=self._fenced,
            fetch_calls=self._fetch_calls,
            ack_calls=self._ack_calls,
            slots_in_use=self._used,
        )

    async def run(self, *, handle_signals: bool = False) -> None:
        """Serve until ``stop()`` (or SIGTERM/SIGINT with ``handle_signals``)."""
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        log.info(
            "worker %s serving lanes %s of app %s (concurrency %d slots)",
            self.id,
            ",".join(self.lanes),
            self.app.name,
            self.concurrency,
        )
        try:
            async with AsyncExitStack() as stack:
                runner = await self._start_executors(stack)
                await self._serve(runner)
        finally:
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

    async def _start_executors(self, stack: AsyncExitStack) -> Runner:
        settings = self.app.settings.worker
        threads = ThreadExecutor(settings.thread_pool_size)
        stack.push_async_callback(threads.aclose)
        processes = None
        if any(t.options.executor == "process" for t in self.app.tasks.values()):
            size = settings.process_pool_size or os.cpu_count() or 1
            processes = ProcessExecutor(size, "fairlane.runtime.invoke:invoke_sync")
            await processes.start()
            stack.push_async_callback(processes.aclose)
        runner = Runner(self.app, threads, processes, self.id)
        # a pool a workflow's process step started on first use
        stack.push_async_callback(runner.aclose)
        return runner

    async def _serve(self, runner: Runner) -> None:
        self._runner = runner
        monitor = LoopMonitor(self.app.settings.worker.loop_block_threshold)
        store = self.app.store
        # tasks and lanes declared after the app connected are recorded too, so that
        # sweeps trim every task's records by age and dispatch uses every lane's classes
        self.app.check_lanes()
        await self.app.declare_tasks()
        await self.app.declare_lanes()
        async with AsyncExitStack() as stack:
            if self.health_port is not None:
                health = HealthServer(self.health_port, monitor)
                health.start()
                stack.callback(health.stop)
            if self.metrics_port is not None:
                self._start_metrics(stack, self.metrics_port)
            async with asyncio.TaskGroup() as services:
                services.create_task(monitor.run(self._closed))
                services.create_task(
                    renew_loop(
                        store=store,
                        worker_id=self.id,
                        lease=self.lease,
                        held=self._held,
                        on_lost=self._lost,
                        on_cancel=self._cancel_requested,
                        stop=self._closed,
                    )
                )
                services.create_task(sweep_loop(store, self.lease, self._closed))
                services.create_task(cron_loop(self.app.crons, self._stopping))
                services.create_task(self._ack_loop())
                if self._metrics is not None:
                    services.create_task(self._sample_loop(self._metrics))
                async with asyncio.TaskGroup() as jobs:
                    await self._fetch_loop(jobs)
                    await self._drain()
                await self._flush()
                self._closed.set()
            # after the renewals have stopped, so no heartbeat follows the goodbye
            await self._leave()
        log.info("worker %s stopped", self.id)

    # -- metrics ---------------------------------------------------------------------

    def _start_metrics(self, stack: AsyncExitStack, port: int) -> None:
        config = self.metrics_config
        metrics = WorkerMetrics(self.app, self.lanes, self.concurrency, config)
        lanes = [*self.lanes, *self.app.lanes, *(t.options.lane for t in self.app.tasks.values())]
        reader = StoreReader(
            self.app.url or self.app.resolve_url(),
            self.app.name,
            lanes,
            timeout=config.store_timeout,
            max_age=config.store_max_age,
        )
        stack.callback(reader.close)
        metrics.registry.register(StoreCollector(reader))
        server = MetricsServer(port, metrics.registry, reader, config.host)
        server.start()
        stack.callback(server.stop)
        self._metrics, self.metrics_server = metrics, server
        log.info("worker %s serving /metrics and /autoscale on port %d", self.id, server.port)

    async def _sample_loop(self, metrics: WorkerMetrics) -> None:
        interval = self.metrics_config.sample_interval
        while not self._closed.is_set():
            metrics.sample(r.job for r in list(self._running.values()))
            await wait_or_stop(self._closed, interval)

    # -- fetching --------------------------------------------------------------------

    async def _fetch_loop(self, jobs: asyncio.TaskGroup) -> None:
        lease_ms = round(self.lease.duration * 1000)
        failures = 0
        # Capped budgets (below) keep the worker and the server busy side by side, but a
        # job wider than the cap would never be leased: the first call, and the first
        # after each idle wait, ask for every free slot.
        widen = True
        while not self._stopping.is_set():
            free = self.concurrency - self._used
            if free <= 0:  # below 0 after a hand-off wider than what was free
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            outcomes, self._outcomes = self._outcomes, []
            want = free if widen else self._budget(free)
            try:
                fetched = await self.app.store.exchange(
                    self.id,
                    self.lanes,
                    want,
                    lease_ms,
                    outcomes,
                    idle_ms=self._idle_ms(),
                    slots=self.concurrency,
                )
            except StoreUnavailable as exc:
                self._outcomes[:0] = outcomes
                failures += 1
                delay = min(_RECONNECT_CAP, 0.1 * 2**failures)
                log.warning("fetch failed (%s); retrying in %.1fs", exc, delay)
                await wait_or_stop(self._stopping, delay)
                continue
            failures = 0
            widen = False
            self._fetch_calls += 1
            self._count_settled(outcomes, fetched.ack_codes)
            self._start(jobs, fetched.jobs)
            if self._metrics is not None:
                self._metrics.started(fetched.jobs)
            if fetched.jobs:
                continue
            if self.burst and not self._running and not self._outcomes:
                if want < free:  # an empty reply to a capped ask says nothing of wider jobs
                    widen = True
                    continue
                log.info("worker %s: no work left (burst)", self.id)
                self._stopping.set()  # also ends the cron loop, which waits on it
                return
            handed = await self._idle_wait(fetched.next_due_ms)
            widen = True
            if handed is not None:
                self._start(jobs, [handed])
                if self._metrics is not None:
                    self._metrics.started([handed])
        self._carrier_active = False
        self._flush_needed.set()

    def _budget(self, free: int) -> int:
        """How many slots to lease in the next call of a busy worker."""
        # Leasing at most half the slots per call keeps one batch running while the
        # server prepares the next, so the worker and the server work side by side.
        return min(free, self.batch, max(1, self.concurrency // 2))

    def _start(self, jobs: asyncio.TaskGroup, fetched: Sequence[FetchedJob]) -> None:
        for job in fetched:
            self._running[job.id] = _Running(job, jobs.create_task(self._run_job(job)))
            self._used += job.slots
        self._fetched += len(fetched)

    def _idle_ms(self) -> int:
        """How long to stay registered idle if given nothing (0: do not register)."""
        if self.burst or self._stopping.is_set():
            return 0
        # outlives the longest block, so a registered worker is always listening
        return round((self.idle_block + 1.0) * 1000)

    async def _idle_wait(self, next_due_ms: int | None) -> FetchedJob | None:
        """Block until work arrives; returns a job an enqueue handed straight to us."""
        timeout = (
            self.idle_block if next_due_ms is None else min(self.idle_block, next_due_ms / 1000)
        )
        if timeout <= 0 or self._stopping.is_set():
            return None
        self._carrier_active = False
        if self._outcomes:
            self._flush_needed.set()
        waiter = asyncio.ensure_future(
            self.app.store.wait_for_work(self.lanes, timeout, self.id if self._idle_ms() else None)
        )
        # `stop()` cancels this wait directly: one future to wake on, not a race of two
        self._idle_waiter = waiter
        try:
            woken = await waiter
        except asyncio.CancelledError:
            if not (self._stopping.is_set() and waiter.cancelled()):
                raise
            # A job handed over is leased to us; if the wait was cut short after the
            # server sent it, its lease expires and it is reclaimed -- never lost.
            return None
        except StoreUnavailable as exc:
            log.warning("waiting for work failed (%s); retrying", exc)
            await wait_or_stop(self._stopping, 1.0)
            return None
        finally:
            self._idle_waiter = None
            self._carrier_active = True
        return woken if isinstance(woken, FetchedJob) else None

    # -- running ---------------------------------------------------------------------

    async def _run_job(self, job: FetchedJob) -> None:
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
        traced = tracing.attempt(job, self.app.tasks)
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
            self._used -= job.slots
            running = self._running.get(job.id)
            if running is not None and running.job is job:
                del self._running[job.id]
            self._slot_freed.set()
        if self._metrics is not None:
            self._metrics.finished(job, outcome, time.monotonic() - began)
        if outcome is not None:
            self._outcomes.append(outcome)
            if not self._carrier_active:
                self._flush_needed.set()

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

    def _held(self) -> list[tuple[str, str]]:
        return [(job_id, r.job.token) for job_id, r in self._running.items()]

    def _interrupt(self, ids: list[str], reason: str) -> None:
        for job_id in ids:
            running = self._running.get(job_id)
            if running is not None:
                self._cancel_reasons[job_id] = reason
                running.task.cancel()

    def _lost(self, leases: list[tuple[str, str]]) -> None:
        ids = [
            job_id
            for job_id, token in leases
            if (running := self._running.get(job_id)) is not None and running.job.token == token
        ]
        if ids:
            log.warning("lost the lease of %d job(s); stopping them: %s", len(ids), ids[:5])
            if self._metrics is not None:
                self._metrics.lost(len(ids))
            self._interrupt(ids, CancelReason.LEASE_LOST)

    def _cancel_requested(self, ids: list[str]) -> None:
        self._interrupt(ids, CancelReason.CANCELLED)

    async def _drain(self) -> None:
        if self._running:
            log.info("waiting up to %.1fs for %d running job(s)", self.grace, len(self._running))
            deadline = time.monotonic() + self.grace
            while self._running and time.monotonic() < deadline:
                self._slot_freed.clear()
                await wait_or_stop(self._slot_freed, deadline - time.monotonic())
        leftover = list(self._running)
        if leftover:
            log.warning("handing back %d unfinished job(s)", len(leftover))
            self._interrupt(leftover, CancelReason.SHUTDOWN)

    # -- settling --------------------------------------------------------------------

    async def _ack_loop(self) -> None:
        """Settles outcomes while the fetch loop is idle (otherwise `exchange` carries them)."""
        while True:
            if await self._wait_flush_needed():
                return
            # let attempts finishing in this same loop turn join the batch
            await asyncio.sleep(0)
            if not self._carrier_active:
                await self._flush()

    async def _wait_flush_needed(self) -> bool:
        """Wait until outcomes need settling here; True when the worker has closed."""
        closed = asyncio.ensure_future(self._closed.wait())
        needed = asyncio.ensure_future(self._flush_needed.wait())
        try:
            await asyncio.wait({closed, needed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
            needed.cancel()
            await asyncio.gather(closed, needed, return_exceptions=True)
        self._flush_needed.clear()
        return self._closed.is_set()

    async def _flush(self) -> None:
        for attempt in range(6):
            outcomes, self._outcomes = self._outcomes, []
            if not outcomes:
                return
            try:
                codes = await self.app.store.ack(self.lanes, outcomes)
            except StoreUnavailable as exc:
                self._outcomes[:0] = outcomes
                log.warning("settling %d outcome(s) failed: %s", len(outcomes), exc)
                await asyncio.sleep(min(_RECONNECT_CAP, 0.1 * 2**attempt))
                continue
            self._ack_calls += 1
            self._count_settled(outcomes, codes)

    async def _leave(self) -> None:
        """Stop being handed jobs, and hand back any that reached the inbox meanwhile."""
        lease_ms = round(self.lease.duration * 1000)
        try:
            handed = await self.app.store.leave(self.id, lease_ms, self.lanes)
            if handed:
                log.info("handing back %d job(s) given while stopping", len(handed))
                await self.app.store.ack(
                    self.lanes, [Outcome(j.id, j.token, "release") for j in handed]
                )
        except StoreUnavailable as exc:
            log.warning(
                "could not hand back jobs given while stopping (they will be "
                "reclaimed when their leases expire): %s",
                exc,
            )

    def _count_settled(self, outcomes: Sequence[Outcome], codes: Sequence[int]) -> None:
        if self._metrics is not None:
            self._metrics.settled(outcomes, codes)
        stale = sum(1 for c in codes if c == 0)
        self._settled += len(outcomes) - stale
        if stale:
            self._fenced += stale
            log.warning(
                "%d late write(s) rejected: their lease had passed to another worker", stale
            )
