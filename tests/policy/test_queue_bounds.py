"""The default queue bounds' rule (``fairlane.policy.admission.bounds``). Pure.

What is refused and why: a ready job against its tenant's class queue, then the lane's
ready slots (its width counted); a scheduled job against the lane's ready and
scheduled jobs together; ``None`` lifts a bound; a batch is judged job by job, each
stored job counted before the next; the lane bound is split over scheduling shards.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairlane.policy.admission import (
    DEFAULT_LANE_MAX_QUEUED,
    DEFAULT_TENANT_MAX_QUEUED,
    LANE_READ_EVERY,
    QueueBounds,
    QueueCounts,
    QueuedJob,
    admit_batch,
    queue_refusal,
    reads_lane,
)


def refusal(bounds: QueueBounds, **counts: int) -> str | None:
    scheduled = bool(counts.pop("scheduled", 0))
    return queue_refusal(
        bounds,
        scheduled=scheduled,
        slots=counts.get("slots", 1),
        tenant_queued=counts.get("tenant", 0),
        lane_ready=counts.get("ready", 0),
        lane_scheduled=counts.get("later", 0),
    )


def test_the_defaults_are_generous() -> None:
    bounds = QueueBounds()
    assert (bounds.tenant_max, bounds.lane_max) == (100_000, 1_000_000)
    assert (DEFAULT_TENANT_MAX_QUEUED, DEFAULT_LANE_MAX_QUEUED) == (100_000, 1_000_000)


def test_a_ready_job_is_refused_by_its_tenant_first_then_by_the_lane() -> None:
    bounds = QueueBounds(tenant_max=3, lane_max=10)
    assert refusal(bounds, tenant=2, ready=9) is None
    assert refusal(bounds, tenant=3, ready=0) == "tenant_queue_full"
    assert refusal(bounds, tenant=3, ready=10) == "tenant_queue_full"
    assert refusal(bounds, tenant=0, ready=10) == "lane_queue_full"
    # a wide job counts its slots: it may not take the lane past the bound
    assert refusal(bounds, tenant=0, ready=9, slots=2) == "lane_queue_full"
    assert refusal(bounds, tenant=0, ready=8, slots=2) is None
    # scheduled jobs do not hold back work that is ready now
    assert refusal(bounds, tenant=0, ready=5, later=500) is None


def test_a_scheduled_job_counts_against_the_lane_with_the_ready_ones() -> None:
    bounds = QueueBounds(tenant_max=1, lane_max=10)
    # the delayed set is one for all tenants: the tenant bound does not apply to it
    assert refusal(bounds, scheduled=1, tenant=50, ready=4, later=5) is None
    assert refusal(bounds, scheduled=1, ready=4, later=6) == "lane_queue_full"
    assert refusal(bounds, scheduled=1, ready=10) == "lane_queue_full"


def test_none_lifts_a_bound() -> None:
    assert refusal(QueueBounds(None, 5), tenant=10**9, ready=4) is None
    assert refusal(QueueBounds(5, None), tenant=4, ready=10**9) is None
    assert refusal(QueueBounds(5, None), scheduled=1, ready=10**9, later=10**9) is None
    unbounded = QueueBounds(None, None)
    assert unbounded.unbounded
    assert refusal(unbounded, tenant=10**9, ready=10**9) is None


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10"])
def test_a_bound_is_a_whole_number_of_at_least_one(bad: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        QueueBounds(tenant_max=bad)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError)):
        QueueBounds(lane_max=bad)  # type: ignore[arg-type]


def test_the_lane_bound_is_split_over_the_shards_and_the_tenant_bound_is_not() -> None:
    assert QueueBounds(7, 10).per_shard(1) == QueueBounds(7, 10)
    assert QueueBounds(7, 10).per_shard(3) == QueueBounds(7, 4)
    assert QueueBounds(7, None).per_shard(4) == QueueBounds(7, None)
    with pytest.raises(ValueError):
        QueueBounds().per_shard(0)


def test_a_batch_is_judged_job_by_job() -> None:
    bounds = QueueBounds(tenant_max=2, lane_max=4)
    counts = QueueCounts()
    jobs = [QueuedJob("a", "std")] * 3 + [QueuedJob("b", "std")] * 2 + [QueuedJob("c", "std")]
    assert admit_batch(bounds, counts, jobs) == [
        None,
        None,
        "tenant_queue_full",
        None,
        None,
        "lane_queue_full",
    ]
    assert counts.tenant_queues == {("std", "a"): 2, ("std", "b"): 2}
    assert counts.lane_ready == 4
    # a tenant's bound is per class queue; the lane's is over every class
    assert admit_batch(bounds, counts, [QueuedJob("a", "bulk")]) == ["lane_queue_full"]


def test_a_single_job_reads_the_lane_one_time_in_sixteen_or_while_it_is_full() -> None:
    assert LANE_READ_EVERY == 16
    assert reads_lane(2, 7, marked_full=False)
    assert reads_lane(1, 32, marked_full=False)
    assert not reads_lane(1, 33, marked_full=False)
    assert reads_lane(1, 33, marked_full=True)


def test_a_full_lane_is_marked_and_checked_on_every_call_until_a_read_finds_room() -> None:
    bounds = QueueBounds(tenant_max=None, lane_max=2)
    counts = QueueCounts()
    # single jobs between reads are taken unchecked: the lane passes its bound
    took = [admit_batch(bounds, counts, [QueuedJob(f"t{n}", "std")], n) for n in range(1, 5)]
    assert took == [[None]] * 4 and counts.lane_ready == 4
    assert admit_batch(bounds, counts, [QueuedJob("x", "std")], 16) == ["lane_queue_full"]
    assert counts.marked_full
    # marked full, an unread number is checked too
    assert admit_batch(bounds, counts, [QueuedJob("x", "std")], 17) == ["lane_queue_full"]
    counts.ready_slots["std"] = 1  # jobs left the lane
    assert admit_batch(bounds, counts, [QueuedJob("x", "std")], 18) == [None]
    assert not counts.marked_full
    # the tenant bound is checked on every call
    tight = QueueBounds(tenant_max=1, lane_max=None)
    fresh = QueueCounts()
    assert admit_batch(tight, fresh, [QueuedJob("a", "std")], 3) == [None]
    assert admit_batch(tight, fresh, [QueuedJob("a", "std")], 5) == ["tenant_queue_full"]


def test_counts_below_zero_read_as_none_waiting() -> None:
    # the store's cached counters may dip below zero for a moment
    counts = QueueCounts.of({"std": -2, "bulk": 3}, {}, 0)
    assert counts.lane_ready == 3


@given(
    tenant_max=st.none() | st.integers(1, 6),
    lane_max=st.none() | st.integers(1, 12),
    jobs=st.lists(
        st.tuples(st.sampled_from("abc"), st.sampled_from(["x", "y"]), st.integers(1, 3)),
        max_size=40,
    ),
    later=st.lists(st.booleans(), min_size=40, max_size=40),
)
def test_no_bound_is_ever_exceeded(
    tenant_max: int | None,
    lane_max: int | None,
    jobs: list[tuple[str, str, int]],
    later: list[bool],
) -> None:
    bounds = QueueBounds(tenant_max, lane_max)
    counts = QueueCounts()
    batch = [QueuedJob(t, c, s, w) for (t, c, s), w in zip(jobs, later, strict=False)]
    reasons = admit_batch(bounds, counts, batch, first_seq=0)
    stored = [job for job, reason in zip(batch, reasons, strict=True) if reason is None]
    assert len(stored) + sum(r is not None for r in reasons) == len(batch)
    if tenant_max is not None:
        assert all(n <= tenant_max for n in counts.tenant_queues.values())
    if lane_max is not None:
        assert counts.lane_ready <= lane_max
        assert counts.scheduled <= lane_max
    if tenant_max is None and lane_max is None:
        assert len(stored) == len(batch)
