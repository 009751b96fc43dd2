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
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from fairlane.app import App
from fairlane.cli._common import EXIT_FAILURE, AppSpec, RedisUrl, console, fail, load_app, run
from fairlane.codec import decode_error
from fairlane.store.runs import Checkpoint, LogEvent, RunHistory
from fairlane.workflows import Workflow

__all__ = ["runs_app", "runs_show"]

runs_app = typer.Typer(help="Durable workflow runs: inspect one.", no_args_is_help=True)

_WAIT_KINDS = frozenset({"sleep", "signal", "children"})
_VALUE_WIDTH = 40


@dataclass(frozen=True, slots=True)
class StepView:
    """One checkpoint of the run."""

    index: int
    kind: str
    name: str
    status: str
    ms: int
    worker: str
    ended_ms: int
    slice: int | None  # the slice that wrote it (1-based), when the log covers it
    value: Any


@dataclass(frozen=True, slots=True)
class SliceView:
    """One lease of the run: where and when it ran, and how it ended."""

    index: int
    worker: str
    attempt: int
    started_ms: int
    ended_ms: int | None  # None while it runs, or when it was cut short
    outcome: str  # suspended | yielded | ended | interrupted | running
    wait: str | None  # what a suspended slice waits for: sleep, signal:<name>, children
    until_ms: int | None  # when a suspended slice is woken at the latest
    status: str | None  # the run's final status, for the slice that ended it
    checkpoints: int
    idle_ms: int | None  # from its end to the next slice's start


@dataclass(frozen=True, slots=True)
class WaitView:
    """A durable wait that completed (it is a checkpoint) or is in progress."""

    step: int | None  # the checkpoint's index; None for the wait in progress
    kind: str
    name: str
    status: str  # ok | timeout | waiting
    waited_ms: int
    until_ms: int | None


@dataclass(frozen=True, slots=True)
class RunView:
    """Everything ``runs show`` prints."""

    id: str
    task: str
    tenant: str
    lane: str
    status: str
    attempts: int
    max_attempts: int | None
    enqueued_ms: int | None
    started_ms: int | None
    finished_ms: int | None
    result: Any
    error: str | None
    steps: list[StepView]
    slices: list[SliceView]
    waits: list[WaitView]
    pending_signals: int


# -- reading ---------------------------------------------------------------------------


async def _load(app: App, run_id: str) -> tuple[dict[str, bytes], RunHistory, int]:
    async with app:
        record = await app.store.job_record(run_id)
        history = await app.store.runs.history(run_id)
        seconds, micros = await app.store.client.time()
        return record, history, int(seconds) * 1000 + int(micros) // 1000


def _text(record: dict[str, bytes], key: str, default: str = "-") -> str:
    raw = record.get(key)
    return raw.decode("utf-8", "replace") if raw else default


def _int(record: dict[str, bytes], key: str) -> int | None:
    raw = record.get(key)
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def _json_value(raw: str | bytes) -> Any:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _slice_of(ended_ms: int, starts: list[int]) -> int | None:
    """The slice a checkpoint was written in: the last one started at or before it."""
    found = None
    for index, start in enumerate(starts, 1):
        if start <= ended_ms:
            found = index
    return found


def _slices(log: list[LogEvent], steps: list[StepView], status: str) -> list[SliceView]:
    starts = [(i, e) for i, e in enumerate(log) if e.kind == "slice"]
    views: list[SliceView] = []
    for n, (position, event) in enumerate(starts, 1):
        after = log[position + 1] if position + 1 < len(log) else None
        next_start = starts[n][1].at_ms if n < len(starts) else None
        ended_ms: int | None = None
        wait = until = final = None
        if after is not None and after.kind == "suspend":
            ended_ms = after.at_ms
            outcome = "yielded" if after.detail == "yield" else "suspended"
            if outcome == "suspended":
                wait, until = after.detail, after.extra
        elif after is not None and after.kind == "end":
            ended_ms, outcome, final = after.at_ms, "ended", after.detail
        elif after is None and status == "running":
            outcome = "running"
        else:  # a failed attempt, a lost lease, or a record gone: nothing logged its end
            outcome = "interrupted"
        views.append(
            SliceView(
                index=n,
                worker=event.detail,
                attempt=event.extra,
                started_ms=event.at_ms,
                ended_ms=ended_ms,
                outcome=outcome,
                wait=wait,
                until_ms=until,
                status=final,
                checkpoints=sum(1 for s in steps if s.slice == n),
                idle_ms=next_start - ended_ms
                if next_start is not None and ended_ms is not None
                else None,
            )
        )
    return views


def _waits(
    steps: list[StepView], slices: list[SliceView], log: list[LogEvent], now_ms: int
) -> list[WaitView]:
    waits = [
        WaitView(s.index, s.kind, s.name, s.status, s.ms, None)
        for s in steps
        if s.kind in _WAIT_KINDS
    ]
    last = slices[-1] if slices else None
    # still waiting: the log ends with the suspension (a run cancelled meanwhile has ended)
    waiting = bool(log) and log[-1].kind == "suspend"
    if waiting and last is not None and last.wait and last.ended_ms:
        kind, _, name = last.wait.partition(":")
        waits.append(WaitView(None, kind, name, "waiting", now_ms - last.ended_ms, last.until_ms))
    return waits


def _view(run_id: str, record: dict[str, bytes], history: RunHistory, now_ms: int) -> RunView:
    status = _text(record, "st", "(record removed)")
    starts = [e.at_ms for e in history.log if e.kind == "slice"]
    steps = [_step(i, c, starts) for i, c in enumerate(history.steps)]
    slices = _slices(history.log, steps, status)
    error = None
    if record.get("err"):
        try:
            info = decode_error(record["err"])
            error = f"{info.type}: {info.message}"
        except Exception:  # a malformed error is still shown, raw
            error = _text(record, "err")
    return RunView(
        id=run_id,
        task=_text(record, "task"),
        tenant=_text(record, "tenant"),
        lane=_text(record, "lane"),
        status=status,
        attempts=_int(record, "att") or 0,
        max_attempts=_int(record, "max"),
        enqueued_ms=_int(record, "enq"),
        # the record's start is its latest lease's: the run started with its first slice
        started_ms=slices[0].started_ms if slices else _int(record, "start"),
        finished_ms=_int(record, "fin"),
        result=_json_value(record["res"]) if record.get("res") else None,
        error=error,
        steps=steps,
        slices=slices,
        waits=_waits(steps, slices, history.log, now_ms),
        pending_signals=history.pending_signals,
    )


def _step(index: int, c: Checkpoint, starts: list[int]) -> StepView:
    return StepView(
        index=index,
        kind=c.kind,
        name=c.name,
        status=c.status,
        ms=c.ms,
        worker=c.worker,
        ended_ms=c.ended_ms,
        slice=_slice_of(c.ended_ms, starts),
        value=_json_value(c.value),
    )


# -- printing --------------------------------------------------------------------------


def _at(ms: int | None) -> str:
    if ms is None:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if value is not None else "-"
    return text if len(text) <= _VALUE_WIDTH else text[: _VALUE_WIDTH - 3] + "..."


def _ending(s: SliceView) -> str:
    if s.outcome == "suspended":
        return f"suspended waiting for {s.wait} until {_at(s.until_ms)}"
    if s.outcome == "yielded":
        return "yielded its slot"
    if s.outcome == "ended":
        return f"ended: {s.status}"
    if s.outcome == "running":
        return "running"
    return "interrupted (failed, or its lease was lost)"


def _print(view: RunView) -> None:
    out = console()
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
        ("enqueued", _at(view.enqueued_ms)),
        ("started", _at(view.started_ms)),
        ("finished", _at(view.finished_ms)),
        *([("result", _short(view.result))] if view.result is not None else []),
        *([("error", view.error)] if view.error else []),
        ("pending signals", str(view.pending_signals)),
    ):
        head.add_row(label, escape(value))
    out.print(head)

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
            _at(s.ended_ms),
            str(s.slice) if s.slice is not None else "-",
            escape(_short(s.value)),
        )
    out.print(steps if view.steps else "no checkpoints yet")

    slices = Table(title=f"slices ({len(view.slices)})", title_justify="left")
    for column in ("#", "worker", "attempt", "started", "ended", "how", "checkpoints", "idle ms"):
        slices.add_column(column, overflow="fold")
    for part in view.slices:
        slices.add_row(
            str(part.index),
            escape(part.worker),
            str(part.attempt),
            _at(part.started_ms),
            _at(part.ended_ms),
            escape(_ending(part)),
            str(part.checkpoints),
            str(part.idle_ms) if part.idle_ms is not None else "-",
        )
    out.print(slices if view.slices else "no slices yet (the run has not started)")

    if view.waits:
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
                _at(w.until_ms),
            )
        out.print(waits)


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
    if not record and not history.steps and not history.log:
        fail(
            f"no run {run_id} in app {app.name!r} (never enqueued, or removed by retention)",
            EXIT_FAILURE,
        )
    task = app.tasks.get(_text(record, "task", ""))
    if record and not history.log and not record.get("wfr") and not isinstance(task, Workflow):
        fail(f"{run_id} is a job of task {_text(record, 'task')}, not a workflow run")
    view = _view(run_id, record, history, now_ms)
    if as_json:
        typer.echo(json.dumps(asdict(view), indent=2, ensure_ascii=False))
    else:
        _print(view)
