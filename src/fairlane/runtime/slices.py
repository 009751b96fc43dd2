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

from fairlane.config.settings import DurabilitySettings
from fairlane.policy.slicing import SliceBudget
from fairlane.registry import TaskDefinition
from fairlane.runtime.context import (
    Context,
    Diverged,
    LeaseLost,
    NonDeterminismError,
    ProcessPool,
)
from fairlane.runtime.hooks import WorkerHooks

if TYPE_CHECKING:
    from fairlane.store.api import Store
    from fairlane.store.wire import FetchedJob

__all__ = ["run_slice"]


async def run_slice(
    flow: TaskDefinition[Any, Any],
    job: FetchedJob,
    *,
    store: Store,
    worker: str,
    process_pool: ProcessPool,
    durability: DurabilitySettings,
    hooks: WorkerHooks,
) -> Any:
    """Run one slice of ``job`` (a run of the workflow ``flow``); its value if the run
    finished."""
    shape = flow.workflow
    if shape is None:
        raise TypeError(f"task {flow.name} is not a workflow")
    start = await store.runs.load(job.id, job.token, worker)
    if start is None:
        raise LeaseLost(job.id)
    ctx = Context(
        store=store,
        run_id=job.id,
        token=job.token,
        tenant=job.tenant,
        fairness_key=job.fairness_key,
        service_class=start.service_class,
        worker=worker,
        history=start.steps,
        failures=start.failures,
        budget=SliceBudget(shape.slice_seconds, shape.slice_steps, time.monotonic()),
        max_children=shape.max_children,
        process_pool=process_pool,
        durability=durability,
        hooks=hooks,
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
