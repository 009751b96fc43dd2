"""One durable workflow run as the faces show it: its steps, slices and waits.

A run is a job (task, tenant, status, attempts) plus a history: its checkpoints (one
per completed operation: a step, a sleep, a signal wait, a wait for children) and a
log of its *slices* (each lease of the run, from the worker loading its history to
the run suspending, yielding its slot, or ending). :func:`run_view` turns the job's
record and that history into plain dataclasses, which ``fairlane runs show`` prints
and the dashboard serves as JSON. It reads nothing itself: the caller passes the
record, the history and the server's time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fairlane.store.records import JobRecord
from fairlane.store.runs import Checkpoint, LogEvent, RunHistory

__all__ = ["RunView", "SliceView", "StepView", "WaitView", "run_view"]

_WAIT_KINDS = frozenset({"sleep", "signal", "children"})


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


def run_view(run_id: str, record: JobRecord | None, history: RunHistory, now_ms: int) -> RunView:
    """The run ``run_id`` from its record (None: removed) and its history."""
    rec = record or JobRecord(run_id)
    status = rec.status or "(record removed)"
    starts = [e.at_ms for e in history.log if e.kind == "slice"]
    steps = [_step(i, c, starts) for i, c in enumerate(history.steps)]
    slices = _slices(history.log, steps, status)
    failure = rec.failure
    return RunView(
        id=run_id,
        task=rec.task or "-",
        tenant=rec.tenant or "-",
        lane=rec.lane or "-",
        status=status,
        attempts=rec.attempts,
        max_attempts=rec.max_attempts,
        enqueued_ms=rec.enqueued_ms,
        # the record's start is its latest lease's: the run started with its first slice
        started_ms=slices[0].started_ms if slices else rec.started_ms,
        finished_ms=rec.finished_ms,
        result=_json_value(rec.result) if rec.result else None,
        error=f"{failure.type}: {failure.message}" if failure is not None else None,
        steps=steps,
        slices=slices,
        waits=_waits(steps, slices, history.log, now_ms),
        pending_signals=history.pending_signals,
    )


def _step(index: int, c: Checkpoint, starts: list[int]) -> StepView:
    slice_ = _slice_of(c.ended_ms, starts)
    return StepView(
        index, c.kind, c.name, c.status, c.ms, c.worker, c.ended_ms, slice_, _json_value(c.value)
    )
