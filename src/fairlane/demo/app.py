"""The demo's app: its tasks, its two lanes and its admission pool, configured from the environment.

This module owns what the demo's worker processes run. ``fairlane demo`` starts
``fairlane worker fairlane.demo.app:app --lanes light`` (and ``--lanes heavy``) with
``FAIRLANE_DEMO_APP`` (the app's name, hence its key namespace) and ``FAIRLANE_DEMO_MODE``
set for them, and builds the same app itself with :func:`build_app` to submit jobs:

* mode ``fair``: lane ``light`` is the admission pool of :data:`POOLS_TOML` (classes
  ``guaranteed``, ``standard`` and ``batch``, a per-tenant queue bound, a deferring batch
  class); lane ``heavy`` has the default classes;
* mode ``fifo``: no pool. The demo then submits every job as one tenant in one class, so
  dispatch is plain first-in, first-out.

The tasks stand in for an AI platform's work: each waits (``asyncio.sleep``) for the
simulated model and tool calls it is given, reports the tokens it used, and, if asked,
fails its first attempt the way a flaky upstream does, so that the retry is real.
Settings come from here alone (no ``FAIRLANE_`` variables, no project files), so a user's
environment cannot change what the demo measures. With ``FAIRLANE_DEMO_PARENT`` set (the
demo's pid), a worker stops itself (SIGTERM, so gracefully) if the demo disappears
without stopping it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import tomllib
from pathlib import Path
from typing import Literal

from fairlane.app import App
from fairlane.config.pools import FairlaneConfig, parse_config
from fairlane.config.settings import load_settings
from fairlane.policy.backoff import Backoff
from fairlane.policy.retention import Retention
from fairlane.runtime.context import Context
from fairlane.runtime.usage import context

__all__ = [
    "APP_ENV",
    "HEAVY_SLOTS",
    "LIGHT_SLOTS",
    "MODE_ENV",
    "PARENT_ENV",
    "POOLS_TOML",
    "Mode",
    "UpstreamError",
    "app",
    "build_app",
    "pools",
]

Mode = Literal["fair", "fifo"]

APP_ENV = "FAIRLANE_DEMO_APP"
MODE_ENV = "FAIRLANE_DEMO_MODE"
PARENT_ENV = "FAIRLANE_DEMO_PARENT"

#: worker slots serving each lane (one worker process per lane)
LIGHT_SLOTS = 16
HEAVY_SLOTS = 4

#: the admission pool of lane ``light`` in the fair run, as a user would write it
POOLS_TOML = """
[pools.light]
capacity_units = 400            # what admitted, unfinished jobs may reserve at once
recovery_reserve_units = 10     # kept free by new submissions, for retries

[pools.light.classes.guaranteed]
nominal_share = 0.25            # interactive work: a quarter of the lane is assured
min_slots = 2
min_units = 20
lendable = 0.5                  # half of it is never lent: a chat starts at once
max_queue = 100

[pools.light.classes.standard]
nominal_share = 0.75
max_queue = 400
tenant_max_queue = 24           # one tenant holds at most 24 admitted, unfinished jobs;
response_when_full = "defer"    # more are stored, admitted as its own jobs finish,
max_deferred = 80               # up to 80 deferred: past that, rejected with Retry-After

[pools.light.classes.batch]
batch = true                    # runs only on capacity no other class wants now
max_queue = 3
max_deferred = 20
response_when_full = "defer"

[retry]
max_attempts = 3
base_seconds = 1                # Retry-After: 1, 2, 4, 8 s ... for a tenant's repeated
max_seconds = 8                 # rejections within a minute, +-30 %

[estimation]
max_reservation_units = 40      # a wider job is rejected as too_wide
safety_multiplier = 1.25
"""

_SETTINGS_DIR = Path(__file__).resolve().parent
_ATTEMPTS = 3
_BACKOFF = Backoff(base=0.25, cap=2.0, jitter="full")
_TIMEOUT = 30.0
# the demo reads every record while it runs and deletes them all at the end
_KEEP = Retention(completed=1_000_000, failed=1_000_000)


class UpstreamError(RuntimeError):
    """A simulated transient failure of a model or tool provider; the retry succeeds."""


def pools() -> FairlaneConfig:
    """The fair run's admission config, parsed from :data:`POOLS_TOML`."""
    return parse_config(tomllib.loads(POOLS_TOML), source="fairlane.demo.app POOLS_TOML")


async def _simulate(
    waits: list[float], fail_first: bool, input_tokens: int, output_tokens: int
) -> float:
    """Wait out each simulated call in turn; fail the first attempt after the first call
    when asked; report the tokens and tool calls used. Returns the seconds waited."""
    job = context()
    for i, seconds in enumerate(waits):
        await asyncio.sleep(seconds)
        if i == 0 and fail_first and job.attempt == 1:
            raise UpstreamError("simulated 503 from the model provider (the retry succeeds)")
    job.report_usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        tool_calls=max(0, len(waits) - 1),
    )
    return float(sum(waits))


async def agent_step(
    waits: list[float], fail_first: bool, input_tokens: int, output_tokens: int
) -> float:
    """One step of an agent: a model call, maybe tool calls and a second model call."""
    return await _simulate(waits, fail_first, input_tokens, output_tokens)


async def chat(
    waits: list[float], fail_first: bool, input_tokens: int, output_tokens: int
) -> float:
    """An interactive reply: one short model call, a person waiting on it."""
    return await _simulate(waits, fail_first, input_tokens, output_tokens)


async def summarise(
    waits: list[float], fail_first: bool, input_tokens: int, output_tokens: int
) -> float:
    """Offline batch work: a long model call over a large document."""
    return await _simulate(waits, fail_first, input_tokens, output_tokens)


async def render(
    waits: list[float], fail_first: bool, input_tokens: int, output_tokens: int
) -> float:
    """A heavy tool call (a document render) in lane ``heavy``."""
    return await _simulate(waits, fail_first, input_tokens, output_tokens)


async def call_model(seconds: float) -> float:
    """One simulated model or tool call of a research run (a workflow step)."""
    await asyncio.sleep(seconds)
    return seconds


async def research(ctx: Context, topic: str, waits: list[float]) -> int:
    """A long agent run: one checkpointed step per call. It yields its slot every second
    of new steps and re-enters fair dispatch behind its tenant's other work."""
    for i, seconds in enumerate(waits):
        await ctx.step(f"call-{i}", call_model, seconds)
    return len(waits)


def build_app(name: str, mode: Mode, redis_url: str | None = None) -> App:
    """The demo app named ``name`` (its key namespace) for ``mode``."""
    if mode not in ("fair", "fifo"):
        raise ValueError(f"mode must be 'fair' or 'fifo', got {mode!r}")
    settings = load_settings(
        project_dir=_SETTINGS_DIR,
        environ={},
        redis_url=redis_url,
        worker={"grace_period": 2.0, "idle_block": 1.0},
    )
    made = App(
        name,
        redis_url=redis_url,
        settings=settings,
        config=pools() if mode == "fair" else None,
    )
    for fn, task_name, lane, service_class in (
        (agent_step, "demo.agent_step", "light", "standard"),
        (chat, "demo.chat", "light", "guaranteed"),
        (summarise, "demo.summarise", "light", "batch"),
        (render, "demo.render", "heavy", "standard"),
    ):
        made.task(
            name=task_name,
            gateway=True,  # the demo's tenants call them over the gateway too
            lane=lane,
            service_class=service_class,
            attempts=_ATTEMPTS,
            backoff=_BACKOFF,
            timeout=_TIMEOUT,
            retention=_KEEP,
        )(fn)
    made.workflow(
        name="demo.research",
        gateway=True,
        lane="heavy",
        slice_seconds=1.0,
        slice_steps=8,
        attempts=_ATTEMPTS,
        backoff=_BACKOFF,
        timeout=_TIMEOUT,
        retention=_KEEP,
    )(research)
    return made


def _watch_parent(parent: int) -> None:
    """Stop this worker (SIGTERM: gracefully) once the demo that started it is gone."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="fairlane-demo-parent-watch", daemon=True).start()


def _mode_from_env() -> Mode:
    mode = os.environ.get(MODE_ENV, "fair")
    if mode == "fifo":
        return "fifo"
    if mode == "fair":
        return "fair"
    raise ValueError(f"{MODE_ENV} must be 'fair' or 'fifo', got {mode!r}")


app = build_app(os.environ.get(APP_ENV, "fairlane-demo"), _mode_from_env())

if os.environ.get(PARENT_ENV, "").isdigit():
    _watch_parent(int(os.environ[PARENT_ENV]))
