"""A global key in words, for ``explain``: what part of a key shared by the app's shards
the job's shard holds, and what the others hold (``fairlane.store.views.globalkeys``).

A job of an app of many shards parked on a key its tenants share with other shards
waits for its own shard's part of the key, not for the key as a whole: the balancer
(``fairlane.policy.globalkeys``) moves parts toward the shards whose tenants wait, by
their weights, a pass at a time. So the sentence names the part, what of it is in use
and how many wait on this shard, beside what the other shards hold.
"""

from __future__ import annotations

from typing import Any

from fairlane.store.views.globalkeys import GlobalKeyView, ShardPart

__all__ = ["global_key_row", "global_key_text", "part_text"]


def part_text(part: float) -> str:
    """A part as people read it: ``0.25``, ``0.5``, ``1``."""
    return f"{part:.3g}"


def _shards(n: int) -> str:
    return f"{n} shard" if n == 1 else f"{n} shards"


def _others(view: GlobalKeyView, shard: int) -> str:
    others = [p for p in view.parts if p.shard != shard]
    if not others:
        return ""
    whom = "the other shard" if len(others) == 1 else f"the other {len(others)} shards"
    used = sum(p.used for p in others)
    waiting = sum(p.waiting for p in others)
    if view.limit is None:
        held = f"part {part_text(sum(p.part for p in others))}"
    else:
        held = f"{sum(p.held or 0 for p in others)}"
    verb = "holds" if len(others) == 1 else "hold"
    return f"; {whom} {verb} {held}, {used} in use, {waiting} waiting"


def _here(mine: ShardPart) -> str:
    if mine.slots is None:
        return f"this shard holds part {part_text(mine.part)} of its rate"
    return f"this shard holds {mine.held} of it (part {part_text(mine.part)})"


def global_key_text(view: GlobalKeyView, shard: int) -> str:
    """``waits for <key>: a global key of limit 4 shared by 3 shards; this shard holds 1
    of it (part 0.25), 1 in use, 3 waiting here; the other 2 shards hold 3, ...``"""
    mine = next((p for p in view.parts if p.shard == shard), None)
    kind = f"a global key of limit {view.limit}" if view.limit is not None else "a global rate key"
    text = f"waits for {view.key}: {kind} shared by {_shards(view.shards)}"
    if mine is None:
        return text
    here = f"{_here(mine)}, {mine.used} in use, {mine.waiting} waiting here"
    return f"{text}; {here}{_others(view, shard)}"


def global_key_row(view: GlobalKeyView) -> dict[str, Any]:
    """A global key as JSON (``explain --json``, the dashboard): its limit and each
    shard's part, slots held, slots in use, jobs waiting and their tenants' weight."""
    return {
        "key": view.key,
        "limit": view.limit,
        "shards": [
            {
                "shard": p.shard,
                "part": p.part,
                "held": p.held,
                "used": p.used,
                "waiting": p.waiting,
                "weight": p.weight,
            }
            for p in view.parts
        ],
    }
