"""Fast paths: the policy core's decisions, re-stated on plain lists for the inner loop.

The policy core's objects are written to be read and proved (frozen dataclasses,
mappings by name, ``Fraction`` ranks, a fresh ``ClassTable`` per admission call). A
million dispatches through them would take minutes, so the engine uses these
equivalents instead. Each one keeps the core's math and is checked against the core's
own object on random small cases (``tests/sim/test_fastpath.py``, with hypothesis):

* :class:`ClassChooser` is ``fairlane.policy.classes.next_class`` for one table at one
  fixed capacity: the levels (assured, lend limit, ceiling, max width) are computed
  once by the core's own ``fairlane.policy.classes.levels``; per call it forms the
  claims, ranks the classes (``f / a`` compared exactly, as integers ``f * (L // a)``
  with ``L`` the lcm of the assured levels) and returns at the first class that may
  start -- holds and batch yielding depend only on better-ranked classes, and no
  better-ranked class starts, so stopping there changes nothing. With one-slot heads
  the answer depends only on ``f`` and ``min(d, a + 1)`` (demand enters the claims
  only through ``min(a, f + d)``), so ``choose_narrow`` memoises it.
* :class:`FairClass` is ``fairlane.policy.fairqueue.FairQueue`` (rules 1 and 2) with
  integer tenants, one FIFO ``deque`` per tenant and a heap of active tenants holding
  exactly one entry per active tenant (no cancel or adjust here, so no lazy
  deletion). The cost is given at pop time; tags are computed by the same expressions,
  so they agree bit for bit. Ties go to the smaller tenant name, as in the core.
* :class:`Gate` is ``fairlane.policy.admission.fits`` for one pool: rules 3-5, with the
  class rules' verdict on a lone head (no other class has a head, so none holds it back
  and none starts before a batch class) computed directly from the unit table's levels.
* ``TenantThrottle`` is the name of the throttle keys' fast path in the twins table:
  ``fairlane.sim.keys.FifoKeys``, the store's rule before issue 16 (``waiters=fifo``);
  the rule after it is ``fairlane.sim.keys.FairKeys``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from typing import Any

from fairlane.policy.admission import FullReason, PoolConfig, unit_table
from fairlane.policy.classes import ClassTable, levels
from fairlane.sim.keys import FifoKeys as TenantThrottle

__all__ = ["ClassChooser", "FairClass", "Gate", "TenantThrottle"]

_MEMO_SIZE = 1 << 16


class ClassChooser:
    """``next_class`` for one class table at a fixed capacity, on lists by class position.

    ``choose(f, w, d)``: ``f`` in-flight slots, ``w`` head widths (0: nothing waits),
    ``d`` waiting slots; returns the position of the class to start, or -1.
    """

    __slots__ = ("_memo", "a", "batch", "capacity", "ceil", "clip", "gap", "mult", "n", "top",
                 "widest")  # fmt: skip

    def __init__(self, table: ClassTable, capacity: int) -> None:
        self.capacity = capacity
        self.a, lend, self.ceil, self.widest = levels(table, capacity)
        self.n = len(self.a)
        self.gap = [a - x for a, x in zip(self.a, lend, strict=True)]  # the kept reserve
        self.top = [min(a, w) for a, w in zip(self.a, self.widest, strict=True)]
        lcm = math.lcm(*[a for a in self.a if a]) if any(self.a) else 1
        # rank bucket: non-batch before batch, a > 0 before a == 0 (the core's rank key)
        self.batch = [2 * c.batch + (a == 0) for c, a in zip(table, self.a, strict=True)]
        self.mult = [lcm // a if a else 1 for a in self.a]
        # Waiting demand enters only through min(a, f + d) and whether d > 0, so the
        # decision on one-slot heads is a function of f and min(d, a + 1): memoised.
        self.clip = [a + 1 for a in self.a]
        self._memo: dict[tuple[int, ...], int] = {}

    def choose_narrow(self, f: Sequence[int], d: Sequence[int]) -> int:
        """``choose`` when every head is one slot wide (``w[i] = 1`` iff ``d[i] > 0``)."""
        key = (*f, *[x if x < c else c for x, c in zip(d, self.clip, strict=True)])
        found = self._memo.get(key)
        if found is None:
            if len(self._memo) >= _MEMO_SIZE:
                self._memo.clear()
            found = self._memo[key] = self.choose(f, [1 if x else 0 for x in d], d)
        return found

    def choose(self, f: Sequence[int], w: Sequence[int], d: Sequence[int]) -> int:
        free = self.capacity - sum(f)
        if free <= 0:  # every start needs w <= free, and w >= 1
            return -1
        claims, total, heads = self._claims(f, w, d)
        if not heads:
            return -1
        if len(heads) == 1:  # a lone head: no other class can hold it back
            i = heads[0]
            return i if self._may_start(i, f[i], w[i], free, free - (total - claims[i])) else -1
        mult, bucket = self.mult, self.batch
        order = sorted([(bucket[i], f[i] * mult[i], i) for i in heads])
        a, ceil, widest = self.a, self.ceil, self.widest
        held = False
        for _, _, i in order:  # classes without a head are idle: neither start nor hold
            wi, fi = w[i], f[i]
            if wi > widest[i] or (fi + wi > a[i] and fi + wi > ceil[i]):
                continue  # too-wide, or at its ceiling: waits, holds nobody
            if fi + wi <= a[i]:  # within assured: never held back
                if wi <= free:
                    return i
                held = True
            elif wi > free or wi > free - (total - claims[i]) or held:
                held = True  # no-slots, no-spare, or held by a better-ranked class
            else:
                return i  # borrows from spare
        return -1

    def _claims(
        self, f: Sequence[int], w: Sequence[int], d: Sequence[int]
    ) -> tuple[list[int], int, list[int]]:
        """Each class's claim on the free slots, their sum, and the classes with a head."""
        a, gap, top = self.a, self.gap, self.top
        claims: list[int] = []
        heads: list[int] = []
        for i in range(self.n):
            fi, wi = f[i], w[i]
            x = fi
            if wi:
                heads.append(i)
                if fi + wi <= top[i]:  # waiting work claims while its head fits assured
                    x += max(d[i], wi)
            claims.append(max(0, min(a[i], max(x, gap[i])) - fi))
        return claims, sum(claims), heads

    def _may_start(self, i: int, fi: int, wi: int, free: int, spare: int) -> bool:
        if wi > self.widest[i]:
            return False
        if fi + wi <= self.a[i]:
            return wi <= free
        return fi + wi <= self.ceil[i] and wi <= free and wi <= spare


class FairClass:
    """Start-time fair queuing of integer tenants in one class (``FairQueue`` rules 1-2).

    ``tags``, ``queues``, ``weights`` and ``names`` are shared per-tenant lists (a tenant
    is in one class); ``v`` and the active heap are this class's.
    """

    __slots__ = ("active", "names", "queues", "tags", "v", "weights")

    def __init__(
        self,
        tags: list[float],
        queues: list[deque[Any]],
        weights: Sequence[float],
        names: Sequence[str],
    ) -> None:
        self.v = 0.0
        self.active: list[tuple[float, str, int]] = []
        self.tags, self.queues, self.weights, self.names = tags, queues, weights, names

    def push(self, t: int, item: Any, first: bool = False) -> bool:
        """Queue ``item`` last (``first``: first) in ``t``'s queue; True if it made ``t``
        active (rule 1). ``first`` is the order key of a job older than any waiting."""
        q = self.queues[t]
        if first:
            q.appendleft(item)
        else:
            q.append(item)
        if len(q) > 1:
            return False
        tag = self.tags[t]
        if tag < self.v:
            tag = self.tags[t] = self.v
        heapq.heappush(self.active, (tag, self.names[t], t))
        return True

    def head(self) -> int:
        """The active tenant with the least ``(tag, name)``, or -1."""
        return self.active[0][2] if self.active else -1

    def pop(self, cost: float) -> Any:
        """Dispatch the head tenant's first item, charging ``cost`` (rule 2)."""
        tag, name, t = self.active[0]
        q = self.queues[t]
        item = q.popleft()
        self.v = tag
        tag = tag + cost / self.weights[t]
        self.tags[t] = tag
        if q:
            heapq.heapreplace(self.active, (tag, name, t))
        else:
            heapq.heappop(self.active)
        return item

    def drop(self) -> Any:
        """Take the head tenant's first item out uncharged (``FairQueue.remove``, rule 3:
        its tag and ``V`` stay), as for a job that parks on a throttle key."""
        t = self.active[0][2]
        q = self.queues[t]
        item = q.popleft()
        if not q:
            heapq.heappop(self.active)
        return item


class Gate:
    """``admission.fits`` (rules 3-5) for one pool, on per-class and per-tenant counters."""

    __slots__ = ("a", "batch", "capacity", "ceil", "gap", "limits", "n", "reserve", "widest")

    def __init__(self, table: ClassTable, pool: PoolConfig) -> None:
        units = unit_table(table, pool)
        self.capacity = pool.capacity_milli
        self.reserve = pool.reserve_milli
        self.a, lend, self.ceil, self.widest = levels(units, self.capacity)
        self.gap = [a - x for a, x in zip(self.a, lend, strict=True)]
        self.n = len(self.a)
        self.batch = [c.batch for c in units]
        specs = [pool.admission(name) for name in table.names]
        # (tenant job limit, tenant milli limit, class job limit, class milli limit)
        self.limits = [
            (s.tenant_limit, s.tenant_queue_milli, s.max_queue, s.max_queue_milli) for s in specs
        ]

    def fits(
        self,
        i: int,
        mu: int,
        reserved: Sequence[int],
        admitted: Sequence[int],
        *,
        tenant_admitted: int,
        tenant_reserved: int,
        fresh: bool = True,
    ) -> FullReason | None:
        """None if a job of ``mu`` milli-units of class ``i`` may be admitted, else why not."""
        t_jobs, t_milli, q_jobs, q_milli = self.limits[i]
        if tenant_admitted >= t_jobs or (t_milli is not None and tenant_reserved + mu > t_milli):
            return "tenant_queue_full"
        if admitted[i] >= q_jobs or (q_milli is not None and reserved[i] + mu > q_milli):
            return "class_queue_full"
        width = mu if mu > 1 else 1
        used = sum(reserved)
        free = max(0, self.capacity - used)
        fi, ai = reserved[i], self.a[i]
        room = False
        if width <= self.widest[i]:
            if fi + width <= ai:
                room = width <= free
            elif fi + width <= self.ceil[i] and width <= free:
                others = 0  # the other classes' claims: their reserves (nothing waits there)
                for j in range(self.n):
                    if j != i:
                        x = max(reserved[j], self.gap[j])
                        others += max(0, min(self.a[j], x) - reserved[j])
                room = width <= free - others
        if room and (not fresh or self.capacity - used - mu >= self.reserve):
            return None
        return "class_full"
