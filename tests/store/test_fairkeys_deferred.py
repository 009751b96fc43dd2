"""Fairness keys of deferred jobs, in the store: a keyed job deferred by admission takes
its key's fair order number when a readmission pass admits it into its tenant's queue
(``fairlane.policy.fairkeys``, rule 3), not at its enqueue, and a retry, pooled or not,
keeps the order number it has.

One tenant's queue in a lane with a pool of 2 units, jobs of 1 unit each: two unkeyed
jobs fill the pool, three keyed ones are deferred with their FIFO numbers. Each ack frees
one unit, its pass admits the tenant's next deferred job (FIFO within a tenant), and the
job's ``seq`` then is the one ``TenantOrder`` gives it against the queue as it stands.
"""

from __future__ import annotations

from typing import cast

import pytest

from fairlane.policy.admission import AdmissionClass, EstimationSettings, PoolConfig
from fairlane.policy.classes import ClassTable, ServiceClass
from fairlane.policy.fairkeys import TenantOrder
from fairlane.store.api import Store
from fairlane.store.wire import FetchedJob, NewJob, Outcome

pytestmark = pytest.mark.anyio

LANE, CLS, TENANT, WORKER, LONG = "fd", "std", "acme", "w1", 600_000
TABLE = ClassTable((ServiceClass(CLS, nominal_share=1.0),))
POOL = PoolConfig(
    capacity_units=2.0,
    classes=(AdmissionClass(CLS, max_queue=50, max_deferred=50, when_full="defer"),),
)


def job(job_id: str, key: str = "", max_attempts: int = 1) -> NewJob:
    return NewJob(
        job_id, TENANT, 0, "fd.job", "[]", max_attempts, "0,0,none", 0, "-1,-1", "-1,-1",
        service_class=CLS, declared_mu=1000, declared=1, fairness_key=key,
    )  # fmt: skip


async def declare(store: Store, *, pooled: bool = True) -> None:
    await store.declare_lane(LANE, TABLE, "jobs")
    if pooled:
        estimation = EstimationSettings(max_reservation_units=2, safety_multiplier=1.0)
        await store.declare_admission(LANE, TABLE, POOL, estimation)
    await store.exchange(WORKER, [LANE], 0, LONG, slots=10)


async def seq(store: Store, job_id: str) -> float:
    raw = cast("bytes | None", await store.client.hget(store.keys.job(job_id), "seq"))
    assert raw is not None, job_id
    return float(raw)


async def queue(store: Store) -> list[tuple[float, str]]:
    rows = await store.client.zrange(
        store.keys.tenant_queue(LANE, CLS, TENANT), 0, -1, withscores=True
    )
    return [(float(score), m.decode()) for m, score in rows]


async def take_one(store: Store) -> FetchedJob:
    got = await store.exchange(WORKER, [LANE], 1, LONG, slots=10)
    assert len(got.jobs) == 1
    return got.jobs[0]


async def test_a_deferred_keyed_job_is_tagged_when_admitted(store: Store) -> None:
    await declare(store)
    order = TenantOrder()
    replies = await store.submit(LANE, [job("a1"), job("a2")])
    assert [r.code for r in replies] == [1, 1]
    order.enqueue("a1", "", 0, 1)
    order.enqueue("a2", "", 0, 2)
    replies = await store.submit(LANE, [job("d1", "u1"), job("d2", "u1"), job("d3", "u2")])
    assert [r.code for r in replies] == [2, 2, 2]
    # deferred: their FIFO numbers, and no key charged yet
    assert [await seq(store, i) for i in ("d1", "d2", "d3")] == [3, 4, 5]
    assert await store.client.exists(store.keys.fairness_tags(LANE, CLS, TENANT)) == 0
    fifo = {"d1": ("u1", 3), "d2": ("u1", 4), "d3": ("u2", 5)}
    admitted = []
    for deferred in ("d1", "d2", "d3"):
        running = await take_one(store)
        assert running.id == order.pop()
        # the ack frees a unit: its pass admits the tenant's next deferred job
        done = [Outcome(running.id, running.token, "ok")]
        await store.exchange(WORKER, [LANE], 0, LONG, done, slots=10)
        key, number = fifo[deferred]
        expected = order.enqueue(deferred, key, 0, number)
        assert await seq(store, deferred) == expected, deferred
        assert await queue(store) == order.queue
        admitted.append(expected)
    tags = await store.client.zrange(
        store.keys.fairness_tags(LANE, CLS, TENANT), 0, -1, withscores=True
    )
    assert {k.decode(): f for k, f in tags} == order.tags.next_tag
    # d1 entered behind a2 (order 2) at the head's order, ahead of its FIFO number 3
    assert admitted[0] == 2


@pytest.mark.parametrize("pooled", [True, False], ids=["pool", "no-pool"])
async def test_a_retry_keeps_its_order_number(store: Store, pooled: bool) -> None:
    """A keyed job's retry is promoted with the order number it has (attempt 1): its key
    is not charged again, and it is not tagged against the queue it finds then. (With a
    pool the retry passes the gate again when due; without, it is promoted at once.)"""
    await declare(store, pooled=pooled)
    replies = await store.submit(LANE, [job("a1"), job("k1", "u1", max_attempts=2)])
    assert [r.code for r in replies] == [1, 1]
    assert await seq(store, "k1") == 1  # the head's order (a1's 1), ahead of its FIFO 2
    first, keyed = await take_one(store), await take_one(store)
    assert (first.id, keyed.id) == ("a1", "k1")
    outcomes = [Outcome("a1", first.token, "ok"), Outcome("k1", keyed.token, "retry", "", 0)]
    await store.exchange(WORKER, [LANE], 0, LONG, outcomes, slots=10)
    # a job with order 3 heads the queue when the retry is promoted: tagged anew, the
    # retry would take 3 and run after it
    assert [r.code for r in await store.submit(LANE, [job("a3")])] == [1]
    again = await take_one(store)  # promoted (due at once), ahead of a3, leased again
    assert (again.id, again.attempt) == ("k1", 2)
    assert await seq(store, "k1") == 1
