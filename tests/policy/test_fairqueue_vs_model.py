"""The reference model's fair queue against ``fairlane.policy.fairqueue.FairQueue``.

The scripts are held to the reference model (``tests/store/test_model_vs_lua.py``) and
the simulator's fast path to ``FairQueue`` (``tests/sim/test_fastpath.py``); this test
pairs the two Python statements themselves. A hypothesis state machine drives both
with the same pushes (three tenants, two priorities), dispatches and weight changes,
with nothing in flight at any activation -- one worker of one slot acks each job
before the next fetch, where the model's activation credit (``max(F_t, V - r / m)``,
"The store's activation credit" in ``fairlane.policy.fairqueue``) is rule 1's
``max(V, F_t)`` exactly -- and requires the same job at every dispatch, the same
virtual time and the same start tag for every active tenant, bit for bit.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fairlane.policy.fairqueue import FairQueue, job_order
from fairlane.policy.reference.dispatch import ClassQueue
from fairlane.policy.reference.model import QueueModel

LANE, CLASS, WORKER = "a", "standard", "w"
TENANTS = ("t1", "t2", "t3")


class FairOrderMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.model = QueueModel()
        self.queue = FairQueue()
        self.now = 0
        self.jobs = 0

    @property
    def cq(self) -> ClassQueue:
        return self.model.lane(LANE).cls(CLASS)

    def tick(self) -> int:
        self.now += 1
        return self.now

    @rule(tenant=st.sampled_from(TENANTS), prio=st.sampled_from([0, 0, 1]))
    def push(self, tenant: str, prio: int) -> None:
        self.jobs += 1
        job_id = f"j{self.jobs:04d}"
        self.model.enqueue(job_id, tenant, LANE, prio, 1, now=self.tick())
        # the model numbers its jobs in enqueue order, as the scripts' seq does
        self.queue.push(tenant, job_id, 1.0, job_order(prio, self.model.seq))

    @rule()
    def dispatch(self) -> None:
        batch = self.model.fetch(WORKER, [LANE], 1, 60_000, now=self.tick())
        taken = self.queue.pop()
        assert [g.id for g in batch.jobs] == ([taken.job_id] if taken else [])
        for grant in batch.jobs:
            assert self.model.ack(grant.id, grant.token, "ok", now=self.tick()) == 1

    @rule(tenant=st.sampled_from(TENANTS), weight=st.sampled_from([None, 0.5, 2.0, 3.0]))
    def weigh(self, tenant: str, weight: float | None) -> None:
        self.model.configure(tenant, weight)
        self.queue.set_weight(tenant, 1.0 if weight is None else weight)

    @invariant()
    def same_virtual_time_and_tags(self) -> None:
        assert self.cq.vtime == self.queue.virtual_time
        tags = {t: self.queue.tenant(t).tag for t in self.queue.active_tenants()}
        assert self.cq.fair == tags


FairOrderMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60)
TestFairOrder = FairOrderMachine.TestCase
