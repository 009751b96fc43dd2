"""Refusals ignored (``fairlane.gateway.holds``): a flow refused again before its last
Retry-After has run out is held (half to all of the longest hold, spread); a flow that
waited as told, or another flow, is answered at once. Pure: the clock and the draw
passed in."""

from __future__ import annotations

import pytest

from fairlane.gateway import holds
from fairlane.gateway.holds import Holds


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_refusal_ignored_is_held() -> None:
    clock = Clock()
    kept = Holds(longest=1.0, clock=clock, draw=lambda: 1.0)
    assert kept.hold_for("a", 2.0) == 0.0  # the first refusal: at once
    clock.now += 0.5
    assert kept.hold_for("a", 0.01) == 1.0  # came back 1.5 s early
    assert kept.hold_for("b", 2.0) == 0.0  # another flow is not held for a's
    clock.now += 2.0  # a waited (past the 2.5 s its first refusal set)
    assert kept.hold_for("a", 0.01) == 0.0
    # a Retry-After of milliseconds is not a hold of milliseconds
    clock.now += 0.001
    assert kept.hold_for("a", 0.01) == 1.0
    assert Holds(longest=0.0, clock=clock).hold_for("a", 30.0) == 0.0


def test_holds_are_spread_over_the_second_half_of_the_longest() -> None:
    draws = iter([0.0, 0.5])
    kept = Holds(longest=4.0, clock=Clock(), draw=lambda: next(draws))
    kept.hold_for("a", 10.0)
    assert kept.hold_for("a", 10.0) == 2.0
    assert kept.hold_for("a", 10.0) == 3.0


def test_past_the_most_held_answers_go_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(holds, "MAX_HELD", 2)
    kept = Holds(longest=1.0, clock=Clock())
    kept.hold_for("a", 5.0)
    kept.held = 2  # two answers asleep
    assert kept.hold_for("a", 5.0) == 0.0


def test_flows_whose_retry_after_ran_out_are_forgotten_as_the_map_grows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(holds, "_PRUNE_AT", 3)
    clock = Clock()
    kept = Holds(longest=1.0, clock=clock, draw=lambda: 1.0)
    kept.hold_for("a", 1.0)
    kept.hold_for("b", 1.0)
    kept.hold_for("c", 10.0)
    clock.now += 2.0
    kept.hold_for("d", 1.0)
    assert kept.hold_for("c", 1.0) == 1.0  # c's Retry-After is still kept: held
    assert set(kept._until) == {"c", "d"}
