"""Who waits in a lane: its active tenants per class, their queues and rejections.

A tenant is active in a class while it has jobs queued there (it is a member of the
class's ``fair`` set, in the shard its name hashes to -- or, after the shard count
changed under live queues, in another too: each is read and their queues summed).
Beside them, per class, the jobs admission deferred (the ``deferred`` set), the lane's
delayed jobs, its state merged over the shards (``fairlane.store.views.lanes``), and
each tenant's recent admission rejections (``adm:rej``: ``count|window start``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from fairlane.store.fields import field_int, field_text
from fairlane.store.keys import AppKeys
from fairlane.store.reads import Plan, cmd
from fairlane.store.views.lanes import LaneState, lane_reads, merge_lanes, parse_lane_state

__all__ = ["LaneTenants", "lane_tenants"]


@dataclass(frozen=True, slots=True)
class LaneTenants:
    """A lane's state and who waits in it, over every shard."""

    state: LaneState
    queued: dict[tuple[str, str], int]  # (class, tenant) -> jobs queued, for every active one
    deferred: dict[str, int]  # class -> jobs in its deferred set
    rejected: dict[str, int]  # tenant -> admission rejections in the current window


def lane_tenants(keys: Sequence[AppKeys], lane: str, classes: Sequence[str]) -> Plan[LaneTenants]:
    """The lane's state, active tenants, deferred jobs and rejections, then the active
    tenants' queue lengths: two round trips."""
    batch = []
    for k in keys:
        batch += lane_reads(k, lane)
        batch.append(cmd("hgetall", k.lane_rejections(lane)))
        for cls in classes:
            batch.append(cmd("zrange", k.class_key(lane, cls, "fair"), 0, -1))
            batch.append(cmd("zcard", k.class_key(lane, cls, "deferred")))
    reply = yield batch
    width = 3 + 2 * len(classes)  # replies per shard
    states: list[LaneState] = []
    rejections: dict[str, str] = {}
    active: list[tuple[tuple[str, str], int]] = []  # ((class, tenant), shard)
    deferred: dict[str, int] = defaultdict(int)
    for shard in range(len(keys)):
        part = reply[shard * width : (shard + 1) * width]
        states.append(parse_lane_state(part[0], part[1]))
        rejections.update({field_text(k): field_text(v) for k, v in part[2].items()})
        for i, cls in enumerate(classes):
            active.extend(((cls, field_text(t)), shard) for t in part[3 + 2 * i])
            deferred[cls] += int(part[4 + 2 * i])
    lengths = yield [
        cmd("zcard", keys[shard].tenant_queue(lane, cls, tenant)) for (cls, tenant), shard in active
    ]
    queued: dict[tuple[str, str], int] = defaultdict(int)
    for (pair, _), n in zip(active, lengths, strict=True):
        queued[pair] += int(n)
    rejected = {t: field_int(r.partition("|")[0]) or 0 for t, r in rejections.items()}
    return LaneTenants(merge_lanes(states), dict(queued), dict(deferred), rejected)
