"""What a submission is told: accepted, deferred, rejected (with Retry-After) or unavailable.

``task.submit(...)`` answers with an :class:`Admission`; ``task.enqueue(...)`` raises
:class:`Rejected` instead of returning a rejection. The decision itself is the
store's, made atomically with the reservation (``fairlane.policy.admission`` states
the rules; ``fairlane.registry.pricing`` prices what a caller declares), but for
``store_full``: a store above its memory mark refuses before the script runs, and a
server at its limit refuses the script itself (``StoreFull``, answered here as a
rejection). This module
turns the store's reply into the answer, with a Retry-After that grows with the
tenant's recent rejections and is jittered on this side, so that callers refused
together do not return together.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Generic, Literal, TypeVar

from fairlane.errors import FairlaneError, StoreFull
from fairlane.policy.admission.memory import STORE_FULL
from fairlane.policy.admission.reasons import (
    CLASS_NOT_ENTITLED,
    DEADLINE_UNMEETABLE,
    TENANT_PAUSED,
)
from fairlane.policy.pauses import refusal_retry_after
from fairlane.registry.pricing import Pricing, cost_key
from fairlane.store.durability import NotAcknowledged
from fairlane.store.gate import StoreBusy
from fairlane.store.wire import Reply, StoreError

if TYPE_CHECKING:
    from fairlane.app.job import Job
    from fairlane.store.durability import Acknowledgement
    from fairlane.store.wire import Submitted

__all__ = [
    "CLASS_NOT_ENTITLED",
    "DEADLINE_UNMEETABLE",
    "STORE_BUSY",
    "STORE_FULL",
    "STORE_UNAVAILABLE",
    "TENANT_PAUSED",
    "Admission",
    "AdmissionStatus",
    "NotAcknowledged",
    "Pricing",
    "Rejected",
    "answer",
    "cost_key",
    "store_full",
    "unavailable",
]

R = TypeVar("R")
AdmissionStatus = Literal["accepted", "deferred", "rejected", "unavailable"]

_CODES: dict[int, AdmissionStatus] = {
    Reply.ACCEPTED: "accepted",
    Reply.EXISTING: "accepted",
    Reply.DEFERRED: "deferred",
}
#: seconds an `unavailable` answer suggests waiting: the store is down, not contended
UNAVAILABLE_RETRY_AFTER = 1.0


class Rejected(FairlaneError):
    """Admission refused the job; nothing was stored. Retry after ``retry_after`` seconds;
    None when retrying cannot help (``class_not_entitled``: the job's class is restricted
    and its tenant is not entitled to it)."""

    # the type name jobs record and users match on (codec.encode_error): as before the move
    __module__ = "fairlane.admission"

    def __init__(
        self, reason: str, retry_after: float | None, *, estimated_start: datetime | None = None
    ) -> None:
        if retry_after is None:
            why = _FINAL.get(reason, "retrying cannot change the answer")
            super().__init__(f"the job was not admitted ({reason}): {why}")
        else:
            super().__init__(
                f"the job was not admitted ({reason}); retry after {retry_after:.1f} s"
            )
        self.reason = reason
        self.retry_after = retry_after
        #: ``deadline_unmeetable``: when the job was expected to start (None: not estimated)
        self.estimated_start = estimated_start


_FINAL = {
    DEADLINE_UNMEETABLE: "it is not expected to finish by its deadline (its estimated "
    "start and learned length), or the deadline has passed; on_unmeetable='accept' takes it anyway",
    CLASS_NOT_ENTITLED: "the job's class is restricted and this tenant is not entitled "
    "to it (app.tenants.configure(tenant, classes=[...]))",
}


@dataclass(frozen=True, slots=True)
class Admission(Generic[R]):
    """The answer to one submission."""

    status: AdmissionStatus
    job: Job[R] | None
    """The stored job (accepted or deferred); None when rejected or unavailable."""
    reason: str | None = None
    """Machine-readable: ``class_full``, ``class_queue_full``, ``tenant_queue_full``,
    ``lane_queue_full`` (a lane's default queue bounds), ``too_wide``,
    ``deadline_unmeetable``, ``class_not_entitled`` (a restricted class the tenant is not
    entitled to), ``tenant_paused`` (an operator quarantined the tenant: Retry-After runs
    to the quarantine's end), ``store_full`` (the server above the memory mark, or at its limit),
    ``store_unavailable`` (the server cannot be reached), ``store_busy`` (every
    connection of this process stayed in use for ``connection.timeout``); None when
    accepted."""
    retry_after: float | None = None
    """Seconds to wait before trying again (rejected or unavailable); None when retrying
    cannot help (``deadline_unmeetable``, ``class_not_entitled``)."""
    estimated_start: datetime | None = None
    """When the job is expected to start (aware, UTC), where it was estimated: a
    submission with a deadline, or one that asked (``estimate_start=True``); None where
    nothing can be said (``fairlane.policy.startpredict``). An estimate, not a promise."""
    acknowledgement: Acknowledgement | None = None
    """With ``durability`` asked for and the job stored: what the replicas and AOF
    confirmed (``acknowledgement.met`` False: the job may not survive a failover)."""

    @property
    def admitted(self) -> bool:
        """Whether the job is stored (accepted, or deferred until room frees)."""
        return self.status in ("accepted", "deferred")


def answer(reply: Submitted, job: Job[R] | None, pricing: Pricing) -> Admission[R]:
    """The store's reply to one submitted job, as an :class:`Admission`."""
    if reply.code == Reply.EXISTING and reply.reason == "deferred":
        return Admission("deferred", job, None)  # the job this idempotency key names
    if reply.code in _CODES:
        return Admission(
            _CODES[reply.code], job, reply.reason if reply.code == Reply.DEFERRED else None
        )
    if reply.code == Reply.DEADLINE_UNMEETABLE:
        return Admission("rejected", None, DEADLINE_UNMEETABLE, None)
    if reply.code == Reply.CLASS_NOT_ENTITLED:
        return Admission("rejected", None, CLASS_NOT_ENTITLED, None)
    if reply.code == Reply.TENANT_PAUSED:
        left = reply.paused_ms or 0
        return Admission("rejected", None, TENANT_PAUSED, refusal_retry_after(left, 0))
    if reply.code == Reply.REJECTED:
        reason = reply.reason or "class_full"
        return Admission("rejected", None, reason, pricing.retry_after(reply.earlier_rejections))
    raise ValueError(f"job {reply.id}: refused by the store (code {reply.code})")


#: The reasons of an ``unavailable`` answer: the server, or this process's connections.
STORE_UNAVAILABLE = "store_unavailable"
STORE_BUSY = "store_busy"


def unavailable(error: StoreError) -> Admission[R]:
    """The answer to a submission the store could not take: nothing was stored."""
    reason = STORE_BUSY if isinstance(error, StoreBusy) else STORE_UNAVAILABLE
    return Admission("unavailable", None, reason, UNAVAILABLE_RETRY_AFTER)


def store_full(full: StoreFull, pricing: Pricing) -> Admission[R]:
    """The answer to a job the store had no room for: nothing was written, whether the
    memory mark refused it or the server did."""
    return Admission("rejected", None, STORE_FULL, pricing.full_retry_after(full.depth))
