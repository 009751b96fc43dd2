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
from fairlane.payloads.sweep import payload_sweep_loop
from fairlane.policy.backpressure import Decision
from fairlane.runtime.cron import cron_loop
from fairlane.runtime.executors import ProcessExecutor, ThreadExecutor
from fairlane.runtime.health import HealthServer, LoopMonitor
from fairlane.runtime.lease import renew_loop, sweep_loop, wait_or_stop
from fairlane.runtime.outage import Outage
from fairlane.runtime.pressure import (
    PressureCollector,
    PressureConfig,
    PressureGauge,
    Sensor,
    default_sensors,
    describe_limit,
)
from fairlane.runtime.runner import CancelReason, Runner
from fairlane.store.redis import FetchedJob, Outcome, StoreUnavailable

if TYPE_CHECKING:
    from fairlane.app import App

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("fairlane.worker")
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
        pressure: PressureConfig | None = None,
        sensors: Sequence[Sensor] | None = None,
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
        # resource backpressure (``runtime/pressure.py``): None when turned off
        self.pressure = _pressure_gauge(
            concurrency, pressure or PressureConfig.from_settings(settings.worker.pressure), sensors
        )
        # set by an exchange that registered us idle (enqueues may hand us jobs until
        # the next exchange); a worker that starts holding back leaves the idle set first
        self._maybe_idle = False
        self._held_back = False  # as last logged
        # While the store is unreachable: one warning per outage, jittered backoff.
        self._fetch_outage = Outage(f"worker {self.id}: fetching", log)
        self._ack_outage = Outage(f"worker {self.id}: settling", log)
        # Every lease this worker holds ends by this time (monotonic) unless a renewal
        # or a fetch succeeds again: the time the last successful one was sent, plus
        # the lease length. Outcomes still unsent past it are dropped, as fenced.
        self._leases_end = time.monotonic() + self.lease.duration
        self._stop_at: float | None = None

    # -- control ---------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop: it stops fetching and drains gracefully."""
        if not self._stopping.is_set():
            log.info("worker %s stopping (grace %.1fs)", self.id, self.grace)
            self._stop_at = time.monotonic()
        self._stopping.set()
        self._slot_freed.set()  # a worker holding back under pressure waits on it
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
        if self.pressure is not None:
            limit = describe_limit(self.pressure.sensors)
            log.info(
                "worker %s: backpressure on (%s)",
                self.id,
                "no memory sensor"
                if limit is None
                else f"memory limit {limit.bytes / 2**20:.0f} MiB, from {limit.source}",
            )
            # the first fetch already asks within the allowance
            self._note_pressure(self.pressure.sample(time.monotonic()))
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
        await self._declare(attempts=5)
        async with AsyncExitStack() as stack:
            if self.health_port is not None:
                health = HealthServer(
                    self.health_port,
                    monitor,
                    details=None if self.pressure is None else self._pressure_details,
                )
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
                        on_renewed=self._renewed,
                    )
                )
                services.create_task(sweep_loop(store, self.lease, self._closed))
                if self.app.payloads is not None:  # removes payloads whose records are gone
                    services.create_task(
                        payload_sweep_loop(
                            store, self.app.payloads, self.lease.sweep_interval, self._closed
                        )
                    )
                services.create_task(
                    cron_loop(self.app.crons, self._stopping, store.server_time_ms)
                )
                services.create_task(self._ack_loop())
                if self._metrics is not None:
                    services.create_task(self._sample_loop(self._metrics))
                if self.pressure is not None:
                    services.create_task(self._pressure_loop(self.pressure))
                async with asyncio.TaskGroup() as jobs:
                    await self._fetch_loop(jobs)
                    await self._drain()
                await self._flush(final=True)
                self._closed.set()
            # after the renewals have stopped, so no heartbeat follows the goodbye;
            # skipped while the store is unreachable (what it would hand back is
            # reclaimed when its lease expires)
            if not self._ack_outage.down:
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
        if self.pressure is not None:
            metrics.registry.register(PressureCollector(self.pressure))
        server = MetricsServer(port, metrics.registry, reader, config.host)
        server.start()
        stack.callback(server.stop)
        self._metrics, self.metrics_server = metrics, server
        log.info("worker %s serving /metrics and /autoscale on port %d", self.id, server.port)

    async def _sample_loop(self, metrics: WorkerMetrics) -> None:
        interval = self.metrics_config.sample_interval
        while not self._closed.is_set():
            metrics.sample(r.job for r in list(self._running.values()))
            sent = time.time()
            with contextlib.suppress(StoreUnavailable):  # the offset stays as last read
                server_ms = await self.app.store.server_time_ms()
                metrics.sync_clock(server_ms, sent, time.time())
            await wait_or_stop(self._closed, interval)

    # -- resource pressure -----------------------------------------------------------

    async def _pressure_loop(self, gauge: PressureGauge) -> None:
        """Sample the sensors; wake the fetch loop when room opens; log holding back."""
        while not self._closed.is_set():
            room = gauge.room(self._used)
            self._note_pressure(gauge.sample(time.monotonic()))
            if gauge.room(self._used) > room:
                self._slot_freed.set()
            await wait_or_stop(self._closed, gauge.interval)

    def _note_pressure(self, decision: Decision) -> None:
        """Log once when the worker starts holding back entirely, and once when it stops."""
        if decision.holding and not self._held_back:
            log.warning(
                "worker %s takes no new work (its running jobs go on): %s",
                self.id,
                self._describe_readings(decision.stopped),
            )
        elif self._held_back and not decision.holding:
            log.info("worker %s takes new work again (%s)", self.id, self._describe_readings())
        self._held_back = decision.holding

    def _describe_readings(self, names: Sequence[str] = ()) -> str:
        assert self.pressure is not None
        readings = self.pressure.readings
        shown = (
            [r for r in readings if r.name in names] if names else [r for r in readings if r.acts]
        )
        return ", ".join(f"{r.name} {r.value:.3g} (soft {r.soft}, hard {r.hard})" for r in shown)

    def _pressure_details(self) -> dict[str, object]:
        assert self.pressure is not None
        return {"pressure": self.pressure.snapshot()}

    async def _hold(self) -> None:
        """Lease nothing while pressure leaves no room; running jobs go on and settle."""
        assert self.pressure is not None
        self._carrier_active = False
        try:
            if self._maybe_idle:
                # still in the idle set from before: leave it, so enqueues stop handing
                # us jobs, and hand back (unstarted, not counted) any handed meanwhile
                outcomes, self._outcomes = self._outcomes, []
                try:
                    fetched = await self.app.store.exchange(
                        self.id,
                        self.lanes,
                        0,
                        round(self.lease.duration * 1000),
                        outcomes,
                        slots=self.concurrency,
                    )
                except StoreUnavailable as exc:
                    self._outcomes[:0] = outcomes
                    log.debug("leaving the idle set failed (%s); retrying", exc)
                else:
                    self._maybe_idle = False
                    self._fetch_calls += 1
                    self._count_settled(outcomes, fetched.ack_codes)
                    self._hand_back(fetched.jobs)
            if self._outcomes:
                self._flush_needed.set()
            self._slot_freed.clear()
            await wait_or_stop(self._slot_freed, self.pressure.interval)
        finally:
            self._carrier_active = True

    def _hand_back(self, jobs: Sequence[FetchedJob]) -> None:
        if jobs:
            self._outcomes.extend(Outcome(j.id, j.token, "release") for j in jobs)
            self._flush_needed.set()

    # -- fetching --------------------------------------------------------------------

    async def _fetch_loop(self, jobs: asyncio.TaskGroup) -> None:
        lease_ms = round(self.lease.duration * 1000)
        # Capped budgets (below) keep the worker and the server busy side by side, but a
        # job wider than the cap would never be leased: the first call, and the first
        # after each idle wait, ask for every free slot.
        widen = True
        while not self._stopping.is_set():
            free = self.concurrency - self._used
            room = free if self.pressure is None else self.pressure.room(self._used)
            if room <= 0:
                await self._wait_for_room(free)
                continue
            outcomes, self._outcomes = self._outcomes, []
            want = room if widen else self._budget(room)
            sent = time.monotonic()
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
                self._drop_expired_outcomes()
                await wait_or_stop(self._stopping, self._fetch_outage.failed(exc))
                continue
            if self._fetch_outage.down:
                self._fetch_outage.recovered()
                await self._redeclare()
            if outcomes and self._ack_outage.down:
                self._ack_outage.recovered()  # settled here, carried by the exchange
            if fetched.jobs:
                self._renewed(sent)
            widen = False
            self._maybe_idle = not fetched.jobs and self._idle_ms() > 0
            self._fetch_calls += 1
            self._count_settled(outcomes, fetched.ack_codes)
            self._start(jobs, fetched.jobs)
            if fetched.malformed:
                self._set_aside(fetched.malformed)
            if self._metrics is not None:
                self._metrics.started(fetched.jobs)
            if fetched.jobs:
                continue
            if self.burst and not self._running and not self._outcomes:
                if want < room:  # an empty reply to a capped ask says nothing of wider jobs
                    widen = True
                    continue
                log.info("worker %s: no work left (burst)", self.id)
                self._stopping.set()  # also ends the cron loop, which waits on it
                return
            handed = await self._idle_wait(fetched.next_due_ms)
            widen = True
            if handed is not None:
                self._take_handed(jobs, handed)
        self._carrier_active = False
        self._flush_needed.set()

    async def _wait_for_room(self, free: int) -> None:
        if free > 0:  # resource pressure leaves no room for now
            await self._hold()
            return
        # no free slot (below 0 after a hand-off wider than what was free)
        self._slot_freed.clear()
        await self._slot_freed.wait()

    def _take_handed(self, jobs: asyncio.TaskGroup, handed: FetchedJob) -> None:
        """Start a job an enqueue handed to us while idle, unless we now hold back."""
        if self.pressure is not None and self.pressure.holding:
            self._hand_back([handed])
            return
        self._start(jobs, [handed])
        if self._metrics is not None:
            self._metrics.started([handed])

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

    def _set_aside(self, rows: Sequence[tuple[str, str]]) -> None:
        """Dead-letter leased jobs whose rows this worker cannot read, without running them."""
        log.error("dead-lettering %d job(s) this worker cannot read: %s", len(rows), rows[:5])
        self._outcomes.extend(Outcome(job_id, token, "dead", _UNREADABLE) for job_id, token in rows)

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
            await wait_or_stop(self._stopping, self._fetch_outage.failed(exc))
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

    async def _flush(self, *, final: bool = False) -> None:
        """Settle pending outcomes, retrying while the store is unreachable until they
        are settled or their leases are known to have ended; the final flush of a
        stopping worker also gives up when its grace period is over."""
        while self._outcomes:
            outcomes, self._outcomes = self._outcomes, []
            try:
                codes = await self.app.store.ack(self.lanes, outcomes)
            except StoreUnavailable as exc:
                self._outcomes[:0] = outcomes
                delay = self._ack_outage.failed(exc)
                if self._drop_expired_outcomes():
                    return
                if not final:
                    # a stopping worker's last flush takes over, bounded by the grace
                    if await wait_or_stop(self._stopping, delay):
                        return
                    continue
                left = (self._stop_at or time.monotonic()) + self.grace - time.monotonic()
                if left <= delay:
                    log.warning(
                        "worker %s: %d outcome(s) not settled by the end of the grace "
                        "period; their jobs are reclaimed when their leases expire",
                        self.id,
                        len(self._outcomes),
                    )
                    return
                await asyncio.sleep(delay)
                continue
            self._ack_outage.recovered()
            self._ack_calls += 1
            self._count_settled(outcomes, codes)

    def _renewed(self, sent: float) -> None:
        """A renewal (or a fetch) sent at ``sent`` succeeded: the leases run from then."""
        self._leases_end = max(self._leases_end, sent + self.lease.duration)

    def _drop_expired_outcomes(self) -> bool:
        """Drop the unsent outcomes once every lease they were fenced by has ended; the
        store would reject them (or the jobs are reclaimed and run again). True if so."""
        if not self._outcomes or time.monotonic() < self._leases_end:
            return False
        log.warning(
            "worker %s: dropping %d unsettled outcome(s): the store was unreachable until "
            "their leases ended, so their jobs are reclaimed and run again",
            self.id,
            len(self._outcomes),
        )
        self._outcomes.clear()
        return True

    async def _declare(self, attempts: int) -> None:
        """Record tasks and lanes, retrying a call that fails while the server restarts;
        after ``attempts`` the error is raised."""
        for attempt in range(1, attempts + 1):
            try:
                await self.app.declare_tasks()
                await self.app.declare_lanes()
            except StoreUnavailable as exc:
                delay = self._fetch_outage.failed(exc)
                if attempt == attempts:
                    raise
                await wait_or_stop(self._stopping, delay)
            else:
                self._fetch_outage.recovered()
                return

    async def _redeclare(self) -> None:
        """After an outage, record tasks and lanes again: a server restarted without
        persistence has lost them (and loads the function library on first use). If
        that fails, the next exchange fails too, and comes back here once it succeeds."""
        with contextlib.suppress(StoreUnavailable):
            await self._declare(attempts=1)

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


def _pressure_gauge(
    concurrency: int, config: PressureConfig, sensors: Sequence[Sensor] | None
) -> PressureGauge | None:
    """The worker's gauge: ``sensors`` if given (they replace the built-ins), else the built-ins."""
    if sensors is None and not config.enabled:
        return None
    chosen = list(sensors) if sensors is not None else default_sensors(config)
    return PressureGauge(chosen, concurrency, config.bounds(), config.interval)
