"""The store's default queue bounds (``lua/bounds.lua``) against their pure rule
(``fairlane.policy.admission.bounds``).

A hypothesis state machine drives the real Lua library (through
``fairlane.store.api.Store`` on the real server) and the policy (``admit_batch`` on a
:class:`QueueCounts` of its own) with the same operations, on a lane without a pool
whose bounds are drawn per run (small, so that they are hit; either may be lifted):

* **submit** a batch of 1-5 jobs, each of one of three tenants, one of the lane's two
  classes, one or two slots wide, ready now or scheduled a minute ahead. Every job's
  answer (stored, or refused with ``tenant_queue_full`` / ``lane_queue_full`` and the
  count of the tenant's earlier rejections) equals the policy's;
* **cancel** a random waiting job (ready or scheduled): it leaves the counts on both
  sides, so the bounds admit again what they refused.

Calls of one job read the lane only on every ``LANE_READ_EVERY``-th FIFO number or
while the lane is marked full (``reads_lane``): the model is told the call's first
number, so it knows which calls the store checks. After every step the store's counts
-- each class's waiting slots ``d:<c>``, each tenant queue's size, the delayed set's
size -- and its full mark equal the model's, and on their own no tenant queue holds
more than the tenant bound and the lane passes its bound by no more than the single
jobs between two reads. Nothing here is counted on dispatch or ack; the bounds read
what enqueue and cancel already keep.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule, run_state_machine_as_test

from fairlane.policy.admission.bounds import (
    LANE_READ_EVERY,
    QueueBounds,
    QueueCounts,
    QueuedJob,
    admit_batch,
)
from fairlane.policy.classes import ClassTable, ServiceClass
from fairlane.store.library import LIBRARY_CODE
from fairlane.store.wire import NewJob
from tests.store.harness import StoreMachine

LANE = "bnd"
TASK = "bnd.job"
TENANTS = ("t1", "t2", "t3")
CLASSES = ("fast", "slow")
TABLE = ClassTable(
    [ServiceClass("fast", nominal_share=0.5), ServiceClass("slow", nominal_share=0.5)]
)
LATER_MS = 60_000
SOURCE = Path(__file__).resolve().parents[2] / "src" / "fairlane" / "store" / "lua"

JOBS = st.lists(
    st.tuples(
        st.sampled_from(TENANTS),
        st.sampled_from(CLASSES),
        st.integers(1, 2),
        st.booleans(),
    ),
    min_size=1,
    max_size=5,
)


class BoundsMachine(StoreMachine):
    prefix: ClassVar[str] = "bnd"

    def __init__(self) -> None:
        super().__init__()
        self.counts = QueueCounts()
        self.bounds = QueueBounds(None, None)
        self.waiting: dict[str, QueuedJob] = {}
        self.rejections: dict[str, int] = {}
        self.n = 0

    @initialize(
        tenant_max=st.none() | st.integers(1, 4),
        lane_max=st.none() | st.integers(1, 9),
    )
    def declare(self, tenant_max: int | None, lane_max: int | None) -> None:
        self.bounds = QueueBounds(tenant_max, lane_max)
        self.run(self.store.declare_lane(LANE, TABLE))
        self.run(self.store.declare_bounds(LANE, self.bounds))

    @rule(jobs=JOBS)
    def submit(self, jobs: list[tuple[str, str, int, bool]]) -> None:
        wanted = [QueuedJob(t, c, s, later) for t, c, s, later in jobs]
        new = []
        for job in wanted:
            self.n += 1
            new.append(
                NewJob(
                    f"j{self.n}",
                    job.tenant,
                    0,
                    TASK,
                    "[]",
                    1,
                    "",
                    0,
                    "0,0",
                    "0,0",
                    delay_ms=LATER_MS if job.scheduled else None,
                    service_class=job.cls,
                    slots=job.slots,
                )
            )
        first_seq = int(self.client.hget(self.keys.stats, "fifo") or 0) + 1
        reasons = admit_batch(self.bounds, self.counts, wanted, first_seq)
        replies = self.run(self.store.submit(LANE, new))
        for job, sent, reason, reply in zip(wanted, new, reasons, replies, strict=True):
            if reason is None:
                assert (reply.code, reply.reason) == (1, None), f"{sent.id}: {job}"
                self.waiting[sent.id] = job
                continue
            assert reply.code == -4, f"{sent.id}: {job} should be refused ({reason})"
            assert reply.reason == reason, f"{sent.id}: {job}"
            # refusals are counted per tenant in the minute, as admission's are
            assert reply.earlier_rejections == self.rejections.get(job.tenant, 0)
            self.rejections[job.tenant] = self.rejections.get(job.tenant, 0) + 1

    @precondition(lambda self: bool(self.waiting))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.waiting)))
        job = self.waiting.pop(job_id)
        assert self.run(self.store.cancel(job_id)) == "cancelled"
        if job.scheduled:
            self.counts.scheduled -= 1
        else:
            key = (job.cls, job.tenant)
            self.counts.tenant_queues[key] -= 1
            self.counts.ready_slots[job.cls] -= job.slots

    @invariant()
    def counts_agree(self) -> None:
        state = self.keys.lane(LANE).state
        raw = self.client.hmget(state, [f"d:{c}" for c in CLASSES])
        ready = {c: int(v or 0) for c, v in zip(CLASSES, raw, strict=True)}
        assert ready == {c: self.counts.ready_slots.get(c, 0) for c in CLASSES}
        for cls in CLASSES:
            for tenant in TENANTS:
                size = int(self.client.zcard(self.keys.tenant_queue(LANE, cls, tenant)))
                assert size == self.counts.tenant_queues.get((cls, tenant), 0)
                if self.bounds.tenant_max is not None:
                    assert size <= self.bounds.tenant_max
        delayed = int(self.client.zcard(self.keys.lane(LANE).delayed))
        assert delayed == self.counts.scheduled
        # a lane passes its bound by at most the single jobs taken between two reads
        if self.bounds.lane_max is not None:
            assert sum(ready.values()) <= self.bounds.lane_max + (LANE_READ_EVERY - 1) * 2
            assert delayed <= self.bounds.lane_max + LANE_READ_EVERY - 1
        mark = self.client.hget(state, "qb")
        assert (mark is not None and mark.endswith(b",f")) == self.counts.marked_full


def test_default_queue_bounds_agree_with_the_policy(redis_url: str) -> None:
    BoundsMachine.redis_url = redis_url
    run_state_machine_as_test(
        BoundsMachine,
        settings=settings(
            max_examples=30,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


@pytest.mark.parametrize(
    ("raw", "stored"),
    [
        (QueueBounds(3, None), b"3,-1"),
        (QueueBounds(None, 7), b"-1,7"),
        (QueueBounds(None, None), None),
        (None, None),
    ],
)
def test_declared_bounds_are_one_field_of_the_lane_state(
    redis_url: str, raw: QueueBounds | None, stored: bytes | None
) -> None:
    machine = BoundsMachine.__new__(BoundsMachine)
    BoundsMachine.redis_url = redis_url
    StoreMachine.__init__(machine)
    try:
        machine.run(machine.store.declare_bounds(LANE, QueueBounds(1, 1)))
        machine.run(machine.store.declare_bounds(LANE, raw))
        assert machine.client.hget(machine.keys.lane(LANE).state, "qb") == stored
    finally:
        machine.close()


def test_the_lane_is_read_as_often_as_the_policy_says() -> None:
    # the library writes the policy's figure into the source it loads
    assert "__LANE_READ_EVERY__" in (SOURCE / "bounds.lua").read_text()
    assert f"local queue_bounds = {{LANE_READ_EVERY = {LANE_READ_EVERY}}}" in LIBRARY_CODE
