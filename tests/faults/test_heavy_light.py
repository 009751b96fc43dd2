"""Heavy work kept apart from light: CPU-bound workflows do not hold up small jobs.

Two real worker processes run ``tests.faults.heavy_light_app``: one serves lane
``heavy``, where workflow runs spin the CPU in process-executor steps; the other serves
lane ``light``, where each job reports the server time it began. Light jobs are enqueued
one at a time, first with the heavy lane idle, then while heavy runs are checkpointing
busy steps, and their enqueue-to-start latencies (both on the server's clock) are
compared. A coarse guard, not a benchmark: the loaded median must stay within
``max(5 x idle, idle + 50 ms)``. Then the heavy worker is SIGKILLed mid-step: the light
worker must go on serving, and the killed worker's pool children must exit (they end
with their step) rather than spin on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from fairlane import App
from tests.faults.heavy_light_app import build
from tests.faults.worker_proc import eventually, server_ms, wait_ready

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.embedded_only]

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = 40  # light jobs per measurement
GAP = 0.025  # s between two light enqueues
HEAVY_RUNS = 2  # runs in flight; the heavy worker's process pool has one child
STEP_SECONDS = 0.4  # CPU per heavy step
STEPS = 100  # more than the test ever lets run: the heavy lane stays busy


class Workers:
    """``fairlane worker`` processes of one test; stopped, reaped and their logs shown on exit."""

    def __init__(self, namespace: str, redis_url: str, log_dir: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRLANE_")}
        path = env.get("PYTHONPATH")
        env.update(HL_APP=namespace, PYTHONPATH=f"{ROOT}{os.pathsep}{path}" if path else str(ROOT))
        self.env, self.url, self.log_dir = env, redis_url, log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[tuple[Path, IO[bytes]]] = []
        self.orphans: set[int] = set()  # pool children of a killed worker

    def start(self, lane: str, concurrency: int) -> subprocess.Popen[bytes]:
        path = self.log_dir / f"worker-{lane}.log"
        log = path.open("wb")
        self.logs.append((path, log))
        argv = ["worker", "tests.faults.heavy_light_app:app", "--lanes", lane]
        argv += ["--concurrency", str(concurrency), "--redis-url", self.url]
        proc = subprocess.Popen(
            [sys.executable, "-m", "fairlane.cli", *argv],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL, as a crash or the OOM killer would; its pool children are noted first."""
        self.orphans |= _children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for pid in self.orphans:  # they exit at the end of their step; never leave one
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for path, log in self.logs:
            log.close()
            tail = path.read_text(errors="replace").splitlines()[-15:]
            print(f"--- {path.name} (last lines)", *tail, sep="\n")  # shown when a test fails


@contextlib.contextmanager
def workers(namespace: str, redis_url: str, log_dir: Path) -> Iterator[Workers]:
    fleet = Workers(namespace, redis_url, log_dir)
    try:
        yield fleet
    finally:
        fleet.close()


def _children(pid: int) -> set[int]:
    """The child processes of ``pid`` (Linux /proc; empty elsewhere)."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as listing:
                found |= {int(child) for child in listing.read().split()}
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie left for a reaper does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def light_latencies(app: App, count: int) -> list[int]:
    """Enqueue ``count`` light jobs one at a time; each one's enqueue-to-start ms."""
    light = app.get_task("light")
    jobs = []
    for _ in range(count):
        jobs.append(await light.enqueue())
        await asyncio.sleep(GAP)
    began = [int(await job.result(timeout=15)) for job in jobs]
    pipe = app.store.client.pipeline(transaction=False)
    for job in jobs:
        pipe.hget(app.store.keys.job(job.id), "enq")
    enqueued = [int(raw) for raw in await pipe.execute()]
    return [start - enq for start, enq in zip(began, enqueued, strict=True)]


async def heavy_checkpoints(app: App, run_ids: list[str], since_ms: int) -> int:
    """Heavy steps checkpointed at or after ``since_ms``, over all runs."""
    total = 0
    for run_id in run_ids:
        history = await app.store.runs.history(run_id)
        total += sum(1 for step in history.steps if step.ended_ms >= since_ms)
    return total


async def test_heavy_lane_does_not_hold_up_light_jobs(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    app = build(namespace, redis_url)
    async with app:
        with workers(namespace, redis_url, tmp_path) as fleet:
            heavy, light = fleet.start("heavy", HEAVY_RUNS), fleet.start("light", 8)
            await wait_ready(app, heavy.pid)
            await wait_ready(app, light.pid)
            await light_latencies(app, 3)  # warm up: imports, connections

            idle = await light_latencies(app, SAMPLES)

            crunch = app.get_task("crunch")
            runs = [(await crunch.enqueue(STEPS, STEP_SECONDS)).id for _ in range(HEAVY_RUNS)]
            start_ms = await server_ms(app)

            async def busy() -> bool:  # the pool child is up and a step is done: load is on
                return await heavy_checkpoints(app, runs, start_ms) > 0

            await eventually(busy, "the first heavy step", timeout=20)
            window_ms = await server_ms(app)
            loaded = await light_latencies(app, SAMPLES)
            window = (await server_ms(app) - window_ms) / 1000
            during = await heavy_checkpoints(app, runs, window_ms)

            fleet.kill(heavy)  # mid-step: the pool child is spinning
            after = await light_latencies(app, 3)
            assert light.poll() is None, "the light worker died with the heavy one"

            async def orphans_gone() -> bool:  # a pool child ends with its step, not later
                return not any(_alive(pid) for pid in fleet.orphans)

            await eventually(orphans_gone, "the killed worker's pool children to exit", 10)

    idle_median, loaded_median = statistics.median(idle), statistics.median(loaded)
    bound = max(5 * idle_median, idle_median + 50)
    print(
        f"\nlight enqueue->start, {SAMPLES} jobs each: idle median {idle_median:g} ms "
        f"(max {max(idle)}), heavy busy median {loaded_median:g} ms (max {max(loaded)}), "
        f"bound {bound:g} ms; {during} heavy steps of {STEP_SECONDS:g}s checkpointed in the "
        f"{window:.2f}s loaded window; after the heavy worker's SIGKILL: {after} ms "
        f"({len(fleet.orphans)} pool children of it exited)"
    )
    # the heavy lane really was busy while the loaded figures were taken
    assert during >= max(1, int(window / STEP_SECONDS) - 2)
    assert loaded_median <= bound
    assert len(after) == 3  # light jobs still complete after the crash
