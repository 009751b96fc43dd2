"""Default queue bounds: how many jobs may wait in a lane that has no admission pool.

A lane with a pool is bounded by its pool (the classes' ``max_queue`` and
``tenant_max_queue``, ``gate``). Every other lane, the default lane included, gets two
bounds from the settings (``queues.tenant_max_queued``, ``queues.lane_max_queued``;
``None`` lifts one). This module owns the rule; the store carries it out in
``lua/bounds.lua`` and ``tests/store/test_bounds_lua.py`` holds the two to each other.

What counts as queued, and why (the counts are the ones the store already keeps, so
the check costs one read per lane and per tenant queue in an enqueue call, and
nothing on dispatch or ack):

* **ready** jobs count: those in a tenant's queue, and those a throttle key woke that
  wait for a worker slot. The lane's figure is its classes' waiting slots (``d:<c>``),
  so a job of ``slots=N`` counts N; a tenant's figure is the size of its queue in the
  job's class (``q:<lane>:<class>:<tenant>``): the tenant bound is per class queue,
  and a tenant using several classes of a lane may hold that many in each.
* **scheduled** jobs (a delay, a time, a retry's backoff) count against the lane's
  bound for a new scheduled job (ready + scheduled), not against a tenant's: the lane's
  delayed set is one for all tenants. A new ready job is checked against the ready
  jobs only, so a lane full of jobs due tomorrow does not refuse work for now.
* **throttled** jobs (waiting on a throttle key) are not counted: their waiters are
  kept per key, not per lane, and they re-enter the lane's count when woken.

When the lane is read. An enqueue call of several jobs reads the lane's counts; a call
of one job reads them one time in ``LANE_READ_EVERY`` (by the FIFO number it draws,
``reads_lane``), or every time while the lane is marked full (the store marks it on a
``lane_queue_full`` refusal and clears the mark when a read finds room). A single
enqueue then costs a sixteenth of a read for the lane bound, and the lane may pass its
bound by at most ``LANE_READ_EVERY - 1`` single jobs (those taken between two reads
just as it filled). The tenant bound is exact: its queue is read by every call (the
read that activating the tenant would make anyway).

With scheduling shards each shard holds its part of a lane, so the lane bound is split
evenly over the shards (``per_shard``); a tenant lives in one shard, so its bound is
whole. A refusal stores nothing and answers ``Rejected(reason, retry_after)`` with
the same Retry-After as the admission gate's rejections (``rejections.retry_after``:
doubling with the tenant's rejections in the last minute, jittered).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import msgspec

from fairlane.policy.admission.units import check_count

__all__ = [
    "DEFAULT_LANE_MAX_QUEUED",
    "DEFAULT_TENANT_MAX_QUEUED",
    "LANE_READ_EVERY",
    "QueueBounds",
    "QueueCounts",
    "QueueReason",
    "QueuedJob",
    "admit_batch",
    "queue_refusal",
    "reads_lane",
]

DEFAULT_TENANT_MAX_QUEUED = 100_000
DEFAULT_LANE_MAX_QUEUED = 1_000_000
#: a call of one job reads the lane's counts when its FIFO number is a multiple of this
LANE_READ_EVERY = 16

QueueReason = Literal["tenant_queue_full", "lane_queue_full"]


class QueueBounds(msgspec.Struct, frozen=True):
    """Most jobs queued per tenant (in one class queue) and per lane; None: unbounded."""

    tenant_max: int | None = DEFAULT_TENANT_MAX_QUEUED
    lane_max: int | None = DEFAULT_LANE_MAX_QUEUED

    def __post_init__(self) -> None:
        for name in ("tenant_max", "lane_max"):
            value = getattr(self, name)
            if value is not None:
                check_count(name, value, low=1)

    @property
    def unbounded(self) -> bool:
        return self.tenant_max is None and self.lane_max is None

    def per_shard(self, shards: int) -> QueueBounds:
        """The bounds one of ``shards`` scheduling shards applies: the lane's split
        evenly (rounded up), the tenant's whole (a tenant lives in one shard)."""
        check_count("shards", shards, low=1)
        lane = None if self.lane_max is None else math.ceil(self.lane_max / shards)
        return QueueBounds(self.tenant_max, lane)


def reads_lane(jobs: int, first_seq: int, marked_full: bool) -> bool:
    """Whether an enqueue call of ``jobs`` jobs, the first numbered ``first_seq``,
    checks the lane's bound: a call of several always, one of a single job every
    ``LANE_READ_EVERY``-th number, any while the lane is marked full."""
    return marked_full or jobs > 1 or first_seq % LANE_READ_EVERY == 0


def queue_refusal(
    bounds: QueueBounds,
    *,
    scheduled: bool,
    slots: int = 1,
    tenant_queued: int,
    lane_ready: int,
    lane_scheduled: int,
) -> QueueReason | None:
    """Why a new job is refused, or None when it may wait.

    A ready job (``scheduled`` False) ``slots`` wide is refused ``tenant_queue_full``
    when its tenant's class queue holds ``tenant_max`` jobs, else ``lane_queue_full``
    when its slots would take the lane's ready slots past ``lane_max``. A scheduled job
    is refused ``lane_queue_full`` when the lane's ready slots and scheduled jobs
    together reach ``lane_max``.
    """
    if scheduled:
        if bounds.lane_max is not None and lane_ready + lane_scheduled >= bounds.lane_max:
            return "lane_queue_full"
        return None
    if bounds.tenant_max is not None and tenant_queued >= bounds.tenant_max:
        return "tenant_queue_full"
    if bounds.lane_max is not None and lane_ready + slots > bounds.lane_max:
        return "lane_queue_full"
    return None


class QueuedJob(msgspec.Struct, frozen=True):
    """What the rule needs of a new job: whose, which class, how wide, and whether it
    waits for a time (scheduled) or is ready now."""

    tenant: str
    cls: str
    slots: int = 1
    scheduled: bool = False


class QueueCounts(msgspec.Struct):
    """A lane's queued counts as the store keeps them: ready slots per class, jobs per
    (class, tenant) queue, and scheduled jobs."""

    ready_slots: dict[str, int] = msgspec.field(default_factory=dict)
    tenant_queues: dict[tuple[str, str], int] = msgspec.field(default_factory=dict)
    scheduled: int = 0
    marked_full: bool = False  # a lane_queue_full refusal since the last read with room

    @classmethod
    def of(
        cls,
        ready_slots: Mapping[str, int],
        tenant_queues: Mapping[tuple[str, str], int],
        scheduled: int,
    ) -> QueueCounts:
        return cls(dict(ready_slots), dict(tenant_queues), scheduled)

    @property
    def lane_ready(self) -> int:
        return sum(max(0, n) for n in self.ready_slots.values())


def admit_batch(
    bounds: QueueBounds, counts: QueueCounts, jobs: Sequence[QueuedJob], first_seq: int = 0
) -> list[QueueReason | None]:
    """One enqueue call's jobs in order, the first numbered ``first_seq``: each
    refusal's reason (None: stored), with ``counts`` updated by every stored job, so that
    a batch is judged job by job. A call that does not read the lane (``reads_lane``)
    checks the tenant bound only."""
    lane_read = reads_lane(len(jobs), first_seq, counts.marked_full)
    checked = bounds if lane_read else QueueBounds(bounds.tenant_max, None)
    out: list[QueueReason | None] = []
    for job in jobs:
        key = (job.cls, job.tenant)
        reason = queue_refusal(
            checked,
            scheduled=job.scheduled,
            slots=job.slots,
            tenant_queued=counts.tenant_queues.get(key, 0),
            lane_ready=counts.lane_ready,
            lane_scheduled=counts.scheduled,
        )
        out.append(reason)
        if reason == "lane_queue_full":
            counts.marked_full = True
        if reason is not None:
            continue
        if checked.lane_max is not None:
            counts.marked_full = False  # a read found room
        if job.scheduled:
            counts.scheduled += 1
        else:
            counts.tenant_queues[key] = counts.tenant_queues.get(key, 0) + 1
            counts.ready_slots[job.cls] = counts.ready_slots.get(job.cls, 0) + job.slots
    return out
