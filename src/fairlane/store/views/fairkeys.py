"""The fairness keys at work in a lane: per class and active tenant, its keys ahead.

A tenant queue's keys' next tags (``fk:<lane>:<class>:<tenant>``, ``lua/fairkeys.lua``)
say how far each key has been served ahead of the queue's head, in FIFO steps
(``fairlane.policy.fairkeys``): a key ``n`` steps ahead at weight 1 has about ``n`` jobs
waiting. Tags at or below the head carry nothing (the next keyed enqueue drops them), so
they are not counted. Read in three round trips: the classes' active tenants (the first
``limit`` by tag of each), their queues' heads, then their keys above the head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fairlane.policy.fairkeys import head_order
from fairlane.store.fields import field_text
from fairlane.store.keys import AppKeys
from fairlane.store.reads import Plan, cmd

__all__ = ["TenantKeys", "fairness_keys"]

#: the keys furthest ahead shown per tenant
SHOWN = 3


@dataclass(frozen=True, slots=True)
class TenantKeys:
    """One active tenant of a class that has fairness keys with a claim above its head."""

    service_class: str
    tenant: str
    keys: int
    """Its keys tagged above the head of its queue (the keys sharing its part now)."""
    ahead: tuple[tuple[str, float], ...]
    """The keys furthest ahead, with how many FIFO steps above the head."""


def fairness_keys(
    keys: Sequence[AppKeys], lane: str, classes: Sequence[str], limit: int = 20
) -> Plan[list[TenantKeys]]:
    """The tenants of ``lane``'s ``classes`` (in each shard, the first ``limit`` active
    ones) whose queues hold keyed jobs, ordered by class, then tenant."""
    spots = [(k, c) for k in keys for c in classes]
    active = yield [cmd("zrange", k.class_key(lane, c, "fair"), 0, limit - 1) for k, c in spots]
    queues = [
        (k, c, field_text(t))
        for (k, c), tenants in zip(spots, active, strict=True)
        for t in tenants
    ]
    heads = yield [
        cmd("zrange", k.tenant_queue(lane, c, t), 0, 0, withscores=True) for k, c, t in queues
    ]
    waiting = [
        (k, c, t, head_order(float(head[0][1])))
        for (k, c, t), head in zip(queues, heads, strict=True)
        if head
    ]
    batch = []
    for k, c, t, h in waiting:
        tags = k.fairness_tags(lane, c, t)
        batch += [
            cmd("zcount", tags, f"({h!r}", "+inf"),
            cmd("zrevrange", tags, 0, SHOWN - 1, withscores=True),
        ]
    reply = yield batch
    out: list[TenantKeys] = []
    for i, (_, c, t, h) in enumerate(waiting):
        count, top = int(reply[2 * i]), reply[2 * i + 1]
        if count:
            ahead = tuple((field_text(m), float(f) - h) for m, f in top if float(f) > h)
            out.append(TenantKeys(c, t, count, ahead))
    return sorted(out, key=lambda v: (v.service_class, v.tenant))
