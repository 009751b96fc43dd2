"""The worker's background services (fairlane.runtime.services), each run on its own.

Pressure: the first sample is taken before any fetch, the fetch loops are woken when
the allowance grows, and holding back is logged once each way. Metrics: every pass
samples the running jobs and syncs the recorder's clock with a real server's, keeping
the last offset through an outage. Health: ``/health`` answers with the pressure.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import urllib.request
from collections.abc import Iterable, Sequence
from contextlib import AsyncExitStack

import pytest

from fairlane.policy.backpressure import Bounds, Reading
from fairlane.runtime.health import LoopMonitor
from fairlane.runtime.pressure import PressureGauge
from fairlane.runtime.services import (
    JobRecorder,
    MetricsSampler,
    PressureService,
    WorkerServices,
)
from fairlane.runtime.slots import SlotPool
from fairlane.store.api import Store
from fairlane.store.wire import FetchedJob, Outcome

pytestmark = pytest.mark.anyio


class Dial:
    """A sensor reading memory at values the test lines up, one per read; on its last
    value it sets ``closed``, so a service's loop ends after that sample."""

    name = "dial"

    def __init__(self, values: Sequence[float], closed: asyncio.Event | None = None) -> None:
        self.values = list(values)
        self.closed = closed
        self.reads = 0

    def read(self) -> Sequence[Reading]:
        value = self.values[min(self.reads, len(self.values) - 1)]
        self.reads += 1
        if self.closed is not None and self.reads >= len(self.values):
            self.closed.set()
        return [Reading("memory", value, 0.8, 0.9, stop=True)]


def service(dial: Dial, pool: SlotPool) -> PressureService:
    gauge = PressureGauge([dial], pool.concurrency, Bounds(min_fraction=0.25), interval=0.01)
    pool.pressure = gauge
    return PressureService(gauge, pool, "w1")


# -- pressure --------------------------------------------------------------------------------


async def test_start_takes_the_first_sample_so_the_first_fetch_is_within_the_allowance(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="fairlane.worker")
    pool = SlotPool(4, batch=100)
    pressure = service(Dial([0.95]), pool)
    assert pool.room() == 4  # not yet sampled
    pressure.start(0.0)
    assert pool.holding and pool.room() == 0
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "worker w1: backpressure on (no memory sensor)"
    assert messages[1].startswith("worker w1 takes no new work (its running jobs go on): memory")


async def test_easing_pressure_wakes_the_fetch_loops_and_is_logged_once_each_way(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="fairlane.worker")
    closed = asyncio.Event()
    pool = SlotPool(4, batch=100)
    dial = Dial([0.95, 0.95, 0.95, 0.5], closed)
    pressure = service(dial, pool)
    pressure.start(0.0)
    pool.freed.clear()
    await pressure.run(closed)
    assert dial.reads == 4
    assert pool.freed.is_set() and not pool.holding
    said = [r.getMessage().split(" (")[0] for r in caplog.records if "new work" in r.getMessage()]
    assert said == ["worker w1 takes no new work", "worker w1 takes new work again"]


async def test_steady_pressure_wakes_nobody() -> None:
    closed = asyncio.Event()
    pool = SlotPool(4, batch=100)
    dial = Dial([0.95, 0.95, 0.95], closed)
    pressure = service(dial, pool)
    pressure.start(0.0)
    pool.freed.clear()
    await pressure.run(closed)
    assert dial.reads == 3 and not pool.freed.is_set()


def test_the_readings_described_are_those_that_act_or_those_named() -> None:
    class Mixed:
        name = "mixed"

        def read(self) -> Sequence[Reading]:
            return [Reading("memory", 0.5, 0.8, 0.9, stop=True), Reading("cpu_worker", 0.3)]

    pool = SlotPool(2, batch=1)
    gauge = PressureGauge([Mixed()], 2)
    pressure = PressureService(gauge, pool, "w1")
    gauge.sample(0.0)
    assert pressure.describe_readings() == "memory 0.5 (soft 0.8, hard 0.9)"
    assert pressure.describe_readings(["cpu_worker"]) == "cpu_worker 0.3 (soft None, hard None)"
    details = pressure.details()
    assert list(details) == ["pressure"]
    assert details["pressure"] == gauge.snapshot()


# -- metrics ---------------------------------------------------------------------------------


class Recorder:
    """Records what the sampler tells it, in order."""

    def __init__(self, closed: asyncio.Event, passes: int) -> None:
        self.closed = closed
        self.passes = passes
        self.samples: list[list[str]] = []
        self.clocks: list[tuple[int, float, float]] = []

    def started(self, jobs: Sequence[FetchedJob]) -> None:
        raise AssertionError("the sampler only samples")

    def finished(self, job: FetchedJob, outcome: Outcome | None, seconds: float) -> None:
        raise AssertionError("the sampler only samples")

    def settled(self, outcomes: Sequence[Outcome], codes: Sequence[int]) -> None:
        raise AssertionError("the sampler only samples")

    def lost(self, n: int) -> None:
        raise AssertionError("the sampler only samples")

    def sample(self, running: Iterable[FetchedJob]) -> None:
        self.samples.append([job.id for job in running])
        if len(self.samples) == self.passes:
            self.closed.set()

    def sync_clock(self, server_ms: int, sent: float, received: float) -> None:
        self.clocks.append((server_ms, sent, received))


def _running(*ids: str) -> list[FetchedJob]:
    return [FetchedJob(i, "1", 1, "t", "[]", 0, 0, "acme", 3, "", 0) for i in ids]


async def test_each_pass_samples_the_running_jobs_and_syncs_the_clock(store: Store) -> None:
    closed = asyncio.Event()
    recorder = Recorder(closed, passes=2)
    running = [_running("a", "b"), _running("b")]
    recorded: JobRecorder = recorder
    sampler = MetricsSampler(recorded, lambda: running.pop(0), store.server_time_ms, 0.01)
    await sampler.run(closed)
    assert recorder.samples == [["a", "b"], ["b"]]
    # the last pass samples, then finds the worker closed: its clock read still happens
    assert len(recorder.clocks) == 2
    for server_ms, sent, received in recorder.clocks:
        assert server_ms > 0 and sent <= received


async def test_an_unreachable_store_leaves_the_clock_as_last_read(namespace: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = Store.from_url(
        f"redis://127.0.0.1:{port}", namespace, socket_connect_timeout=0.5, socket_timeout=0.5
    )
    closed = asyncio.Event()
    recorder = Recorder(closed, passes=3)
    try:
        await MetricsSampler(recorder, list, dead.server_time_ms, 0.01).run(closed)
    finally:
        await dead.aclose()
    assert recorder.samples == [[], [], []]
    assert recorder.clocks == []


# -- the services together -------------------------------------------------------------------


def _get(port: int) -> tuple[int, dict[str, object]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as reply:
        return reply.status, json.loads(reply.read())


async def test_the_services_run_until_closed_and_health_shows_the_pressure() -> None:
    closed = asyncio.Event()
    pool = SlotPool(4, batch=100)
    pressure = service(Dial([0.5]), pool)
    pressure.start(0.0)
    services = WorkerServices(LoopMonitor(5.0), health_port=0, pressure=pressure)
    async with AsyncExitStack() as stack:
        services.open(stack)
        assert services.health is not None
        async with asyncio.TaskGroup() as tasks:
            services.start(tasks, closed)
            status, body = await asyncio.to_thread(_get, services.health.port)
            closed.set()
    assert status == 200
    assert body["ok"] is True
    shown = body["pressure"]
    assert isinstance(shown, dict) and shown["holding"] is False
    assert shown["readings"] == {"memory": 0.5}


async def test_without_a_port_or_pressure_only_the_monitor_runs() -> None:
    closed = asyncio.Event()
    services = WorkerServices(LoopMonitor(5.0))
    async with AsyncExitStack() as stack:
        services.open(stack)
        assert services.health is None
        before = len(asyncio.all_tasks())
        async with asyncio.TaskGroup() as tasks:
            services.start(tasks, closed)
            assert len(asyncio.all_tasks()) == before + 1
            closed.set()
