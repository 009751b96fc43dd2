"""Global keys: one limit for an app of many shards, held in parts by its shards.

An app of ``n > 1`` shards runs each shard's dispatch in one atomic script on that
shard's primary, so no script can see a key's use on the other shards. A key named by
tenants of several shards (``model:big``, ``model:rpm``) is therefore *global*: the
whole app runs it within its limit by giving each shard a **part** of it, a fraction
``part_i`` in ``[0, 1]`` with ``sum(part_i) <= 1``, and letting each shard's dispatch
decide alone against its part:

* a concurrency limit ``L`` becomes ``floor(part_i * L)`` slots on shard ``i``;
* a rate key of ``limit`` per ``per`` and burst ``B`` becomes, on shard ``i``, a bucket
  of ``part_i * limit`` per ``per`` and burst ``part_i * B``.

Keys of one tenant (``tenant:<t>``, a lane's ``lane:<l>:tenant:<t>`` cap) live in that
tenant's shard and stay local: :func:`is_tenant_key`. An app of one shard has no global
keys at all.

The balancer
------------
One worker of the app at a time (a lease in the home shard) runs *passes*, each with an
*epoch* no earlier pass had. A pass reads every shard's report of its global keys
(:class:`KeyReport`), computes each key's target parts (:func:`targets`), then moves
capacity in two steps:

1. **lower** on the shards whose part shrinks: the shard sets its part and answers what
   it still *holds*, ``max(part, used / L)`` -- slots already running are not taken
   back, they are left to end;
2. **raise** on the shards whose part grows, by at most what is free once the lowers
   answered: ``1 - sum(held)`` (:func:`raises`).

A shard takes an order only from an epoch at least the highest it has seen, and a
report records the epoch: every order of an older pass that reaches a shard after the
newer pass read it is refused.

Proof of ``sum(running) <= L`` at every instant (concurrency; rates alike with tokens)
-----------------------------------------------------------------------------------
Let ``held_i = max(part_i, used_i / L)``. A shard dispatches only while ``used_i <
floor(part_i * L)``, so between two orders ``held_i`` never grows: ``used_i`` rises only
up to ``part_i * L``, and above it only falls. Claim: ``sum(held_i) <= 1`` always.

* A lower never raises ``held_i``.
* A pass raises shard ``j`` only after every report and every lower of the pass has
  answered; by the previous point each ``held_i`` it read is an upper bound of the
  shard's held now, unless an order changed it since -- and only a pass's own orders
  (sequential) or an older pass's can. An older pass's order that lands after this
  pass read the shard is refused (fencing). One that landed before it was read is in
  the report. So the free capacity the pass computes is a lower bound of the true
  free capacity, and a raise within it keeps the sum at most 1.

Since ``used_i <= held_i * L``, ``sum(used_i) <= L``. Worker deaths change nothing here:
a dead worker's jobs keep their slots until the shard's sweep frees them. A balancer
that dies mid-pass leaves parts lowered but not raised (capacity idle until the next
pass), never the reverse. What this does not cover: a primary that loses its last
writes in a failover may come back with a part (or tokens) an order had already taken.

Fairness across shards
----------------------
Targets share the key between shards by the weights of the tenants waiting on it in
each (the weighted max-min fair share of the parts, each shard capped at what it can
use: its running jobs plus its waiters), and what no waiter needs goes to the shards
that use the key, by weight, so an arrival there need not wait for a pass. Within a
shard the key is shared between tenants by weight as on one primary
(``fairlane.policy.throttle``). So a backlogged tenant's share of the key is its
weight's share of all waiting tenants' weights, less the rounding of parts to whole
slots (one slot per shard) and the lag of one pass behind a change of demand.

Rates
-----
A lowered or raised rate part takes effect on the tokens at once: the shard's bucket is
settled at its old part (its level as of now) and capped at the new burst. The virtual
bucket ``sum(level_i)`` is then at most ``sum(part_i) * B <= B`` and refills at most
``sum(part_i) * limit <= limit`` per ``per``, so the whole app takes at most ``B +
limit`` tokens in any window of ``per`` (``fairlane.policy.rates``' guarantee).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import msgspec

__all__ = [
    "EPSILON",
    "KeyReport",
    "Order",
    "PassPlan",
    "ShardParts",
    "held",
    "is_pool_key",
    "is_tenant_key",
    "plan_pass",
    "pool_key",
    "pool_part",
    "pool_scaled",
    "raises",
    "slots_of",
    "targets",
]

#: what a computed part may exceed a whole slot's worth by and still count as the slot
EPSILON = 1e-9


def is_tenant_key(key: str) -> bool:
    """A key of one tenant, which stays in that tenant's shard: ``tenant:<t>`` or a
    lane's per-tenant cap ``lane:<l>:tenant:<t>``."""
    if key.startswith("tenant:"):
        return True
    if key.startswith("lane:"):
        rest = key[len("lane:") :]
        lane, sep, tail = rest.partition(":")
        return bool(sep) and ":" not in lane and tail.startswith("tenant:")
    return False


def slots_of(part: float, limit: int) -> int:
    """The slots a part of a concurrency limit gives a shard."""
    return max(0, math.floor(part * limit + EPSILON))


class KeyReport(msgspec.Struct, frozen=True):
    """One shard's report of one global key."""

    part: float  # its part in force
    used: int  # slots held and offered on it
    limit: int | None  # its concurrency limit in force, None for a key of rates only
    waiting: int  # jobs parked on it
    weight: float  # the sum of the weights of the tenants waiting on it
    active: bool  # some job of the shard names it
    paused_until: int = 0  # ms of the server, 0: not paused


def held(report: KeyReport) -> float:
    """What a shard holds of a key: its part, or more while more runs than it."""
    if report.limit:
        return max(report.part, report.used / report.limit)
    return report.part


def targets(reports: Sequence[KeyReport]) -> list[float]:
    """Each shard's target part of one key (the module docstring's fair share)."""
    limits = [r.limit for r in reports if r.limit]
    if limits:
        return _slot_targets(reports, max(limits))
    return _rate_targets(reports)


def _weight(r: KeyReport) -> float:
    if r.waiting > 0:
        return max(r.weight, EPSILON)
    return 1.0 if r.active or r.used > 0 else 0.0


def _water_fill(capacity: float, demands: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Weighted max-min fair shares of ``capacity``: each ``min(demand, level * weight)``
    for the highest level that fits."""
    out = [0.0] * len(demands)
    live = [i for i, w in enumerate(weights) if w > 0 and demands[i] > 0]
    left = capacity
    while live and left > EPSILON:
        total = sum(weights[i] for i in live)
        level = left / total
        capped = [i for i in live if demands[i] - out[i] <= level * weights[i]]
        if not capped:
            for i in live:
                out[i] += level * weights[i]
            return out
        for i in capped:
            left -= demands[i] - out[i]
            out[i] = demands[i]
        live = [i for i in live if i not in capped]
    return out


def _spread_leftover(shares: list[float], capacity: float, reports: Sequence[KeyReport]) -> None:
    """What no waiter needs goes to the shards that use the key, by weight."""
    left = capacity - sum(shares)
    users = [i for i, r in enumerate(reports) if r.active or r.waiting > 0]
    if left <= EPSILON or not users:
        return
    total = sum(_weight(reports[i]) for i in users)
    for i in users:
        shares[i] += left * _weight(reports[i]) / total


def _slot_targets(reports: Sequence[KeyReport], limit: int) -> list[float]:
    demands = [float(r.used + r.waiting) for r in reports]
    shares = _water_fill(float(limit), demands, [_weight(r) for r in reports])
    _spread_leftover(shares, float(limit), reports)
    slots = [math.floor(s + EPSILON) for s in shares]
    # the slots rounding left over go to the largest remainders
    order = sorted(range(len(shares)), key=lambda i: (slots[i] - shares[i], i))
    for i in order[: max(0, math.floor(sum(shares) + EPSILON) - sum(slots))]:
        slots[i] += 1
    return [s / limit for s in slots]


def _rate_targets(reports: Sequence[KeyReport]) -> list[float]:
    demands = [1.0 if r.waiting > 0 else 0.0 for r in reports]
    shares = _water_fill(1.0, demands, [_weight(r) for r in reports])
    _spread_leftover(shares, 1.0, reports)
    total = sum(shares)
    return [s / total for s in shares] if total > 1.0 else shares


class Order(msgspec.Struct, frozen=True):
    """A part to set on one shard for one key; ``paused_until`` lengthens its pause."""

    key: str
    part: float
    paused_until: int = 0


def raises(wanted: Mapping[int, float], holding: Sequence[float]) -> dict[int, float]:
    """The parts a pass may raise shards to: each shard of ``wanted`` (shard -> target
    above its part) toward its target, in shard order, within what is free once
    ``holding`` (every shard's held part, after the lowers) is counted."""
    free = 1.0 - sum(holding)
    out: dict[int, float] = {}
    for shard in sorted(wanted):
        if free <= EPSILON:
            break
        now = holding[shard]
        part = min(wanted[shard], now + free)
        if part > now:
            out[shard] = part
            free -= part - now
    return out


class ShardParts:
    """One shard's side of one global key, as its Lua twin keeps it
    (``store/lua/globalkeys.lua``): the part in force, the slots in use, and the
    highest epoch seen. Orders of an older epoch are refused."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.part = 0.0
        self.used = 0
        self.epoch = 0

    def room(self) -> int:
        return slots_of(self.part, self.limit) - self.used

    def start(self) -> bool:
        """Dispatch one job on the key, if its part has room."""
        if self.room() <= 0:
            return False
        self.used += 1
        return True

    def end(self) -> None:
        """A job on the key ended (or its dead worker's lease was swept)."""
        self.used -= 1

    def fence(self, epoch: int) -> bool:
        if epoch < self.epoch:
            return False
        self.epoch = epoch
        return True

    def report(self, epoch: int) -> KeyReport | None:
        """The shard's report to a pass of ``epoch``; None when the epoch is stale."""
        if not self.fence(epoch):
            return None
        return KeyReport(self.part, self.used, self.limit, 0, 0.0, self.used > 0)

    def order(self, epoch: int, part: float) -> float | None:
        """Set the part (a lower or a raise); answers what the shard holds now, or None
        when the epoch is stale."""
        if not self.fence(epoch):
            return None
        self.part = part
        return held(KeyReport(self.part, self.used, self.limit, 0, 0.0, False))


_IDLE = KeyReport(0.0, 0, None, 0, 0.0, False)


class PassPlan(msgspec.Struct, frozen=True):
    """A pass's first step, from every shard's report: the orders that lower parts (and
    lengthen pauses), by shard; what each key's shards hold before them; and the parts
    each key's shards want above what they hold."""

    lowers: list[list[Order]]
    holding: dict[str, list[float]]
    wanted: dict[str, dict[int, float]]

    def raise_orders(self, answers: Sequence[Mapping[str, float]]) -> list[list[Order]]:
        """The second step, once the lowers answered (``answers``: each shard's held
        parts after its lowers): the orders that raise parts within what is free."""
        out: list[list[Order]] = [[] for _ in self.lowers]
        for key, wanted in self.wanted.items():
            holding = list(self.holding[key])
            for shard, answer in enumerate(answers):
                if key in answer:
                    holding[shard] = answer[key]
            for shard, part in raises(wanted, holding).items():
                out[shard].append(Order(key, part))
        return out


def plan_pass(reports: Sequence[Mapping[str, KeyReport]]) -> PassPlan:
    """What a pass does with its reports (one mapping of key -> report per shard)."""
    lowers: list[list[Order]] = [[] for _ in reports]
    holding: dict[str, list[float]] = {}
    wanted: dict[str, dict[int, float]] = {}
    for key in sorted({k for r in reports for k in r}):
        rows = [r.get(key, _IDLE) for r in reports]
        goal = targets(rows)
        holding[key] = [held(r) for r in rows]
        pause = max(r.paused_until for r in rows)
        up: dict[int, float] = {}
        for shard, (row, part) in enumerate(zip(rows, goal, strict=True)):
            behind = row.paused_until < pause
            if part < row.part - EPSILON or behind:
                lowers[shard].append(Order(key, min(part, row.part), pause if behind else 0))
            if part > holding[key][shard] + EPSILON:
                up[shard] = part
        if up:
            wanted[key] = up
    return PassPlan(lowers, holding, wanted)


# -- admission pools -------------------------------------------------------------------

#: an admission pool of lane ``L`` is the global key ``pool:<L>``; limit and rate keys
#: of users may not start with it (``registry.calls``), so no user key can name a pool
POOL_PREFIX = "pool:"


def pool_key(lane: str) -> str:
    """The global key of lane ``lane``'s admission pool."""
    return POOL_PREFIX + lane


def is_pool_key(key: str) -> bool:
    return key.startswith(POOL_PREFIX)


def pool_part(part: float | None, shards: int) -> float:
    """A shard's part of an admission pool: the part in force, or ``1 / shards`` while no
    pass has set one (``part`` None).

    A throttle key's absent part is none: only dispatch uses it, and every worker runs a
    balancer before it dispatches. A pool is used by producers, which submit before any
    worker (and so any balancer) runs; an equal share each sums to 1 over the shards, so
    the pool's bound holds from the first submission. For the same reason a pool's part
    is never cleaned up when idle (it would come back as ``1 / shards`` beside parts
    that already sum to 1), and a shard reports it as this share while it is absent, so
    that the balancer's view of the parts is the one the shards admit by (the Lua twin:
    ``keyparts.pool_part``)."""
    if part is None:
        return 1.0 / shards
    return part


def pool_scaled(value: int, part: float) -> int:
    """What a bound of the pool (its capacity, a class's floor or queue bounds, the
    recovery reserve, in milli-units or jobs) is on a shard of ``part``: rounded down,
    so that the shards' bounds sum to at most the pool's (``keyparts.scaled``)."""
    return max(0, math.floor(part * value + EPSILON))
