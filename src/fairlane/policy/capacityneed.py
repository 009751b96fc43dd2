"""The slots a lane needs: for every waiting job with a deadline to meet it, and for its
backlog to clear within a horizon. ``/autoscale``'s ``slots_needed`` and the gauge
``fairlane_lane_slots_needed`` say it, so that an autoscaler adds workers for what the
work needs rather than for how much of it waits. Worked out from what the store holds
at a scrape (``fairlane.store.views.needs`` reads it, bounded), assuming every job
takes its learned mean and nothing else arrives.

Deadlines
---------
Jobs ``j`` wait (ready to run, in their queues) with a learned length ``p_j`` (an
attempt's mean), a width of ``w_j`` slots and ``T_j`` seconds left to the last moment
they may finish as dispatch judges it: the deadline less ``(DEADLINE_SAFETY - 1) p_j``
(dispatch lets a job start only while ``DEADLINE_SAFETY p_j`` fits before its deadline,
``startpredict.unmeetable``; :func:`finish_by_s`).
A job that cannot finish in time however many slots there are -- ``p_j > T_j``, the
test dispatch applies before it leases one (``startpredict.unmeetable``) -- is
counted apart (``unmeetable``, a count of jobs, not slots) and asks for nothing.

*Demand by a time.* By ``t`` seconds from now job ``j`` must have done at least the part
of its work it cannot do after ``t``: all of it when ``T_j <= t``, and
``p_j - (T_j - t)`` when that is positive (it can run at most ``T_j - t`` after ``t``).
With ``s_j = T_j - p_j``, the latest it can start,

    D(t) = sum_j w_j * min(p_j, max(0, t - s_j))      slot-seconds due by t.

*Held meanwhile.* Work already running keeps its slots: a class with ``f`` slots in
flight holds them for about ``r``, half its learned mean length (a slot's job is on
average halfway through; unknown: held throughout), so ``H(t) = sum f * min(t, r)``.

*The bound.* ``m`` slots give ``m * t`` slot-seconds by ``t``; every deadline is met
only if ``D(t) + H(t) <= m * t`` for every ``t``, so

    m >= max over t of (D(t) + H(t)) / t,

taken at the times some job must have started (``s_j``) or finished (``T_j``): ``D``
is piecewise linear with its corners there, so on each stretch between them ``D / t``
is ``a / t + b`` (monotone) and its largest value lies at a corner. (``H``'s own
corners, at each class's residual, are not looked at: ``H / t`` only falls with ``t``,
and the figure is about the deadlines, not the work already running.)
With every deadline job's ``p_j`` counted whole only at its own deadline this is the
classic condition of earliest-deadline-first (Horn's for one machine, necessary on
``m``: sort by deadline; ``m >= max_k sum_{i<=k} p_i w_i / T_k``); the part of a
later job that must run before ``t`` only tightens it. It is a **lower bound**: real
slots are whole and jobs are not pre-empted, fair queuing between tenants does not
serve deadlines first, and work arriving later asks for more. A job with nothing
learned counts as needing its slots until its deadline (``p_j = T_j``): never less
than it may need.

*Bounded.* Each counted job fits alone (``p_j <= T_j``), so ``D(t) / t <= sum w_j``,
and ``H(t) / t <= sum f``: the figure never exceeds the slots in flight plus the
widths of the jobs counted -- running them all at once meets every deadline -- and
that is its cap.

Horizon
-------
The backlog outside batch classes (batch runs only on slots no other class wants) is
``W`` slot-seconds: each waiting job at its tenant's learned slot-seconds in its
class, else its class's. To clear it within ``h`` seconds while the slots in flight
``F`` keep serving what arrives,

    m = F + W / h.

Jobs with nothing learned of their tenant or class count a slot each, as the backlog
does. Capped at ``F`` plus the slots waiting: more would find nothing to run.

The figure to scale on (``slots_needed``) is the largest of the two and of the slots
in flight (busy slots are needed slots); each is a whole number of slots, rounded up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import msgspec

from fairlane.policy.startpredict import DEADLINE_SAFETY, unmeetable

__all__ = [
    "DEFAULT_HORIZON_S",
    "DeadlineJob",
    "DeadlineNeed",
    "HorizonNeed",
    "Queued",
    "Running",
    "deadline_need",
    "horizon_need",
    "slots_needed",
    "whole_slots",
]

#: seconds the backlog outside batch classes is to clear in, by default
DEFAULT_HORIZON_S = 300.0
#: what a figure may exceed a whole number of slots by and still round down to it (the
#: sums are of floats)
_SLACK = 1e-6


class DeadlineJob(msgspec.Struct, frozen=True):
    """A job waiting to run with a deadline ``left_s`` seconds from now (negative: past);
    its learned length (seconds an attempt takes; None: nothing learned) and width."""

    left_s: float
    length_s: float | None
    slots: int = 1


class Running(msgspec.Struct, frozen=True):
    """Slots in flight in one class, and how long they are expected to stay held
    (None: unknown, held throughout)."""

    slots: int
    residual_s: float | None


class Queued(msgspec.Struct, frozen=True):
    """Jobs waiting in a class outside batch (one tenant's, or the tenants a read did
    not reach), with their learned slot-seconds each (None: nothing learned)."""

    jobs: int
    slot_seconds: float | None


class DeadlineNeed(msgspec.Struct, frozen=True):
    """The slots every deadline needs (whole, rounded up) and the figure before rounding;
    the jobs counted, those no capacity can bring in on time, and the time (seconds from
    now) where the bound is tightest (None: nothing to meet)."""

    slots: int
    exact: float
    jobs: int
    unmeetable: int
    binding_s: float | None


class HorizonNeed(msgspec.Struct, frozen=True):
    """The slots that clear the backlog within the horizon (whole, rounded up), the figure
    before rounding, the work waiting (slot-seconds) and the jobs of no learned length."""

    slots: int
    exact: float
    work_s: float
    unlearned: int


def whole_slots(figure: float) -> int:
    """A figure of slots as whole slots, rounded up (a sum's float noise rounds down)."""
    return max(0, math.ceil(figure - _SLACK))


def _held(running: Sequence[Running], t: float) -> float:
    return sum(r.slots * (t if r.residual_s is None else min(t, r.residual_s)) for r in running)


def finish_by_s(job: DeadlineJob) -> float:
    """The seconds left to the last moment the job may finish as dispatch judges it: its
    deadline less its learned length taken ``DEADLINE_SAFETY - 1`` times more
    (``startpredict.latest_start_ms``), so that it is late here exactly when dispatch
    would expire it."""
    if job.length_s is None:
        return job.left_s
    return job.left_s - (DEADLINE_SAFETY - 1) * job.length_s


def _corners(jobs: Iterable[DeadlineJob]) -> list[tuple[float, float]]:
    """Where ``D``'s slope changes: +w at each job's latest start, -w at its deadline."""
    out = []
    for j in jobs:
        due = finish_by_s(j)
        length = due if j.length_s is None else j.length_s
        width = max(1, j.slots)
        out.append((due - length, float(width)))
        out.append((due, -float(width)))
    return sorted(out)


def deadline_need(jobs: Sequence[DeadlineJob], running: Sequence[Running] = ()) -> DeadlineNeed:
    """The slots the deadlines of ``jobs`` need (the module's bound), next to ``running``."""
    late = [j for j in jobs if _late(j)]
    counted = [j for j in jobs if not _late(j) and finish_by_s(j) > 0]
    best, binding = 0.0, None
    due, slope, at = 0.0, 0.0, 0.0
    for t, change in _corners(counted):
        due += slope * (t - at)
        at, slope = t, slope + change
        if t > 0:
            figure = (due + _held(running, t)) / t
            if figure > best:
                best, binding = figure, t
    cap = sum(r.slots for r in running) + sum(max(1, j.slots) for j in counted)
    exact = min(best, float(cap))
    return DeadlineNeed(whole_slots(exact), exact, len(counted), len(late), binding)


def _late(job: DeadlineJob) -> bool:
    expected = None if job.length_s is None else job.length_s * 1000
    return unmeetable(0.0, round(job.left_s * 1000), expected)


def horizon_need(
    queued: Sequence[Queued], in_flight: int, ready_slots: int, horizon_s: float
) -> HorizonNeed:
    """The slots that clear ``queued`` within ``horizon_s`` seconds while ``in_flight``
    slots keep serving; at most ``in_flight + ready_slots``."""
    if horizon_s <= 0:
        raise ValueError(f"horizon_s must be > 0, got {horizon_s}")
    work = sum(q.jobs * q.slot_seconds for q in queued if q.slot_seconds is not None)
    unlearned = sum(q.jobs for q in queued if q.slot_seconds is None)
    exact = min(in_flight + work / horizon_s + unlearned, float(in_flight + ready_slots))
    return HorizonNeed(whole_slots(exact), max(0.0, exact), work, unlearned)


def slots_needed(deadlines: int, horizon: int, in_flight: int) -> int:
    """The figure to scale on: the largest of the two needs and the slots in flight."""
    return max(deadlines, horizon, in_flight)
