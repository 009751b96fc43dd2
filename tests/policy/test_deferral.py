"""Fair deferral's own rules (``fairlane.policy.admission.deferral``), on a pool of units.

The pool here is the simplest one: ``capacity`` milli-units, a head fits while the
units reserved plus its own stay within it, and a head wider than the pool never fits.
On random pushes, releases and passes the queue must keep its invariants and:

* admit each tenant's jobs in their ``seq`` order (FIFO within a tenant);
* leave no head that fits behind a pass that was not held and did not run out of budget
  (no head-of-line blocking across tenants);
* admit at most ``OVERTAKE_LIMIT`` jobs past a pinned head, and while held admit
  nothing but it;
* never try more than ``PASS_BUDGET`` heads in a pass;
* leave nothing behind: no empty group, no finish tag at or below ``V``, and no ``V``,
  finish tag or pin once nothing is deferred.

Two fixed cases check the shares by weight and the wide head's wait exactly.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from fairlane.policy.admission import (
    MIN_CHARGE_MILLI,
    OVERTAKE_LIMIT,
    PASS_BUDGET,
    DeferredQueue,
    Verdict,
    charge_units,
)

TENANTS = ("a", "b", "c", "d")
WEIGHTS = {"a": 3.0, "b": 1.0, "c": 0.5, "d": 1.0}


class Pool:
    """Reserved milli-units against a capacity, and the jobs holding them."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.used = capacity, 0
        self.held: list[tuple[str, int]] = []
        self.tried = 0

    def judge(self) -> Callable[[str, str, int], Verdict]:
        def verdict(job_id: str, tenant: str, mu: int) -> Verdict:
            self.tried += 1
            if self.used + mu <= self.capacity:
                self.used += mu
                self.held.append((job_id, mu))
                return "admit"
            return "wait" if mu <= self.capacity else "never"

        return verdict

    def release(self, pick: int) -> None:
        _, mu = self.held.pop(pick % len(self.held))
        self.used -= mu


class Run:
    """One queue on one pool, with what the checks need to remember."""

    def __init__(self, capacity: int) -> None:
        self.queue: DeferredQueue[str] = DeferredQueue()
        self.pool = Pool(capacity)
        self.seq = 0
        self.admitted: dict[str, list[int]] = {t: [] for t in TENANTS}
        self.seqs: dict[str, int] = {}
        self.pinned_at: dict[str, int] = {}  # pinned job -> admissions before it was pinned
        self.admissions = 0

    def push(self, tenant: str, mu: int) -> None:
        self.seq += 1
        self.seqs[f"j{self.seq}"] = self.seq
        self.queue.push(tenant, f"j{self.seq}", self.seq, mu)

    def judge(self, job_id: str, tenant: str, mu: int) -> Verdict:
        verdict = self.pool.judge()(job_id, tenant, mu)
        if verdict == "admit":
            if job_id in self.pinned_at:
                # the admissions past it since it was pinned
                assert self.admissions - self.pinned_at.pop(job_id) <= OVERTAKE_LIMIT
            self.admissions += 1
        elif verdict == "wait" and self.queue.pin is None:
            self.pinned_at[job_id] = self.admissions  # the pass pins it now
        return verdict

    def readmit(self) -> None:
        queue, pool = self.queue, self.pool
        held_before, pin_before = queue.held, queue.pin
        pool.tried = 0
        taken = queue.readmit(self.judge, WEIGHTS.__getitem__)
        assert pool.tried <= PASS_BUDGET
        if held_before:  # held: the pinned head goes first, or nothing does
            assert not taken or taken[0].job_id == pin_before
        for r in taken:
            assert r.admitted
            self.admitted[r.tenant].append(self.seqs[r.job_id])
        if pool.tried < PASS_BUDGET and not queue.held:
            # no head left behind that fits now
            for group in queue.groups.values():
                assert pool.used + queue.jobs[group[0][1]].milli_units > pool.capacity
        if queue.held:
            assert pool.used + queue.jobs[queue.pin or ""].milli_units > pool.capacity


ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.sampled_from(TENANTS), st.integers(0, 5000)),
        st.tuples(st.just("push"), st.sampled_from(TENANTS), st.sampled_from([250, 500, 1000])),
        st.tuples(st.just("release"), st.just(""), st.integers(0, 99)),
        st.tuples(st.just("pass"), st.just(""), st.just(0)),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, capacity=st.sampled_from([1000, 2500, 4000]))
def test_fair_deferral_keeps_its_rules(ops: list[tuple[str, str, int]], capacity: int) -> None:
    run = Run(capacity)
    queue, pool = run.queue, run.pool
    for op, tenant, n in ops:
        if op == "push":
            run.push(tenant, n)
        elif op == "release" and pool.held:
            pool.release(n)
        elif op == "pass":
            run.readmit()
        queue.check_invariants()
        assert queue.overtakes <= OVERTAKE_LIMIT
    for tenant, order in run.admitted.items():
        assert order == sorted(order), tenant  # FIFO within a tenant
    # drain what is left: release everything, pass until nothing more is admitted
    while queue.jobs:
        while pool.held:
            pool.release(0)
        before = len(queue)
        run.readmit()
        if len(queue) == before:
            # only heads that never fit are left; each keeps its own tenant's jobs back
            heads = [queue.jobs[g[0][1]] for g in queue.groups.values()]
            assert all(h.milli_units > capacity for h in heads)
            break
    if not queue.jobs:  # drained: nothing is left, not even V or a finish tag
        assert queue.groups == {} and queue.tags == {} and queue.pin is None
        assert queue.finish == {} and queue.v == 0


def test_backlogged_tenants_are_admitted_by_weight() -> None:
    """One unit of room, one job out per pass: over 400 admissions a tenant of weight 3
    and one of weight 1 share 3:1, within the fair queue's bound at every prefix."""
    queue: DeferredQueue[str] = DeferredQueue()
    for n in range(400):
        queue.push("heavy", f"h{n}", 2 * n, 1000)
        queue.push("light", f"l{n}", 2 * n + 1, 1000)
    weights = {"heavy": 3.0, "light": 1.0}
    pool = Pool(1000)
    got = {"heavy": 0, "light": 0}
    for _ in range(400):
        (r,) = queue.readmit(pool.judge(), weights.__getitem__)
        pool.release(0)
        got[r.tenant] += 1
        # |W_i / w_i - W_j / w_j| <= c / w_i + c / w_j (one-unit jobs)
        assert abs(got["heavy"] / 3 - got["light"] / 1) <= 1 / 3 + 1
    assert got == {"heavy": 300, "light": 100}


def test_a_wide_head_is_overtaken_at_most_the_bound_then_gets_the_room() -> None:
    """A job as wide as the pool behind a full pool, small jobs of another tenant behind
    it: each release lets one small job past, the OVERTAKE_LIMIT-th holds the class,
    and the wide one is admitted once everything admitted has been released."""
    queue: DeferredQueue[str] = DeferredQueue()
    pool = Pool(4000)
    for n in range(4):  # the pool is full of four admitted one-unit jobs
        pool.used += 1000
        pool.held.append((f"f{n}", 1000))
    queue.push("a-wide", "wide", 1, 4000)
    for n in range(30):
        queue.push("small", f"s{n}", 2 + n, 1000)
    order: list[str] = []
    while "wide" not in order:
        pool.release(0)
        order += [r.job_id for r in queue.readmit(pool.judge(), lambda t: 1.0)]
        assert len(order) <= 40
    assert order.index("wide") == OVERTAKE_LIMIT
    assert queue.pin != "wide"  # a small head waits pinned behind it now


def test_the_charge_is_the_reserved_units_and_never_nothing() -> None:
    assert charge_units(2500) == 2.5
    assert charge_units(0) == MIN_CHARGE_MILLI / 1000 > 0
