"""A workflow run's children: the calls it asks for, and starting them.

A child is a job of the run's tenant, made by its task's declaration like any other
(``fairlane.registry``), with an id fixed by the run and its place in the history
(``<run>.<seq>.<i>``, so a retried slice submits the same ones), the run as its parent,
and the run's throttle key ``run:<id>`` limiting how many run at once. A child takes the
run's fairness key (the end user the run is for, read from its fetched job) unless its
call names its own (``ctx.call(...).with_fairness_key(key)``), so a workflow's children
share their tenant's part as that end user, as the run does. Children of one lane go to
the store in one call, with the app's durability.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from fairlane.config.settings import DurabilitySettings
from fairlane.registry import CallOptions, TaskDefinition
from fairlane.runtime.hooks import WorkerHooks
from fairlane.store.api import Store
from fairlane.store.durability import NotAcknowledged
from fairlane.store.shards import submit
from fairlane.store.wire import NewJob

__all__ = ["ChildCall", "start_children"]


class ChildCall(msgspec.Struct, frozen=True):
    """A child job to start from a run (``ctx.call``), for ``ctx.gather``."""

    task: TaskDefinition[Any, Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    fairness_key: str | None = None  # None: the run's own

    def with_fairness_key(self, key: str) -> ChildCall:
        """This call with its own fairness key instead of the run's (checked when the
        child is made, as an enqueue checks it)."""
        return msgspec.structs.replace(self, fairness_key=key)


def _child_job(
    call: ChildCall, child_id: str, *, run_id: str, tenant: str, key: str, cls: str, cap: int
) -> NewJob:
    task = call.task
    if not task.has_class(cls):
        cls = task.options.service_class
    job = task.new_job(
        task.encode_args(call.args, call.kwargs),
        CallOptions(
            tenant=tenant,
            idempotency_key=child_id,
            service_class=cls,
            limits={f"run:{run_id}": cap},
            fairness_key=(key or None) if call.fairness_key is None else call.fairness_key,
        ),
    )
    return msgspec.structs.replace(job, id=child_id, parent=run_id)


async def start_children(  # noqa: PLR0917 - the run's parts
    store: Store,
    run_id: str,
    tenant: str,
    fairness_key: str,
    service_class: str,
    max_children: int,
    pending: Sequence[tuple[str, ChildCall]],
    durability: DurabilitySettings,
    hooks: WorkerHooks,
) -> None:
    """Submit the children not yet settled, each in the run's service class when its
    lane has it (else its task's own) and with the run's ``fairness_key`` ('' none) when
    its call names none; a refusal fails the slice, which is retried."""
    by_lane: dict[str, list[NewJob]] = {}
    for child_id, call in pending:
        job = _child_job(
            call,
            child_id,
            run_id=run_id,
            tenant=tenant,
            key=fairness_key,
            cls=service_class,
            cap=max_children,
        )
        by_lane.setdefault(call.task.options.lane, []).append(job)
    for lane, jobs in by_lane.items():
        # the children carry the run's trace: the send span is the slice's child
        with hooks.sending(lane, jobs):
            replies, ack = await submit(store, lane, jobs, durability)
            if ack is not None and not ack.met:
                # their ids are fixed: the retried slice submits the same ones
                raise NotAcknowledged([], ack)
        for reply in replies:
            if reply.code < 0:
                # a child refused now is asked for again when the run is retried
                raise RuntimeError(
                    f"child {reply.id} of run {run_id} was refused "
                    f"({reply.reason or reply.code}); the run will try again"
                )
