"""Leasing one job of a declared task or workflow, as a worker would, without a worker.

The runner's and the slices' unit tests drive one attempt at a time: the job is made
with the definition's own ``encode_args`` and ``new_job``, stored in its tenant's shard
and leased back with one exchange, so what the test runs is a real lease.
"""

from __future__ import annotations

from typing import Any

from fairlane.app import App
from fairlane.registry import CallOptions, TaskDefinition
from fairlane.store.wire import FetchedJob

WORKER = "w1"
LEASE_MS = 30_000


async def lease_one(
    app: App,
    definition: TaskDefinition[Any, Any],
    lane: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    tenant: str,
    slots: int,
) -> FetchedJob:
    """Store one job of ``definition`` for ``tenant`` and lease it as worker ``w1``."""
    job = definition.new_job(definition.encode_args(args, kwargs), CallOptions(tenant=tenant))
    store = app.sharded.store_for_job(job.id)
    assert [s.code for s in await store.submit(lane, [job])] == [1]
    fetched = await store.exchange(WORKER, [lane], 1, LEASE_MS, slots=slots)
    assert [j.id for j in fetched.jobs] == [job.id]
    return fetched.jobs[0]
