"""``estimated_start``: when a waiting job is expected to start, and what that rests on.

The rule and its error model are ``fairlane.policy.startpredict``; the store reads what
it needs in one call (``Store.estimate_job`` / ``estimate_new``). Nothing here runs on
a job's own path unless asked: a submission with a deadline, or one that asks for its
estimate, takes that one read before it is sent; ``job.info()``, ``explain``, the
gateway's job view and the dashboard take it when they are read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import msgspec

from fairlane.policy.startpredict import Prediction, predict
from fairlane.store.api import Store
from fairlane.store.durations import Estimated
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

#: why nothing can be said, by the job's status
_NOT_WAITING = {
    "running": "it is running",
    "deferred": "it waits for admission to find it room",
    "throttled": "it waits for a throttle key to let it through",
    "suspended": "it is a workflow run that waits",
}


@dataclass(frozen=True, slots=True)
class StartEstimate:
    """When a job is expected to start (an estimate, not a promise) and why."""

    at: datetime | None
    """The expected start (aware, UTC); None where nothing can be said (``why_none``)."""
    wait_s: float | None = None
    """Seconds from the estimate to the expected start."""
    prediction: Prediction | None = None
    """What the figure rests on: work ahead, slots, share (``policy/startpredict.py``)."""
    expected_run_s: float | None = None
    """How long the job itself is expected to run (learned), if known."""
    deadline: datetime | None = None
    why_none: str = ""
    lane: str = ""
    cls: str = ""

    @property
    def finish(self) -> datetime | None:
        """The expected end: the expected start plus the learned run length."""
        if self.at is None or self.expected_run_s is None:
            return None
        return datetime.fromtimestamp(self.at.timestamp() + self.expected_run_s, UTC)

    @property
    def needs_ms(self) -> int | None:
        """Milliseconds from the estimate to the expected end (None: not known)."""
        if self.wait_s is None or self.expected_run_s is None:
            return None
        return max(1, round((self.wait_s + self.expected_run_s) * 1000))

    @property
    def meets_deadline(self) -> bool | None:
        """Whether the expected end is by the deadline (None: no deadline, or unknown)."""
        finish = self.finish
        if finish is None or self.deadline is None:
            return None
        return finish <= self.deadline


def _when(ms: float) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def start_estimate(est: Estimated) -> StartEstimate:
    """The estimate from what the store said (``Store.estimate_job`` / ``estimate_new``)."""
    base = StartEstimate(
        None,
        expected_run_s=None if est.own_ms is None else est.own_ms / 1000,
        deadline=None if est.deadline_ms is None else _when(est.deadline_ms),
        lane=est.lane,
        cls=est.cls,
    )
    if not est.state:
        return dataclasses.replace(base, why_none="the job is not known")
    if est.paused:
        return dataclasses.replace(base, why_none="an operator's pause holds it")
    if est.situation is None:
        why = _NOT_WAITING.get(est.state, f"it is {est.state}")
        return dataclasses.replace(base, why_none=why)
    prediction = predict(est.situation)
    if prediction is None:
        why = (
            "no live worker serves its lane"
            if est.situation.capacity <= 0
            else "no attempt of its class has finished yet: there is nothing to learn from"
        )
        return dataclasses.replace(base, why_none=why)
    start_ms = est.now_ms + prediction.wait_s * 1000
    if est.state == "scheduled" and est.run_at_ms is not None:
        start_ms = max(start_ms, est.run_at_ms)
    return dataclasses.replace(
        base,
        at=_when(start_ms),
        wait_s=(start_ms - est.now_ms) / 1000,
        prediction=prediction,
    )


def _deadline_ms(deadline: str, now_ms: int) -> int | None:
    """A submitted job's deadline field ('' none, '+ms' relative, absolute ms)."""
    if not deadline:
        return None
    if deadline.startswith("+"):
        return now_ms + int(deadline[1:])
    return int(deadline)


async def estimate_submission(store: Store, job: NewJob, lane: str) -> StartEstimate:
    """The estimate of ``job`` as if it were submitted now, at the end of its tenant's
    queue: the one read a submission takes before it is sent."""
    est = await store.estimate_new(
        tenant=job.tenant, lane=lane, cls=job.service_class, task=job.task
    )
    deadline = _deadline_ms(job.deadline, est.now_ms)
    if job.at_ms is not None or job.delay_ms:
        run_at = job.at_ms if job.at_ms is not None else est.now_ms + (job.delay_ms or 0)
        est = dataclasses.replace(est, state="scheduled", run_at_ms=run_at)
    return start_estimate(dataclasses.replace(est, deadline_ms=deadline))


def refusing_late(job: NewJob, start: StartEstimate, on_unmeetable: OnUnmeetable) -> NewJob:
    """``job`` carrying how long it is expected to take to finish, so that enqueue refuses
    it when that lands after its deadline (unless the caller takes it anyway)."""
    needs = start.needs_ms
    if on_unmeetable == "accept" or not job.deadline or needs is None:
        return job
    return msgspec.structs.replace(job, needs_ms=needs)
