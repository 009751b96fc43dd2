"""The backpressure policy (fairlane.policy.backpressure): caps, hysteresis, recovery."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairlane.policy.backpressure import (
    Bounds,
    PressureState,
    Reading,
    allowance,
    decide,
    reading_cap,
)

BOUNDS = Bounds(min_fraction=0.25, max_fraction=1.0, recovery=0.5, resume_band=0.5)

values = st.floats(min_value=0.0, max_value=2.0, allow_nan=False)
fractions = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
concurrencies = st.integers(min_value=1, max_value=500)
times = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
steps = st.floats(min_value=0.0, max_value=30.0, allow_nan=False)


@st.composite
def bounds(draw: st.DrawFn) -> Bounds:
    low = draw(st.floats(min_value=0.0, max_value=1.0))
    high = draw(st.floats(min_value=max(low, 0.01), max_value=1.0))
    return Bounds(
        min_fraction=low,
        max_fraction=high,
        recovery=draw(st.floats(min_value=0.01, max_value=10.0)),
        resume_band=draw(fractions),
    )


@st.composite
def states(draw: st.DrawFn) -> PressureState:
    if draw(st.booleans()):
        return PressureState()
    stopped = draw(st.frozensets(st.sampled_from(["memory", "other"])))
    return PressureState(fraction=draw(fractions), at=draw(times), stopped=stopped)


def memory(value: float, soft: float = 0.8, hard: float = 0.9) -> Reading:
    return Reading("memory", value, soft, hard, stop=True)


def cpu(value: float) -> Reading:
    return Reading("cpu", value, 0.9, 1.0)


def test_below_soft_nothing_is_held_back() -> None:
    d = decide([memory(0.5), cpu(0.2), Reading("info", 123.0)], PressureState(), BOUNDS, 0.0)
    assert (d.fraction, d.holding, d.limiting) == (1.0, False, None)
    assert allowance(d, 10, 3) == 7


def test_between_soft_and_hard_the_cap_falls_linearly() -> None:
    assert reading_cap(memory(0.85), BOUNDS) == pytest.approx(0.625)
    d = decide([memory(0.85)], PressureState(), BOUNDS, 0.0)
    assert d.target(40) == 25
    assert allowance(d, 40, 20) == 5
    assert allowance(d, 40, 30) == 0
    assert d.limiting == "memory" and not d.holding


def test_at_the_hard_limit_a_stopping_reading_holds_and_another_shrinks_to_the_floor() -> None:
    d = decide([memory(0.9)], PressureState(), BOUNDS, 0.0)
    assert d.holding and d.stopped == ("memory",) and allowance(d, 10, 0) == 0
    d = decide([cpu(1.0)], PressureState(), BOUNDS, 0.0)
    assert not d.holding and d.fraction == 0.25 and allowance(d, 10, 0) == 2


def test_a_holding_worker_resumes_only_below_the_resume_point() -> None:
    held = decide([memory(0.95)], PressureState(), BOUNDS, 0.0)
    # 0.87 is below hard but above the resume point (0.85): still holding
    still = decide([memory(0.87)], held.state, BOUNDS, 1.0)
    assert still.holding
    freed = decide([memory(0.84)], still.state, BOUNDS, 2.0)
    assert not freed.holding
    # and it climbs back gradually from nothing: 0.5 per second
    assert freed.fraction == pytest.approx(0.5)
    assert allowance(freed, 10, 0) == 5


def test_tightening_is_immediate_and_loosening_is_rate_limited() -> None:
    d = decide([cpu(0.2)], PressureState(), BOUNDS, 0.0)
    d = decide([cpu(1.0)], d.state, BOUNDS, 0.1)
    assert d.fraction == 0.25
    d = decide([cpu(0.2)], d.state, BOUNDS, 0.6)
    assert d.fraction == pytest.approx(0.5)
    d = decide([cpu(0.2)], d.state, BOUNDS, 10.0)
    assert d.fraction == 1.0


def test_a_shrunk_worker_keeps_at_least_one_slot() -> None:
    d = decide([cpu(1.0)], PressureState(), Bounds(min_fraction=0.0), 0.0)
    assert d.target(3) == 1 and allowance(d, 3, 0) == 1


def test_readings_and_bounds_are_validated() -> None:
    with pytest.raises(ValueError, match="both soft and hard"):
        Reading("x", 1.0, soft=0.5)
    with pytest.raises(ValueError, match="below hard"):
        Reading("x", 1.0, soft=0.9, hard=0.9)
    with pytest.raises(ValueError, match="NaN"):
        Reading("x", float("nan"))
    with pytest.raises(ValueError, match="min_fraction"):
        Bounds(min_fraction=0.8, max_fraction=0.5)
    with pytest.raises(ValueError, match="recovery"):
        Bounds(recovery=0)


@given(
    mem=values,
    c=values,
    state=states(),
    b=bounds(),
    now=times,
    concurrency=concurrencies,
    used=st.integers(min_value=0, max_value=600),
)
def test_allowance_is_never_above_the_free_slots(
    *,
    mem: float,
    c: float,
    state: PressureState,
    b: Bounds,
    now: float,
    concurrency: int,
    used: int,
) -> None:
    d = decide([memory(mem), cpu(c)], state, b, now)
    room = allowance(d, concurrency, used)
    assert 0 <= room <= max(0, concurrency - used)
    assert 0.0 <= d.fraction <= b.max_fraction


@given(
    mem=st.floats(min_value=0.9, max_value=10.0), c=values, state=states(), b=bounds(), now=times
)
def test_at_or_over_the_hard_limit_nothing_new_is_taken(
    mem: float, c: float, state: PressureState, b: Bounds, now: float
) -> None:
    d = decide([memory(mem), cpu(c)], state, b, now)
    assert d.holding
    assert all(allowance(d, n, 0) == 0 for n in (1, 7, 100))


@given(low=values, high=values, c=values, state=states(), b=bounds(), now=times)
def test_more_pressure_never_allows_more(
    *, low: float, high: float, c: float, state: PressureState, b: Bounds, now: float
) -> None:
    low, high = min(low, high), max(low, high)
    calm = decide([memory(low), cpu(c)], state, b, now)
    tight = decide([memory(high), cpu(c)], state, b, now)
    assert tight.fraction <= calm.fraction
    assert set(calm.stopped) <= set(tight.stopped)
    for concurrency in (1, 10, 64):
        assert allowance(tight, concurrency, 0) <= allowance(calm, concurrency, 0)
    calm_cpu = decide([memory(0.0), cpu(low)], state, b, now)
    tight_cpu = decide([memory(0.0), cpu(high)], state, b, now)
    assert tight_cpu.fraction <= calm_cpu.fraction


@given(mem=values, c=values, state=states(), b=bounds(), now=times, pause=steps)
def test_it_recovers_fully_once_pressure_drops(
    *, mem: float, c: float, state: PressureState, b: Bounds, now: float, pause: float
) -> None:
    d = decide([memory(mem), cpu(c)], state, b, now)
    calm = [memory(0.1), cpu(0.1)]
    # the first calm reading clears any hold; from zero, 1 / recovery seconds restore it all
    d = decide(calm, d.state, b, now + pause)
    assert not d.holding
    d = decide(calm, d.state, b, now + pause + 1.0 / b.recovery + 1e-6)
    assert d.fraction == b.max_fraction
    assert allowance(d, 100, 0) == max(1, int(b.max_fraction * 100 + 1e-9))


@given(mem=values, state=states(), b=bounds(), now=times, later=steps)
def test_recovery_is_never_faster_than_the_rate(
    mem: float, state: PressureState, b: Bounds, now: float, later: float
) -> None:
    first = decide([memory(mem)], state, b, now)
    second = decide([memory(0.0)], first.state, b, now + later)
    assert second.fraction <= first.fraction + b.recovery * later + 1e-9
