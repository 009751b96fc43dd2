"""The app of ``test_heavy_light``: CPU-bound workflows in lane ``heavy``, tiny jobs in ``light``.

Workers load it as ``tests.faults.heavy_light_app:app`` (run from the repository root,
with ``--redis-url``); the app is named by ``$HL_APP`` so that it is the test's
namespace. The test builds the same app with ``build`` to enqueue. Settings come from
here alone (no ``FAIRLANE_`` variables, no project files): short leases, and a process
pool of one child, so the heavy worker keeps at most one core busy.

* ``crunch(steps, seconds)``, a workflow in lane ``heavy``: ``steps`` steps, each a
  pure-Python busy loop of ``seconds`` run with ``executor="process"``.
* ``light()``, a task in lane ``light``: returns the server's time (ms) when it began,
  so the test measures enqueue-to-start latency on the server's clock alone.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from fairlane import App, Context
from fairlane.config.settings import load_settings
from fairlane.policy.retention import Retention

__all__ = ["app", "build", "burn", "crunch", "light"]

HERE = Path(__file__).resolve().parent
KEEP_ALL = Retention(completed=None, failed=None)  # the test reads every record


def burn(seconds: float) -> int:
    """Spin the CPU for ``seconds`` (pure Python); the loop count. Runs in a pool child."""
    end = time.perf_counter() + seconds
    spins = 0
    while time.perf_counter() < end:
        spins += 1
    return spins


async def crunch(ctx: Context, steps: int, seconds: float) -> int:
    total = 0
    for i in range(steps):
        total += await ctx.step(f"burn-{i}", burn, seconds, executor="process")
    return total


async def light() -> int:
    """The server time (ms) at which this job began running."""
    seconds, micros = await app.store.client.time()  # the worker's app: this module's
    return int(seconds) * 1000 + int(micros) // 1000


def build(name: str, url: str | None = None) -> App:
    """The app, named ``name``; ``url`` is for the test's side (workers get --redis-url)."""
    settings = load_settings(
        project_dir=HERE,
        environ={},
        redis_url=url,
        lease={"duration": 3.0, "renew_interval": 0.5, "sweep_interval": 0.5},
        worker={"grace_period": 1.0, "idle_block": 1.0, "process_pool_size": 1},
    )
    made = App(name, redis_url=url, settings=settings)
    made.workflow(name="crunch", lane="heavy", attempts=1, retention=KEEP_ALL)(crunch)
    made.task(name="light", lane="light", attempts=1, retention=KEEP_ALL)(light)
    return made


app = build(os.environ.get("HL_APP", "heavy_light"))
