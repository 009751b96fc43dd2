"""``fairlane runs show``: one durable workflow run, as its store records it.

A run is a job (task, tenant, status, attempts) plus a history: its checkpoints (one
per completed operation: a step, a sleep, a signal wait, a wait for children) and a
log of its *slices* (each lease of the run, from the worker loading its history to
the run suspending, yielding its slot, or ending). This command prints the job's
record, the checkpoints, the slices (how each ended, and how many checkpoints it
made: those written between its start and the next slice's), the waits with how
long each took, and the signals delivered but not yet taken. ``--json`` prints the
same as one JSON document.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from fairlane.app import App
from fairlane.app.workflows import Workflow
from fairlane.cli._common import (
    EXIT_FAILURE,
    AppSpec,
    RedisUrl,
    console,
    fail,
    load_app,
    run,
    utc_ms,
)
from fairlane.insight.runview import RunView, SliceView, run_view
from fairlane.store.records import JobRecord
from fairlane.store.runs import RunHistory

__all__ = ["runs_app", "runs_show"]

runs_app = typer.Typer(help="Durable workflow runs: inspect one.", no_args_is_help=True)

_VALUE_WIDTH = 40


async def _load(app: App, run_id: str) -> tuple[JobRecord | None, RunHistory, int]:
    async with app:
        store = app.store_for_job(run_id)
        record = await store.read_job(run_id)
        history = await store.runs.history(run_id)
        return record, history, await store.server_time_ms()


# -- printing --------------------------------------------------------------------------


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if value is not None else "-"
    return text if len(text) <= _VALUE_WIDTH else text[: _VALUE_WIDTH - 3] + "..."


def _ending(s: SliceView) -> str:
    if s.outcome == "suspended":
        return f"suspended waiting for {s.wait} until {utc_ms(s.until_ms)}"
    if s.outcome == "yielded":
        return "yielded its slot"
    if s.outcome == "ended":
        return f"ended: {s.status}"
    if s.outcome == "running":
        return "running"
    return "interrupted (failed, or its lease was lost)"


def _print(view: RunView) -> None:
    out = console()
    out.print(_head(view))
    out.print(_steps(view) if view.steps else "no checkpoints yet")
    out.print(_slices(view) if view.slices else "no slices yet (the run has not started)")
    if view.waits:
        out.print(_waits(view))


def _head(view: RunView) -> Table:
    """The run's identity, status, attempts and times, one per row."""
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column(overflow="fold")
    of = f" of {view.max_attempts}" if view.max_attempts is not None else ""
    for label, value in (
        ("run", view.id),
        ("task", view.task),
        ("tenant", view.tenant),
        ("lane", view.lane),
        ("status", view.status),
        ("attempts", f"{view.attempts}{of}"),
        ("enqueued", utc_ms(view.enqueued_ms)),
        ("started", utc_ms(view.started_ms)),
        ("finished", utc_ms(view.finished_ms)),
        *([("result", _short(view.result))] if view.result is not None else []),
        *([("error", view.error)] if view.error else []),
        ("pending signals", str(view.pending_signals)),
    ):
        head.add_row(label, escape(value))
    return head


def _steps(view: RunView) -> Table:
    """Its checkpoints: steps, with what each took and where it ended."""
    steps = Table(title=f"steps ({len(view.steps)})", title_justify="left")
    for column in ("#", "kind", "name", "status", "took ms", "worker", "ended", "slice", "value"):
        steps.add_column(
            column, overflow="fold", justify="right" if column == "took ms" else "left"
        )
    for s in view.steps:
        steps.add_row(
            str(s.index),
            s.kind,
            escape(s.name),
            s.status,
            str(s.ms),
            escape(s.worker),
            utc_ms(s.ended_ms),
            str(s.slice) if s.slice is not None else "-",
            escape(_short(s.value)),
        )
    return steps


def _slices(view: RunView) -> Table:
    """The slices it ran in: on which worker, which attempt, and how each ended."""
    slices = Table(title=f"slices ({len(view.slices)})", title_justify="left")
    for column in ("#", "worker", "attempt", "started", "ended", "how", "checkpoints", "idle ms"):
        slices.add_column(column, overflow="fold")
    for part in view.slices:
        slices.add_row(
            str(part.index),
            escape(part.worker),
            str(part.attempt),
            utc_ms(part.started_ms),
            utc_ms(part.ended_ms),
            escape(_ending(part)),
            str(part.checkpoints),
            str(part.idle_ms) if part.idle_ms is not None else "-",
        )
    return slices


def _waits(view: RunView) -> Table:
    """Its durable waits, done or in progress: how long each waited, and until when."""
    waits = Table(title=f"waits ({len(view.waits)})", title_justify="left")
    for column in ("step", "kind", "name", "status", "waited ms", "until"):
        waits.add_column(column, overflow="fold")
    for w in view.waits:
        waits.add_row(
            str(w.step) if w.step is not None else "-",
            w.kind,
            escape(w.name),
            w.status,
            str(w.waited_ms),
            utc_ms(w.until_ms),
        )
    return waits


# -- the command -----------------------------------------------------------------------


@runs_app.command("show")
def runs_show(
    app_spec: AppSpec,
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print the run as JSON.")] = False,
    redis_url: RedisUrl = None,
) -> None:
    """Show a workflow run: its record, checkpoints, slices, waits and pending signals."""
    app = load_app(app_spec, redis_url)
    record, history, now_ms = run(_load(app, run_id))
    if record is None and not history.steps and not history.log:
        fail(
            f"no run {run_id} in app {app.name!r} (never enqueued, or removed by retention)",
            EXIT_FAILURE,
        )
    plain = record is not None and not isinstance(app.tasks.get(record.task), Workflow)
    if record is not None and plain and not history.log and not record.run_started:
        fail(f"{run_id} is a job of task {record.task or '-'}, not a workflow run")
    view = run_view(run_id, record, history, now_ms)
    if as_json:
        typer.echo(json.dumps(asdict(view), indent=2, ensure_ascii=False))
    else:
        _print(view)
