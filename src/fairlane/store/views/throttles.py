"""Throttle keys: each key's limit, its use, its offers and the jobs waiting for it.

The ``thr`` hash holds, per throttle key, its limit (``l:<key>``, as the last task to
declare it recorded), the slots held by running jobs (``u:<key>``), the offers made to
woken jobs on their way back to a lane slot (``o:<key>``) and the jobs naming it
(``r:<key>``); ``thr:wait`` holds the waiting jobs by tenant group, member
``<key>\\0<tenant>\\0<order>\\0<job id>``.
Over shards, a key's use, offers, jobs and waiters are summed over those that hold it,
and its limit is the largest any of them recorded (the task declares it). A key's free
room is ``limit - in_use - offers``: an offer is a slot promised to a woken job, which
takes it with its lane slot (``fairlane.policy.throttle``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from fairlane.store.fields import field_int, field_text
from fairlane.store.keys import AppKeys
from fairlane.store.reads import Plan, cmd, scan_fields

__all__ = ["ThrottleView", "throttles"]


@dataclass(frozen=True, slots=True)
class ThrottleView:
    """One throttle key over every shard: ``in_use`` slots held by running jobs,
    ``offers`` made to woken jobs back in their tenants' queues; ``waiters`` are job ids
    by tenant group (each group first in line first; which group goes next is the key's
    fair tags' call)."""

    key: str
    limit: int | None
    in_use: int
    offers: int
    jobs: int
    waiters: list[str]


def throttles(keys: Sequence[AppKeys], waiter_limit: int) -> Plan[list[ThrottleView]]:
    """Every throttle key some shard knows (by limit or waiter), sorted by key; at most
    ``waiter_limit`` waiters read per shard."""
    reply = yield [
        c
        for k in keys
        for c in (
            scan_fields(k.throttles, "l:*"),
            cmd("zrange", k.throttle_waiters, 0, waiter_limit - 1),
        )
    ]
    limits: dict[str, int] = {}
    waiters: dict[str, list[str]] = defaultdict(list)
    held: list[tuple[int, str]] = []  # (shard, key) of every key a shard knows
    for shard in range(len(keys)):
        declared, waiting = reply[2 * shard], reply[2 * shard + 1]
        known: set[str] = set()
        for name, value in declared.items():
            key = field_text(name)[2:]
            limits[key] = max(limits.get(key, 0), field_int(value) or 0)
            known.add(key)
        for member in waiting:
            key, _, rest = field_text(member).partition("\0")
            waiters[key].append(rest.split("\0", 2)[-1])
            known.add(key)
        held.extend((shard, key) for key in sorted(known))
    if not held:
        return []
    use = yield [
        cmd("hmget", keys[shard].throttles, f"u:{key}", f"o:{key}", f"r:{key}")
        for shard, key in held
    ]
    in_use: dict[str, int] = defaultdict(int)
    offers: dict[str, int] = defaultdict(int)
    jobs: dict[str, int] = defaultdict(int)
    for (_, key), (used, offered, refs) in zip(held, use, strict=True):
        in_use[key] += field_int(used) or 0
        offers[key] += field_int(offered) or 0
        jobs[key] += field_int(refs) or 0
    return [
        ThrottleView(
            key, limits.get(key), in_use[key], offers[key], jobs[key], waiters.get(key, [])
        )
        for key in sorted({key for _, key in held})
    ]
