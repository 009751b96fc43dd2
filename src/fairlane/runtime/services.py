"""The worker's background services, beside its fetch loops: pressure, metrics, health.

Each service here runs until the worker has closed and knows nothing of the app:

- ``PressureService`` samples the resource gauge (``runtime/pressure.py``) every
  interval, wakes the shard loops when the allowance grows (they may be holding back),
  and logs once when the worker starts holding back entirely and once when it stops;
  its ``details`` are what ``/health`` shows of it.
- ``MetricsSampler`` samples the running jobs into the worker's recorder and keeps the
  recorder's view of the server's clock, from which queue waits are measured.
- ``WorkerServices`` starts them, with the event-loop monitor and its ``/health``
  endpoint, as the worker's tasks.

The recorder is anything shaped like ``JobRecorder``: the metrics floor provides one,
and the runtime never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AsyncExitStack, ExitStack
from typing import TYPE_CHECKING, Protocol

from fairlane.policy.backpressure import Decision
from fairlane.runtime.health import LoopMonitor
from fairlane.runtime.lease import wait_or_stop
from fairlane.runtime.pressure import PressureGauge, describe_limit
from fairlane.runtime.slots import SlotPool
from fairlane.store.wire import FetchedJob, Outcome, StoreError

if TYPE_CHECKING:
    from fairlane.runtime.healthserver import HealthServer

__all__ = ["JobRecorder", "MetricsSampler", "PressureService", "WorkerServices"]

log = logging.getLogger("fairlane.worker")


class JobRecorder(Protocol):
    """What a worker records of its jobs, on its own path and with no server calls."""

    def started(self, jobs: Sequence[FetchedJob]) -> None: ...

    def finished(self, job: FetchedJob, outcome: Outcome | None, seconds: float) -> None: ...

    def settled(self, outcomes: Sequence[Outcome], codes: Sequence[int]) -> None: ...

    def lost(self, n: int) -> None: ...

    def sample(self, running: Iterable[FetchedJob]) -> None: ...

    def sync_clock(self, server_ms: int, sent: float, received: float) -> None: ...


class PressureService:
    """Keeps a worker's pressure decision fresh, and says when it holds back."""

    def __init__(self, gauge: PressureGauge, slots: SlotPool, worker_id: str) -> None:
        self.gauge = gauge
        self.slots = slots
        self.worker_id = worker_id
        self._held_back = False  # as last logged

    def start(self, now: float) -> None:
        """Log the memory limit in force, and take the first sample, so that the first
        fetch already asks within the allowance."""
        limit = describe_limit(self.gauge.sensors)
        log.info(
            "worker %s: backpressure on (%s)",
            self.worker_id,
            "no memory sensor"
            if limit is None
            else f"memory limit {limit.bytes / 2**20:.0f} MiB, from {limit.source}",
        )
        self.note(self.gauge.sample(now))

    async def run(self, closed: asyncio.Event) -> None:
        """Sample the sensors; wake the fetch loops when room opens; log holding back."""
        gauge, slots = self.gauge, self.slots
        while not closed.is_set():
            room = gauge.room(slots.used)
            self.note(gauge.sample(time.monotonic()))
            if gauge.room(slots.used) > room:
                slots.notify()
            await wait_or_stop(closed, gauge.interval)

    def note(self, decision: Decision) -> None:
        """Log once when the worker starts holding back entirely, and once when it stops."""
        if decision.holding and not self._held_back:
            log.warning(
                "worker %s takes no new work (its running jobs go on): %s",
                self.worker_id,
                self.describe_readings(decision.stopped),
            )
        elif self._held_back and not decision.holding:
            log.info(
                "worker %s takes new work again (%s)", self.worker_id, self.describe_readings()
            )
        self._held_back = decision.holding

    def describe_readings(self, names: Sequence[str] = ()) -> str:
        """The readings named (default: every one that acts), with their thresholds."""
        readings = self.gauge.readings
        shown = (
            [r for r in readings if r.name in names] if names else [r for r in readings if r.acts]
        )
        return ", ".join(f"{r.name} {r.value:.3g} (soft {r.soft}, hard {r.hard})" for r in shown)

    def details(self) -> dict[str, object]:
        """The worker's pressure as ``/health`` shows it."""
        return {"pressure": self.gauge.snapshot()}


class MetricsSampler:
    """Samples the running jobs into a recorder, and syncs its clock with the server's."""

    def __init__(
        self,
        recorder: JobRecorder,
        running: Callable[[], Iterable[FetchedJob]],
        server_time_ms: Callable[[], Awaitable[int]],
        interval: float,
    ) -> None:
        self.recorder = recorder
        self.running = running
        self.server_time_ms = server_time_ms
        self.interval = interval

    async def run(self, closed: asyncio.Event) -> None:
        recorder = self.recorder
        while not closed.is_set():
            recorder.sample(self.running())
            sent = time.time()
            with contextlib.suppress(StoreError):  # the offset stays as last read
                server_ms = await self.server_time_ms()
                recorder.sync_clock(server_ms, sent, time.time())
            await wait_or_stop(closed, self.interval)


class WorkerServices:
    """A worker's background services: the loop monitor (and ``/health`` when given a
    port), resource pressure and metrics sampling, each when the worker has it."""

    def __init__(
        self,
        monitor: LoopMonitor,
        *,
        health_port: int | None = None,
        pressure: PressureService | None = None,
        sampler: MetricsSampler | None = None,
    ) -> None:
        self.monitor = monitor
        self.health_port = health_port
        self.pressure = pressure
        self.sampler = sampler
        self.health: HealthServer | None = None

    def open(self, stack: ExitStack | AsyncExitStack) -> None:
        """Start the ``/health`` endpoint, if asked for; ``stack`` stops it."""
        if self.health_port is None:
            return
        from fairlane.runtime.healthserver import HealthServer  # noqa: PLC0415 - see there

        details = None if self.pressure is None else self.pressure.details
        self.health = HealthServer(self.health_port, self.monitor, details=details)
        self.health.start()
        stack.callback(self.health.stop)

    def start(self, tasks: asyncio.TaskGroup, closed: asyncio.Event) -> None:
        """Run every service in ``tasks`` until ``closed`` is set."""
        tasks.create_task(self.monitor.run(closed))
        if self.sampler is not None:
            tasks.create_task(self.sampler.run(closed))
        if self.pressure is not None:
            tasks.create_task(self.pressure.run(closed))
