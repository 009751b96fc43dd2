"""A workflow app for the kill -9 fault tests, and the worker process that serves it.

Run it as ``python -m tests.faults.workflow_app`` from the repository root; it reads the
same environment variables as ``tests.faults.worker_proc`` (``worker_env`` builds
them): ``FLT_APP``, ``FLT_URL``, ``FLT_LEASE``, ``FLT_RENEW``, ``FLT_SWEEP``,
``FLT_CONCURRENCY``, and ``FLT_LEDGER``, here the prefix of the test's own keys.

``ten_steps`` runs ten steps. Each step's side effect is recorded in Redis before the
step returns: ``HINCRBY <prefix>:ledger:<run> <step key> 1`` (keyed by the step's
idempotency key, as an idempotent consumer would key its writes) and, apart from the
key, ``HINCRBY <prefix>:calls:<run> <step number> 1`` (every invocation). The run's
argument ``kill_at`` picks where the worker running it is SIGKILLed, once per run
(a ``SET NX`` marker ``<prefix>:killed:<run>`` says it happened, and where):

* mode ``boundary``: right after step ``kill_at``'s checkpoint (0: before step 1,
  10: after the last checkpoint, before the run returns);
* mode ``effect``: inside step ``kill_at``, after its side effect and before its
  checkpoint, so the step must run again -- under the same idempotency key.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
from pathlib import Path
from typing import Any

import fairlane
from fairlane.app import App
from fairlane.app.workflows import Workflow
from fairlane.policy.backoff import Backoff
from fairlane.policy.retention import Retention
from tests.faults.worker_proc import process_options, quick_app, serve_with_ledger

__all__ = ["STEPS", "WORKFLOW", "build_app", "expected_total", "keys_of", "main"]

HERE = Path(__file__).resolve().parent
STEPS = 10
WORKFLOW = "ten_steps"
NO_WAIT = Backoff(0, 0, "none")
KEEP_ALL = Retention(completed=None, failed=None)

# set in the worker process by main(); the steps below only ever run there
_ctx: dict[str, Any] = {}


def keys_of(prefix: str, run_id: str) -> tuple[str, str, str]:
    """The run's ledger (by step key), raw call counter (by step number) and kill marker."""
    return f"{prefix}:ledger:{run_id}", f"{prefix}:calls:{run_id}", f"{prefix}:killed:{run_id}"


def expected_total(seed: int) -> int:
    return seed * sum(range(1, STEPS + 1))


async def kill_once(run_id: str, where: str) -> None:
    """SIGKILL this worker process, unless this run has been killed already."""
    _, _, marker = keys_of(_ctx["prefix"], run_id)
    if await _ctx["client"].set(marker, f"{where}:{os.getpid()}", nx=True):
        os.kill(os.getpid(), signal.SIGKILL)
        await asyncio.sleep(60)  # never reached: SIGKILL cannot be handled


async def effect(n: int, seed: int, kill_after: bool) -> int:
    """Step ``n``: record the side effect under the step's idempotency key, then return."""
    step = fairlane.current_step()
    ledger, calls, _ = keys_of(_ctx["prefix"], step.run_id)
    client = _ctx["client"]
    await client.hincrby(ledger, step.key, 1)
    await client.hincrby(calls, str(n), 1)
    if kill_after:
        await kill_once(step.run_id, f"effect:{n}")
    return n * seed


def build_app(
    name: str,
    url: str,
    *,
    lease: float = 1.0,
    renew: float = 0.2,
    sweep: float = 0.3,
    concurrency: int = 1,
    shards: int = 1,
) -> tuple[App, Workflow[[int, int, str], int]]:
    app = quick_app(
        name, url, lease=lease, renew=renew, sweep=sweep, concurrency=concurrency, shards=shards
    )

    # one slice per lease: the run only gives its slot back when it is killed
    @app.workflow(
        name=WORKFLOW,
        slice_steps=10 * STEPS,
        slice_seconds=60.0,
        attempts=10,
        backoff=NO_WAIT,
        timeout=30.0,
        retention=KEEP_ALL,
    )
    async def ten_steps(ctx: fairlane.Context, seed: int, kill_at: int, mode: str) -> int:
        total = 0
        for n in range(1, STEPS + 1):
            if mode == "boundary" and kill_at == n - 1:
                await kill_once(ctx.run_id, f"boundary:{n - 1}")
            kill_after = mode == "effect" and kill_at == n
            total += await ctx.step(f"step-{n}", effect, n, seed, kill_after)
        if mode == "boundary" and kill_at == STEPS:
            await kill_once(ctx.run_id, f"boundary:{STEPS}")
        return total

    return app, ten_steps


def main() -> None:
    app, _ = build_app(**process_options())
    asyncio.run(serve_with_ledger(app, _ctx))


if __name__ == "__main__":
    # run the copy imported under the module's real name (as worker_proc does)
    importlib.import_module("tests.faults.workflow_app").main()
