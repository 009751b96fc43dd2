"""One slice of a workflow run: load its history, replay, go on, and say how it ended.

A slice returns the run's result when the function finishes. Otherwise it ends by
raising: ``Suspend`` (the run yields or waits; the worker acks it as ``suspend``),
``LeaseLost`` (a checkpoint was fenced; the worker writes nothing more),
``NonDeterminismError`` (the code no longer matches the history), or whatever the
workflow itself raised (a failed slice, retried within the run's attempt budget).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fairlane.policy.slicing import SliceBudget
from fairlane.runtime.context import (
    Context,
    Diverged,
    LeaseLost,
    NonDeterminismError,
    ProcessPool,
)

if TYPE_CHECKING:
    from fairlane.store.api import Store
    from fairlane.store.wire import FetchedJob
    from fairlane.workflows import Workflow

__all__ = ["run_slice"]


async def run_slice(
    flow: Workflow[Any, Any],
    job: FetchedJob,
    *,
    store: Store,
    worker: str,
    process_pool: ProcessPool,
) -> Any:
    """Run one slice of ``job`` (a run of ``flow``); its value if the run finished."""
    start = await store.runs.load(job.id, job.token, worker)
    if start is None:
        raise LeaseLost(job.id)
    shape = flow.workflow
    ctx = Context(
        store=store,
        run_id=job.id,
        token=job.token,
        tenant=job.tenant,
        service_class=start.service_class,
        worker=worker,
        history=start.steps,
        failures=start.failures,
        budget=SliceBudget(shape.slice_seconds, shape.slice_steps, time.monotonic()),
        max_children=shape.max_children,
        process_pool=process_pool,
    )
    args, kwargs = flow.codec.decode(job.args)
    try:
        value = await flow.fn(ctx, *args, **kwargs)
    except Diverged as exc:
        raise exc.error from None
    if ctx.replaying:
        raise NonDeterminismError(
            f"run {job.id} returned with {len(start.steps) - ctx.checkpoints_read} "
            "checkpointed operations not asked for again: the workflow's code changed"
        )
    return value
