"""The slice budget: when a workflow's slice must give its slot back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairlane.policy.slicing import SliceBudget


@given(
    seconds=st.floats(min_value=0.001, max_value=100),
    steps=st.integers(min_value=1, max_value=50),
    elapsed=st.lists(st.floats(min_value=0, max_value=10), min_size=1, max_size=60),
)
def test_a_slice_yields_at_its_first_exhausted_limit_and_always_progresses(
    seconds: float, steps: int, elapsed: list[float]
) -> None:
    budget = SliceBudget(seconds, steps, started=0.0)
    now = 0.0
    done = 0
    for dt in elapsed:
        now += dt
        if budget.spent(now):
            break
        budget.step_done()
        done += 1
    assert done >= 1  # the first new step of a slice always runs
    assert done <= steps
    if done < len(elapsed):  # it stopped: a limit was reached before the next step
        assert done == steps or now >= seconds


def test_bad_budgets_are_refused() -> None:
    with pytest.raises(ValueError, match="seconds > 0"):
        SliceBudget(0, 5, 0.0)
    with pytest.raises(ValueError, match="steps >= 1"):
        SliceBudget(1.0, 0, 0.0)
