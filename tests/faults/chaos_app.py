"""The chaos test's app (a task and a workflow with idempotent side effects) and its worker.

Run it as ``python -m tests.faults.chaos_app`` from the repository root, with the
environment ``tests.faults.worker_proc.worker_env`` builds (``FLT_APP``, ``FLT_URL``,
``FLT_LEASE``, ``FLT_RENEW``, ``FLT_SWEEP``, ``FLT_CONCURRENCY``, ``FLT_SHARDS``;
``FLT_LEDGER`` is the prefix of the test's own keys).

Side effects go to two hashes apart from the app's keys, as a consumer that dedupes
would write them:

* ``<prefix>:ledger``: ``HSETNX <idempotency key> <pid>``, the effect applied at most
  once per key (the job's id for a task; the step key ``run:step:attempt`` for a step);
* ``<prefix>:calls``: ``HINCRBY <idempotency key> 1``, every invocation, so that the
  test can tell which effects were attempted more than once, and check those were
  only the attempts a killed worker lost.

Both writes go in one ``MULTI`` so that a kill never leaves one without the other.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from pathlib import Path
from typing import Any

import fairlane
from fairlane.app import App
from fairlane.app.task import Task
from fairlane.app.workflows import Workflow
from fairlane.policy.backoff import Backoff
from fairlane.policy.retention import Retention
from tests.faults.worker_proc import process_options, quick_app, serve_with_ledger

__all__ = ["FLOW_STEPS", "build_app", "keys_of", "main"]

HERE = Path(__file__).resolve().parent
FLOW_STEPS = 3
NO_WAIT = Backoff(0, 0, "none")
KEEP_ALL = Retention(completed=None, failed=None)
# a job may lose several workers in a row to the kills; it must never run out of attempts
ATTEMPTS = 25

# set in the worker process by main(); the functions below only ever run there
_ctx: dict[str, Any] = {}


def keys_of(prefix: str) -> tuple[str, str]:
    """The ledger (effects applied, by idempotency key) and the raw invocation counter."""
    return f"{prefix}:ledger", f"{prefix}:calls"


async def _effect(key: str) -> None:
    ledger, calls = keys_of(_ctx["prefix"])
    async with _ctx["client"].pipeline(transaction=True) as pipe:
        pipe.hsetnx(ledger, key, os.getpid())
        pipe.hincrby(calls, key, 1)
        await pipe.execute()


async def effect(n: int, pause: float) -> int:
    """A short task: a little work, then its side effect keyed by its job id."""
    await asyncio.sleep(pause)
    await _effect(fairlane.context().id)
    return n


async def step_effect(n: int, pause: float) -> int:
    """A workflow step: its side effect keyed by the step's idempotency key."""
    await asyncio.sleep(pause)
    await _effect(fairlane.current_step().key)
    return n


def build_app(
    name: str,
    url: str,
    *,
    lease: float = 1.0,
    renew: float = 0.2,
    sweep: float = 0.3,
    concurrency: int = 10,
    shards: int = 1,
) -> tuple[App, Task[[int, float], int], Workflow[[int, float], int]]:
    app = quick_app(
        name, url, lease=lease, renew=renew, sweep=sweep, concurrency=concurrency, shards=shards
    )
    task = app.task(
        name="effect", attempts=ATTEMPTS, backoff=NO_WAIT, timeout=30.0, retention=KEEP_ALL
    )(effect)

    @app.workflow(name="flow", attempts=ATTEMPTS, backoff=NO_WAIT, timeout=30.0, retention=KEEP_ALL)
    async def flow(ctx: fairlane.Context, seed: int, pause: float) -> int:
        total = 0
        for i in range(1, FLOW_STEPS + 1):
            total += await ctx.step(f"step-{i}", step_effect, seed * i, pause)
        return total

    return app, task, flow


def main() -> None:
    app, _, _ = build_app(**process_options())
    asyncio.run(serve_with_ledger(app, _ctx))


if __name__ == "__main__":
    # run the copy imported under the module's real name (as worker_proc does)
    importlib.import_module("tests.faults.chaos_app").main()
