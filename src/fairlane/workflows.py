"""Durable workflows as tasks: ``@app.workflow``, its options, and signals.

A workflow is a task whose function takes a ``Context`` first. Its runs are jobs like
any other (enqueued, admitted, dispatched fairly, leased, retried), but each lease
runs one *slice*: the function replays its checkpoints and goes on until it finishes,
waits, or spends the slice's budget (``slice_seconds`` or ``slice_steps``), then
gives its slot back. ``fairlane.runtime.slices`` runs a slice; ``Context`` holds the
operations.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypeVar

import msgspec

from fairlane.codec import ArgsCodec
from fairlane.errors import JobNotFound
from fairlane.runtime.context import Context
from fairlane.task import Task, TaskOptions

if TYPE_CHECKING:
    from fairlane.app import App

__all__ = ["RunNotFound", "SignalResult", "Workflow", "WorkflowOptions", "send_signal"]

P = ParamSpec("P")
R = TypeVar("R")

SignalResult = Literal["delivered", "duplicate", "finished"]
WorkflowFunction = Callable[Concatenate[Context, P], Awaitable[R]]


class RunNotFound(JobNotFound):
    """No run of that id exists (never started, or removed by retention)."""


@dataclass(frozen=True, slots=True)
class WorkflowOptions:
    """How a workflow's runs are sliced and fanned out."""

    slice_seconds: float = 2.0
    """A slice yields its slot at the first step after this many seconds."""
    slice_steps: int = 20
    """A slice yields its slot after this many new steps."""
    max_children: int = 10
    """At most this many of one run's child jobs run at once (throttle key ``run:<id>``)."""

    def __post_init__(self) -> None:
        if not self.slice_seconds > 0:
            raise ValueError(f"slice_seconds must be > 0, got {self.slice_seconds}")
        if self.slice_steps < 1:
            raise ValueError(f"slice_steps must be >= 1, got {self.slice_steps}")
        if self.max_children < 1:
            raise ValueError(f"max_children must be >= 1, got {self.max_children}")


class Workflow(Task[P, R]):
    """A registered workflow: enqueued like a task, run in checkpointed slices."""

    def __init__(
        self,
        app: App,
        fn: WorkflowFunction[P, R],
        options: TaskOptions,
        workflow: WorkflowOptions,
    ) -> None:
        super().__init__(app, fn, options)  # type: ignore[arg-type]
        # the Context is the worker's to give: callers pass the arguments after it
        self.codec = ArgsCodec(fn, skip_first=True)
        self.workflow = workflow

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, lane={self.options.lane!r})"


async def send_signal(
    app: App, run_id: str, name: str, payload: Any = None, *, signal_id: str | None = None
) -> SignalResult:
    """Deliver a signal to a run; see ``App.signal``."""
    if not name or "\n" in name:
        raise ValueError(f"a signal name must be non-empty text without newlines, got {name!r}")
    try:
        blob = msgspec.json.encode(payload).decode()
    except (TypeError, msgspec.EncodeError) as exc:
        raise TypeError(f"the signal's payload cannot be encoded as JSON: {exc}") from None
    if len(blob) > app.settings.max_payload_bytes:
        raise ValueError(f"the signal's payload is over {app.settings.max_payload_bytes} bytes")
    code = await app.store_for_job(run_id).runs.signal(run_id, name, blob, signal_id or "")
    if code < 0:
        raise RunNotFound(f"no run {run_id!r}: never started, or removed by retention")
    return {1: "delivered", 2: "duplicate"}.get(code, "finished")  # type: ignore[return-value]
