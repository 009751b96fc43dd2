"""A lane's state, parsed once and merged over the shards.

The lane state hash (``lane:<l>:state``, ``fairlane/store/keys.py``) caches the lane's
capacity ``C`` (its live workers' slots) and, per service class, the slots in flight
(``f:<c>``) and waiting (``d:<c>``), and for lanes with an admission pool the deferred
jobs (``ad:<c>``), the admitted ones holding a reservation (``an:<c>``) and the
milli-units reserved (``ar:<c>``). :func:`parse_lane_state` is the one reader of that
hash; a value that does not parse is left out, as a reader of records does.

An app split into scheduling shards holds a lane in every shard. Merged
(:func:`merge_lanes`), its jobs and slots are summed over them, but not its capacity:
every worker registers its whole size in every shard, so each shard's ``C`` is already
the fleet's, and the largest is taken, should a shard not have heard from a new worker
yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from fairlane.store.fields import field_int, field_text
from fairlane.store.keys import AppKeys
from fairlane.store.reads import Cmd, Plan, cmd

__all__ = [
    "LaneState",
    "lane_reads",
    "lane_states",
    "lane_states_by_shard",
    "merge_lanes",
    "parse_lane_state",
]


class LaneState(msgspec.Struct, frozen=True):
    """A lane's cached capacity and its classes' slots and admission counters, and how
    many of its jobs are scheduled for later; counters are as the store holds them (a
    cached one may dip below zero for a moment: :meth:`clamped` reads those as 0)."""

    capacity: int
    in_flight: dict[str, int]  # class -> slots of running jobs
    waiting: dict[str, int]  # class -> slots of jobs queued and ready
    # class -> jobs admission deferred
    deferred: dict[str, int] = msgspec.field(default_factory=dict)
    # class -> milli-units reserved
    reserved_mu: dict[str, int] = msgspec.field(default_factory=dict)
    admitted: dict[str, int] = msgspec.field(default_factory=dict)  # class -> admitted, reserving
    delayed: int = 0  # jobs scheduled for later (lane:<l>:delayed)

    def clamped(self) -> LaneState:
        """The state with every count below zero read as zero."""

        def floor(counts: dict[str, int]) -> dict[str, int]:
            return {name: max(0, n) for name, n in counts.items()}

        return LaneState(
            max(0, self.capacity),
            floor(self.in_flight),
            floor(self.waiting),
            floor(self.deferred),
            floor(self.reserved_mu),
            floor(self.admitted),
            max(0, self.delayed),
        )


# the per-class fields: their prefix, and the attribute they count in
_PER_CLASS = {
    "f": "in_flight",
    "d": "waiting",
    "ad": "deferred",
    "ar": "reserved_mu",
    "an": "admitted",
}


def parse_lane_state(raw: Mapping[Any, Any], delayed: Any = 0) -> LaneState:
    """A lane state hash (``HGETALL``; names and values bytes or text), with the size of
    the lane's delayed set."""
    counts: dict[str, dict[str, int]] = {name: {} for name in _PER_CLASS.values()}
    capacity = 0
    for key, value in raw.items():
        name, n = field_text(key), field_int(value)
        if n is None:
            continue
        if name == "C":
            capacity = n
            continue
        kind, colon, cls = name.partition(":")
        if colon and kind in _PER_CLASS:
            counts[_PER_CLASS[kind]][cls] = n
    return LaneState(capacity, **counts, delayed=field_int(delayed, 0))


def _summed(parts: Iterable[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in parts:
        for cls, n in part.items():
            out[cls] = out.get(cls, 0) + n
    return out


def merge_lanes(shards: Sequence[LaneState]) -> LaneState:
    """One lane as the shards hold it together: jobs and slots summed, the capacity not."""
    if len(shards) == 1:
        return shards[0]
    return LaneState(
        capacity=max(s.capacity for s in shards),
        in_flight=_summed(s.in_flight for s in shards),
        waiting=_summed(s.waiting for s in shards),
        deferred=_summed(s.deferred for s in shards),
        reserved_mu=_summed(s.reserved_mu for s in shards),
        admitted=_summed(s.admitted for s in shards),
        delayed=sum(s.delayed for s in shards),
    )


def lane_reads(keys: AppKeys, lane: str) -> list[Cmd]:
    """The two commands that read one lane in one shard (parsed by ``parse_lane_state``)."""
    lane_keys = keys.lane(lane)
    return [cmd("hgetall", lane_keys.state), cmd("zcard", lane_keys.delayed)]


def lane_states_by_shard(
    keys: Sequence[AppKeys], lanes: Sequence[str]
) -> Plan[list[dict[str, LaneState]]]:
    """Each shard's state of ``lanes``, in shard order, in one round trip."""
    reply = yield [c for k in keys for lane in lanes for c in lane_reads(k, lane)]
    replies = iter(reply)
    return [{lane: parse_lane_state(next(replies), next(replies)) for lane in lanes} for _ in keys]


def lane_states(keys: Sequence[AppKeys], lanes: Sequence[str]) -> Plan[dict[str, LaneState]]:
    """``lanes`` merged over the shards, in one round trip."""
    per_shard = yield from lane_states_by_shard(keys, lanes)
    return {lane: merge_lanes([shard[lane] for shard in per_shard]) for lane in lanes}
