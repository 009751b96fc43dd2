"""Per-key throttles and tenant ceilings (fairlane.policy.throttle, fairlane.policy.ceilings)."""

from __future__ import annotations

import math
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fairlane.policy.ceilings import (
    DurationMean,
    RateWindow,
    TenantLimits,
    ceiling,
    earned_base,
    pressure_factor,
    tenant_limit,
)
from fairlane.policy.deadlineorder import DEADLINE_SPAN
from fairlane.policy.throttle import Acquired, Parked, Throttles, Wake

# -- throttles: examples ----------------------------------------------------------------


def _run(t: Throttles, job: str, tenant: str = "") -> Acquired:
    """A woken job's next dispatch: its offers become holds."""
    got = t.try_acquire(job, {}, 0, 0, tenant=tenant)
    assert isinstance(got, Acquired), got
    return got


def test_a_job_runs_only_while_it_holds_every_key() -> None:
    t = Throttles()
    keys = {"tenant:acme": 10, "sub:acme/u42": 2, "doc:884": 4}
    first = t.try_acquire("j1", keys, priority=0, seq=1)
    assert isinstance(first, Acquired)
    assert first.keys == ("doc:884", "sub:acme/u42", "tenant:acme")
    assert isinstance(t.try_acquire("j2", keys, priority=0, seq=2), Acquired)
    third = t.try_acquire("j3", keys, priority=0, seq=3)
    assert third == Parked("j3", "sub:acme/u42")
    # a parked job holds nothing anywhere
    assert t.in_use("tenant:acme") == 2
    assert t.in_use("doc:884") == 2
    assert t.holds("j3") is None
    assert t.waiters("sub:acme/u42") == ("j3",)
    # another sub-tenant of the same account is not held up by u42
    assert isinstance(t.try_acquire("j4", {"tenant:acme": 10, "sub:acme/u7": 2}, 0, 4), Acquired)


def test_a_release_offers_the_slot_and_the_woken_job_takes_it_with_its_lane_slot() -> None:
    t = Throttles()
    t.try_acquire("h", {"k": 1}, 0, 0, tenant="a")
    assert t.try_acquire("w", {"k": 1}, 0, 1, tenant="b") == Parked("w", "k")
    (wake,) = t.release("h")
    assert wake == Wake("w", ("k",), "k")
    # an offer, not a hold: nothing runs on k, yet nobody else can take its slot
    assert (t.in_use("k"), t.offers("k"), t.holds("w"), t.offered("w")) == (0, 1, None, ("k",))
    assert t.try_acquire("late", {"k": 1}, 9, 2, tenant="c") == Parked("late", "k")
    got = _run(t, "w")
    assert (t.in_use("k"), t.offers("k"), t.holds("w")) == (1, 0, ("k",))
    assert got.token == 2
    (wake,) = t.release("w", got.token)
    assert wake.job_id == "late"


def test_waiters_are_fair_between_tenants_by_weight_not_fifo() -> None:
    """A flood of tenant a parks first; b's waiters are woken at b's weight share."""
    weights = {"a": 1.0, "b": 4.0}
    t = Throttles(weights)
    t.try_acquire("h", {"k": 1}, 0, 0, tenant="a")
    for i in range(20):
        t.try_acquire(f"a{i}", {"k": 1}, 0, 1 + i, tenant="a")
    for i in range(20):
        t.try_acquire(f"b{i}", {"k": 1}, 0, 100 + i, tenant="b")
    assert t.groups("k")["a"][:2] == ("a0", "a1")
    woken = []
    running = "h"
    for _ in range(15):
        (wake,) = t.release(running)
        running = wake.job_id
        _run(t, running)
        woken.append(running[0])
    # b is woken 4 times for each of a's (ties go to the smaller name)
    assert woken == list("abbbb" * 3)


def test_within_a_tenant_highest_priority_first_then_fifo() -> None:
    t = Throttles()
    assert isinstance(t.try_acquire("holder", {"k": 1}, 0, 0), Acquired)
    for job, prio, seq in [("low1", 0, 1), ("high1", 5, 2), ("low2", 0, 3), ("high2", 5, 4)]:
        assert isinstance(t.try_acquire(job, {"k": 1}, prio, seq), Parked)
    assert t.waiters("k") == ("high1", "high2", "low1", "low2")
    order = []
    running = "holder"
    for _ in range(4):
        (wake,) = t.release(running)
        assert wake.key == "k"
        order.append(wake.job_id)
        running = wake.job_id
        _run(t, running)
    assert order == ["high1", "high2", "low1", "low2"]
    assert t.release(running) == []
    assert t.statistics().keys == ()  # an idle key is forgotten, tags and all


def test_a_returning_tenant_starts_at_the_keys_virtual_time() -> None:
    """An idle tenant keeps no credit beyond its finish tag, and a finish tag at or
    below V is deleted."""
    t = Throttles()
    t.try_acquire("h", {"k": 1}, 0, 0, tenant="a")
    t.try_acquire("b0", {"k": 1}, 0, 1, tenant="b")
    for i in range(4):
        t.try_acquire(f"a{i}", {"k": 1}, 0, 2 + i, tenant="a")
    running = "h"
    for _ in range(3):
        (wake,) = t.release(running)
        running = wake.job_id
        _run(t, running)
    # woken: a0 (tag 0, by name), b0 (tag 0), a1 (tag 1); b's group is gone
    assert running == "a1"
    assert t.groups("k") == {"a": ("a2", "a3")}
    assert t.vtime("k") == 1.0 and t.finish_tags("k") == {}
    t.try_acquire("b1", {"k": 1}, 0, 9, tenant="b")
    assert t.start_tags("k") == {"a": 2.0, "b": 1.0}  # max(F_b = 1, V = 1)


def test_a_waiter_blocked_on_another_key_moves_and_the_next_one_gets_the_slot() -> None:
    t = Throttles()
    t.try_acquire("ha", {"a": 1}, 0, 0)
    t.try_acquire("hb", {"b": 1}, 0, 1)
    assert t.try_acquire("w1", {"a": 1, "b": 1}, 9, 2) == Parked("w1", "a")
    assert t.try_acquire("w2", {"a": 1}, 0, 3) == Parked("w2", "a")
    (wake,) = t.release("ha")
    # w1 (first in line) still lacks b: it moves to b's group holding nothing; w2 is woken
    assert wake.job_id == "w2"
    assert t.parked_on("w1") == "b"
    assert t.holds("w1") is None
    _run(t, "w2")
    assert t.release("hb") == []  # w1 tried, a is full: moves back to a
    assert t.parked_on("w1") == "a"
    (wake,) = t.release("w2")
    assert wake.job_id == "w1"
    assert _run(t, "w1").keys == ("a", "b")
    assert t.statistics().moves == 2


def test_each_waiter_is_tried_at_most_once_per_release() -> None:
    t = Throttles()
    t.try_acquire("h", {"a": 1, "b": 1}, 0, 0)
    t.try_acquire("hc", {"c": 1}, 0, 1)
    for i in range(20):  # all need c too, which stays full
        t.try_acquire(f"w{i}", {"a": 1, "b": 1, "c": 1}, 0, 2 + i, tenant=f"t{i % 3}")
    assert len(t.waiters("a")) == 20
    assert t.release("h") == []
    assert t.statistics().moves == 20  # each moved exactly once: a -> c, and b had nobody
    assert len(t.waiters("c")) == 20
    assert t.in_use("a") == t.in_use("b") == 0


def test_raising_a_limit_wakes_waiters_before_the_arrival() -> None:
    t = Throttles()
    t.try_acquire("h", {"k": 1}, 0, 0)
    t.try_acquire("w1", {"k": 1}, 0, 1)
    t.try_acquire("w2", {"k": 1}, 0, 2)
    result = t.try_acquire("new", {"k": 3}, 9, 3)
    assert t.limit("k") == 3
    assert isinstance(result, Parked)  # w1 and w2 came first and took the new room
    assert [w.job_id for w in result.wakes] == ["w1", "w2"]
    assert (t.in_use("k"), t.offers("k")) == (1, 2)
    assert t.waiters("k") == ("new",)


def test_lowering_a_limit_preempts_nobody_and_an_offer_above_it_is_given_back() -> None:
    t = Throttles()
    for i in range(2):
        t.try_acquire(f"h{i}", {"k": 3}, 0, i)
    t.try_acquire("w", {"k": 3}, 0, 2)  # admitted: in_use 3
    t.try_acquire("x", {"k": 3}, 0, 3)
    (wake,) = t.release("w")
    assert wake.job_id == "x"
    assert t.try_acquire("y", {"k": 1}, 0, 4) == Parked("y", "k")  # the limit falls to 1
    # x's offer cannot become a hold (2 in use, limit 1): it is given back, x waits again
    again = t.try_acquire("x", {}, 0, 3)
    assert again == Parked("x", "k") and t.offers("k") == 0
    assert t.release("h0") == []
    (wake,) = t.release("h1")
    assert wake.job_id == "x"  # x came first


def test_a_zero_limit_pauses_a_key_until_it_is_raised() -> None:
    t = Throttles()
    assert t.try_acquire("w", {"k": 0}, 0, 0) == Parked("w", "k")
    raised = t.try_acquire("x", {"k": 2}, 0, 1)
    assert isinstance(raised, Acquired)
    assert [w.job_id for w in raised.wakes] == ["w"]


def test_tokens_fence_a_late_release_after_reclaim() -> None:
    t = Throttles()
    first = t.try_acquire("j", {"k": 1}, 0, 0)
    assert isinstance(first, Acquired)
    assert t.try_acquire("w", {"k": 1}, 0, 1) == Parked("w", "k")
    (wake,) = t.forget("j")  # reclaimed: its slot is offered to w
    assert wake.job_id == "w"
    assert t.forget("j") == []  # idempotent
    assert t.release("j") == []  # a duplicate release frees nothing
    held = _run(t, "w")
    t.release("w")
    again = t.try_acquire("j", {"k": 1}, 0, 0)  # the retried run
    assert isinstance(again, Acquired)
    assert again.token > held.token > first.token
    assert t.release("j", first.token) == []  # the first run's late release: no-op
    assert t.holds("j") == ("k",)
    assert t.release("j", again.token) == []
    assert t.holds("j") is None


def test_cancel_removes_a_waiter_or_gives_a_woken_jobs_offers_back() -> None:
    t = Throttles()
    t.try_acquire("h", {"k": 1}, 0, 0)
    t.try_acquire("w1", {"k": 1, "m": 5}, 0, 1)
    t.try_acquire("w2", {"k": 1}, 0, 2)
    t.try_acquire("w3", {"k": 1}, 0, 3)
    assert t.cancel("w1") == []
    assert t.cancel("w1") == []
    assert t.limit("m") is None  # nobody names m any more
    (wake,) = t.release("h")
    assert wake.job_id == "w2"
    # w2 expires (or is cancelled) before it runs: its offer passes on to w3
    (wake,) = t.forget("w2")
    assert wake.job_id == "w3" and t.offers("k") == 1
    assert t.cancel("w3") == [] and t.statistics().keys == ()
    stats = t.statistics()
    assert (stats.acquired, stats.parked, stats.cancelled, stats.released) == (1, 3, 3, 1)


def test_bad_calls_are_refused_without_changing_anything() -> None:
    t = Throttles()
    t.try_acquire("j", {"k": 1}, 0, 0)
    before = t.statistics()
    with pytest.raises(ValueError, match="already"):
        t.try_acquire("j", {"k": 5}, 0, 1)
    with pytest.raises(ValueError, match="limit"):
        t.try_acquire("x", {"k": -1}, 0, 1)
    with pytest.raises(ValueError, match="seq"):  # below every deadline order
        t.try_acquire("x", {"k": 1}, 0, -DEADLINE_SPAN - 1)
    with pytest.raises(ValueError, match="charge"):
        t.try_acquire("x", {"k": 1}, 0, 1, charge=-1)
    assert t.statistics() == before


def test_a_job_with_no_keys_is_admitted_at_once() -> None:
    t = Throttles()
    assert t.try_acquire("j", {}, 0, 0) == Acquired("j", 1, ())
    assert t.release("j") == []


# -- throttles: state machine -----------------------------------------------------------

JOBS = tuple(f"j{i}" for i in range(8))
KEYS = ("a", "b", "c", "d")
TENANTS = ("t1", "t2", "t3")
key_limits = st.dictionaries(st.sampled_from(KEYS), st.integers(1, 2), min_size=1, max_size=3)


class ThrottleMachine(RuleBasedStateMachine):
    """Random dispatches (arrivals and woken jobs), releases, reclaims and cancels,
    checked against a brute-force oracle of I1-I3 and the waiter order."""

    fixed: ClassVar[dict[str, int] | None] = None  # a subclass pins the limits

    def __init__(self) -> None:
        super().__init__()
        self.weights = {"t1": 1.0, "t2": 2.0, "t3": 0.5}
        self.t = Throttles(self.weights)
        self.status = dict.fromkeys(JOBS, "idle")  # idle, holding, parked, offered
        self.spec: dict[str, tuple[int, int, str]] = {}  # job -> (priority, seq, tenant)
        self.old_token: dict[str, int] = {}
        self.last_token = 0
        self.seq = 0
        self.prev_load: dict[str, int] = {}

    def _woken(self, wakes: tuple[Wake, ...] | list[Wake]) -> None:
        for w in wakes:
            assert self.status[w.job_id] == "parked"
            assert w.key in w.keys
            self.status[w.job_id] = "offered"

    def _token(self, token: int) -> None:
        assert token > self.last_token
        self.last_token = token

    def _jobs(self, *statuses: str) -> list[str]:
        return [j for j in JOBS if self.status[j] in statuses]

    @precondition(lambda self: self._jobs("idle", "offered"))
    @rule(data=st.data(), keys=key_limits, priority=st.integers(0, 2))
    def dispatch(self, data: st.DataObject, keys: dict[str, int], priority: int) -> None:
        job = data.draw(st.sampled_from(self._jobs("idle", "offered")))
        if self.fixed is not None:
            keys = {k: self.fixed[k] for k in keys}
        if self.status[job] == "offered":
            priority, seq, tenant = self.spec[job]
            wanted = self.t.offered(job) or ()
            room_before = {k: self.t.in_use(k) < (self.t.limit(k) or 0) for k in wanted}
        else:
            self.seq += 1
            seq, tenant = self.seq, data.draw(st.sampled_from(TENANTS))
            self.spec[job] = (priority, seq, tenant)
            wanted = tuple(sorted(keys))
            room_before = {}
        result = self.t.try_acquire(job, keys, priority, seq, tenant=tenant)
        self._woken(result.wakes)
        if isinstance(result, Acquired):
            assert result.keys == wanted
            self._token(result.token)
            self.status[job] = "holding"
            assert not room_before or all(room_before.values())
        else:
            assert result.key in wanted
            self.status[job] = "parked"

    @precondition(lambda self: self._jobs("holding"))
    @rule(data=st.data(), with_token=st.booleans())
    def release(self, data: st.DataObject, with_token: bool) -> None:
        job = data.draw(st.sampled_from(self._jobs("holding")))
        token = self.t.token(job)
        assert token is not None
        wakes = self.t.release(job, token if with_token else None)
        self.status[job] = "idle"
        self.old_token[job] = token
        self._woken(wakes)

    @precondition(lambda self: self._jobs("holding", "parked", "offered"))
    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(self._jobs("holding", "parked", "offered")))
        token = self.t.token(job)
        if token is not None:
            self.old_token[job] = token
        wakes = self.t.forget(job)
        if self.status[job] == "parked":
            assert wakes == []  # a waiter leaving frees nothing
        self.status[job] = "idle"
        self._woken(wakes)
        stats = self.t.statistics()
        assert self.t.forget(job) == []  # a second reclaim is a no-op
        assert self.t.statistics() == stats

    @rule(job=st.sampled_from(JOBS))
    def no_ops(self, job: str) -> None:
        """Calls that must change nothing: double dispatch, stray and late releases."""
        stats = self.t.statistics()
        if self.status[job] in ("holding", "parked"):
            with pytest.raises(ValueError, match="already"):
                self.t.try_acquire(job, {"a": 3}, 0, self.seq + 1)
        if self.status[job] == "idle":
            assert self.t.cancel(job) == []
        if self.status[job] != "holding":
            assert self.t.release(job) == []  # double release
        old = self.old_token.get(job)
        if old is not None:
            assert self.t.release(job, old) == []  # a fenced late release
        assert self.t.statistics() == stats

    def run_everything(self) -> None:
        """No starvation: releasing every holder and dispatching every woken job, round
        after round, runs every waiter."""
        for _ in range(4 * len(JOBS) + 1):
            busy = self._jobs("holding", "offered")
            if not busy:
                break
            for job in busy:
                if self.status[job] == "holding":
                    self.status[job] = "idle"
                    self._woken(self.t.release(job))
                elif self.status[job] == "offered":
                    prio, seq, tenant = self.spec[job]
                    got = self.t.try_acquire(job, {}, prio, seq, tenant=tenant)
                    self._woken(got.wakes)
                    self.status[job] = "holding" if isinstance(got, Acquired) else "parked"
        assert all(s == "idle" for s in self.status.values()), self.status
        assert self.t.statistics().keys == ()

    @invariant()
    def consistent(self) -> None:
        t = self.t
        for job in JOBS:  # I1: one state
            assert (t.holds(job) is not None) == (self.status[job] == "holding")
            assert (t.parked_on(job) is not None) == (self.status[job] == "parked")
            assert (t.offered(job) is not None) == (self.status[job] == "offered")
        stats = t.statistics()
        named = {k for j in JOBS for k in t.holds(j) or t.wants(j) or t.offered(j) or ()}
        assert {s.key for s in stats.keys} == named  # idle keys are forgotten
        for s in stats.keys:
            assert s.in_use == sum(s.key in (t.holds(j) or ()) for j in JOBS)
            assert s.offers == sum(s.key in (t.offered(j) or ()) for j in JOBS)
            groups, starts = t.groups(s.key), t.start_tags(s.key)
            assert s.waiters == sum(len(g) for g in groups.values())
            # tags: a group has a start tag >= V; idle tenants keep only finish tags > V
            assert set(starts) == set(groups)
            assert all(tag >= t.vtime(s.key) for tag in starts.values())
            assert all(f > t.vtime(s.key) for f in t.finish_tags(s.key).values())
            assert not set(t.finish_tags(s.key)) & set(groups)
            for tenant, group in groups.items():  # priority, then FIFO, within a tenant
                order = sorted((-self.spec[j][0], self.spec[j][1], j) for j in group)
                assert list(group) == [o[2] for o in order]
                assert all(self.spec[j][2] == tenant and t.parked_on(j) == s.key for j in group)
        for key in KEYS:
            limit = t.limit(key) or 0
            load = t.in_use(key) + t.offers(key)
            # I2: never over the limit, unless a lowered limit left more, which then
            # does not grow
            assert load <= max(limit, self.prev_load.get(key, 0))
            if self.fixed is not None:
                assert load <= self.fixed[key]
            # I3: a key with waiters has no room
            assert not t.waiters(key) or limit - load <= 0
        for job in JOBS:  # brute force: no waiter could take all its keys now
            wants = t.wants(job)
            if wants is not None:
                assert any((t.limit(k) or 0) - t.in_use(k) - t.offers(k) <= 0 for k in wants)
        self.prev_load = {k: t.in_use(k) + t.offers(k) for k in KEYS}

    def teardown(self) -> None:
        self.run_everything()


class FixedLimitMachine(ThrottleMachine):
    fixed: ClassVar[dict[str, int] | None] = {"a": 1, "b": 2, "c": 1, "d": 3}


machine_settings = settings(max_examples=150, stateful_step_count=50, deadline=None)
TestThrottleMachine = ThrottleMachine.TestCase
TestThrottleMachine.settings = machine_settings
TestFixedLimitMachine = FixedLimitMachine.TestCase
TestFixedLimitMachine.settings = machine_settings


# -- ceilings: formulas ---------------------------------------------------------------


def test_earned_base_is_littles_law_never_below_the_floor() -> None:
    assert earned_base(floor=2, rate_per_min=120, mean_duration_s=30) == 60
    assert earned_base(floor=80, rate_per_min=120, mean_duration_s=30) == 80
    assert earned_base(floor=0, rate_per_min=1, mean_duration_s=90) == 2  # 1.5 rounds up
    # 9.3 * 200 / 60 is 31.000000000000004 in binary floating point: still 31, not 32
    assert earned_base(floor=0, rate_per_min=9.3, mean_duration_s=200) == 31
    assert earned_base(floor=3, rate_per_min=0, mean_duration_s=30) == 3
    with pytest.raises(ValueError):
        earned_base(1, -1, 1)


def test_ceiling_adds_the_larger_burst_rounded_down() -> None:
    assert ceiling(60, burst_floor=5, burst_pct=0.25) == 75
    assert ceiling(10, burst_floor=5, burst_pct=0.25) == 15  # the burst floor wins
    assert ceiling(10, burst_floor=0, burst_pct=0.25) == 12  # 2.5 -> 2
    assert ceiling(10, burst_floor=0, burst_pct=0.3) == 13  # 3.0000000000000004 -> 3


def test_pressure_factor_clamps_and_is_f_max_when_idle() -> None:
    assert pressure_factor(100, 200, 0.1, 2.0) == 0.5
    assert pressure_factor(100, 50, 0.1, 2.0) == 2.0
    assert pressure_factor(100, 40, 0.1, 1.5) == 1.5
    assert pressure_factor(100, 10_000, 0.1, 2.0) == 0.1
    assert pressure_factor(100, 0, 0.1, 2.0) == 2.0
    with pytest.raises(ValueError):
        pressure_factor(100, 10, 0.5, 0.2)


def test_tenant_limit_example() -> None:
    acme = TenantLimits(floor=10, burst_floor=5, burst_pct=0.25)
    # base 60, ceiling 75; idle pool -> the whole ceiling
    assert tenant_limit(acme, 120, 30, pool_target=400, in_flight=0) == 75
    # pool saturated twice over: the ceiling halves
    assert tenant_limit(acme, 120, 30, pool_target=400, in_flight=800) == 37
    # room to spare and f_max above 1: expands past the ceiling
    assert tenant_limit(acme, 120, 30, 400, 200, f_max=2.0) == 150
    # deep pressure: never below the floor
    assert tenant_limit(acme, 120, 30, 400, 1_000_000) == 10
    capped = TenantLimits(floor=10, max_concurrency=50, burst_floor=5, burst_pct=0.25)
    assert tenant_limit(capped, 120, 30, 400, 0) == 50


def test_tenant_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="below the floor"):
        TenantLimits(floor=5, max_concurrency=4)
    with pytest.raises(ValueError):
        TenantLimits(burst_pct=-0.1)
    with pytest.raises(ValueError):
        TenantLimits(weight=0)


def test_a_spiky_tenant_does_not_hurt_a_steady_one() -> None:
    # steady: 60/min x 10 s = 10 in flight, all covered by its floor of 10
    steady = TenantLimits(floor=10, burst_floor=2, burst_pct=0.2)
    spiky = TenantLimits(floor=5, burst_floor=2, burst_pct=0.5)
    pool = 100
    calm = tenant_limit(steady, 60, 10, pool, in_flight=60)
    # the spiky tenant surges to 3000/min x 20 s = 1000 in flight
    surge_in_flight = 10 + 1000
    steady_now = tenant_limit(steady, 60, 10, pool, surge_in_flight)
    spiky_now = tenant_limit(spiky, 3000, 20, pool, surge_in_flight)
    assert calm == 12
    assert steady_now == 10  # its floor: everything it needs
    spiky_ceiling = ceiling(earned_base(5, 3000, 20), 2, 0.5)
    assert spiky_ceiling == 1500
    assert spiky_now == math.floor(1500 * pool / surge_in_flight) == 148
    assert spiky_ceiling - spiky_now > calm - steady_now  # the spiky one sheds more


tenants = st.builds(
    TenantLimits,
    floor=st.integers(0, 50),
    burst_floor=st.integers(0, 20),
    burst_pct=st.floats(0, 2),
)
rates = st.floats(0, 10_000, allow_nan=False)
durations = st.floats(0, 600, allow_nan=False)


@given(
    st.lists(st.tuples(tenants, rates, durations), min_size=1, max_size=6),
    st.integers(1, 10_000),
    st.integers(0, 100_000),
)
def test_pressure_sheds_every_ceiling_by_the_same_proportion(
    fleet: list[tuple[TenantLimits, float, float]], pool: int, in_flight: int
) -> None:
    factor = pressure_factor(pool, in_flight, 0.0, 1.0)
    for settings_, rate, duration in fleet:
        top = ceiling(
            earned_base(settings_.floor, rate, duration), settings_.burst_floor, settings_.burst_pct
        )
        limit = tenant_limit(settings_, rate, duration, pool, in_flight)
        assert limit >= settings_.floor  # never below the floor
        assert limit <= max(top, settings_.floor)  # f_max = 1: never above the ceiling
        # each keeps the fraction `factor` of its ceiling, give or take the rounding
        assert limit >= max(settings_.floor, math.floor(top * factor + 1e-9))
        assert limit >= top * factor - 1
        # and more pressure never raises anyone's limit
        assert tenant_limit(settings_, rate, duration, pool, in_flight * 2 + 1) <= limit


# -- ceilings: signals ----------------------------------------------------------------


def test_rate_window_measures_a_steady_stream() -> None:
    window = RateWindow(buckets=6, width_ms=10_000)
    for t in range(0, 120_000, 500):  # 2 per second = 120/min
        window.add(t)
    assert window.per_minute(119_999) == pytest.approx(120, rel=0.02)
    assert window.count(119_999) == 120  # the last minute only


def test_rate_window_forgets_old_buckets_and_ignores_stale_adds() -> None:
    window = RateWindow(buckets=3, width_ms=1_000)
    window.add(500, count=10)
    assert window.count(2_999) == 10
    assert window.count(3_000) == 0  # bucket 0 left the window
    window.add(5_000)  # bucket 5, slot 2
    window.add(1_000, count=7)  # bucket 1, slot 1
    window.add(4_100, count=2)  # bucket 4 reuses slot 1: bucket 1's count is dropped
    window.add(1_200, count=99)  # bucket 1 again: its slot holds a newer bucket, ignored
    assert window.count(5_000) == 3
    assert window.per_minute(5_999) == pytest.approx(3 * 60_000 / 3_000)
    with pytest.raises(ValueError):
        window.add(-1)


@given(st.lists(st.integers(0, 100_000), max_size=60), st.integers(0, 100_000))
def test_rate_window_counts_exactly_the_recent_buckets(times: list[int], now: int) -> None:
    window = RateWindow(buckets=4, width_ms=1_000)
    times.sort()
    for t in times:
        window.add(t)
    now = max([now, *times])  # time passed in does not go back
    expected = sum(1 for t in times if now // 1_000 - 4 < t // 1_000 <= now // 1_000)
    assert window.count(now) == expected


def test_duration_mean_is_an_ewma() -> None:
    mean = DurationMean(alpha=0.5)
    assert mean.value(default=30.0) == 30.0
    assert mean.observe(10) == 10
    assert mean.observe(20) == 15
    assert mean.observe(20) == 17.5
    assert mean.samples == 3
    slow = DurationMean()
    slow.observe(10)
    slow.observe(110)  # one outlier moves it a tenth of the way
    assert slow.value() == pytest.approx(20)
    for _ in range(200):
        slow.observe(40)
    assert slow.value() == pytest.approx(40)
    with pytest.raises(ValueError):
        DurationMean(alpha=0)
    with pytest.raises(ValueError):
        slow.observe(-1)
