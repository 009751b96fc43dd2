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
from fairlane.policy.throttle import Acquired, Handoff, Parked, Throttles

# -- throttles: examples ----------------------------------------------------------------


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


def test_handoff_goes_highest_priority_first_then_fifo() -> None:
    t = Throttles()
    assert isinstance(t.try_acquire("holder", {"k": 1}, 0, 0), Acquired)
    for job, prio, seq in [("low1", 0, 1), ("high1", 5, 2), ("low2", 0, 3), ("high2", 5, 4)]:
        assert isinstance(t.try_acquire(job, {"k": 1}, prio, seq), Parked)
    assert t.waiters("k") == ("high1", "high2", "low1", "low2")
    order = []
    running = "holder"
    for _ in range(4):
        (handoff,) = t.release(running)
        assert handoff.key == "k"
        assert t.holds(handoff.job_id) == ("k",)
        order.append(handoff.job_id)
        running = handoff.job_id
    assert order == ["high1", "high2", "low1", "low2"]
    assert t.release(running) == []
    assert t.statistics().keys == ()  # an idle key is forgotten


def test_a_waiter_blocked_on_another_key_moves_and_the_next_one_gets_the_slot() -> None:
    t = Throttles()
    t.try_acquire("ha", {"a": 1}, 0, 0)
    t.try_acquire("hb", {"b": 1}, 0, 1)
    assert t.try_acquire("w1", {"a": 1, "b": 1}, 9, 2) == Parked("w1", "a")
    assert t.try_acquire("w2", {"a": 1}, 0, 3) == Parked("w2", "a")
    (handoff,) = t.release("ha")
    # w1 (first in line) still lacks b: it moves to b's queue holding nothing; w2 runs
    assert handoff.job_id == "w2"
    assert t.parked_on("w1") == "b"
    assert t.holds("w1") is None
    assert t.in_use("a") == 1
    # when a and b are both free again w1 runs
    assert t.release("hb") == []  # w1 tried, a is full: moves back to a
    assert t.parked_on("w1") == "a"
    (handoff,) = t.release("w2")
    assert handoff.job_id == "w1"
    assert t.holds("w1") == ("a", "b")
    assert t.statistics().moves == 2


def test_each_waiter_is_tried_at_most_once_per_release() -> None:
    t = Throttles()
    t.try_acquire("h", {"a": 1, "b": 1}, 0, 0)
    t.try_acquire("hc", {"c": 1}, 0, 1)
    for i in range(20):  # all need c too, which stays full
        t.try_acquire(f"w{i}", {"a": 1, "b": 1, "c": 1}, 0, 2 + i)
    assert len(t.waiters("a")) == 20
    assert t.release("h") == []
    stats = t.statistics()
    assert stats.moves == 20  # each moved exactly once: a -> c, and b had nobody
    assert len(t.waiters("c")) == 20
    assert t.in_use("a") == t.in_use("b") == 0


def test_raising_a_limit_hands_off_to_waiters_before_the_arrival() -> None:
    t = Throttles()
    t.try_acquire("h", {"k": 1}, 0, 0)
    t.try_acquire("w1", {"k": 1}, 0, 1)
    t.try_acquire("w2", {"k": 1}, 0, 2)
    result = t.try_acquire("new", {"k": 3}, 9, 3)
    assert t.limit("k") == 3
    assert isinstance(result, Parked)  # w1 and w2 came first and took the new room
    assert [h.job_id for h in result.handoffs] == ["w1", "w2"]
    assert t.in_use("k") == 3
    assert t.waiters("k") == ("new",)


def test_lowering_a_limit_preempts_nobody_and_admits_nobody_until_below_it() -> None:
    t = Throttles()
    for i in range(3):
        t.try_acquire(f"h{i}", {"k": 3}, 0, i)
    assert t.try_acquire("w", {"k": 1}, 0, 3) == Parked("w", "k")
    assert t.in_use("k") == 3  # above the new limit: nobody preempted
    assert t.release("h0") == []
    assert t.release("h1") == []  # in_use 1, not below 1
    (handoff,) = t.release("h2")
    assert handoff.job_id == "w"


def test_a_zero_limit_pauses_a_key_until_it_is_raised() -> None:
    t = Throttles()
    assert t.try_acquire("w", {"k": 0}, 0, 0) == Parked("w", "k")
    raised = t.try_acquire("x", {"k": 2}, 0, 1)
    assert isinstance(raised, Acquired)
    assert [h.job_id for h in raised.handoffs] == ["w"]


def test_tokens_fence_a_late_release_after_reclaim() -> None:
    t = Throttles()
    first = t.try_acquire("j", {"k": 1}, 0, 0)
    assert isinstance(first, Acquired)
    assert t.try_acquire("w", {"k": 1}, 0, 1) == Parked("w", "k")
    (handoff,) = t.forget("j")  # reclaimed: its slot goes to w
    assert handoff.job_id == "w"
    assert t.forget("j") == []  # idempotent
    assert t.release("j") == []  # a duplicate release frees nothing
    assert t.in_use("k") == 1
    t.release("w")
    again = t.try_acquire("j", {"k": 1}, 0, 0)  # the retried run
    assert isinstance(again, Acquired)
    assert again.token > handoff.token > first.token
    assert t.release("j", first.token) == []  # the first run's late release: no-op
    assert t.holds("j") == ("k",)
    assert t.release("j", again.token) == []
    assert t.holds("j") is None


def test_forget_and_cancel_remove_a_waiter() -> None:
    t = Throttles()
    t.try_acquire("h", {"k": 1}, 0, 0)
    t.try_acquire("w1", {"k": 1, "m": 5}, 0, 1)
    t.try_acquire("w2", {"k": 1}, 0, 2)
    assert t.cancel_waiter("w1") is True
    assert t.cancel_waiter("w1") is False
    assert t.limit("m") is None  # nobody names m any more
    assert t.forget("w2") == []
    assert t.waiters("k") == ()
    assert t.release("h") == []
    stats = t.statistics()
    assert (stats.acquired, stats.parked, stats.cancelled, stats.released) == (1, 2, 2, 1)


def test_bad_calls_are_refused_without_changing_anything() -> None:
    t = Throttles()
    t.try_acquire("j", {"k": 1}, 0, 0)
    before = t.statistics()
    with pytest.raises(ValueError, match="already"):
        t.try_acquire("j", {"k": 5}, 0, 1)
    with pytest.raises(ValueError, match="limit"):
        t.try_acquire("x", {"k": -1}, 0, 1)
    with pytest.raises(ValueError, match="seq"):
        t.try_acquire("x", {"k": 1}, 0, -1)
    assert t.statistics() == before


def test_a_job_with_no_keys_is_admitted_at_once() -> None:
    t = Throttles()
    assert t.try_acquire("j", {}, 0, 0) == Acquired("j", 1, ())
    assert t.release("j") == []


# -- throttles: state machine -----------------------------------------------------------

JOBS = tuple(f"j{i}" for i in range(8))
KEYS = ("a", "b", "c", "d")
key_limits = st.dictionaries(st.sampled_from(KEYS), st.integers(1, 2), min_size=1, max_size=3)


class ThrottleMachine(RuleBasedStateMachine):
    """Random acquire / release / forget / cancel, checked against a brute-force oracle."""

    fixed: ClassVar[dict[str, int] | None] = None  # a subclass pins the limits

    def __init__(self) -> None:
        super().__init__()
        self.t = Throttles()
        self.status = dict.fromkeys(JOBS, "idle")
        self.order: dict[str, tuple[int, int, str]] = {}  # job -> (-priority, seq, id)
        self.old_token: dict[str, int] = {}
        self.last_token = 0
        self.seq = 0
        self.prev_in_use: dict[str, int] = {}

    # helpers

    def _admitted(
        self, handoffs: tuple[Handoff, ...] | list[Handoff], before: dict[str, tuple[str, ...]]
    ) -> None:
        for h in handoffs:
            assert self.status[h.job_id] == "parked"
            assert h.key in h.keys
            self._token(h.token)
            self.status[h.job_id] = "holding"
            # nobody ahead of it in the freed key's queue is still waiting there
            queue = before[h.key]
            for ahead in queue[: queue.index(h.job_id)]:
                assert self.t.parked_on(ahead) != h.key

    def _token(self, token: int) -> None:
        assert token > self.last_token
        self.last_token = token

    def _queues(self) -> dict[str, tuple[str, ...]]:
        return {k: self.t.waiters(k) for k in KEYS}

    def _jobs(self, *statuses: str) -> list[str]:
        return [j for j in JOBS if self.status[j] in statuses]

    # rules

    @precondition(lambda self: self._jobs("idle"))
    @rule(data=st.data(), keys=key_limits, priority=st.integers(0, 2))
    def acquire(self, data: st.DataObject, keys: dict[str, int], priority: int) -> None:
        job = data.draw(st.sampled_from(self._jobs("idle")))
        if self.fixed is not None:
            keys = {k: self.fixed[k] for k in keys}
        self.seq += 1
        before = self._queues()
        result = self.t.try_acquire(job, keys, priority, self.seq)
        self._admitted(result.handoffs, before)
        if isinstance(result, Acquired):
            assert result.keys == tuple(sorted(keys))
            self._token(result.token)
            self.status[job] = "holding"
            # no barging: an arrival takes no key that anyone waits on
            assert all(self.t.waiters(k) == () for k in keys)
        else:
            full = [k for k in sorted(keys) if self.t.in_use(k) >= keys[k]]
            assert result.key == full[0]
            self.status[job] = "parked"
            self.order[job] = (-priority, self.seq, job)

    @precondition(lambda self: self._jobs("holding"))
    @rule(data=st.data(), with_token=st.booleans())
    def release(self, data: st.DataObject, with_token: bool) -> None:
        job = data.draw(st.sampled_from(self._jobs("holding")))
        before = self._queues()
        token = self.t.token(job)
        assert token is not None
        handoffs = self.t.release(job, token if with_token else None)
        self.status[job] = "idle"
        self.old_token[job] = token
        self._admitted(handoffs, before)

    @precondition(lambda self: self._jobs("holding", "parked"))
    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(self._jobs("holding", "parked")))
        before = self._queues()
        token = self.t.token(job)
        handoffs = self.t.forget(job)
        if self.status[job] == "holding":
            assert token is not None
            self.old_token[job] = token
            self._admitted(handoffs, before)
        else:
            assert handoffs == []
        self.status[job] = "idle"
        stats = self.t.statistics()
        assert self.t.forget(job) == []  # a second reclaim is a no-op
        assert self.t.statistics() == stats

    @precondition(lambda self: self._jobs("parked"))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(self._jobs("parked")))
        assert self.t.cancel_waiter(job) is True
        self.status[job] = "idle"

    @rule(job=st.sampled_from(JOBS))
    def no_ops(self, job: str) -> None:
        """Calls that must change nothing: double acquire, stray and late releases."""
        stats = self.t.statistics()
        if self.status[job] != "idle":
            with pytest.raises(ValueError, match="already"):
                self.t.try_acquire(job, {"a": 3}, 0, self.seq + 1)
        if self.status[job] != "parked":
            assert self.t.cancel_waiter(job) is False
        if self.status[job] != "holding":
            assert self.t.release(job) == []  # double release
        old = self.old_token.get(job)
        if old is not None:
            assert self.t.release(job, old) == []  # a fenced late release
        assert self.t.statistics() == stats

    def release_everything(self) -> None:
        """No starvation: releasing every holder, round after round, runs every waiter."""
        for _ in range(len(JOBS) + 1):
            holders = self._jobs("holding")
            if not holders:
                break
            for job in holders:
                before = self._queues()
                self.status[job] = "idle"
                self._admitted(self.t.release(job), before)
        assert all(s == "idle" for s in self.status.values())
        assert self.t.statistics().keys == ()

    # invariants

    @invariant()
    def consistent(self) -> None:
        t = self.t
        holding = {j: t.holds(j) for j in JOBS if self.status[j] == "holding"}
        for job in JOBS:
            # hold or wait, never both
            assert (t.holds(job) is not None) == (self.status[job] == "holding")
            assert (t.parked_on(job) is not None) == (self.status[job] == "parked")
        stats = t.statistics()
        named = {k for keys in holding.values() for k in keys or ()}
        named |= {k for j in JOBS if self.status[j] == "parked" for k in t.wants(j) or ()}
        assert {s.key for s in stats.keys} == named  # idle keys are forgotten
        for s in stats.keys:
            assert s.in_use == sum(s.key in (keys or ()) for keys in holding.values())
            assert s.waiters == len(t.waiters(s.key))
        for key in KEYS:
            in_use, limit, queue = t.in_use(key), t.limit(key), t.waiters(key)
            # never over-admission: in_use rises above the limit in force only if it
            # was already there (a lowered limit), and then it does not grow
            assert in_use <= max(limit or 0, self.prev_in_use.get(key, 0))
            if self.fixed is not None:
                assert in_use <= self.fixed[key]
            # waiters in priority order, FIFO within a priority
            assert list(queue) == [o[2] for o in sorted(self.order[j] for j in queue)]
            assert all(t.parked_on(j) == key for j in queue)
            # work conservation: a key with waiters is full
            if queue:
                assert limit is not None
                assert in_use >= limit
        # brute force: no waiter could take all its keys now
        for job in JOBS:
            wants = t.wants(job)
            if wants is not None:
                assert any(t.in_use(k) >= (t.limit(k) or 0) for k in wants)
        self.prev_in_use = {k: t.in_use(k) for k in KEYS}

    def teardown(self) -> None:
        self.release_everything()


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
