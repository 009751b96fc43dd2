"""Operators' pauses' metric families, read at the scrape from the store's read model
(``fairlane.store.views.pauses``):

- ``fairlane_paused_scopes{kind}``: the pauses in force, by kind (``tenant``, ``key``,
  ``task``, ``lane``, and ``refuse`` for a tenant's quarantine), every kind listed (0
  when none), a task's or lane's pause once however many shards hold it;
- ``fairlane_parked_jobs``: the jobs a task's or fairness key's pause parked (out of
  their queues until resumed);
- ``fairlane_lane_paused_slots{lane,class}``: the waiting slots a lane's, class's or
  tenant's pause holds back in their queues, which the backlog an autoscaler reads
  leaves out (``fairlane.metrics.store``).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from fairlane.store.views.pauses import PausedWork

__all__ = ["pause_families"]


def pause_families(paused: PausedWork) -> Iterator[Metric]:
    scopes = GaugeMetricFamily(
        "fairlane_paused_scopes",
        "Operators' pauses in force, by kind: tenant, key (a tenant's fairness key), task, "
        "lane (or one class), refuse (a tenant's quarantine).",
        labels=["kind"],
    )
    for kind, n in paused.scopes.items():
        scopes.add_metric([kind], n)
    yield scopes
    parked = GaugeMetricFamily(
        "fairlane_parked_jobs",
        "Jobs a paused task or fairness key parked, out of their queues until resumed.",
    )
    parked.add_metric([], paused.parked)
    yield parked
    held = GaugeMetricFamily(
        "fairlane_lane_paused_slots",
        "Waiting slots a paused lane, class or tenant holds back in their queues: left "
        "out of the backlog to scale on (a paused tenant's jobs count one slot each).",
        labels=["lane", "class"],
    )
    for (lane, cls), n in sorted(paused.held.items()):
        held.add_metric([lane, cls], n)
    yield held
