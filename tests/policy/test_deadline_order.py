"""Deadline order (``fairlane.policy.deadlineorder``): the rule, its place among the
scores, and -- on the reference model -- that it never changes the tenants served.

The property drives ``QueueModel`` twice with the same random operations (submissions
of several tenants with weights, priorities, widths and deadlines;
fetches that settle what ran), deadline order on (by the task or by the class) in one
and off in the other, and requires the same sequence of tenants served: the identity
the module's proof gives when a tenant's jobs ask the same of dispatch.
``tests/store/test_model_vs_lua.py`` holds the store to the model, and
``tests/store/test_deadline_order_lua.py`` checks the property on the store itself.
"""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from fairlane.policy.classes import ClassTable, ServiceClass
from fairlane.policy.deadlineorder import (
    DEADLINE_EPOCH_MS,
    DEADLINE_SPAN,
    DEADLINE_TICK_MS,
    deadline_order,
    entry_order,
    is_deadline_ordered,
)
from fairlane.policy.fairkeys import ORDER_SPAN, TenantOrder, order_score, present_order
from fairlane.policy.reference.model import Ack, QueueModel, Submission
from fairlane.registry.calls import PRIORITY_LIMIT

NOW = 1_767_225_600_000  # 2026-01-01, ms
FIFO_END = ORDER_SPAN - DEADLINE_SPAN  # FIFO numbers stay below it


def test_earlier_deadlines_order_first_within_one_tick_they_tie() -> None:
    a, b = deadline_order(NOW + 1000), deadline_order(NOW + 2000)
    assert -DEADLINE_SPAN <= a < b < 0
    tick_start = NOW - (NOW - DEADLINE_EPOCH_MS) % DEADLINE_TICK_MS
    assert deadline_order(tick_start) == deadline_order(tick_start + DEADLINE_TICK_MS - 1)
    assert deadline_order(tick_start) < deadline_order(tick_start + DEADLINE_TICK_MS)
    # out of the band: clamped to its ends, still before every FIFO number
    assert deadline_order(0) == -DEADLINE_SPAN
    assert deadline_order(10**16) == -1


def test_the_option_off_or_no_deadline_keeps_the_fifo_number() -> None:
    assert entry_order(7, NOW, ordered=False) == 7
    assert entry_order(7, None, ordered=True) == 7
    assert entry_order(7, NOW, ordered=True) == deadline_order(NOW)
    assert is_deadline_ordered(deadline_order(NOW)) and not is_deadline_ordered(0)


@pytest.mark.parametrize("prio", [-PRIORITY_LIMIT, 0, PRIORITY_LIMIT - 1])
def test_a_priority_keeps_its_band_and_every_score_is_exact(prio: int) -> None:
    """At a priority: its deadline orders, then its FIFO numbers, all above the next
    priority's, every score a whole number a double holds exactly."""
    scores = [
        order_score(prio + 1, FIFO_END - 1),  # the highest FIFO number of the priority above
        order_score(prio, -DEADLINE_SPAN),
        order_score(prio, deadline_order(NOW)),
        order_score(prio, -1),
        order_score(prio, 0),
        order_score(prio, FIFO_END - 1),
    ]
    assert scores == sorted(scores) and len(set(scores)) == len(scores)
    assert all(float(s) == int(s) and abs(s) < 2**53 for s in scores)


def test_a_keys_present_skips_the_deadline_ordered_jobs() -> None:
    order = TenantOrder()
    order.push("d1", 0, deadline_order(NOW))
    assert order.head() is None  # no FIFO job: a keyed job enters at its own number
    order.push("f1", 0, 5)
    order.push("d2", 0, deadline_order(NOW + 5000))
    assert order.head() == 5
    assert order.enqueue("k1", "user", 0, 9) == 5  # tagged at the FIFO head, as before
    assert order.enqueue("k2", "user", 0, deadline_order(NOW)) == deadline_order(NOW)
    assert [job_id for _, job_id in order.queue] == ["d1", "k2", "d2", "f1", "k1"]  # ties: by id
    assert present_order([order_score(1, deadline_order(NOW)), order_score(0, 3)]) == 3


# -- the property: the same tenants served, on or off ----------------------------------

TENANTS = ("t1", "t2", "t3")
ORDERED = ClassTable((ServiceClass("standard", nominal_share=1.0, deadline_order=True),))
LANE, WORKER, LEASE, SLOTS = "a", "w", 600_000, 4

# a weight per tenant, and one width for all of its jobs (the proof's identical jobs)
tenant_shapes = st.fixed_dictionaries({
    t: st.tuples(st.sampled_from((1.0, 2.0, 3.0)), st.sampled_from((1, 1, 2))) for t in TENANTS
})  # fmt: skip
operations = st.lists(
    st.one_of(
        st.lists(
            st.tuples(
                st.sampled_from(TENANTS),
                st.sampled_from((0, 0, 0, 1)),  # priority
                st.sampled_from((None, None, 1_000, 1_003, 60_000, 90_000)),  # deadline, ms
            ),
            min_size=1,
            max_size=6,
        ),
        st.tuples(st.integers(1, SLOTS), st.booleans()),  # fetch n, settling what runs
    ),
    min_size=2,
    max_size=14,
)


def _served(ops: list, shapes: dict, *, on: bool, by_class: bool) -> list[tuple[str, str]]:
    """The jobs started, in order, with their tenants, by one run of ``ops``."""
    model = QueueModel()
    if on and by_class:
        model.declare_lane(LANE, ORDERED)
    else:
        model.declare_lane(LANE, ClassTable((ServiceClass("standard", nominal_share=1.0),)))
    for tenant, (weight, _) in shapes.items():
        model.configure(tenant, weight)
    served: list[tuple[str, str]] = []
    running: list[Ack] = []
    n = 0
    for now, op in enumerate([*ops, *[(SLOTS, True)] * 200], start=1):
        if len(ops) < now and len(served) == n:
            break  # every job started
        if isinstance(op, list):
            batch = []
            for tenant, prio, deadline in op:
                n += 1
                batch.append(Submission(
                    f"j{n:03d}", tenant, prio, 1, slots=shapes[tenant][1],
                    deadline_ms=None if deadline is None else NOW + deadline,
                    deadline_order=on and not by_class,
                ))  # fmt: skip
            assert model.enqueue_batch(LANE, batch, now=NOW + now) == [1] * len(batch)
        else:
            want, settle = op
            acks = running if settle else []
            _, got = model.exchange(WORKER, [LANE], want, LEASE, acks, now=NOW + now, slots=SLOTS)
            running = [] if settle else running
            running += [Ack(g.id, g.token) for g in got.jobs]
            served += [(g.id, model.jobs[g.id].tenant) for g in got.jobs]
    model.check_invariants()
    assert len(served) == n, "every job started"
    return served


@settings(max_examples=300, deadline=None)
@given(ops=operations, shapes=tenant_shapes, by_class=st.booleans())
def test_deadline_order_never_changes_the_tenants_served(
    ops: list, shapes: dict, by_class: bool
) -> None:
    on = _served(ops, shapes, on=True, by_class=by_class)
    off = _served(ops, shapes, on=False, by_class=by_class)
    assert [tenant for _, tenant in on] == [tenant for _, tenant in off]
    if on != off:
        event("deadline order started a tenant's jobs in another order")
