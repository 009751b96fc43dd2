"""An app's totals, as the metrics export them: its lanes, counters and decisions.

The ``stats`` hash holds the app's counters (completed, failed, retried, ...), the FIFO
counter ``fifo``, its store ``layout``, and the admission decisions, one field
``adm:<outcome>:<reason>:<lane>:<class>`` each (written by the enqueue script), and, in
lanes that learn costs, the work units estimated and used by the jobs settled,
``units:<est|used>:<lane>:<class>`` in milli-units (written by the ack script;
:func:`work_units`); :func:`split_stats` tells the counters from the decisions and
leaves the units out. Read with
the lanes and the number of throttle waiters in one round trip (:func:`app_totals`),
each summed over the shards but for the lanes, kept per shard for the oldest-age read
(``fairlane.store.views.waits``) and merged by ``fairlane.store.views.lanes``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from fairlane.store.fields import field_int, field_text
from fairlane.store.keys import AppKeys
from fairlane.store.reads import Plan, cmd
from fairlane.store.views.lanes import LaneState, lane_reads, parse_lane_state

__all__ = [
    "DECISION_PREFIX",
    "UNITS_PREFIX",
    "AppTotals",
    "DecisionKey",
    "UnitsKey",
    "app_totals",
    "split_stats",
    "summed",
    "work_units",
]

#: Prefix of the stats-hash fields counting admission decisions (admission.lua).
DECISION_PREFIX = "adm:"

#: (lane, class, outcome, reason) of an admission decision counter
DecisionKey = tuple[str, str, str, str]

#: Prefix of the stats-hash fields summing work units estimated and used (acks.lua).
UNITS_PREFIX = "units:"

#: (lane, class, 'est' or 'used') of a work-units counter
UnitsKey = tuple[str, str, str]


def split_stats(raw: Mapping[str, int]) -> tuple[dict[str, int], dict[DecisionKey, int]]:
    """The stats hash as plain counters (``fifo`` and ``layout`` left out) and admission
    decisions."""
    stats: dict[str, int] = {}
    decisions: dict[DecisionKey, int] = {}
    for name, n in raw.items():
        if name in ("fifo", "layout") or name.startswith(UNITS_PREFIX):
            continue
        if not name.startswith(DECISION_PREFIX):
            stats[name] = n
            continue
        parts = name[len(DECISION_PREFIX) :].split(":")
        if len(parts) == 4:  # outcome, reason, lane, class
            outcome, reason, lane, cls = parts
            decisions[(lane, cls, outcome, reason)] = n
    return stats, decisions


def work_units(raw: Mapping[str, int]) -> dict[UnitsKey, float]:
    """The work units estimated and used per (lane, class), in units, from the stats
    hash (its ``units:`` fields)."""
    out: dict[UnitsKey, float] = {}
    for name, n in raw.items():
        if not name.startswith(UNITS_PREFIX):
            continue
        parts = name[len(UNITS_PREFIX) :].split(":")
        if len(parts) == 3 and parts[0] in ("est", "used"):  # kind, lane, class
            kind, lane, cls = parts
            out[(lane, cls, kind)] = n / 1000
    return out


def summed(hashes: Sequence[Mapping[Any, Any]]) -> dict[str, int]:
    """Counter hashes (``HGETALL`` replies) summed field by field; the stats hash's store
    layout is no counter, and is left out."""
    total: dict[str, int] = {}
    for raw in hashes:
        for k, v in raw.items():
            name = field_text(k)
            if name == "layout":
                continue
            total[name] = total.get(name, 0) + field_int(v, 0)
    return total


class AppTotals(msgspec.Struct, frozen=True):
    """The lanes of each shard, and the counters, decisions and throttle waiters of all."""

    lanes: list[dict[str, LaneState]]  # per shard, in shard order
    stats: dict[str, int]
    decisions: dict[DecisionKey, int]
    throttle_waiters: int
    units: dict[UnitsKey, float] = msgspec.field(default_factory=dict)


def app_totals(keys: Sequence[AppKeys], lanes: Sequence[str]) -> Plan[AppTotals]:
    """Lanes, the stats hash and the throttle waiters of every shard, in one round trip."""
    batch = []
    for k in keys:
        batch += [c for lane in lanes for c in lane_reads(k, lane)]
        batch += [cmd("hgetall", k.stats), cmd("zcard", k.throttle_waiters)]
    replies = iter((yield batch))
    per_shard: list[dict[str, LaneState]] = []
    stats: list[Mapping[Any, Any]] = []
    waiters = 0
    for _ in keys:
        per_shard.append({lane: parse_lane_state(next(replies), next(replies)) for lane in lanes})
        stats.append(next(replies))
        waiters += int(next(replies))
    total = summed(stats)
    plain, decisions = split_stats(total)
    return AppTotals(per_shard, plain, decisions, waiters, work_units(total))
