"""The enqueue script's fairness keys against ``fairlane.policy.fairkeys``, on the real server.

A hypothesis state machine drives one tenant's queue in a lane without admission with
the same operations on both sides: batches of jobs, some keyed (several keys, weights
set and reset), some not, at two priorities, some scheduled 1 ms later (due by the next
dispatch, whose fetch promotes them: a keyed one takes its key's order number then,
against the queue as it is at that moment) and some for much later (promoted never: they
keep their FIFO number and charge no key yet); dispatches of a few jobs; jobs handed back
unstarted (they re-enter with the order number they have). After every step the two
agree on every job's order number (the record's ``seq``), on the queue's order, on the
keys' next tags (``fk:<lane>:<class>:<tenant>``) and on which jobs each dispatch gave.
"""

from __future__ import annotations

import time
from typing import ClassVar, cast

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule

from fairlane.policy.fairkeys import TenantOrder
from fairlane.store.wire import NewJob, Outcome
from tests.store.harness import StoreMachine

LANE, CLASS, TENANT, WORKER = "a", "standard", "acme", "w1"
LONG = 600_000
SOON = 1  # ms
SLOTS = 1000
KEYS = ("", "u1", "u2", "u3", "u4")
WEIGHTS = (1.0, 2.0, 3.0, 0.5)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class FairKeysVsPolicy(StoreMachine):
    prefix: ClassVar[str] = "fk"

    def __init__(self) -> None:
        super().__init__()
        self.model = TenantOrder(weights={})
        self.weights: dict[str, float] = {}
        self.model.weights = self.weights
        self.seq = 0
        self.next_id = 0
        self.prio: dict[str, int] = {}
        self.order: dict[str, float] = {}
        self.running: dict[str, str] = {}  # id -> lease token
        self.soon: dict[str, tuple[str, int]] = {}  # due 1 ms later: id -> (key, FIFO number)

    @initialize()
    def register(self) -> None:
        # the worker registers its slots in the lane before anything is submitted
        self.run(self.store.exchange(WORKER, [LANE], 0, LONG, slots=SLOTS))

    def new_job(self, key: str, prio: int, later: int) -> NewJob:
        self.next_id += 1
        job_id = f"j{self.next_id:05d}"
        self.prio[job_id] = prio
        return NewJob(
            job_id, TENANT, prio, "t", "[]", 3, "1,60,full", 0.0, "-1,-1", "-1,-1",
            delay_ms=(None, LONG, SOON)[later], fairness_key=key,
        )  # fmt: skip

    @rule(
        batch=st.lists(
            st.tuples(
                st.sampled_from(KEYS),
                st.sampled_from((0, 0, 0, 1)),
                st.sampled_from((0,) * 5 + (1, 2)),  # due now, much later, 1 ms later
            ),
            min_size=1,
            max_size=6,
        )
    )
    def enqueue(self, batch: list[tuple[str, int, int]]) -> None:
        jobs = [self.new_job(key, prio, later) for key, prio, later in batch]
        replies = self.run(self.store.submit(LANE, jobs))
        assert [r.code for r in replies] == [1] * len(jobs)
        for job in jobs:
            self.seq += 1  # one FIFO number per job of the batch, in order
            if job.delay_ms is not None:
                self.order[job.id] = self.seq  # scheduled: its FIFO number, no key charged
                if job.delay_ms == SOON:
                    self.soon[job.id] = (job.fairness_key, self.seq)
                continue
            self.order[job.id] = self.model.enqueue(
                job.id, job.fairness_key, job.priority, self.seq
            )

    @rule(want=st.integers(min_value=1, max_value=4))
    def dispatch(self, want: int) -> None:
        # the jobs due 1 ms later are due now (waited for on the server's clock); the
        # fetch promotes them first, earliest first, ties by id, each tagged as it enters
        runs = {i: int(self.client.hget(self.keys.job(i), "run") or 0) for i in self.soon}
        while runs and self.server_ms() < max(runs.values()):
            time.sleep(0.001)
        for job_id in sorted(runs, key=lambda i: (runs[i], i)):
            key, seq = self.soon.pop(job_id)
            self.order[job_id] = self.model.enqueue(job_id, key, self.prio[job_id], seq)
        got = self.run(self.store.exchange(WORKER, [LANE], want, LONG, slots=SLOTS))
        expected = [job for job in (self.model.pop() for _ in range(want)) if job is not None]
        assert [j.id for j in got.jobs] == expected
        for job in got.jobs:
            self.running[job.id] = job.token

    def server_ms(self) -> int:
        sec, usec = self.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    @rule(data=st.data())
    def hand_back(self, data: st.DataObject) -> None:
        if not self.running:
            return
        job_id = data.draw(st.sampled_from(sorted(self.running)))
        token = self.running.pop(job_id)
        outcome = Outcome(job_id, token, "release")
        got = self.run(self.store.exchange(WORKER, [LANE], 0, LONG, [outcome], slots=SLOTS))
        assert got.ack_codes == [1]
        self.model.push(job_id, self.prio[job_id], self.order[job_id])

    @rule(key=st.sampled_from(KEYS[1:]), weight=st.sampled_from(WEIGHTS))
    def set_weight(self, key: str, weight: float) -> None:
        self.run(self.store.configure_key_weight(TENANT, key, weight))
        if weight == 1:
            self.weights.pop(key, None)
        else:
            self.weights[key] = weight

    @invariant()
    def same_orders_queue_and_tags(self) -> None:
        queue = self.keys.tenant_queue(LANE, CLASS, TENANT)
        rows = cast("list[tuple[bytes, float]]", self.client.zrange(queue, 0, -1, withscores=True))
        assert [(score, _s(m)) for m, score in rows] == self.model.queue
        for job_id, order in self.order.items():
            raw = self.client.hget(self.keys.job(job_id), "seq")
            assert raw is not None and float(raw) == order, job_id
        fk = self.keys.fairness_tags(LANE, CLASS, TENANT)
        tags = cast("list[tuple[bytes, float]]", self.client.zrange(fk, 0, -1, withscores=True))
        assert {_s(k): f for k, f in tags} == self.model.tags.next_tag


@pytest.fixture
def machine(redis_url: str) -> type[FairKeysVsPolicy]:
    FairKeysVsPolicy.redis_url = redis_url
    return FairKeysVsPolicy


def test_fairness_keys_agree_with_the_policy(machine: type[FairKeysVsPolicy]) -> None:
    state = machine.TestCase
    state.settings = settings(
        max_examples=60,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    state().runTest()
