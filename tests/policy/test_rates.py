"""The bucket rules of rate keys (``fairlane.policy.rates``) and their guarantee.

Examples of each rule (level, fit and take, correction, pause, due time, adaptive cut
and growth, bad input), then one million random operations on the rules -- arrivals
of random costs that take when they fit and otherwise wait for their due time,
completions with refunds and debts, pauses, time advancing -- checked incrementally:
in every window of length ``per``, the tokens taken net of the refunds made in it are
at most ``limit + burst``.
"""

from __future__ import annotations

import math
import random
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairlane.policy.rates import (
    ADAPTIVE_CUT,
    Adaptive,
    Bucket,
    Rate,
    adaptive_cut,
    adaptive_grow,
    adaptive_limit,
    correct,
    due_at,
    fits,
    job_cost,
    level,
    pause,
    take,
)

# -- examples ---------------------------------------------------------------------------


def test_a_rate_defaults_its_burst_to_its_limit_and_counts_jobs() -> None:
    r = Rate(10, per=2.0)
    assert (r.limit, r.per, r.capacity, r.per_ms, r.units) == (10.0, 2.0, 10.0, 2000.0, False)
    assert Rate(5, burst=8, cost="units").units
    assert job_cost(r, 40.0) == 1.0
    assert job_cost(Rate(5, cost="units"), 40.0) == 40.0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"limit": 0}, ValueError),
        ({"limit": -1}, ValueError),
        ({"limit": math.inf}, ValueError),
        ({"limit": math.nan}, ValueError),
        ({"limit": True}, TypeError),
        ({"limit": "5"}, TypeError),
        ({"limit": 5, "per": 0}, ValueError),
        ({"limit": 5, "per": 0.0001}, ValueError),
        ({"limit": 5, "per": 400 * 86400.0}, ValueError),
        ({"limit": 5, "burst": 0}, ValueError),
        ({"limit": 5, "burst": math.inf}, ValueError),
        ({"limit": 5, "burst": 0.5}, ValueError),  # a job-counting burst below one job
        ({"limit": 5, "cost": "tokens"}, ValueError),
        ({"limit": 2e15}, ValueError),
    ],
)
def test_bad_rates_are_refused(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        Rate(**kwargs)  # type: ignore[arg-type]


def test_a_units_rate_may_burst_below_one_unit() -> None:
    assert Rate(5, burst=0.5, cost="units").capacity == 0.5


def test_the_level_refills_at_limit_per_period_up_to_the_burst() -> None:
    r = Rate(10, per=1.0, burst=4)
    b = Bucket(0.0, 1000)
    assert level(r, b, 1000) == 0.0
    assert level(r, b, 1100) == pytest.approx(1.0)
    assert level(r, b, 1300) == pytest.approx(3.0)
    assert level(r, b, 9000) == 4.0  # never above the burst
    assert level(r, b, 500) == 0.0  # a clock behind the stamp refills nothing
    assert level(r, Bucket(9.0, 0), 0) == 4.0  # tokens above a lowered burst are capped
    assert level(r, Bucket(-2.0, 0), 100) == pytest.approx(-1.0)  # a debt refills too


def test_a_job_fits_only_unpaused_with_its_cost_and_taking_leaves_the_rest() -> None:
    r = Rate(10, per=1.0, burst=5, cost="units")
    b = Bucket.full(r, 0)
    assert fits(r, b, 5.0, 0)
    assert not fits(r, b, 5.01, 0)
    after = take(r, b, 3.5, 0)
    assert after == Bucket(1.5, 0)
    assert not fits(r, after, 2.0, 0)
    assert fits(r, after, 2.0, 50)  # 0.5 refilled
    assert take(r, after, 2.0, 50) == Bucket(0.0, 50)
    assert not fits(r, pause(b, 10), 1.0, 9)
    assert fits(r, pause(b, 10), 1.0, 10)


def test_a_correction_refunds_up_to_the_burst_or_charges_a_debt() -> None:
    r = Rate(10, per=1.0, burst=5, cost="units")
    b = take(r, Bucket.full(r, 0), 4.0, 0)  # 1 left
    assert correct(r, b, 3.0, 0) == Bucket(4.0, 0)
    assert correct(r, b, 30.0, 0) == Bucket(5.0, 0)  # capped
    debt = correct(r, b, -6.0, 0)
    assert debt == Bucket(-5.0, 0)
    # the debt is paid back by the refill before anything fits, even a free job
    assert not fits(r, debt, 0.0, 499)
    assert fits(r, debt, 0.0, 500)
    assert correct(r, b, 1.0, 100).stamp == 100  # a correction is as of now


def test_a_pause_only_lengthens_and_tokens_refill_through_it() -> None:
    r = Rate(10, per=1.0)
    b = pause(Bucket(0.0, 0), 2000)
    assert pause(b, 1000).paused_until == 2000
    assert pause(b, 3000).paused_until == 3000
    assert level(r, b, 1500) == 10.0
    assert not fits(r, b, 1.0, 1999)
    assert fits(r, b, 1.0, 2000)


def test_the_due_time_is_the_first_ms_the_cost_fits() -> None:
    r = Rate(3, per=1.0, burst=10, cost="units")
    b = Bucket(0.0, 0)
    assert due_at(r, b, 1.0, 0) == 334  # ceil(1000 / 3)
    assert not fits(r, b, 1.0, 333) and fits(r, b, 1.0, 334)
    assert due_at(r, b, 0.0, 0) == 1  # never before the next ms
    assert due_at(r, pause(b, 5000), 1.0, 0) == 5000
    assert due_at(r, Bucket(-2.0, 0), 1.0, 0) == 1000  # the debt first


@settings(max_examples=300, deadline=None)
@given(
    limit=st.floats(0.01, 1e6),
    per=st.floats(0.001, 3600.0),
    burst_share=st.floats(0.01, 1.0),
    tokens_share=st.floats(-2.0, 1.0),
    cost_share=st.floats(0.0, 1.0),
    stamp=st.integers(0, 10**9),
    after=st.integers(0, 10**6),
)
def test_a_job_fits_at_its_due_time_and_not_one_ms_before(
    *,
    limit: float,
    per: float,
    burst_share: float,
    tokens_share: float,
    cost_share: float,
    stamp: int,
    after: int,
) -> None:
    r = Rate(limit, per=per, burst=max(1.0, limit * burst_share * 10), cost="units")
    b = Bucket(r.capacity * tokens_share, stamp)
    now = stamp + after
    cost = r.capacity * cost_share
    if fits(r, b, cost, now):
        return
    due = due_at(r, b, cost, now)
    assert due > now
    # rounding may leave the level a hair short at the due ms: then one more ms does
    assert fits(r, b, cost, due) or fits(r, b, cost, due + 1)
    # and never later than one ms after the first ms that fits (the same rounding)
    assert due <= now + 2 or not fits(r, b, cost, due - 2)


def test_adaptive_values_are_cut_and_grow_within_their_bounds() -> None:
    spec = Adaptive(max=8, min=2)
    assert adaptive_cut(8.0, spec) == 8.0 * ADAPTIVE_CUT
    assert adaptive_cut(3.0, spec) == 2.0  # never below min
    assert adaptive_grow(4.0, spec) == 4.25  # one slot per `value` successes
    assert adaptive_grow(7.9, spec) == 8.0  # never above max
    assert adaptive_limit(4.99) == 4
    value = 8.0
    for _ in range(20):
        value = adaptive_cut(value, spec)
    assert value == 2.0
    successes = 0
    while value < 8.0:
        value = adaptive_grow(value, spec)
        successes += 1
    assert 20 < successes < 40  # additive: about (8^2 - 2^2) / 2


@pytest.mark.parametrize(("high", "low"), [(0, 0), (3, 4), (2**31, 1), (4, 0)])
def test_bad_adaptive_bounds_are_refused(high: int, low: int) -> None:
    with pytest.raises(ValueError):
        Adaptive(max=high, min=low)
    with pytest.raises(TypeError):
        Adaptive(max=4.0, min=1)  # type: ignore[arg-type]


# -- a million random operations ----------------------------------------------------------


class WindowCheck:
    """The largest net take (takes less refunds) over every window of ``per_ms``.

    Events come in time order. Over integer-ms windows ``[a, a + per)`` the net is
    piecewise constant in ``a`` and changes only where an event enters or leaves, so
    the windows that end at an event, ``(t - per, t]``, and those that start just after
    one, ``(t, t + per]``, are all there is to check; both are kept with running sums
    (checked after every event, so events of one ms are checked in part too)."""

    def __init__(self, per_ms: int) -> None:
        self.per = per_ms
        self.total = 0.0
        self.base = 0.0  # total of the events before the window that ends now
        self.recent: deque[tuple[int, float]] = deque()  # (time, total after it)
        self.opened: deque[tuple[int, float]] = deque()  # window start -> total then
        self.worst = 0.0

    def add(self, t: int, net: float) -> None:
        while self.opened and self.opened[0][0] + self.per < t:
            self.worst = max(self.worst, self.total - self.opened.popleft()[1])
        self.total += net
        while self.recent and self.recent[0][0] <= t - self.per:
            self.base = self.recent.popleft()[1]
        self.recent.append((t, self.total))
        self.worst = max(self.worst, self.total - self.base)
        if self.opened and self.opened[-1][0] == t:
            self.opened[-1] = (t, self.total)
        else:
            self.opened.append((t, self.total))

    def close(self) -> float:
        while self.opened:
            self.worst = max(self.worst, self.total - self.opened.popleft()[1])
        return self.worst


def test_window_check_finds_the_worst_window() -> None:
    check = WindowCheck(10)
    for t, net in [(0, 5.0), (5, -4.0), (9, 3.0), (12, 6.0), (30, 1.0)]:
        check.add(t, net)
    # (5, 15]: 3 + 6 beats (2, 12]: -4 + 3 + 6 and [0, 9]: 5 - 4 + 3
    assert check.close() == 9.0


def _million(seed: int, rate: Rate, ops: int) -> tuple[float, int, int]:
    """Random arrivals (FIFO behind the first that does not fit, as a key's waiters
    are), completions, pauses and time on one bucket, in busy and quiet spells (so the
    bucket both runs dry and fills up again); returns the worst window's net take and
    the numbers of takes and debts."""
    rng = random.Random(seed)
    per = int(rate.per_ms)
    check = WindowCheck(per)
    bucket = Bucket.full(rate, 0)
    now = 0
    waiting: deque[float] = deque()
    running: list[float] = []
    takes = debts = 0
    steps = (0, 0, 1, 2, 5, 20, per // 10)
    costs = (0.0, 0.3, 1.0, 1.0, 2.5, rate.capacity * 0.4, rate.capacity)
    busy = 0.5
    for op in range(ops):
        if op % 2000 == 0:
            busy = rng.choice((0.02, 0.3, 0.5, 0.6))
        roll = rng.random()
        if roll < 0.3:
            now += rng.choice(steps)
        elif roll < 0.3 + busy:
            waiting.append(rng.choice(costs) if rate.units else 1.0)
        elif roll < 0.97 and running:
            cost = running.pop(rng.randrange(len(running)))
            if rate.units:
                used = cost * rng.choice((0.0, 0.5, 1.0, 1.0, 1.7, 4.0))
                before = level(rate, bucket, now)
                bucket = correct(rate, bucket, cost - used, now)
                if cost > used:
                    check.add(now, -(bucket.tokens - before))  # what it really gave back
                elif cost < used:
                    debts += 1
        elif roll < 0.975:
            bucket = pause(bucket, now + rng.choice((0, 50, per, 3 * per)))
        elif waiting and not fits(rate, bucket, waiting[0], now):
            # the key is due: at the time its head fits, or a little late
            now = due_at(rate, bucket, waiting[0], now) + rng.choice((0, 0, 1, 7))
        while waiting and fits(rate, bucket, waiting[0], now):
            cost = waiting.popleft()
            bucket = take(rate, bucket, cost, now)
            check.add(now, cost)
            running.append(cost)
            takes += 1
    return check.close(), takes, debts


@pytest.mark.parametrize(
    ("seed", "rate", "ops"),
    [
        (1, Rate(90, per=0.6, burst=40, cost="units"), 400_000),
        (2, Rate(7, per=0.25, burst=3), 300_000),
        (3, Rate(2.5, per=1.0, burst=12.5, cost="units"), 300_000),
    ],
)
def test_a_million_operations_never_admit_more_than_limit_plus_burst_per_window(
    seed: int, rate: Rate, ops: int
) -> None:
    worst, takes, debts = _million(seed, rate, ops)
    bound = rate.limit + rate.capacity
    assert worst <= bound * (1 + 1e-9), (worst, bound)
    # the runs are tight: the worst window comes close to the bound
    assert worst >= 0.8 * bound, (worst, bound)
    assert takes > ops // 50
    assert debts > 0 or not rate.units
