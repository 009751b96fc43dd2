"""Retention specs: durations, counts and their encoded form (fairlane.policy.retention)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairlane.policy.retention import (
    DEFAULT_COMPLETED,
    DEFAULT_FAILED,
    Keep,
    Retention,
    parse_duration,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("7d", 7 * 86400.0),
        ("2w", 14 * 86400.0),
        ("12h", 43200.0),
        ("15m", 900.0),
        ("90s", 90.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        ("42", 42.0),
        (" 3 d ", 3 * 86400.0),
        ("0s", 0.0),
    ],
)
def test_parse_duration_strings(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


def test_parse_duration_numbers_and_timedeltas() -> None:
    assert parse_duration(30) == 30.0
    assert parse_duration(1.5) == 1.5
    assert parse_duration(timedelta(minutes=2)) == 120.0


@pytest.mark.parametrize("bad", ["", "soon", "7x", "-1s", "1d2h", "d7", "1,5s", "7 days", "1e3s"])
def test_parse_duration_refuses_bad_strings(bad: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


@pytest.mark.parametrize("bad", [-1, -0.5, timedelta(seconds=-1)])
def test_parse_duration_refuses_negative_values(bad: float | timedelta) -> None:
    with pytest.raises(ValueError, match="negative"):
        parse_duration(bad)


@pytest.mark.parametrize(
    ("spec", "keep", "encoded"),
    [
        (1000, Keep(1000, None), "1000,-1"),
        (0, Keep(0, None), "0,-1"),
        ("7d", Keep(None, 604800.0), "-1,604800000"),
        ("1s", Keep(None, 1.0), "-1,1000"),
        ((100, "1h"), Keep(100, 3600.0), "100,3600000"),
        ((100, None), Keep(100, None), "100,-1"),
        ((None, "30m"), Keep(None, 1800.0), "-1,1800000"),
        (timedelta(hours=2), Keep(None, 7200.0), "-1,7200000"),
        (None, Keep(None, None), "-1,-1"),
    ],
)
def test_keep_specs(spec: object, keep: Keep, encoded: str) -> None:
    parsed = Keep.of(spec)  # type: ignore[arg-type]
    assert parsed == keep
    assert parsed.encode() == encoded
    assert Keep.of(parsed) is parsed


@pytest.mark.parametrize("bad", ["forever", "10 records", (10, "later")])
def test_bad_keep_specs_raise_value_error(bad: object) -> None:
    with pytest.raises(ValueError):
        Keep.of(bad)  # type: ignore[arg-type]


def test_negative_count_and_bool_are_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        Keep.of(-1)
    with pytest.raises(ValueError, match=">= 0"):
        Keep.of((-5, "1h"))
    with pytest.raises(TypeError):
        Keep.of(True)


def test_defaults_bound_both_count_and_age() -> None:
    r = Retention()
    assert r.completed == Keep.of(DEFAULT_COMPLETED) == Keep(200_000, 3600.0)
    assert r.failed == Keep.of(DEFAULT_FAILED) == Keep(10000, 7 * 86400.0)
    assert r.completed.count is not None and r.completed.age is not None
    assert r.failed.count is not None and r.failed.age is not None


def test_retention_none_is_unbounded_only_when_asked() -> None:
    r = Retention(completed=None, failed=50)
    assert r.completed.encode() == "-1,-1"
    assert r.failed.encode() == "50,-1"
    assert r.completed.describe() == "forever"
    assert "last 50" in repr(r)


def test_retention_equality_and_hash() -> None:
    assert Retention(100, "1h") == Retention(Keep(100, None), Keep(None, 3600.0))
    assert hash(Retention(100, "1h")) == hash(Retention(100, 3600.0))
    assert Retention(100) != Retention(101)
    assert Retention() != "Retention()"


def test_bad_retention_strings_raise_at_declaration() -> None:
    with pytest.raises(ValueError):
        Retention(completed="a week")
    with pytest.raises(ValueError):
        Retention(failed=(10, "-1h"))


@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=0, max_value=10**6))
def test_encoded_spec_is_count_and_milliseconds(count: int, seconds: int) -> None:
    keep = Keep.of((count, f"{seconds}s"))
    assert keep.encode() == f"{count},{seconds * 1000}"
    n, age_ms = keep.encode().split(",")
    assert int(n) == count and int(age_ms) == seconds * 1000
