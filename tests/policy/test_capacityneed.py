"""The slots a lane needs (``fairlane.policy.capacityneed``): the deadlines' demand bound
on hand-worked cases and against a brute-force reading of its definition, and the
horizon's figure."""

from __future__ import annotations

import random

import pytest

from fairlane.policy.capacityneed import (
    DeadlineJob,
    Queued,
    Running,
    deadline_need,
    horizon_need,
    slots_needed,
    whole_slots,
)
from fairlane.policy.startpredict import DEADLINE_SAFETY


def test_a_long_job_due_later_must_be_half_done_by_an_earlier_deadline() -> None:
    # by t=20, B (20 slot-s) and A (4) are due whole, and C, needing 28 s by t=30, has
    # done at least 18: 42 slot-s in 20 s is 2.1 slots, so 3. Earliest-deadline-first's
    # condition alone (each job whole at its own deadline) says 2: 52 / 30 at t=30.
    # (each deadline a quarter of the job's length later: dispatch takes a learned length
    # DEADLINE_SAFETY times over, so A must finish 10 s from now, B 20 s, C 30 s)
    jobs = [
        DeadlineJob(11, 4),  # A
        DeadlineJob(22.5, 10, slots=2),  # B
        DeadlineJob(37, 28),  # C
        DeadlineJob(5, 8),  # D: cannot finish in 5 s
    ]
    need = deadline_need(jobs)
    assert need.exact == pytest.approx(2.1)
    assert (need.slots, need.jobs, need.unmeetable, need.binding_s) == (3, 3, 1, 20)


def test_slots_in_flight_hold_their_residual_within_each_window() -> None:
    jobs = [DeadlineJob(11, 4), DeadlineJob(22.5, 10, slots=2), DeadlineJob(37, 28)]
    # 2 slots for 5 s more: 10 slot-s more by t=20 (52 / 20 = 2.6); held throughout
    # (nothing learned) 1 slot adds 1 at every t
    assert deadline_need(jobs, [Running(2, 5.0)]).exact == pytest.approx(2.6)
    assert deadline_need(jobs, [Running(1, None)]).exact == pytest.approx(3.1)


def test_a_job_of_no_learned_length_needs_its_slots_until_its_deadline() -> None:
    need = deadline_need([DeadlineJob(8, None, slots=3), DeadlineJob(-1, None)])
    assert (need.slots, need.jobs, need.unmeetable) == (3, 1, 1)


def test_nothing_to_meet_needs_nothing() -> None:
    assert deadline_need([]).slots == 0
    assert deadline_need([DeadlineJob(1, 2)]).slots == 0  # unmeetable only
    assert deadline_need([], [Running(4, 1.0)]).slots == 0


def _brute(jobs: list[DeadlineJob], running: list[Running]) -> float:
    """The definition, point by point: max over every corner of (D(t) + H(t)) / t."""
    by = {id(j): j.left_s - (DEADLINE_SAFETY - 1) * (j.length_s or 0) for j in jobs}
    fit = [j for j in jobs if by[id(j)] > 0 and (j.length_s or 0) <= by[id(j)]]
    lengths = [(by[id(j)] if j.length_s is None else j.length_s) for j in fit]
    corners = {by[id(j)] for j in fit} | {by[id(j)] - p for j, p in zip(fit, lengths, strict=True)}
    best = 0.0
    for t in sorted(c for c in corners if c > 0):
        due = sum(
            j.slots * min(p, max(0.0, t - (by[id(j)] - p)))
            for j, p in zip(fit, lengths, strict=True)
        )
        held = sum(r.slots * (t if r.residual_s is None else min(t, r.residual_s)) for r in running)
        best = max(best, (due + held) / t)
    cap = sum(r.slots for r in running) + sum(j.slots for j in fit)
    return min(best, cap)


def test_the_sweep_is_the_definition_on_random_cases() -> None:
    rng = random.Random(31)
    for _ in range(300):
        jobs = [
            DeadlineJob(
                rng.uniform(-5, 120),
                rng.choice([None, rng.uniform(0, 60)]),
                rng.choice([1, 1, 2, 4]),
            )
            for _ in range(rng.randint(0, 25))
        ]
        running = [Running(rng.randint(1, 8), rng.choice([None, rng.uniform(0, 30)]))]
        assert deadline_need(jobs, running).exact == pytest.approx(_brute(jobs, running))


def test_the_deadline_figure_never_exceeds_running_everything_at_once() -> None:
    jobs = [DeadlineJob(1.25, 0.999, slots=2) for _ in range(50)]
    need = deadline_need(jobs, [Running(3, None)])
    assert need.slots == 3 + 100


def test_the_horizon_clears_the_work_while_the_slots_in_flight_keep_serving() -> None:
    queued = [Queued(600, 2.0), Queued(300, 1.0), Queued(5, None)]
    # 1500 slot-s over 300 s is 5 slots; 5 jobs of nothing learned one each; 4 in flight
    need = horizon_need(queued, in_flight=4, ready_slots=1000, horizon_s=300)
    assert (need.slots, need.work_s, need.unlearned) == (14, 1500.0, 5)
    # never more slots than the work waiting could fill at once
    assert horizon_need(queued, in_flight=4, ready_slots=6, horizon_s=1).slots == 10
    with pytest.raises(ValueError, match="horizon_s"):
        horizon_need(queued, in_flight=0, ready_slots=0, horizon_s=0)


def test_the_figure_to_scale_on_is_the_largest_and_whole() -> None:
    assert slots_needed(3, 7, 5) == 7
    assert slots_needed(0, 0, 5) == 5
    assert (whole_slots(2.0000000001), whole_slots(2.01), whole_slots(-1)) == (2, 3, 0)
