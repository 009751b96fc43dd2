"""Backoff formulas and the retry decision (fairlane.policy.backoff, fairlane.policy.retry)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairlane.policy.backoff import Backoff
from fairlane.policy.retry import RetryDecision, after_failure

bases = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
caps = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False)
jitters = st.sampled_from(["full", "equal", "none"])
attempts = st.integers(min_value=1, max_value=10_000)
draws = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


def test_raw_doubles_from_base_until_the_cap() -> None:
    b = Backoff(base=0.5, cap=10.0, jitter="none")
    assert [b.raw(n) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_no_jitter_is_exactly_the_raw_delay() -> None:
    b = Backoff(base=2.0, cap=100.0, jitter="none")
    for u in (0.0, 0.3, 0.999):
        assert b.delay(1, u) == 2.0
        assert b.delay(3, u) == 8.0


def test_full_jitter_scales_the_raw_delay_by_the_draw() -> None:
    b = Backoff(base=2.0, cap=100.0, jitter="full")
    assert b.delay(3, 0.0) == 0.0
    assert b.delay(3, 0.25) == pytest.approx(2.0)
    assert b.delay(3, 0.5) == pytest.approx(4.0)


def test_equal_jitter_is_never_below_half_the_raw_delay() -> None:
    b = Backoff(base=2.0, cap=100.0, jitter="equal")
    assert b.delay(3, 0.0) == pytest.approx(4.0)
    assert b.delay(3, 0.5) == pytest.approx(6.0)
    assert b.delay(3, 0.999) == pytest.approx(7.996)


def test_attempts_below_one_count_as_the_first() -> None:
    b = Backoff(base=3.0, cap=100.0, jitter="none")
    assert b.raw(0) == b.raw(-5) == b.raw(1) == 3.0


def test_huge_attempt_numbers_stay_finite_and_capped() -> None:
    b = Backoff(base=1.0, cap=60.0, jitter="none")
    assert b.raw(10**9) == 60.0
    assert math.isfinite(Backoff(base=1.0, cap=1e300).raw(10**9))


@pytest.mark.parametrize(
    "kwargs",
    [{"base": -1.0}, {"cap": -0.5}, {"jitter": "random"}, {"jitter": ""}],
)
def test_invalid_backoff_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"backoff|jitter"):
        Backoff(**kwargs)  # type: ignore[arg-type]


@given(bases, caps, jitters, attempts, draws)
def test_delay_lies_within_the_jitter_band(
    base: float, cap: float, jitter: str, attempt: int, u: float
) -> None:
    b = Backoff(base, cap, jitter)  # type: ignore[arg-type]
    raw = b.raw(attempt)
    d = b.delay(attempt, u)
    assert 0.0 <= raw <= cap
    low = {"full": 0.0, "equal": raw / 2, "none": raw}[jitter]
    assert low - 1e-9 * max(1.0, raw) <= d <= raw + 1e-9 * max(1.0, raw)


@given(bases, caps, attempts)
def test_raw_delay_never_decreases(base: float, cap: float, attempt: int) -> None:
    b = Backoff(base, cap, "none")
    assert b.raw(attempt + 1) >= b.raw(attempt)


@given(bases, caps, jitters)
def test_encode_decode_round_trip(base: float, cap: float, jitter: str) -> None:
    b = Backoff(base, cap, jitter)  # type: ignore[arg-type]
    text = b.encode()
    assert text.count(",") == 2
    assert Backoff.decode(text) == b


def test_encoded_form_is_what_the_lua_library_parses() -> None:
    assert Backoff(1.5, 30.0, "equal").encode() == "1.5,30.0,equal"


@pytest.mark.parametrize("text", ["1.0,2.0,sometimes", "1.0,2.0", "x,2.0,full", "1,2,full,3"])
def test_decoding_a_bad_stored_backoff_raises(text: str) -> None:
    with pytest.raises(ValueError):
        Backoff.decode(text)


# -- fairlane.policy.retry.after_failure ----------------------------------------------------------


def test_retry_while_attempts_remain_with_the_backoff_delay() -> None:
    b = Backoff(base=1.0, cap=60.0, jitter="none")
    assert after_failure(1, 3, retryable=True, backoff=b, u=0.5) == RetryDecision("retry", 1.0)
    assert after_failure(2, 3, retryable=True, backoff=b, u=0.5) == RetryDecision("retry", 2.0)


def test_dead_when_the_budget_is_spent() -> None:
    b = Backoff()
    assert after_failure(3, 3, retryable=True, backoff=b, u=0.5).kind == "dead"
    # a reclaim may push the attempt count past the budget: still dead, never a retry
    assert after_failure(7, 3, retryable=True, backoff=b, u=0.5).kind == "dead"
    assert after_failure(1, 1, retryable=True, backoff=b, u=0.5).kind == "dead"


def test_not_retryable_is_dead_even_with_attempts_left() -> None:
    assert after_failure(1, 10, retryable=False, backoff=Backoff(), u=0.1) == RetryDecision("dead")


@given(
    attempts, st.integers(min_value=1, max_value=10_000), st.booleans(), bases, caps, jitters, draws
)
def test_after_failure_agrees_with_the_budget_and_backoff(  # noqa: PLR0917
    attempt: int,
    max_attempts: int,
    retryable: bool,
    base: float,
    cap: float,
    jitter: str,
    u: float,
) -> None:
    b = Backoff(base, cap, jitter)  # type: ignore[arg-type]
    decision = after_failure(attempt, max_attempts, retryable=retryable, backoff=b, u=u)
    if retryable and attempt < max_attempts:
        assert decision == RetryDecision("retry", b.delay(attempt, u))
        assert 0.0 <= decision.delay <= cap
    else:
        assert decision == RetryDecision("dead", 0.0)
