"""The share of dispatches each active tenant's weight entitles it to, per lane and class.

Inside a class, fair dispatch serves the tenants with work waiting -- those in the
class's ``fair`` sorted set -- in proportion to their weights: over a backlogged
stretch tenant ``i`` gets ``w_i / sum(w)`` of the work, the sum over the active tenants
only (``fairlane.policy.fairqueue``, its fairness bound). The metrics set that against
the share of dispatches each tenant did get (``fairlane_tenant_entitled_share`` next to
``fairlane_dispatched_jobs_total``).

:func:`entitled_shares` reads only classes with waiting slots, in two round trips: the
number of active tenants of each such class and the first ``tenants`` of them (``ZCARD``
and ``ZRANGE fair 0 N-1``), then their weights (one ``HMGET`` of each shard's
``weights`` hash, where a tenant's settings live in the shard that holds its queues). So
a read costs ``2 * classes + shards`` commands, however many tenants wait; with more
active tenants than ``tenants`` in a class, the unread ones count with the default
weight 1 and their part is returned under the empty tenant name.
"""

from __future__ import annotations

from collections.abc import Sequence

from fairlane.store.fields import field_text
from fairlane.store.keys import AppKeys
from fairlane.store.reads import Plan, cmd
from fairlane.store.views.lanes import LaneState

__all__ = ["UNREAD", "entitled_shares"]

#: The tenant name under which active tenants left unread are returned.
UNREAD = ""

_Where = tuple[int, str, str]  # shard, lane, class


def entitled_shares(
    keys: Sequence[AppKeys], lanes: Sequence[dict[str, LaneState]], tenants: int
) -> Plan[dict[tuple[str, str], dict[str, float]]]:
    """Per (lane, class) with work waiting in any shard, each active tenant's share
    ``w / sum(w)`` (summing to 1); ``lanes`` are each shard's states, in shard order."""
    busy: list[_Where] = [
        (shard, lane, cls)
        for shard, states in enumerate(lanes)
        for lane, state in states.items()
        for cls, n in state.waiting.items()
        if n > 0
    ]
    if not busy:
        return {}
    reply = yield [
        c
        for shard, lane, cls in busy
        for c in (
            cmd("zcard", keys[shard].class_key(lane, cls, "fair")),
            cmd("zrange", keys[shard].class_key(lane, cls, "fair"), 0, tenants - 1),
        )
    ]
    active: dict[int, list[tuple[_Where, str]]] = {}
    unread: dict[tuple[str, str], int] = {}
    for i, where in enumerate(busy):
        names = [field_text(t) for t in reply[2 * i + 1]]
        active.setdefault(where[0], []).extend((where, name) for name in names)
        at = (where[1], where[2])
        unread[at] = unread.get(at, 0) + max(0, int(reply[2 * i]) - len(names))
    shards = sorted(s for s, found in active.items() if found)
    weights = yield [cmd("hmget", keys[s].weights, [name for _, name in active[s]]) for s in shards]
    per_class: dict[tuple[str, str], dict[str, float]] = {}
    for s, got in zip(shards, weights, strict=True):
        for ((_, lane, cls), name), raw in zip(active[s], got, strict=True):
            weight = _weight(raw)
            held = per_class.setdefault((lane, cls), {})
            held[name] = held.get(name, 0.0) + weight
    for at, n in unread.items():
        if n:
            per_class.setdefault(at, {})[UNREAD] = float(n)
    return {at: _normalised(w) for at, w in per_class.items() if sum(w.values()) > 0}


def _weight(raw: object) -> float:
    """A stored weight; absent or unreadable is the default, 1."""
    if raw is None:
        return 1.0
    try:
        weight = float(field_text(raw))
    except ValueError:
        return 1.0
    return weight if weight > 0 else 1.0


def _normalised(weights: dict[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    return {name: w / total for name, w in weights.items()}
