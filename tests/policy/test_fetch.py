"""The fetch decision (fairlane.policy.fetch): room, budget, waits and the step after a reply."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairlane.policy.backpressure import Bounds, Decision, PressureState, Reading, decide
from fairlane.policy.fetch import (
    FetchPlan,
    Next,
    SlotCount,
    Wait,
    accept_handed,
    after_reply,
    budget,
    idle_registration_ms,
    idle_timeout,
    plan_fetch,
    room,
)

BOUNDS = Bounds(min_fraction=0.25, recovery=0.5)


def pressure(memory: float, state: PressureState | None = None) -> Decision:
    """The decision for a memory reading (share of the limit; soft 0.8, hard 0.9)."""
    reading = Reading("memory", memory, 0.8, 0.9, stop=True)
    return decide([reading], state or PressureState(), BOUNDS, now=0.0)


# -- room and budget -----------------------------------------------------------------------


def test_room_without_pressure_is_every_free_slot() -> None:
    assert room(SlotCount(10, used=3, reserved=2), None) == 5
    assert room(SlotCount(10), None) == 10
    # a hand-off wider than what was free leaves the count below zero
    assert room(SlotCount(4, used=5), None) == -1


def test_room_under_pressure_is_the_allowance() -> None:
    calm, squeezed, stopped = pressure(0.5), pressure(0.85), pressure(0.95)
    assert room(SlotCount(8, used=2, reserved=1), calm) == 5
    # halfway between soft and hard: the cap is halfway between 1 and 0.25 of the slots
    assert squeezed.target(8) == 5
    assert room(SlotCount(8, used=2, reserved=1), squeezed) == 2
    assert room(SlotCount(8, used=4, reserved=1), squeezed) == 0
    assert room(SlotCount(8), stopped) == 0


def test_budget_caps_a_busy_ask_at_half_the_slots_and_the_batch() -> None:
    assert budget(10, batch=100, concurrency=10) == 5
    assert budget(3, batch=100, concurrency=10) == 3
    assert budget(10, batch=2, concurrency=10) == 2
    # one slot still gets one
    assert budget(1, batch=100, concurrency=1) == 1
    assert budget(1, batch=100, concurrency=3) == 1


# -- a turn's plan -------------------------------------------------------------------------


def test_a_wide_turn_asks_for_the_whole_room_and_a_capped_one_for_the_budget() -> None:
    slots = SlotCount(10, used=1)
    wide = plan_fetch(slots, None, batch=100, widen=True)
    assert wide == FetchPlan(want=9, wait=Wait.NONE, free=9, room=9)
    assert wide.widest == 9 and not wide.capped
    capped = plan_fetch(slots, None, batch=100, widen=False)
    assert capped == FetchPlan(want=5, wait=Wait.NONE, free=9, room=9)
    assert capped.widest == 5 and capped.capped


def test_a_full_worker_waits_for_a_slot() -> None:
    plan = plan_fetch(SlotCount(4, used=3, reserved=1), None, batch=100, widen=True)
    assert plan.want == 0 and plan.wait is Wait.FULL
    over = plan_fetch(SlotCount(4, used=6), pressure(0.5), batch=100, widen=False)
    assert over.want == 0 and over.wait is Wait.FULL and over.free == -2


def test_pressure_with_free_slots_holds() -> None:
    plan = plan_fetch(SlotCount(8), pressure(0.95), batch=100, widen=True)
    assert plan == FetchPlan(want=0, wait=Wait.PRESSURE, free=8, room=0)
    squeezed = plan_fetch(SlotCount(8, used=5), pressure(0.85), batch=100, widen=True)
    assert squeezed.wait is Wait.PRESSURE and squeezed.free == 3


def test_a_reserved_slot_is_not_offered_twice() -> None:
    # two shards' turns: the second sees what the first's call has reserved
    first = plan_fetch(SlotCount(6), None, batch=100, widen=True)
    second = plan_fetch(SlotCount(6, reserved=first.want), None, batch=100, widen=True)
    assert first.want == 6
    assert second.want == 0 and second.wait is Wait.FULL


# -- after a reply -------------------------------------------------------------------------


WIDE = FetchPlan(want=4, wait=Wait.NONE, free=4, room=4)
CAPPED = FetchPlan(want=2, wait=Wait.NONE, free=4, room=4)


@pytest.mark.parametrize("burst", [False, True])
@pytest.mark.parametrize("busy", [False, True])
def test_jobs_in_the_reply_mean_ask_again_capped(burst: bool, busy: bool) -> None:
    step = after_reply(CAPPED, got_jobs=True, burst=burst, shard_busy=busy)
    assert step is Next.FETCH and not step.widen


def test_an_empty_reply_waits_for_work_unless_a_burst_shard_is_done() -> None:
    assert after_reply(WIDE, got_jobs=False, burst=False, shard_busy=False) is Next.IDLE
    assert after_reply(WIDE, got_jobs=False, burst=True, shard_busy=True) is Next.IDLE
    assert after_reply(WIDE, got_jobs=False, burst=True, shard_busy=False) is Next.DRAINED
    # an empty capped reply says nothing of wider jobs: ask wide before concluding
    assert after_reply(CAPPED, got_jobs=False, burst=True, shard_busy=False) is Next.WIDEN
    assert all(step.widen for step in (Next.IDLE, Next.DRAINED, Next.WIDEN))


def test_idle_timeout_is_the_block_or_the_next_due_job() -> None:
    assert idle_timeout(5.0, None, stopping=False) == 5.0
    assert idle_timeout(5.0, 1500, stopping=False) == 1.5
    assert idle_timeout(5.0, 60_000, stopping=False) == 5.0
    assert idle_timeout(5.0, 0, stopping=False) is None
    assert idle_timeout(5.0, None, stopping=True) is None


def test_idle_registration_outlives_the_block_and_is_off_in_burst_or_stopping() -> None:
    assert idle_registration_ms(5.0, burst=False, stopping=False) == 6000
    assert idle_registration_ms(0.25, burst=False, stopping=False) == 1250
    assert idle_registration_ms(5.0, burst=True, stopping=False) == 0
    assert idle_registration_ms(5.0, burst=False, stopping=True) == 0


def test_a_handed_job_starts_only_with_a_free_slot_and_no_hold() -> None:
    assert accept_handed(holding=False, free=1)
    assert not accept_handed(holding=False, free=0)
    assert not accept_handed(holding=True, free=5)


# -- properties ----------------------------------------------------------------------------


concurrencies = st.integers(min_value=1, max_value=200)


@st.composite
def slot_counts(draw: st.DrawFn) -> SlotCount:
    concurrency = draw(concurrencies)
    used = draw(st.integers(min_value=0, max_value=concurrency + 8))  # + wide hand-offs
    reserved = draw(st.integers(min_value=0, max_value=concurrency))
    return SlotCount(concurrency, used, reserved)


decisions = st.one_of(
    st.none(), st.floats(min_value=0.0, max_value=1.5, allow_nan=False).map(pressure)
)


@given(slot_counts(), decisions, st.integers(min_value=1, max_value=500), st.booleans())
def test_a_plan_never_asks_beyond_the_free_slots_or_the_allowance(
    slots: SlotCount, decision: Decision | None, batch: int, widen: bool
) -> None:
    plan = plan_fetch(slots, decision, batch=batch, widen=widen)
    assert 0 <= plan.want <= max(0, slots.concurrency - slots.used - slots.reserved)
    assert plan.want <= max(0, plan.room)
    assert slots.used + slots.reserved + plan.want <= max(slots.concurrency, slots.taken)
    assert (plan.want > 0) == (plan.wait is Wait.NONE)
    if decision is not None and decision.holding:
        assert plan.want == 0
        assert plan.wait is (Wait.PRESSURE if slots.free > 0 else Wait.FULL)
    if decision is None:
        assert plan.wait is not Wait.PRESSURE


@given(slot_counts(), decisions, st.integers(min_value=1, max_value=500))
def test_a_capped_ask_is_within_the_batch_and_half_the_slots_and_a_wide_one_takes_the_room(
    slots: SlotCount, decision: Decision | None, batch: int
) -> None:
    capped = plan_fetch(slots, decision, batch=batch, widen=False)
    wide = plan_fetch(slots, decision, batch=batch, widen=True)
    assert capped.want <= min(batch, max(1, slots.concurrency // 2))
    assert wide.want == max(0, wide.room)
    assert capped.want <= wide.want
    assert capped.wait is wide.wait
