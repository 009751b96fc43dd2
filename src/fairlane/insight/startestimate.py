"""When a waiting job is expected to start, and how to say it: the estimate worked out
from what the store said (``Store.estimate_job`` / ``estimate_new``) by the rule in
``fairlane.policy.startpredict``, and the sentence ``explain`` and the dashboard give."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime

from fairlane.policy.startpredict import DEADLINE_SAFETY, Prediction, per_job_wait, predict
from fairlane.store.durations import Estimated

__all__ = ["StartEstimate", "start_estimate", "start_text"]


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
    queued: int = -1
    """Its tenant's jobs queued in its class when it was estimated (-1: not read)."""
    per_job_s: float = 0.0
    """What one more job of its tenant ahead of it would add to its wait."""

    @property
    def finish(self) -> datetime | None:
        """The expected end: the expected start plus the learned run length."""
        if self.at is None or self.expected_run_s is None:
            return None
        return datetime.fromtimestamp(self.at.timestamp() + self.expected_run_s, UTC)

    @property
    def needs_ms(self) -> int | None:
        """Milliseconds from the estimate to the end a deadline is judged by: the expected
        start plus the learned length ``DEADLINE_SAFETY`` times over (None: not known)."""
        if self.wait_s is None or self.expected_run_s is None:
            return None
        return max(1, round((self.wait_s + self.expected_run_s * DEADLINE_SAFETY) * 1000))

    @property
    def meets_deadline(self) -> bool | None:
        """Whether the job is expected to finish by its deadline, as a submission's is
        judged (None: no deadline, or not known)."""
        needs = self.needs_ms
        if needs is None or self.deadline is None or self.at is None or self.wait_s is None:
            return None
        estimated_ms = self.at.timestamp() * 1000 - self.wait_s * 1000
        return estimated_ms + needs <= self.deadline.timestamp() * 1000


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
    own = next((b for b in est.situation.backlogs if b.tenant == est.tenant), None)
    return dataclasses.replace(
        base,
        at=_when(start_ms),
        wait_s=(start_ms - est.now_ms) / 1000,
        prediction=prediction,
        queued=own.jobs if own is not None else -1,
        per_job_s=per_job_wait(est.situation),
    )


def _about(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def start_text(est: StartEstimate) -> str:
    """The estimate in one sentence: when, and what it rests on; or why nothing is said."""
    p = est.prediction
    if est.at is None or p is None or est.wait_s is None:
        return f"no start estimate: {est.why_none}" if est.why_none else "no start estimate"
    where = f"{est.lane}/{est.cls}" if est.lane else est.cls
    if est.wait_s <= 0:
        head = f"expected to start at once: {p.slots:g} slots of {where} are free for it"
    else:
        head = (
            f"expected to start in about {_about(est.wait_s)}: {p.work_ahead:,.0f} slot-seconds "
            f"ahead of it in {where} ({p.slots:g} slots), {p.ahead:,} of its tenant's jobs "
            f"ahead, its tenant's share {p.share:.0%} of {p.tenants} waiting tenant(s)"
        )
    tail = ""
    if est.expected_run_s is not None:
        tail = f"; it is expected to run {_about(est.expected_run_s)}"
    if est.meets_deadline is False:
        tail += ", past its deadline"
    return head + tail + " (an estimate, not a promise)"
