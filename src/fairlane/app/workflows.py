"""Durable workflows as tasks: ``Workflow``, its options, and signals.

A workflow is a task whose function takes a ``Context`` first. Its runs are jobs like
any other (enqueued, admitted, dispatched fairly, leased, retried), but each lease
runs one *slice*: the function replays its checkpoints and goes on until it finishes,
waits, or spends the slice's budget (``slice_seconds`` or ``slice_steps``), then
gives its slot back. ``fairlane.runtime.slices`` runs a slice; ``Context`` holds the
operations.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

import msgspec

from fairlane.app.job import TaskOwner
from fairlane.app.task import Task
from fairlane.errors import JobNotFound
from fairlane.registry import TaskOptions, WorkflowOptions
from fairlane.runtime.context import Context

__all__ = [
    "RunNotFound",
    "SignalResult",
    "Workflow",
    "WorkflowFunction",
    "WorkflowOptions",
    "send_signal",
]

P = ParamSpec("P")
R = TypeVar("R")

SignalResult = Literal["delivered", "duplicate", "finished"]
WorkflowFunction = Callable[Concatenate[Context, P], Awaitable[R]]


class RunNotFound(JobNotFound):
    """No run of that id exists (never started, or removed by retention)."""

    # the type name jobs record and users match on (codec.encode_error): as before the move
    __module__ = "fairlane.workflows"


class Workflow(Task[P, R]):
    """A registered workflow: enqueued like a task, run in checkpointed slices."""

    workflow: WorkflowOptions

    def __init__(
        self,
        app: TaskOwner,
        fn: WorkflowFunction[P, R],
        options: TaskOptions,
        workflow: WorkflowOptions,
    ) -> None:
        # the Context is the worker's to give: the codec reads the arguments after it
        super().__init__(app, fn, options, workflow)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, lane={self.options.lane!r})"


async def send_signal(
    app: TaskOwner, run_id: str, name: str, payload: Any = None, *, signal_id: str | None = None
) -> SignalResult:
    """Deliver a signal to a run; see ``App.signal``."""
    if not name or "\n" in name:
        raise ValueError(f"a signal name must be non-empty text without newlines, got {name!r}")
    try:
        blob = msgspec.json.encode(payload).decode()
    except (TypeError, msgspec.EncodeError) as exc:
        raise TypeError(f"the signal's payload cannot be encoded as JSON: {exc}") from None
    limit = app.registry.settings.max_payload_bytes
    if len(blob) > limit:
        raise ValueError(f"the signal's payload is over {limit} bytes")
    code = await app.sharded.store_for_job(run_id).runs.signal(run_id, name, blob, signal_id or "")
    if code < 0:
        raise RunNotFound(f"no run {run_id!r}: never started, or removed by retention")
    return {1: "delivered", 2: "duplicate"}.get(code, "finished")  # type: ignore[return-value]
