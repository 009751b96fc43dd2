"""What a submission is told: accepted, deferred, rejected (with Retry-After) or unavailable.

``task.submit(...)`` answers with an :class:`Admission`; ``task.enqueue(...)`` raises
:class:`Rejected` instead of returning a rejection. The decision itself is the
store's, made atomically with the reservation (``fairlane.policy.admission`` states
the rules). This module prices what a caller declares and turns the store's reply
into the answer, with a Retry-After that grows with the tenant's recent rejections
and is jittered on this side, so that callers refused together do not return together.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from fairlane.errors import FairlaneError
from fairlane.policy.admission import (
    Coefficients,
    Estimate,
    EstimationSettings,
    RetryAfterPolicy,
    retry_after,
    to_milli,
)

if TYPE_CHECKING:
    from fairlane.store.durability import Acknowledgement
    from fairlane.store.wire import Submitted
    from fairlane.task import Job

__all__ = [
    "Admission",
    "AdmissionStatus",
    "NotAcknowledged",
    "Pricing",
    "Rejected",
    "answer",
    "cost_key",
    "unavailable",
]

R = TypeVar("R")
AdmissionStatus = Literal["accepted", "deferred", "rejected", "unavailable"]

_CODES: dict[int, AdmissionStatus] = {1: "accepted", 0: "accepted", 2: "deferred"}
#: seconds an `unavailable` answer suggests waiting: the store is down, not contended
UNAVAILABLE_RETRY_AFTER = 1.0


class Rejected(FairlaneError):
    """Admission refused the job; nothing was stored. Retry after ``retry_after`` seconds."""

    def __init__(self, reason: str, retry_after: float) -> None:
        super().__init__(f"the job was not admitted ({reason}); retry after {retry_after:.1f} s")
        self.reason = reason
        self.retry_after = retry_after


class NotAcknowledged(FairlaneError):
    """The jobs are stored on the primary, but the replicas or AOF fsyncs that the
    ``durability`` setting asks for did not confirm them in time: a failover or a
    crash may still lose them. ``jobs`` are their handles (a retry with the same
    idempotency key finds them, not new copies)."""

    def __init__(self, jobs: list[Job[Any]], acknowledgement: Acknowledgement) -> None:
        super().__init__(f"the enqueue was not acknowledged: {acknowledgement.describe()}")
        self.jobs = jobs
        self.acknowledgement = acknowledgement


@dataclass(frozen=True, slots=True)
class Admission(Generic[R]):
    """The answer to one submission."""

    status: AdmissionStatus
    job: Job[R] | None
    """The stored job (accepted or deferred); None when rejected or unavailable."""
    reason: str | None = None
    """Machine-readable: ``class_full``, ``class_queue_full``, ``tenant_queue_full``,
    ``too_wide``, ``deadline_unmeetable``, ``store_unavailable``; None when accepted."""
    retry_after: float | None = None
    """Seconds to wait before trying again (rejected or unavailable)."""
    acknowledgement: Acknowledgement | None = None
    """With ``durability`` asked for and the job stored: what the replicas and AOF
    confirmed (``acknowledgement.met`` False: the job may not survive a failover)."""

    @property
    def admitted(self) -> bool:
        """Whether the job is stored (accepted, or deferred until room frees)."""
        return self.status in ("accepted", "deferred")


@dataclass(frozen=True, slots=True)
class Pricing:
    """How a declared estimate becomes the milli-units the store reserves."""

    coefficients: Coefficients = field(default_factory=Coefficients)
    estimation: EstimationSettings = field(default_factory=EstimationSettings)
    retry: RetryAfterPolicy = field(default_factory=RetryAfterPolicy)

    def declared_milli(self, estimate: Estimate | float | None) -> int:
        """The caller's declared cost in milli-units (the store raises it to what this
        tenant's jobs were learned to cost, then applies the safety multiplier)."""
        if estimate is None:
            return to_milli(self.estimation.default_units)
        if isinstance(estimate, Estimate):
            return to_milli(estimate.units(self.coefficients))
        if isinstance(estimate, bool) or not isinstance(estimate, int | float):
            raise TypeError(f"estimate must be an Estimate or a number of units, got {estimate!r}")
        if not math.isfinite(estimate) or estimate < 0:
            raise ValueError(f"estimate must be a finite number of units >= 0, got {estimate!r}")
        return to_milli(float(estimate))

    def retry_after(self, earlier_rejections: int) -> float:
        return retry_after(earlier_rejections, random.random(), self.retry)


def cost_key(tenant: str, task: str, estimate: Estimate | float | None) -> str:
    """Whose learned cost applies: the tenant, the workflow (the task unless the estimate
    names one) and the model."""
    workflow = task
    model = ""
    if isinstance(estimate, Estimate):
        workflow = estimate.workflow or task
        model = estimate.model or ""
    return f"{tenant}|{workflow}|{model}"


def answer(reply: Submitted, job: Job[R] | None, pricing: Pricing) -> Admission[R]:
    """The store's reply to one submitted job, as an :class:`Admission`."""
    if reply.code == 0 and reply.reason == "deferred":
        return Admission("deferred", job, None)  # the job this idempotency key names
    if reply.code in _CODES:
        return Admission(_CODES[reply.code], job, reply.reason if reply.code == 2 else None)
    if reply.code == -1:
        return Admission("rejected", None, "deadline_unmeetable", None)
    if reply.code == -4:
        reason = reply.reason or "class_full"
        return Admission("rejected", None, reason, pricing.retry_after(reply.earlier_rejections))
    raise ValueError(f"job {reply.id}: refused by the store (code {reply.code})")


def unavailable() -> Admission[R]:
    return Admission("unavailable", None, "store_unavailable", UNAVAILABLE_RETRY_AFTER)
