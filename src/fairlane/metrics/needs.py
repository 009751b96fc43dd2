"""The slots each lane needs, as the metrics and ``/autoscale`` report them: the rule of
``fairlane.policy.capacityneed`` applied to what a scrape read
(``fairlane.store.views.needs``).

- ``fairlane_lane_slots_needed{lane,for}``: ``for="deadlines"``, the slots every ready
  job with a deadline needs to meet it (a lower bound; with more deadline jobs than a
  read takes, of those due soonest); ``for="horizon"``, the slots that clear the backlog
  outside batch classes within the horizon while the slots in flight keep serving;
- ``fairlane_deadlines_unmeetable{lane}``: ready jobs whose learned length no longer
  fits before their deadline, however many slots there are (dispatch expires them);
- ``fairlane_deadlines_waiting{lane}``: the ready jobs with a deadline counted.

What a pause holds back asks for nothing: a class an operator's pause holds whole
counts neither its deadline jobs nor its backlog (a paused task's or key's jobs are
parked, out of both already).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from fairlane.policy.capacityneed import (
    DeadlineNeed,
    HorizonNeed,
    deadline_need,
    horizon_need,
    slots_needed,
)
from fairlane.store.views.lanes import LaneState
from fairlane.store.views.needs import LaneNeeds

__all__ = ["LaneNeed", "lane_need", "need_families", "need_view"]


@dataclass(frozen=True, slots=True)
class LaneNeed:
    """A lane's needs: for its deadlines, for its horizon, and the figure to scale on;
    the deadline index's entries a read left (the deadline figure a lower bound then)."""

    deadlines: DeadlineNeed
    horizon: HorizonNeed
    slots: int
    unread: int
    horizon_s: float


def lane_need(
    lane: str,
    state: LaneState,
    *,
    found: LaneNeeds,
    batch: frozenset[str],
    held: Mapping[tuple[str, str], int],
    horizon_s: float,
) -> LaneNeed:
    """The rule on what was read of ``lane``; ``held``: the waiting slots pauses hold back
    per (lane, class)."""
    ready = {cls: max(0, n - held.get((lane, cls), 0)) for cls, n in state.waiting.items()}
    shut = {cls for cls, n in state.waiting.items() if n > 0 and ready[cls] == 0}
    running = [r for rs in found.running.values() for r in rs]
    deadlines = deadline_need([j for cls, j in found.deadlines if cls not in shut], running)
    outside = [cls for cls in found.queued if cls not in batch and cls not in shut]
    horizon = horizon_need(
        [q for cls in outside for q in found.queued[cls]],
        sum(n for cls, n in state.in_flight.items() if cls not in batch),
        sum(n for cls, n in ready.items() if cls not in batch),
        horizon_s,
    )
    total = slots_needed(deadlines.slots, horizon.slots, sum(state.in_flight.values()))
    return LaneNeed(deadlines, horizon, total, found.unread, horizon_s)


def need_view(need: LaneNeed | None, in_flight: int) -> dict[str, Any]:
    """A lane's ``/autoscale`` fields for its needs (none read: the slots in flight)."""
    if need is None:
        return {"slots_needed": in_flight, "slots_needed_deadlines": 0, "slots_needed_horizon": 0}
    return {
        "slots_needed": need.slots,
        "slots_needed_deadlines": need.deadlines.slots,
        "slots_needed_horizon": need.horizon.slots,
        "deadlines_waiting": need.deadlines.jobs,
        "deadlines_unmeetable": need.deadlines.unmeetable,
        "deadlines_unread": need.unread,
        "horizon_seconds": need.horizon_s,
    }


def need_families(needs: Mapping[str, LaneNeed]) -> Iterator[Metric]:
    needed = GaugeMetricFamily(
        "fairlane_lane_slots_needed",
        "Slots a lane needs: for=deadlines, for every ready job with a deadline to meet it "
        "(a lower bound); for=horizon, for the backlog outside batch classes to clear "
        "within the horizon while the slots in flight keep serving.",
        labels=["lane", "for"],
    )
    late = GaugeMetricFamily(
        "fairlane_deadlines_unmeetable",
        "Ready jobs whose learned length no longer fits before their deadline, however "
        "many slots there are.",
        labels=["lane"],
    )
    waiting = GaugeMetricFamily(
        "fairlane_deadlines_waiting",
        "Ready jobs with a deadline counted in the slots the deadlines need.",
        labels=["lane"],
    )
    for lane, need in sorted(needs.items()):
        needed.add_metric([lane, "deadlines"], need.deadlines.slots)
        needed.add_metric([lane, "horizon"], need.horizon.slots)
        late.add_metric([lane], need.deadlines.unmeetable)
        waiting.add_metric([lane], need.deadlines.jobs)
    yield needed
    yield late
    yield waiting
