"""The worker: slots, the fetch loops, and settling finished attempts in batches.

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

The worker composes its parts and starts and stops them; each is its own module: the
slots (``runtime/slots.py``), the running attempts (``runtime/attempts.py``), one
shard loop per shard (``runtime/shardloop.py``, settling in ``runtime/settling.py``,
handed the parts in ``runtime/shardlink.py`` rather than the worker), the beat, sent
from a thread so that a blocked event loop does not make a live worker look dead
(``runtime/beating.py``), and the pressure sampling, loop monitor and ``/health``
(``runtime/services.py``).
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

import msgspec

from fairlane.config.lanes import check_lane
from fairlane.registry import Registry
from fairlane.runtime.attempts import Attempts
from fairlane.runtime.balancer import KeyBalancer
from fairlane.runtime.beating import BeatShard, BeatThread
from fairlane.runtime.cron import Enqueue, cron_loop
from fairlane.runtime.durations import DurationLearner
from fairlane.runtime.executors import ThreadExecutor
from fairlane.runtime.health import LoopMonitor
from fairlane.runtime.hooks import Hooks, WorkerHooks
from fairlane.runtime.lease import wait_or_stop
from fairlane.runtime.outage import Outage
from fairlane.runtime.pressure import PressureConfig, Sensor, worker_gauge
from fairlane.runtime.runner import Runner
from fairlane.runtime.services import PressureService, WorkerServices
from fairlane.runtime.shardlink import BurstWatch, LoopSettings, Tally, WorkerLink
from fairlane.runtime.shardloop import ShardLoop
from fairlane.runtime.slots import SlotPool
from fairlane.store.beats import BeatLine
from fairlane.store.shards import ShardedStores
from fairlane.store.wire import FetchedJob, StoreError

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("fairlane.worker")


class WorkerStats(msgspec.Struct, frozen=True):
    """A snapshot of a worker's counters."""

    running: int
    fetched: int
    settled: int
    fenced: int
    fetch_calls: int
    ack_calls: int
    slots_in_use: int = 0


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
        #: what its attempts took, sent to the store for start-time estimates
        self.durations = DurationLearner(stores, self._lane_of)
        self.hooks = Hooks([*hooks, self.durations])
        self._enqueue = enqueue
        self.lanes = list(dict.fromkeys(lanes))
        self.concurrency = concurrency
        self.burst = burst
        self.grace = settings.worker.grace_period
        self.health_port = health_port
        self.id = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        #: what every shard loop fetches with
        self.loop_settings = LoopSettings(
            worker_id=self.id,
            lanes=self.lanes,
            concurrency=concurrency,
            lease=settings.lease,
            idle_block=settings.worker.idle_block,
            burst=burst,
            payloads=registry.payloads,
            tenants=settings.tenants,
        )
        self.stopping = asyncio.Event()
        self.closed = asyncio.Event()
        self.tally = Tally()
        # resource backpressure (``runtime/pressure.py``): None when turned off
        self.pressure = worker_gauge(
            concurrency, pressure or PressureConfig.from_settings(settings.worker.pressure), sensors
        )
        #: the slots the shards' fetch loops share, and take turns at
        self.slots = SlotPool(
            concurrency, batch=settings.worker.fetch_batch, pressure=self.pressure
        )
        self.attempts = Attempts(self.slots, self.hooks, self.tally)
        self._pressure = (
            None if self.pressure is None else PressureService(self.pressure, self.slots, self.id)
        )
        self._declare_outage = Outage(f"worker {self.id}: declaring", log)
        #: the passes that share global keys between shards (an app of many shards)
        self.balancer = KeyBalancer(stores, self.id) if stores.count > 1 else None
        self._stop_at: float | None = None
        self._shards: list[ShardLoop] = []

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

    def _lane_of(self, task: str) -> str:
        """The lane a task is declared in (a task this worker does not know: its first)."""
        known = self.registry.tasks.get(task)
        return known.options.lane if known is not None else self.lanes[0]

    def running_jobs(self) -> list[FetchedJob]:
        """The jobs running on this worker now."""
        return self.attempts.jobs()

    def statistics(self) -> WorkerStats:
        tally = self.tally
        return WorkerStats(
            running=len(self.attempts.running),
            fetched=tally.fetched,
            settled=tally.settled,
            fenced=tally.fenced,
            fetch_calls=tally.fetch_calls,
            ack_calls=tally.ack_calls,
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
            from fairlane.runtime.executors.process import ProcessExecutor  # noqa: PLC0415

            processes = ProcessExecutor(size, "fairlane.runtime.invoke:invoke_sync")
            await processes.start()
            stack.push_async_callback(processes.aclose)
        runner = Runner(self.registry, self.stores, threads, processes, self.id, self.hooks)
        # a pool a workflow's process step started on first use
        stack.push_async_callback(runner.aclose)
        return runner

    async def _serve(self, runner: Runner) -> None:
        self.attempts.runner = runner
        monitor = LoopMonitor(self.registry.settings.worker.loop_block_threshold)
        stores = self.stores.stores
        link = WorkerLink(
            stopping=self.stopping,
            closed=self.closed,
            tally=self.tally,
            burst=BurstWatch(len(stores), self.balancer.quiet if self.balancer else None),
            on_settled=self.hooks.settled,
            redeclare=self.redeclare,
            grace_left=self.grace_left,
        )
        self._shards = [
            ShardLoop(store, self.loop_settings, self.slots, self.attempts, link)
            for store in stores
        ]
        # tasks and lanes declared after the app connected are recorded too, so that
        # sweeps trim every task's records by age and dispatch uses every lane's classes
        self.registry.check_lanes()
        await self._declare(attempts=5)
        side = WorkerServices(monitor, health_port=self.health_port, pressure=self._pressure)
        beats = self._beat_thread()
        async with AsyncExitStack() as stack:
            side.open(stack)
            beats.start()
            stack.push_async_callback(beats.stop)
            plugged = self.hooks.serving(self, stack)
            async with asyncio.TaskGroup() as services:
                side.start(services, self.closed)
                if self.balancer is not None:
                    services.create_task(self.balancer.run(self.closed))
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
                    await self.attempts.drain(self.grace)
                for shard in self._shards:
                    await shard.flush(final=True)
                self.closed.set()
            # after the renewals and the beats have stopped, so none follows the goodbye
            await beats.stop()
            for shard in self._shards:
                await shard.leave()
        log.info("worker %s stopped", self.id)

    def _beat_thread(self) -> BeatThread:
        """The thread that beats in every shard the worker serves, each for as long as
        its leases there can be live (``runtime/beating.py``)."""
        return BeatThread(
            BeatLine.of(self.stores.store),
            self.id,
            self.loop_settings.lease,
            [BeatShard(shard.store.shard, shard.live_until) for shard in self._shards],
        )

    async def _declare(self, attempts: int) -> None:
        """Record tasks and lanes, retrying a call that fails while the server restarts;
        after ``attempts`` the error is raised."""
        for attempt in range(1, attempts + 1):
            try:
                await self.registry.declare(self.stores.stores)
                if self.balancer is not None:
                    await self.balancer.enable()
            except StoreError as exc:
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
        with contextlib.suppress(StoreError):
            await self._declare(attempts=1)
