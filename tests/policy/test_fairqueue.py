"""Start-time fair queuing of tenants (fairlane.policy.fairqueue), against computed shares.

Every test drives the queue by dispatch count, never by time. Shares are compared to
``w_i / sum(w)`` over the active tenants; the pairwise fairness bound, the latency bound
of a newly active tenant and the invariants (I1) and (I2) are checked as the module
docstring states them; a naive O(n) reference must produce the very same dispatches.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import FrozenInstanceError

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairlane.policy.fairqueue import Dispatch, FairQueue, job_order

EPS = 1e-9

weights_st = st.sampled_from([0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0])
costs_st = st.floats(min_value=0.1, max_value=20.0, allow_nan=False, allow_infinity=False)


def close_enough(slack: float, scale: float) -> float:
    return slack + EPS * (1.0 + abs(scale))


class Backlogged:
    """Keeps chosen tenants backlogged: every dispatch of one is replaced by a new job."""

    def __init__(self, q: FairQueue, costs: dict[str, float], depth: int = 2) -> None:
        self.q, self.costs, self.ids = q, costs, itertools.count()
        for tenant, cost in costs.items():
            for _ in range(depth):
                q.push(tenant, f"{tenant}-{next(self.ids)}", cost)

    def pop(self) -> Dispatch:
        d = self.q.pop()
        assert d is not None
        if d.tenant in self.costs:
            self.q.push(d.tenant, f"{d.tenant}-{next(self.ids)}", self.costs[d.tenant])
        return d


def work_shares(q: FairQueue, run: Backlogged, n: int) -> dict[str, float]:
    work: defaultdict[str, float] = defaultdict(float)
    for _ in range(n):
        d = run.pop()
        work[d.tenant] += d.cost
    total = sum(work.values())
    return {t: w / total for t, w in work.items()}


def assert_shares(shares: dict[str, float], weights: dict[str, float]) -> None:
    total = sum(weights.values())
    for tenant, w in weights.items():
        fair = w / total
        assert shares.get(tenant, 0.0) == pytest.approx(fair, rel=0.02), (tenant, shares)


# -- shares against the computed fair share ---------------------------------------------

WEIGHTS_532 = {"a": 5.0, "b": 3.0, "c": 2.0}


@pytest.mark.parametrize(
    "costs",
    [
        {"a": 1.0, "b": 1.0, "c": 1.0},
        {"a": 10.0, "b": 1.0, "c": 3.0},
        {"a": 1.0, "b": 10.0, "c": 3.0},
    ],
    ids=["unit-costs", "a10-b1-c3", "a1-b10-c3"],
)
def test_backlogged_tenants_share_work_by_weight(costs: dict[str, float]) -> None:
    q = FairQueue()
    for tenant, w in WEIGHTS_532.items():
        q.set_weight(tenant, w)
    shares = work_shares(q, Backlogged(q, costs), 10_000)
    assert_shares(shares, WEIGHTS_532)


def test_an_idle_tenants_share_flows_to_the_active_ones() -> None:
    q = FairQueue()
    for tenant, w in WEIGHTS_532.items():
        q.set_weight(tenant, w)
    run = Backlogged(q, {"a": 1.0, "c": 3.0})
    assert_shares(work_shares(q, run, 10_000), {"a": 5.0, "c": 2.0})
    assert q.active_tenants() == tuple(sorted(q.active_tenants(), key=lambda t: q.tenant(t).tag))
    run.costs["b"] = 10.0
    q.push("b", "b-first", 10.0)
    assert_shares(work_shares(q, run, 10_000), WEIGHTS_532)


def test_a_returning_idle_tenant_gets_no_saved_credit() -> None:
    q = FairQueue()
    q.push("c", "c-early")
    run = Backlogged(q, {"a": 1.0, "b": 1.0})
    for _ in range(5_000):
        run.pop()
    assert q.tenant("c").tag < q.virtual_time - 1_000  # it fell far behind while away
    assert q.push("c", "c-back")
    assert q.tenant("c").tag == q.virtual_time  # ... and starts at the present
    run.costs["c"] = 1.0
    got: list[str] = [run.pop().tenant for _ in range(300)]
    for n in range(1, 301):  # at every prefix: at most its third, plus one job
        assert got[:n].count("c") <= n / 3 + 1
    assert got.count("c") == pytest.approx(100, abs=1)


def test_going_idle_does_not_dodge_the_charge_for_the_last_job() -> None:
    q = FairQueue()
    run = Backlogged(q, {"a": 1.0})
    q.push("big", "big-1", 50.0)
    while (d := run.pop()).tenant != "big":
        pass
    assert q.tenant("big").tag == d.finish_tag == q.virtual_time + 50.0
    q.push("big", "big-2", 50.0)  # back at once: it still owes for big-1
    assert q.tenant("big").tag == d.finish_tag
    between = 0
    while run.pop().tenant != "big":
        between += 1
    assert between == 50  # "a" catches up first: 50 unit jobs


# -- the pairwise fairness bound at every prefix ---------------------------------------


class PairWindows:
    """Per pair of tenants, charged work since both became (and stayed) active."""

    def __init__(self, q: FairQueue) -> None:
        self.q = q
        self.work: defaultdict[str, float] = defaultdict(float)
        self.forfeit: defaultdict[str, float] = defaultdict(float)
        self.open: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}

    def activated(self, tenant: str) -> None:
        for other in self.q.active_tenants():
            if other != tenant:
                i, j = sorted((tenant, other))
                self.open[(i, j)] = {t: (self.work[t], self.forfeit[t]) for t in (i, j)}

    def check(self, slack: dict[str, float]) -> None:
        """Check every open window, then close those whose tenants went idle."""
        for pair, start in self.open.items():
            i, j = pair
            wi, wj = self.q.weight(i), self.q.weight(j)
            di = (self.work[i] - start[i][0]) / wi
            dj = (self.work[j] - start[j][0]) / wj
            ri = (self.forfeit[i] - start[i][1]) / wi
            rj = (self.forfeit[j] - start[j][1]) / wj
            bound = slack[i] / wi + slack[j] / wj + ri + rj
            assert abs(di - dj) <= close_enough(bound, di + dj), (pair, di, dj, bound)
        active = set(self.q.active_tenants())
        self.open = {p: s for p, s in self.open.items() if set(p) <= active}


Op = tuple[str, int, float]
ops_st = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 4), costs_st),
        st.tuples(st.just("pop"), st.just(0), st.just(0.0)),
        st.tuples(st.just("adjust"), st.integers(0, 4), st.floats(-15.0, 15.0)),
    ),
    max_size=300,
)


def run_with_bound_checks(weights: list[float], ops: list[Op]) -> None:
    q = FairQueue()
    names = [f"t{k}" for k in range(len(weights))]
    for name, w in zip(names, weights, strict=True):
        q.set_weight(name, w)
    windows = PairWindows(q)
    charge: defaultdict[str, float] = defaultdict(float)  # last cost + positive deltas since
    c_max: defaultdict[str, float] = defaultdict(float)
    for n, (kind, k, x) in enumerate(ops):
        tenant = names[k % len(names)]
        if kind == "push" and q.push(tenant, f"j{n}", x):
            windows.activated(tenant)
        elif kind == "adjust":
            v, before = q.virtual_time, q.tenant(tenant).tag
            q.adjust(tenant, x)
            moved_to = max(before, v) + x / q.weight(tenant)
            windows.forfeit[tenant] += (q.tenant(tenant).tag - moved_to) * q.weight(tenant)
            windows.work[tenant] += x
            charge[tenant] += max(x, 0.0)
        elif kind == "pop" and (d := q.pop()) is not None:
            windows.work[d.tenant] += d.cost
            charge[d.tenant] = d.cost
        for t in names:
            c_max[t] = max(c_max[t], charge[t])
        windows.check(c_max)
        q.check_invariants()
        for t in names:  # (I1) and (I2), with adjustments folded into the charge
            s = q.tenant(t)
            assert not s.active or s.tag >= q.virtual_time
            assert s.tag <= q.virtual_time + close_enough(charge[t] / s.weight, s.tag)


@settings(max_examples=150, deadline=None)
@given(
    weights=st.lists(weights_st, min_size=2, max_size=5),
    ops=ops_st.map(lambda ops: [op for op in ops if op[0] != "adjust"]),
)
def test_the_pairwise_bound_holds_at_every_prefix(weights: list[float], ops: list[Op]) -> None:
    run_with_bound_checks(weights, ops)


@settings(max_examples=150, deadline=None)
@given(weights=st.lists(weights_st, min_size=2, max_size=5), ops=ops_st)
def test_the_pairwise_bound_holds_for_charged_work_with_adjustments(
    weights: list[float], ops: list[Op]
) -> None:
    run_with_bound_checks(weights, ops)


# -- latency of a newly active tenant -----------------------------------------------------


def dispatches_until(q: FairQueue, run: Backlogged, tenant: str) -> list[Dispatch]:
    ahead = []
    while (d := run.pop()).tenant != tenant:
        ahead.append(d)
    return ahead


@pytest.mark.parametrize("warmup", [0, 1, 1_234])
def test_a_new_tenant_behind_a_100k_backlog_goes_within_one_dispatch(warmup: int) -> None:
    q = FairQueue()
    for n in range(100_000):
        q.push("bulk", f"w{n}")
    run = Backlogged(q, {})
    for _ in range(warmup):
        run.pop()
    q.push("newcomer", "m0")
    ahead = dispatches_until(q, run, "newcomer")
    # bound: c_bulk^max + w_bulk * (S_t - V_a) = 1 + 0: one job at most (a tie at V = 0
    # goes to the smaller name, "bulk"; after any dispatch "bulk" is ahead of V)
    assert len(ahead) <= 1
    assert len(ahead) == (1 if warmup == 0 else 0)
    assert q.statistics().waiting == 100_000 - warmup - len(ahead)


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_newly_active_tenant_waits_within_the_sfq_latency_bound(data: st.DataObject) -> None:
    others = data.draw(st.lists(st.tuples(weights_st, costs_st), min_size=1, max_size=4))
    w_t = data.draw(weights_st, label="w_t")
    previous = data.draw(st.none() | costs_st, label="previous job of t")
    warmup = data.draw(st.integers(0, 40), label="dispatches before t returns")
    late = data.draw(st.none() | st.tuples(weights_st, costs_st), label="late tenant")
    q = FairQueue()
    q.set_weight("t", w_t)
    costs = {f"k{n}": c for n, (_, c) in enumerate(others)}
    for n, (w, _) in enumerate(others):
        q.set_weight(f"k{n}", w)
    run = Backlogged(q, costs)
    if previous is not None:
        q.push("t", "t-previous", previous)
        dispatches_until(q, run, "t")
    for _ in range(warmup):
        run.pop()
    v_a = q.virtual_time
    q.push("t", "t-new", 1.0)
    s_t = q.tenant("t").tag
    assert s_t - v_a <= close_enough((previous or 0.0) / w_t, s_t)
    if late is not None:
        q.set_weight("late", late[0])
        run.costs["late"] = late[1]
        q.push("late", "late-0", late[1])
    ahead = dispatches_until(q, run, "t")
    for k, cost in run.costs.items():
        w_k = q.weight(k)
        work = sum(d.cost for d in ahead if d.tenant == k)
        count = sum(1 for d in ahead if d.tenant == k)
        assert work <= close_enough(cost + w_k * (s_t - v_a), work)
        assert work <= close_enough(cost + w_k / w_t * (previous or 0.0), work)
        assert count <= 1 + math.floor(w_k * (s_t - v_a) / cost + EPS)


# -- per-tenant order, cancellation, weights, adjustments -----------------------------------


def test_within_a_tenant_higher_priority_first_then_fifo() -> None:
    q = FairQueue()
    for seq, (job, prio) in enumerate([("low1", 0), ("high1", 5), ("low2", 0), ("high2", 5)]):
        q.push("a", job, order_key=job_order(prio, seq))
    q.push("a", "mid", order_key=job_order(2, 99))
    assert [d.job_id for d in iter(q.pop, None)] == ["high1", "high2", "mid", "low1", "low2"]


def test_without_order_keys_a_tenants_jobs_go_fifo() -> None:
    q = FairQueue()
    for n in range(5):
        q.push("a", f"j{n}")
    assert [d.job_id for d in iter(q.pop, None)] == [f"j{n}" for n in range(5)]


def test_remove_cancels_a_waiting_job_and_the_last_one_idles_its_tenant() -> None:
    q = FairQueue()
    q.push("a", "a1")
    q.push("a", "a2")
    q.push("b", "b1")
    assert q.remove("a1")
    assert not q.remove("a1")
    assert not q.remove("never")
    assert q.active_tenants() == ("a", "b")
    assert q.remove("a2")
    assert q.active_tenants() == ("b",)
    assert not q.tenant("a").active
    assert q.push("a", "a1", 3.0)  # the id is free again; "a" is active again
    assert [d.job_id for d in iter(q.pop, None)] == ["a1", "b1"]
    assert q.statistics().waiting == 0
    q.check_invariants()


def test_cancelling_and_requeueing_gains_no_place() -> None:
    q = FairQueue()
    run = Backlogged(q, {"a": 1.0})
    q.push("b", "b1", 10.0)
    dispatches_until(q, run, "b")
    q.push("b", "b2")
    tag = q.tenant("b").tag
    assert tag > q.virtual_time
    q.remove("b2")
    run.pop()
    q.push("b", "b3")
    assert q.tenant("b").tag == max(q.virtual_time, tag)


def test_stale_heap_entries_are_compacted_away() -> None:
    q = FairQueue()
    for n in range(1_000):
        q.push(f"t{n % 10}", f"j{n}")
    for n in range(1_000):
        if n % 10 < 5 or n % 100 >= 10:  # empty t0..t4; leave t5..t9 ten jobs each
            assert q.remove(f"j{n}")
    for n in range(500):  # every adjust of an active tenant re-enters it in the heap
        q.adjust(f"t{5 + n % 5}", 0.001)
    q.check_invariants()
    # lazy deletion is bounded: at most twice the live entries plus a constant slack
    assert len(q._active) <= 2 * 5 + 64
    assert all(len(q._tenants[f"t{k}"].jobs) <= 2 * 10 + 64 for k in range(5, 10))
    assert q.active_tenants() == ("t5", "t6", "t7", "t8", "t9")
    assert len(list(iter(q.pop, None))) == 50


def test_a_weight_change_applies_from_the_next_charge() -> None:
    q = FairQueue()
    run = Backlogged(q, {"a": 1.0, "b": 1.0})
    for _ in range(100):
        run.pop()
    tag_before = q.tenant("a").tag
    q.set_weight("a", 4.0)
    assert q.tenant("a").tag == tag_before  # no rescaling of the pending tag
    d = dispatches_until(q, run, "a")  # "a" is next or second; its charge uses w=4
    assert len(d) <= 1
    last = q.tenant("a")
    assert last.tag == pytest.approx(q.virtual_time + 1.0 / 4.0)
    assert_shares(work_shares(q, run, 5_000), {"a": 4.0, "b": 1.0})


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_weights_and_costs_must_be_finite_and_positive(bad: float) -> None:
    q = FairQueue()
    with pytest.raises(ValueError, match="weight"):
        q.set_weight("a", bad)
    with pytest.raises(ValueError, match="cost"):
        q.push("a", "j", bad)
    assert q.statistics().waiting == 0


def test_a_job_id_can_wait_only_once_and_deltas_must_be_finite() -> None:
    q = FairQueue()
    q.push("a", "j")
    with pytest.raises(ValueError, match="already waiting"):
        q.push("b", "j")
    with pytest.raises(ValueError, match="finite"):
        q.adjust("a", math.nan)


def test_adjust_charges_an_idle_tenant_from_the_present() -> None:
    q = FairQueue()
    run = Backlogged(q, {"a": 1.0})
    q.set_weight("b", 2.0)
    q.push("b", "b1", 2.0)
    dispatches_until(q, run, "b")
    for _ in range(10):
        run.pop()
    assert q.tenant("b").tag < q.virtual_time  # idle long enough to be at parity
    q.adjust("b", 8.0)  # b1 really cost 10: the extra 8 / w=2 lands on the present
    assert q.tenant("b").tag == q.virtual_time + 4.0
    q.push("b", "b2")
    assert len(dispatches_until(q, run, "b")) == 4


def test_a_refund_brings_a_tenant_to_parity_but_never_ahead() -> None:
    q = FairQueue()
    run = Backlogged(q, {"a": 1.0, "b": 1.0})
    for _ in range(20):
        run.pop()
    q.adjust("a", -1_000.0)
    assert q.tenant("a").tag == q.virtual_time
    q.adjust("idle", -5.0)
    assert q.tenant("idle").tag == q.virtual_time
    assert q.statistics().adjusted == -1_005.0


def test_adjust_moves_an_active_tenants_tag_and_its_place() -> None:
    q = FairQueue()
    run = Backlogged(q, {"a": 1.0, "b": 1.0})
    run.pop()  # a went first (name tie); b is next
    assert q.active_tenants() == ("b", "a")
    q.adjust("b", 1.5)
    assert q.tenant("b").tag == 1.5
    assert q.active_tenants() == ("a", "b")
    assert run.pop().tenant == "a"


def test_empty_queue_pops_nothing_and_snapshots_are_frozen() -> None:
    q = FairQueue()
    assert q.pop() is None
    stats = q.statistics()
    assert (stats.virtual_time, stats.active_tenants, stats.dispatched) == (0.0, 0, 0)
    with pytest.raises(FrozenInstanceError):
        stats.waiting = 3  # type: ignore[misc]
    q.push("a", "j", 2.5)
    d = q.pop()
    assert d == Dispatch("a", "j", 2.5, 0.0, 2.5)
    s = q.tenant("a")
    assert (s.dispatched, s.work, s.active, s.tag) == (1, 2.5, False, 2.5)
    assert q.statistics().work == 2.5


# -- the oracle: a naive O(n) reference of the rules ------------------------------------------


class Reference:
    """Rules 1-5 of the module docstring, by linear scans."""

    def __init__(self) -> None:
        self.v = 0.0
        self.tags: defaultdict[str, float] = defaultdict(float)
        self.weights: defaultdict[str, float] = defaultdict(lambda: 1.0)
        self.queues: defaultdict[str, list[tuple[tuple[int, int], str, float]]] = defaultdict(list)

    def push(self, tenant: str, job_id: str, cost: float, key: tuple[int, int]) -> None:
        if not self.queues[tenant]:
            self.tags[tenant] = max(self.v, self.tags[tenant])
        self.queues[tenant].append((key, job_id, cost))

    def pop(self) -> Dispatch | None:
        active = [t for t, jobs in self.queues.items() if jobs]
        if not active:
            return None
        tenant = min(active, key=lambda t: (self.tags[t], t))
        job = min(self.queues[tenant])
        self.queues[tenant].remove(job)
        start = self.v = self.tags[tenant]
        self.tags[tenant] = start + job[2] / self.weights[tenant]
        return Dispatch(tenant, job[1], job[2], start, self.tags[tenant])

    def remove(self, job_id: str) -> None:
        for jobs in self.queues.values():
            jobs[:] = [j for j in jobs if j[1] != job_id]

    def adjust(self, tenant: str, delta: float) -> None:
        moved = max(self.tags[tenant], self.v) + delta / self.weights[tenant]
        self.tags[tenant] = max(self.v, moved)


oracle_ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 3), costs_st, st.integers(0, 2)),
        st.tuples(st.just("pop"), st.integers(1, 6), st.just(0.0), st.just(0)),
        st.tuples(st.just("remove"), st.integers(0, 3), st.just(0.0), st.integers(0, 3)),
        st.tuples(st.just("adjust"), st.integers(0, 3), st.floats(-10.0, 10.0), st.just(0)),
        st.tuples(
            st.just("weight"), st.integers(0, 3), st.sampled_from([0.5, 1.0, 3.0]), st.just(0)
        ),
    ),
    max_size=300,
)


@settings(max_examples=200, deadline=None)
@given(ops=oracle_ops)
def test_the_queue_dispatches_exactly_as_the_naive_reference(
    ops: list[tuple[str, int, float, int]],
) -> None:
    q, ref = FairQueue(), Reference()
    waiting: dict[str, str] = {}  # job id -> tenant
    for n, (kind, k, x, m) in enumerate(ops):
        tenant = f"t{k}"
        if kind == "push":
            q.push(tenant, f"j{n}", x, job_order(m, n))
            ref.push(tenant, f"j{n}", x, job_order(m, n))
            waiting[f"j{n}"] = tenant
        elif kind == "pop":  # k dispatches in a row, so that tenants often run dry
            for _ in range(k):
                d = q.pop()
                assert d == ref.pop()
                waiting.pop(d.job_id if d else "", None)
        elif kind == "remove":  # one of the tenant's waiting jobs, or one not waiting
            own = sorted(j for j, t in waiting.items() if t == tenant)
            job_id = own[m % len(own)] if own else "never-pushed"
            assert q.remove(job_id) == bool(own)
            ref.remove(job_id)
            waiting.pop(job_id, None)
        elif kind == "adjust":
            q.adjust(tenant, x)
            ref.adjust(tenant, x)
        else:
            q.set_weight(tenant, x)
            ref.weights[tenant] = x
        q.check_invariants()
        assert q.virtual_time == ref.v
    assert [d for d in iter(q.pop, None)] == [d for d in iter(ref.pop, None)]
