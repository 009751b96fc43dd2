"""The store's memory mark (``fairlane.policy.admission.memory``). Pure.

When a new job is refused ``store_full`` (the memory used, plus what is reckoned on
its way, at or above the mark of ``maxmemory``; never without a limit or with the
mark off), when a client reads the server's memory again (by the clock, sooner once
what it stored since may have reached the mark, never with the mark off, seldom
without a limit) and the Retry-After it tells (growing from the mark to the limit,
jittered, within its bounds).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairlane.policy.admission import (
    DEFAULT_MEMORY_MARK,
    STORE_FULL,
    MemoryReading,
    RetryAfterPolicy,
    check_mark,
    reading_due,
    store_full,
    store_full_retry_after,
)
from fairlane.policy.admission.memory import READ_EVERY, UNLIMITED_READ_EVERY, depth

MB = 1 << 20


def test_the_default_mark_is_nine_tenths_of_maxmemory() -> None:
    assert DEFAULT_MEMORY_MARK == 0.9
    assert STORE_FULL == "store_full"


def test_a_server_is_full_at_the_mark_and_above_not_below() -> None:
    assert not store_full(MemoryReading(89 * MB, 100 * MB), 0.9)
    assert store_full(MemoryReading(90 * MB, 100 * MB), 0.9)
    assert store_full(MemoryReading(120 * MB, 100 * MB), 0.9)  # pushed past the limit


def test_what_is_on_its_way_counts_with_the_reading() -> None:
    reading = MemoryReading(85 * MB, 100 * MB)
    assert not store_full(reading, 0.9, pending=4 * MB)
    assert store_full(reading, 0.9, pending=5 * MB)


def test_no_limit_or_no_mark_is_never_full() -> None:
    assert not store_full(MemoryReading(10**12, 0), 0.9)
    assert not store_full(MemoryReading(200 * MB, 100 * MB), None)


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.01, float("nan"), float("inf")])
def test_a_mark_outside_zero_to_one_is_refused(bad: float) -> None:
    with pytest.raises(ValueError):
        check_mark(bad)


def test_a_mark_may_be_the_limit_itself_or_off() -> None:
    assert check_mark(1.0) == 1.0
    assert check_mark(None) is None
    assert store_full(MemoryReading(100 * MB, 100 * MB), 1.0)


def test_a_reading_is_taken_first_and_then_by_the_clock() -> None:
    reading = MemoryReading(10 * MB, 100 * MB)
    assert reading_due(None, 0.9, 0.0, 0)
    assert not reading_due(reading, 0.9, READ_EVERY * 0.99, 0)
    assert reading_due(reading, 0.9, READ_EVERY, 0)


def test_a_server_without_a_limit_is_read_seldom_so_that_a_limit_set_later_is_seen() -> None:
    unlimited = MemoryReading(10 * MB, 0)
    assert not reading_due(unlimited, 0.9, READ_EVERY * 10, 10**9)
    assert reading_due(unlimited, 0.9, UNLIMITED_READ_EVERY, 0)


def test_the_mark_off_never_reads() -> None:
    assert not reading_due(None, None, 10**6, 10**9)


def test_a_client_reads_again_as_soon_as_what_it_stored_may_have_reached_the_mark() -> None:
    reading = MemoryReading(80 * MB, 100 * MB)
    assert not reading_due(reading, 0.9, 0.0, 10 * MB - 1)
    assert reading_due(reading, 0.9, 0.0, 10 * MB)


def test_a_full_server_is_read_again_by_the_clock_alone() -> None:
    # its refusals send nothing: the reckoning does not grow, nor do the readings
    full = MemoryReading(95 * MB, 100 * MB)
    assert not reading_due(full, 0.9, READ_EVERY / 2, 0)
    assert reading_due(full, 0.9, READ_EVERY, 0)


def test_depth_runs_from_the_mark_to_the_limit() -> None:
    assert depth(MemoryReading(90 * MB, 100 * MB), 0.9) == 0.0
    assert depth(MemoryReading(95 * MB, 100 * MB), 0.9) == pytest.approx(0.5)
    assert depth(MemoryReading(100 * MB, 100 * MB), 0.9) == 1.0
    assert depth(MemoryReading(300 * MB, 100 * MB), 0.9) == 1.0
    assert depth(MemoryReading(100 * MB, 100 * MB), 1.0) == 1.0


def test_retry_after_grows_from_base_at_the_mark_to_four_times_at_the_limit() -> None:
    policy = RetryAfterPolicy(base_seconds=2.0, max_seconds=120.0)
    middle = 0.5  # u = 0.5 is the unjittered value
    assert store_full_retry_after(0.0, middle, policy) == pytest.approx(2.0)
    assert store_full_retry_after(0.5, middle, policy) == pytest.approx(5.0)
    assert store_full_retry_after(1.0, middle, policy) == pytest.approx(8.0)


@given(
    deep=st.floats(0.0, 1.0),
    u=st.floats(0.0, 1.0, exclude_max=True),
    base=st.floats(0.0, 50.0),
    cap=st.floats(1.0, 500.0),
)
def test_retry_after_is_jittered_by_thirty_percent_within_its_bounds(
    deep: float, u: float, base: float, cap: float
) -> None:
    policy = RetryAfterPolicy(base_seconds=base, max_seconds=cap)
    wait = store_full_retry_after(deep, u, policy)
    assert 1.0 <= wait <= cap
    raw = base * (1 + 3 * deep)
    assert wait == pytest.approx(min(cap, max(1.0, raw * (0.7 + 0.6 * u))))


@pytest.mark.parametrize(("deep", "u"), [(-0.1, 0.5), (1.1, 0.5), (0.5, 1.0), (0.5, -0.1)])
def test_retry_after_refuses_a_depth_or_draw_out_of_range(deep: float, u: float) -> None:
    with pytest.raises(ValueError):
        store_full_retry_after(deep, u, RetryAfterPolicy())
