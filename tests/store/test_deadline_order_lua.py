"""Deadline order on the real server (``fairlane.policy.deadlineorder``, ``deadlineorder.lua``).

* With deadline order on -- on the job's task or on its class -- one tenant's jobs of
  one priority start earliest deadline first, before its jobs with none (which stay
  FIFO), a higher priority still first; each record's order number is the policy's
  ``deadline_order`` of its deadline. Off, the same submissions start FIFO.
* A workflow run that waits keeps its deadline order (a FIFO one takes a new number).
* The property: the same random submissions of several tenants (weights, priorities,
  deadlines) and the same fetches, on two apps -- deadline order on in one (by the
  task or by the class) and off in the other -- serve the *same sequence of tenants*.
  Ordering a tenant's own queue never changes another tenant's turn.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fairlane.policy.classes import ClassTable, ServiceClass
from fairlane.policy.deadlineorder import deadline_order
from fairlane.store.api import Store
from fairlane.store.connection import create_sync_client
from fairlane.store.wire import NewJob, Outcome, OutcomeKind
from tests.store.harness import drop_app

T = TypeVar("T")
LANE, WORKER = "a", "w"
LONG = 600_000  # ms: a lease that never runs out during a test
SLOTS = 1000
ORDERED = ClassTable((ServiceClass("standard", nominal_share=1.0, deadline_order=True),))
PLAIN = ClassTable((ServiceClass("standard", nominal_share=1.0),))


def new_job(
    job_id: str, tenant: str, prio: int = 0, deadline: int | None = None, ordered: bool = False
) -> NewJob:
    """A job of ``tenant``; ``deadline`` in ms after the enqueue (None: none)."""
    return NewJob(
        job_id, tenant, prio, "t", "[]", 1, "0,0,none", 0.0, "-1,-1", "-1,-1",
        deadline="" if deadline is None else f"+{deadline}", deadline_order=int(ordered),
    )  # fmt: skip


class App:
    """A fresh app on ``redis_url`` with one lane of one class, and a worker of
    ``SLOTS`` slots registered in it; ``close`` deletes its keys."""

    def __init__(self, redis_url: str, table: ClassTable) -> None:
        self.loop = asyncio.new_event_loop()
        self.store = Store.from_url(redis_url, f"edf_{secrets.token_hex(4)}", max_connections=2)
        self.client = create_sync_client(redis_url)
        self.run(self.store.connect())
        self.run(self.store.declare_lane(LANE, table))
        self.run(self.store.exchange(WORKER, [LANE], 0, LONG, slots=SLOTS))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def enqueue(self, jobs: list[NewJob]) -> None:
        replies = self.run(self.store.enqueue(LANE, jobs))
        assert [code for _, code in replies] == [1] * len(jobs), replies

    def fetch(self, n: int) -> list[tuple[str, str]]:
        """(id, tenant) of the jobs one fetch of ``n`` starts, in the order they started."""
        got = self.run(self.store.exchange(WORKER, [LANE], n, LONG, slots=SLOTS))
        return [(job.id, job.tenant) for job in got.jobs]

    def field(self, job_id: str, name: str) -> str:
        value = self.client.hget(self.store.keys.job(job_id), name)
        assert value is not None, f"{job_id} has no {name}"
        return value.decode()

    def close(self) -> None:
        drop_app(self.store, self.client, self.loop)


@pytest.mark.parametrize("way", ["task", "class", "off"])
def test_one_tenants_jobs_start_in_deadline_order(redis_url: str, way: str) -> None:
    app = App(redis_url, ORDERED if way == "class" else PLAIN)
    ordered = way == "task"
    try:
        # (id, priority, deadline in s after now), submitted in this order
        specs = [("n1", 0, None), ("d300", 0, 300), ("d100", 0, 100), ("n2", 0, None),
                 ("d200", 0, 200), ("hi", 1, None)]  # fmt: skip
        app.enqueue([
            new_job(i, "acme", p, None if s is None else s * 1000, ordered) for i, p, s in specs
        ])  # fmt: skip
        started = [job_id for job_id, _ in app.fetch(len(specs))]
        if way == "off":
            assert started == ["hi", "n1", "d300", "d100", "n2", "d200"]  # FIFO
        else:
            assert started == ["hi", "d100", "d200", "d300", "n1", "n2"]
        for job_id, _, seconds in specs:
            seq = float(app.field(job_id, "seq"))
            if seconds is None or way == "off":
                assert seq >= 0, f"{job_id} keeps its FIFO number"
            else:  # the twin: the store's order number is the policy's
                assert seq == deadline_order(int(app.field(job_id, "dl"))), job_id
    finally:
        app.close()


def test_a_deadline_ordered_run_keeps_its_place_when_it_waits(redis_url: str) -> None:
    """A workflow run that waits re-enters with a new FIFO number, unless it is
    deadline-ordered: then it keeps its deadline order (its place by its tenant's rule)."""
    app = App(redis_url, PLAIN)
    try:
        app.enqueue([new_job("fifo", "acme"), new_job("edf", "acme", 0, 60_000, ordered=True)])
        got = app.run(app.store.exchange(WORKER, [LANE], 2, LONG, slots=SLOTS))
        before = {job_id: float(app.field(job_id, "seq")) for job_id in ("fifo", "edf")}
        waits = [Outcome(j.id, j.token, OutcomeKind.SUSPEND, "sleep:0", 0) for j in got.jobs]
        app.enqueue([new_job("later", "acme")])
        again = app.run(app.store.exchange(WORKER, [LANE], 3, LONG, waits, slots=SLOTS))
        assert [j.id for j in again.jobs] == ["edf", "later", "fifo"]
        assert float(app.field("edf", "seq")) == before["edf"] < 0
        assert float(app.field("fifo", "seq")) > before["fifo"]
    finally:
        app.close()


TENANTS = ("t1", "t2", "t3")
# deadlines in ms after the enqueue: ticks apart, and within one tick (a tie, by id)
DEADLINES = (None, 60_000, 60_003, 90_000, 120_000, 300_000)
steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("enqueue"),
            st.lists(
                st.tuples(
                    st.sampled_from(TENANTS),
                    st.sampled_from((0, 0, 0, 1)),  # priority
                    st.sampled_from(DEADLINES),
                ),
                min_size=1,
                max_size=8,
            ),
        ),
        st.tuples(st.just("fetch"), st.integers(1, 4)),
    ),
    min_size=2,
    max_size=10,
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=steps,
    by_class=st.booleans(),
    weights=st.lists(st.sampled_from((1.0, 2.0, 3.0)), min_size=3, max_size=3),
)
def test_deadline_order_never_changes_the_tenants_served(
    redis_url: str, plan: list[tuple[Any, ...]], by_class: bool, weights: list[float]
) -> None:
    on = App(redis_url, ORDERED if by_class else PLAIN)
    off = App(redis_url, PLAIN)
    try:
        for app in (on, off):
            for tenant, weight in zip(TENANTS, weights, strict=True):
                app.run(app.store.configure_tenant(tenant, weight))
        served: dict[str, list[tuple[str, str]]] = {"on": [], "off": []}
        n = 0
        for step in [*plan, ("fetch", 1000)]:  # then everything left
            if step[0] == "enqueue":
                batch = []
                for tenant, prio, deadline in step[1]:
                    n += 1
                    batch.append((f"j{n:03d}", tenant, prio, deadline))
                on.enqueue([new_job(*spec, ordered=not by_class) for spec in batch])
                off.enqueue([new_job(*spec) for spec in batch])
            else:
                for name, app in (("on", on), ("off", off)):
                    served[name] += app.fetch(step[1])
        assert [t for _, t in served["on"]] == [t for _, t in served["off"]]
        assert len(served["on"]) == n
        if served["on"] != served["off"]:
            event("deadline order started a tenant's jobs in another order")
    finally:
        on.close()
        off.close()
