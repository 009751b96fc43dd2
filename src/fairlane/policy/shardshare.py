"""Sharing one worker's slots between the shards it serves, by the weight waiting in each.

A worker of an app of ``n`` shards runs one fetch loop per shard, and the loops share
the worker's ``N`` slots (``runtime/slots.py``). Each shard is a whole scheduler: inside
it the class rules and weighted fair queuing decide which tenant's job starts next
(``policy/classes.py``, ``policy/fairqueue.py``). What this module decides is how many
of the worker's slots each shard's loop may fill.

**The waiting weight.** Every exchange's reply carries the shard's *waiting weight*
``W_i``: the sum, over the lanes the worker serves and the classes of each lane, of the
weights of the tenants that have jobs waiting there (each class's fair set; the store
keeps the sum as tenants enter and leave it, never by a scan). A shard *contends* while
its loop is fetching (waiting for the turn, holding it, or waiting for room); a loop that
found nothing and waits on its shard's wake lists does not.

**Entitlement.** Let ``S`` be the contending shards with ``W_i > 0`` and ``U`` the slots
held by the jobs of every other shard. Shard ``i`` in ``S`` is entitled to

    e_i = (N - U) * W_i / sum(W_j for j in S)

slots; a shard outside ``S`` is entitled to none, and the slots it does not hold are the
others' at once (they are not in ``U``, and it is not in the sum).

**The turn.** Loops waiting for the turn are served lowest ``used_i / W_i`` first (a
shard with ``W_i = 0`` and nothing held first of all, so that it learns its weight; ties
in order of arrival). While another shard of ``S`` contends, a turn asks for at most
``floor(e_i) - used_i`` slots, or one more up to ``ceil(e_i)`` out of the slots left when
every shard of ``S`` holds its floor (``cap``); alone, it asks for what ``policy/fetch.py`` gives. A
shard at its cap waits for a slot to be freed. A shard with ``W_i = 0`` that contends
(its last exchange emptied its waiting work) may hold one slot: a probe that tells it
whether work came.

**Bound.** Take all of ``S`` backlogged, jobs of one slot and equal durations. The cap
keeps ``used_i <= ceil(e_i)``, and a slot above a floor is granted only out of slots no
floor needs. A free slot always has a taker: if no shard is below its floor, the floors
leave it spare and, since ``sum(ceil(e_i)) >= N - U``, a shard is below its ceiling (the
lowest ``used_i / W_i``, whom the turn serves first). A job that ends below a floor frees
a slot only that shard may take. So once the turns are done ``floor(e_i) <= used_i <=
ceil(e_i)`` for every shard, and no slot is free (``tests/policy/test_shardshare.py``
checks it through any order of ends); hence

    | used_i / (N - U)  -  W_i / sum W |  <  1 / (N - U)        (integer slots)

and starts follow slots held. Inside shard ``i``, fair queuing gives tenant ``t`` the
part ``w_t / W_i`` of the shard's starts, within one job per tenant
(``policy/fairqueue.py``). Every worker of the fleet applies the same rule to the same
weights, so tenant ``t``'s share of the fleet's starts is

    w_t / sum(W over the shards)  =  its weight's share of all the weight waiting,

within ``1 / N`` of a worker's slots times ``w_t / W_i`` (the integer error) plus the
fair queue's one-job lag. Errors that this does not remove:

- **staleness**: ``W_i`` is as of shard ``i``'s last exchange. A tenant that becomes
  active or idle in between is counted from the shard's next exchange, which comes
  within one job's run of its loop (a loop at its cap exchanges when a slot is freed)
  plus one round trip; under a steady backlog the weights do not move and the error is
  nought;
- **widths**: a job of width ``k`` may take a shard up to ``ceil(e_i) + k - 1``; a job
  wider than its shard's cap starts once the others' caps leave it the room;
- **durations and classes**: shares are of slots held; starts follow them for jobs of
  equal durations. ``W_i`` sums the classes of a lane, and the class rules inside a
  shard still decide between its classes;
- **a weight changed while its tenant waits** is counted as it was when the tenant
  became active until that class's fair set next empties (the store's sum then starts
  again from nought).

Everything here is pure: the pool (``runtime/slots.py``) passes what it knows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec

__all__ = ["ShardShare", "cap", "entitlements", "turn_key"]

#: a float sum of weights may miss an integer by rounding; below this it is that integer
_EPSILON = 1e-9


class ShardShare(msgspec.Struct, frozen=True):
    """One shard's standing at a worker."""

    weight: float  # waiting weight from its last exchange (0: none waiting, or not known)
    used: int  # slots its jobs hold on the worker
    contending: bool  # its loop is fetching; False: it waits on its wake lists


def _weighted(shares: Mapping[object, ShardShare]) -> dict[object, float]:
    return {k: s.weight for k, s in shares.items() if s.contending and s.weight > 0}


def _parts(
    concurrency: int, shares: Mapping[object, ShardShare]
) -> tuple[dict[object, float], int]:
    weighted = _weighted(shares)
    total = sum(weighted.values())
    held_elsewhere = sum(s.used for k, s in shares.items() if k not in weighted)
    base = max(0, concurrency - held_elsewhere)
    return {k: base * weighted.get(k, 0.0) / total if total else 0.0 for k in shares}, base


def entitlements(concurrency: int, shares: Mapping[object, ShardShare]) -> dict[object, float]:
    """Each contending shard's entitled slots ``e_i`` (see the module docstring); shards
    with no waiting weight, or not contending, are entitled to none."""
    return _parts(concurrency, shares)[0]


def cap(concurrency: int, shares: Mapping[object, ShardShare], shard: object) -> int | None:
    """The most ``shard``'s turn may ask for; None: no cap (no other shard with waiting
    weight contends), the ask is what the fetch policy gives.

    Up to ``floor(e_i)`` at once; the one slot more, to ``ceil(e_i)``, only out of the
    slots left once every shard of ``S`` holds its floor (so a +1 never takes a slot
    another shard's floor needs)."""
    mine = shares[shard]
    weighted = _weighted(shares)
    if not any(k != shard for k in weighted):
        return None
    if shard not in weighted:
        return 1 if mine.used == 0 else 0  # a probe: one slot, to learn its weight
    parts, base = _parts(concurrency, shares)
    floor = math.floor(parts[shard] + _EPSILON)
    if mine.used < floor:
        return floor - mine.used
    spare = base - sum(max(math.floor(parts[k] + _EPSILON), shares[k].used) for k in weighted)
    ceil = math.ceil(parts[shard] - _EPSILON)
    return max(0, min(spare, ceil - mine.used))


def turn_key(share: ShardShare) -> float:
    """The order in which waiting loops get the turn: lowest first."""
    if share.weight <= 0:
        return 0.0 if share.used == 0 else math.inf
    return share.used / share.weight
