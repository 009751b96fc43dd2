"""``estimated_start``: when a waiting job is expected to start, and what that rests on.

The rule and its error model are ``fairlane.policy.startpredict``; the store reads what
it needs in one call (``Store.estimate_job`` / ``estimate_new``). Nothing here runs on
a job's own path unless asked: a submission with a deadline, or one that asks for its
estimate, takes that one read before it is sent; ``job.info()``, ``explain``, the
gateway's job view and the dashboard take it when they are read.
"""

from __future__ import annotations

import time
from typing import Literal

import msgspec

from fairlane.insight.startestimate import StartEstimate, start_estimate
from fairlane.policy.deadlineorder import DEADLINE_SPAN, deadline_order
from fairlane.policy.fairkeys import ORDER_SPAN, order_score
from fairlane.store.api import Store
from fairlane.store.wire import NewJob

__all__ = [
    "OnUnmeetable",
    "StartEstimate",
    "estimate_submission",
    "refusing_late",
    "start_estimate",
]

#: what a submission with a deadline it is not expected to meet gets: refused, or taken
OnUnmeetable = Literal["reject", "accept"]


def _deadline_ms(deadline: str, now_ms: int) -> int | None:
    """A submitted job's deadline field ('' none, '+ms' relative, absolute ms)."""
    if not deadline:
        return None
    if deadline.startswith("+"):
        return now_ms + int(deadline[1:])
    return int(deadline)


def _place(job: NewJob) -> float:
    """The score a job would take in its tenant's queue, near enough to count the jobs
    ahead of it: behind every job of its priority or higher, or by its deadline where
    its task orders by deadline (a relative deadline is placed on this machine's clock:
    one tick of deadline order is far finer than its error)."""
    if job.deadline and job.deadline_order:
        now_ms = time.time() * 1000
        deadline = _deadline_ms(job.deadline, round(now_ms))
        if deadline is not None:
            return order_score(job.priority, deadline_order(deadline))
    return order_score(job.priority, ORDER_SPAN - DEADLINE_SPAN)


async def estimate_submission(store: Store, job: NewJob, lane: str) -> StartEstimate:
    """The estimate of ``job`` as if it were submitted now, at the end of its tenant's
    queue: the one read a submission takes before it is sent."""
    est = await store.estimate_new(
        tenant=job.tenant,
        lane=lane,
        cls=job.service_class,
        task=job.task,
        before=_place(job),
    )
    deadline = _deadline_ms(job.deadline, est.now_ms)
    if job.at_ms is not None or job.delay_ms:
        run_at = job.at_ms if job.at_ms is not None else est.now_ms + (job.delay_ms or 0)
        est = msgspec.structs.replace(est, state="scheduled", run_at_ms=run_at)
    return start_estimate(msgspec.structs.replace(est, deadline_ms=deadline))


def refusing_late(job: NewJob, start: StartEstimate, on_unmeetable: OnUnmeetable) -> NewJob:
    """``job`` carrying how long it is expected to take to finish, so that enqueue refuses
    it when that lands after its deadline (unless the caller takes it anyway)."""
    needs = start.needs_ms
    if on_unmeetable == "accept" or not job.deadline or needs is None:
        return job
    return msgspec.structs.replace(
        job,
        needs_ms=needs,
        needs_seen=start.queued,
        needs_per_job_ms=round(start.per_job_s * 1000),
    )
