"""``fairlane example``: the quickstart, end to end, in one process.

Connects the app of :mod:`fairlane.example` (to ``--redis-url``, the configured server or
the local dev server, started if needed), runs a worker for its lanes in the same event
loop, enqueues jobs for a few tenants, waits for every result and prints a summary.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.table import Table

from fairlane.app import App
from fairlane.app.job import Job
from fairlane.app.worker import Worker
from fairlane.cli._common import EXIT_FAILURE, EXIT_USAGE, RedisUrl, console, fail, run
from fairlane.config.settings import ConfigError
from fairlane.errors import TaskFailed
from fairlane.store.api import redact_url

__all__ = ["example"]

TENANTS = ("acme", "globex", "initech")
TEXTS = (
    "Where is my order?",
    "The package arrived broken, I want a refund",
    "Thanks, everything works now",
    "Can I change my plan?",
    "Delivery was late again",
    "Great support team",
)


@dataclass(frozen=True)
class _Outcome:
    tenant: str
    task: str
    ok: bool
    wait: float  # seconds from enqueue to result in hand
    attempts: int
    detail: str


def example(
    jobs: Annotated[
        int, typer.Option("--jobs", "-n", min=1, max=100_000, help="How many jobs to enqueue.")
    ] = 30,
    redis_url: RedisUrl = None,
    timeout: Annotated[
        float, typer.Option(min=1.0, help="Seconds to wait for each result.")
    ] = 60.0,
) -> None:
    """Run the quickstart: enqueue jobs for a few tenants, run them in-process, summarise."""
    try:
        from fairlane import example as demo  # noqa: PLC0415 - importing it builds an App
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)
    app = demo.app
    if redis_url:
        app.redis_url = redis_url
    outcomes = run(_demo(app, jobs, timeout))
    _summarise(outcomes)
    if not all(outcome.ok for outcome in outcomes):
        raise typer.Exit(EXIT_FAILURE)


async def _enqueue(i: int, tenant: str, run_id: str) -> tuple[str, Job[Any]]:
    from fairlane import example as demo  # noqa: PLC0415 - already imported by example()

    text = TEXTS[i % len(TEXTS)]
    kind = (i // len(TENANTS)) % 3  # every tenant gets every kind of task
    if kind == 0:
        return "classify", await demo.classify.enqueue(text, tenant=tenant)
    if kind == 1:
        return "flaky", await demo.flaky.enqueue(f"{run_id}-{i}", tenant=tenant)
    return "embed", await demo.embed.enqueue(text, tenant=tenant)


async def _wait(tenant: str, task: str, job: Job[Any], started: float, timeout: float) -> _Outcome:
    try:
        value = await job.result(timeout=timeout)
    except TaskFailed as exc:
        ok, detail = False, f"{exc.type_name}: {exc.message}"
    except TimeoutError:
        ok, detail = False, f"no result within {timeout:g}s"
    else:
        ok, detail = True, repr(value)
    waited = time.monotonic() - started
    attempts = (await job.info()).attempts
    return _Outcome(tenant, task, ok, waited, attempts, detail)


async def _demo(app: App, count: int, timeout: float) -> list[_Outcome]:
    out = console()
    async with app:
        lanes = sorted({task.options.lane for task in app.tasks.values()})
        out.print(
            f"server {redact_url(app.url or '?')}; worker in-process on lanes {', '.join(lanes)}"
        )
        worker = Worker(app, lanes=lanes, concurrency=app.settings.worker.concurrency)
        serving = asyncio.create_task(worker.run(), name="fairlane-example-worker")
        waits: list[asyncio.Task[_Outcome]] = []
        try:
            run_id = os.urandom(4).hex()
            for i in range(count):
                tenant = TENANTS[i % len(TENANTS)]
                started = time.monotonic()
                task, job = await _enqueue(i, tenant, run_id)
                waits.append(asyncio.create_task(_wait(tenant, task, job, started, timeout)))
            out.print(f"enqueued {count} job(s) for {min(count, len(TENANTS))} tenant(s)")
            gathered = asyncio.gather(*waits)
            racing: set[asyncio.Future[Any]] = {gathered, serving}
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
            if not gathered.done():  # the worker ended first: surface why
                serving.result()
                raise RuntimeError("the in-process worker stopped before the jobs finished")
            return list(gathered.result())
        finally:
            for waiting in waits:
                waiting.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
            worker.stop()
            await asyncio.wait_for(asyncio.shield(serving), app.settings.worker.grace_period + 10)


def _summarise(outcomes: list[_Outcome]) -> None:
    out = console()
    samples: dict[str, _Outcome] = {}
    for outcome in outcomes:
        samples.setdefault(outcome.task, outcome)
    for task, outcome in samples.items():
        out.print(f"  {task}: {outcome.detail} (attempts: {outcome.attempts})")
    table = Table(title="results per tenant", title_justify="left")
    for column in ("tenant", "jobs", "done", "failed", "retried", "p50 wait", "max wait"):
        table.add_column(column, justify="left" if column == "tenant" else "right")
    for tenant in sorted({o.tenant for o in outcomes}):
        mine = [o for o in outcomes if o.tenant == tenant]
        waits = [o.wait for o in mine]
        table.add_row(
            tenant,
            str(len(mine)),
            str(sum(o.ok for o in mine)),
            str(sum(not o.ok for o in mine)),
            str(sum(o.attempts > 1 for o in mine)),
            f"{statistics.median(waits) * 1000:.0f} ms",
            f"{max(waits) * 1000:.0f} ms",
        )
    out.print(table)
    failures = [o for o in outcomes if not o.ok]
    for outcome in failures[:5]:
        out.print(f"[red]failed[/] {outcome.task} for {outcome.tenant}: {outcome.detail}")
    if not failures:
        out.print(f"[green]all {len(outcomes)} jobs done[/] (wait = enqueue to result in hand)")
