"""Weighted fair queuing of tenants inside one service class, charged by work units.

This is start-time fair queuing (SFQ; Goyal, Vin and Cheng, 1996) with tenants as
the flows and a dispatch as the "packet transmission". There is no link clock: the
server is whichever worker asks next, so virtual time moves only when a job is
dispatched. One :class:`FairQueue` serves one class of one lane.

State
-----
* ``V``, the class's virtual time: the start tag of the latest dispatch (0 at first).
* ``w_t > 0``, tenant ``t``'s weight (1 unless set).
* ``tag_t``, one number per tenant (0 at first). While ``t`` has waiting jobs it is
  *active* and ``tag_t`` is the start tag ``S_t`` of its next dispatch; while it has
  none it is *idle* and ``tag_t`` is the finish tag ``F_t`` its last job left.
* A job's cost ``c > 0`` in work units (1 until admission estimates exist).

Rules
-----
1. **Activate** (the first waiting job arrives): ``tag_t <- max(V, tag_t)``. A tenant
   back from idle starts at the present (no credit saved while away) but never before
   the finish of the job it last got (it cannot dodge that charge by going idle).
2. **Dispatch**: take the active tenant with the least ``(tag_t, t)`` -- ties go to the
   smaller tenant name, the order a Redis sorted set gives equal scores. Take its head
   job (least order key: the caller passes ``(-priority, seq)``, so higher priority
   first, then FIFO). Set ``V <- tag_t`` and charge ``tag_t <- tag_t + c / w_t``. If
   ``t`` has no more waiting jobs it goes idle, keeping ``tag_t`` as ``F_t``.
3. **Cancel** a waiting job: if it was ``t``'s last, ``t`` goes idle keeping ``tag_t``.
   That tag is ``F_t`` itself, or ``max(V_a, F_t)`` if ``t`` has not been dispatched
   since it activated at ``V_a``; as ``V >= V_a`` later, a return gives ``max(V, F_t)``
   either way: cancelling neither gains nor loses a place.
4. **Adjust** by ``delta`` units after a job ran: ``tag_t <- max(V, max(tag_t, V) +
   delta / w_t)``. A charge lands on the present even if ``t`` sat idle meanwhile; a
   refund can bring ``t`` to parity with ``V`` but never ahead of it.
5. **Set a weight**: ``w_t <- w``. Tags are not rescaled; the new weight applies from
   ``t``'s next charge (dispatch or adjust).

Invariants (no adjustments; ``c_t`` = cost of ``t``'s latest dispatched job, 0 if none)
------------------------------------------------------------------------------------
(I1) Every active tag is ``>= V``: rule 1 takes a max with ``V``, rule 2 moves ``V`` to
     the least active tag and the charged tenant above it, rule 4 clamps at ``V``.
     Hence ``V`` never decreases (it is always set to a tag that is ``>= V``).
(I2) ``tag_t <= V + c_t / w_t`` for every tenant: a dispatch leaves exactly
     ``V + c_t / w_t``, ``V`` only grows afterwards, and rule 1 gives either ``V`` or the
     old tag. For a weight changed since, read ``w_t`` as the one charged.

Fairness bound
--------------
Let tenants ``i`` and ``j`` both be active from a moment ``a`` up to the dispatch ``b``
(which may empty either). While ``i`` is active its successive start tags differ by
exactly ``c / w_i`` of the job it was charged for, so the work ``W_i`` dispatched to
``i`` in ``(a, b]`` satisfies ``W_i / w_i = tag_i(b) - tag_i(a)``. By (I1) and (I2)
both tags lie in ``[V, V + c_i^max / w_i]`` at their moment, so ``W_i / w_i`` is within
``c_i^max / w_i`` of ``V(b) - V(a)``, and likewise for ``j``. Therefore

    |W_i / w_i - W_j / w_j|  <=  c_i^max / w_i + c_j^max / w_j.

Over a long backlogged stretch the shares of work converge to ``w_i / sum(w)`` over
the *active* tenants only: an idle tenant's share flows to the others.

Latency bound for a tenant that becomes active
----------------------------------------------
Let ``t`` activate at ``V_a`` with tag ``S_t = max(V_a, F_t)``; by (I2)
``S_t - V_a <= c_t / w_t`` (``c_t`` its previous job; 0 for a new tenant or one whose
``F_t <= V_a``, i.e. idle long enough). Every job dispatched before ``t``'s first has a
start tag in ``[V_a, S_t]`` (at least ``V_a`` by (I1); at most ``S_t`` or ``t`` would
have gone first). Another tenant ``k``'s successive start tags grow by at least
``c / w_k`` per job (exactly while backlogged, more across an idle gap), so all but
the last of ``k``'s jobs in that window sum to at most ``w_k (S_t - V_a)``. Whatever
work ``k`` gets ahead of ``t``, including tenants that activate later, is bounded by

    W_k  <=  c_k^max + w_k (S_t - V_a)  <=  c_k^max + (w_k / w_t) c_t,

and in dispatches by ``1 + floor(w_k (S_t - V_a) / c_k^min)``. Summed, the work
dispatched between ``t``'s activation and its first job is at most

    sum_{k != t} (c_k^max + (w_k / w_t) c_t),

where ``c_t`` is ``t``'s *previous* job (0 if new or idle long enough): the cost of the
job ``t`` is waiting with does not matter, as SFQ orders by start tags. So a new tenant
waits for at most one job of each other tenant, whatever the backlog ahead of it.

Adjustments and weight changes
------------------------------
With adjustments, (I2) reads ``tag_t <= V + C_t / w_t`` with ``C_t`` the cost of
``t``'s latest job plus the positive deltas applied since it was dispatched, and in
the window a delta moves ``tag_i`` by ``delta / w_i`` plus whatever the clamp at ``V``
forfeits (``R_i`` units of refund in the window). So for charged work ``W*``
(dispatched cost plus deltas applied in the window)

    |W*_i / w_i - W*_j / w_j|  <=  (C_i^max + R_i) / w_i + (C_j^max + R_j) / w_j,

and the latency bound holds for charged work with ``S_t`` read when ``t`` is served.
A window that starts after a weight change (weights fixed within it) keeps the bound
with ``c^max / w`` read at the smaller of the old and new weight, since (I2) holds at
its start with the weight ``t`` was last charged at.

The store's activation credit
-----------------------------
The store (and its reference model, ``fairlane.policy.reference.model``) activates a tenant at
``max(F_t, V - r / m)`` instead of rule 1's ``max(V, tag_t)``, where ``r`` is the
class's work dispatched but not yet settled and ``m`` the number of active tenants
(``V`` alone when none is). Dispatch moves ``V`` to ``max(V, tag)``, so ``V`` still never
decreases. Why: workers lease ahead, so at the moment a tenant arrives up to ``r``
units have been dispatched to the others but not yet *run*; starting at ``V`` would
put the newcomer behind that leased work a second time. What it changes:

* the newcomer's start lies in ``[V_a - r / m, S_t]``, so it is served before anyone
  whose tag is above its own: the latency bound above holds with ``S_t - V_a <= c_t /
  w_t`` as before, and becomes 0 jobs of others ahead when ``F_t <= V_a - r / m``;
* (I1) weakens to ``tag_t >= V - r_max / m`` for a tenant while it catches up, so the
  pairwise bound gains one term: ``|W_i / w_i - W_j / w_j| <= c_i^max / w_i + c_j^max /
  w_j + r_max``, with ``r_max`` the most work in flight at an activation in the window
  -- at most the class's slots, however long the window. A tenant's credit is bounded
  by work in flight, never by how long it was idle, so going idle saves nothing.

Redis twin (every operation O(log n))
-------------------------------------
* ``active`` -- sorted set, member tenant, score ``tag_t``: exactly the active
  tenants. ``ZRANGE active 0 0 WITHSCORES`` is rule 2's choice (equal scores order by
  member bytes; UTF-8 byte order is code point order, which is Python's ``str`` order).
* ``state`` -- hash: field ``V``; ``tag:<t>`` holds an idle tenant's ``tag_t`` (an
  active tenant's lives in ``active``); ``w:<t>`` its weight when not 1.
* each tenant's waiting jobs -- a sorted set by order score (``q:<lane>:<tenant>``);
  ``ZCARD`` going 0 -> 1 or 1 -> 0 is activation or going idle.

Push is ``ZADD q`` (+ ``HGET``, ``ZADD active`` on activation); dispatch is ``ZRANGE
active 0 0``, ``ZPOPMIN q``, ``HGET w``, ``HSET V``, then ``ZADD``/``ZREM active`` (+
``HSET tag``); cancel is ``ZREM q`` (+ moving the tag to the hash); adjust is ``ZSCORE
active`` then ``ZADD active`` or ``HSET tag``. Tags are written with 17 significant
digits and computed in Lua doubles (not ``HINCRBYFLOAT``, which rounds through a long
double), so Lua and this model agree bit for bit. An idle ``tag:<t> <= V`` may be
deleted: a missing tag reads as 0, and rules 1 and 4 read an idle tag only through
``max(V, tag)``, so deletion changes no decision. Tags grow with dispatched work;
a double keeps 15-16 significant digits, so a tag of 1e9 resolves 1e-6 units.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

__all__ = ["Dispatch", "FairQueue", "FairQueueStatistics", "TenantSnapshot", "job_order"]

OrderKey = tuple[int, int]
# Lazy deletion leaves stale heap entries; rebuild a heap once they outnumber live ones.
_COMPACT_SLACK = 64


def job_order(priority: int, seq: int) -> OrderKey:
    """The order key of a job: higher ``priority`` first, then lower ``seq`` (FIFO)."""
    return (-priority, seq)


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A job taken by :meth:`FairQueue.pop`, with the tags it was charged between."""

    tenant: str
    job_id: str
    cost: float
    start_tag: float
    finish_tag: float


@dataclass(frozen=True, slots=True)
class TenantSnapshot:
    """One tenant's scheduling state (``tag`` is ``S_t`` when active, ``F_t`` when idle)."""

    tenant: str
    weight: float
    tag: float
    active: bool
    waiting: int
    dispatched: int
    work: float
    adjusted: float


@dataclass(frozen=True, slots=True)
class FairQueueStatistics:
    """Counters of one fair queue."""

    virtual_time: float
    tenants: int
    active_tenants: int
    waiting: int
    dispatched: int
    work: float
    adjusted: float


@dataclass(slots=True)
class _Tenant:
    tag: float = 0.0
    gen: int = 0  # bumped whenever the tenant's entry in the active heap changes
    waiting: int = 0
    jobs: list[tuple[OrderKey, str, int]] = field(default_factory=list)
    dispatched: int = 0
    work: float = 0.0
    adjusted: float = 0.0


@dataclass(frozen=True, slots=True)
class _Job:
    tenant: str
    cost: float
    push_no: int


def _check_positive(what: str, value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{what} must be a finite number > 0, got {value!r}")
    return float(value)


class FairQueue:
    """Start-time fair queuing of tenants by weight and work (see the module docstring).

    ``push``, ``pop``, ``remove``, ``adjust`` and ``set_weight`` take O(log n) amortized
    time (heaps with lazy deletion, compacted once stale entries outnumber live ones);
    ``statistics`` and ``tenant`` are O(1); ``active_tenants`` sorts, O(n log n).
    """

    def __init__(self) -> None:
        self._v = 0.0
        self._tenants: dict[str, _Tenant] = {}
        self._weights: dict[str, float] = {}
        self._jobs: dict[str, _Job] = {}
        self._active: list[tuple[float, str, int]] = []  # (tag, tenant, gen), lazy deletion
        self._n_active = 0
        self._pushes = 0
        self._dispatched = 0
        self._work = 0.0
        self._adjusted = 0.0

    @property
    def virtual_time(self) -> float:
        """``V``: the start tag of the latest dispatch; never decreases."""
        return self._v

    def weight(self, tenant: str) -> float:
        """``w_t``: 1 unless set."""
        return self._weights.get(tenant, 1.0)

    def push(
        self, tenant: str, job_id: str, cost: float = 1.0, order_key: OrderKey | None = None
    ) -> bool:
        """Queue a job; True when it made ``tenant`` active (rule 1).

        ``order_key`` orders the tenant's own jobs, least first (see :func:`job_order`);
        without one a job goes FIFO at priority 0. Equal keys order by ``job_id``.
        """
        if job_id in self._jobs:
            raise ValueError(f"job {job_id!r} is already waiting")
        cost = _check_positive("cost", cost)
        self._pushes += 1
        key = order_key if order_key is not None else job_order(0, self._pushes)
        self._jobs[job_id] = _Job(tenant, cost, self._pushes)
        state = self._tenants.setdefault(tenant, _Tenant())
        heapq.heappush(state.jobs, (key, job_id, self._pushes))
        state.waiting += 1
        if state.waiting > 1:
            return False
        state.tag = max(self._v, state.tag)
        self._n_active += 1
        self._enter(tenant, state)
        return True

    def pop(self) -> Dispatch | None:
        """Dispatch the head job of the active tenant with the least tag (rule 2)."""
        while self._active and not self._is_head(self._active[0]):
            heapq.heappop(self._active)
        if not self._active:
            return None
        tag, tenant, _ = self._active[0]
        state = self._tenants[tenant]
        job_id, job = self._take_head(state)
        finish = tag + job.cost / self.weight(tenant)
        self._v, state.tag = tag, finish
        state.dispatched += 1
        state.work += job.cost
        self._dispatched += 1
        self._work += job.cost
        state.gen += 1
        if state.waiting:
            heapq.heapreplace(self._active, (finish, tenant, state.gen))
        else:
            heapq.heappop(self._active)
            self._n_active -= 1
        return Dispatch(tenant, job_id, job.cost, tag, finish)

    def remove(self, job_id: str) -> bool:
        """Cancel a waiting job (rule 3); False if it is not waiting here."""
        job = self._jobs.pop(job_id, None)
        if job is None:
            return False
        state = self._tenants[job.tenant]
        state.waiting -= 1
        if state.waiting == 0:
            state.jobs.clear()
            state.gen += 1
            self._n_active -= 1
        elif len(state.jobs) > 2 * state.waiting + _COMPACT_SLACK:
            state.jobs = [e for e in state.jobs if self._live(e)]
            heapq.heapify(state.jobs)
        self._compact_active()
        return True

    def set_weight(self, tenant: str, weight: float) -> None:
        """Set ``tenant``'s weight; it applies from the tenant's next charge (rule 5)."""
        self._weights[tenant] = _check_positive("weight", weight)

    def adjust(self, tenant: str, delta: float) -> None:
        """Charge ``delta`` more work units (a refund if negative) to ``tenant`` (rule 4)."""
        if not math.isfinite(delta):
            raise ValueError(f"delta must be finite, got {delta!r}")
        state = self._tenants.setdefault(tenant, _Tenant())
        state.tag = max(self._v, max(state.tag, self._v) + delta / self.weight(tenant))
        state.adjusted += delta
        self._adjusted += delta
        if state.waiting:
            state.gen += 1
            self._enter(tenant, state)
            self._compact_active()

    def active_tenants(self) -> tuple[str, ...]:
        """The active tenants in the order their next jobs would go (by tag, then name)."""
        live = sorted((s.tag, t) for t, s in self._tenants.items() if s.waiting)
        return tuple(t for _, t in live)

    def tenant(self, tenant: str) -> TenantSnapshot:
        """A frozen snapshot of one tenant (defaults if it was never seen)."""
        s = self._tenants.get(tenant, _Tenant())
        return TenantSnapshot(
            tenant, self.weight(tenant), s.tag, s.waiting > 0, s.waiting,
            s.dispatched, s.work, s.adjusted,
        )  # fmt: skip

    def statistics(self) -> FairQueueStatistics:
        """A frozen snapshot of the queue's counters."""
        return FairQueueStatistics(
            self._v, len(self._tenants), self._n_active, len(self._jobs),
            self._dispatched, self._work, self._adjusted,
        )  # fmt: skip

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` naming the first broken invariant."""
        live = [(t, s) for t, s in self._tenants.items() if s.waiting]
        assert self._n_active == len(live), "active count drifted"
        heads = sorted((e[0], e[1]) for e in self._active if self._is_head(e))
        assert heads == sorted((s.tag, t) for t, s in live), "active heap differs from tenants"
        for t, s in live:
            assert s.tag >= self._v, f"(I1) active tenant {t} has tag {s.tag} < V {self._v}"
        per_tenant = sum(s.waiting for s in self._tenants.values())
        assert per_tenant == len(self._jobs), "waiting counts differ from the jobs held"
        for t, s in self._tenants.items():
            assert sum(1 for e in s.jobs if self._live(e)) == s.waiting, f"{t} queue drifted"

    # -- internals --------------------------------------------------------------------

    def _enter(self, tenant: str, state: _Tenant) -> None:
        heapq.heappush(self._active, (state.tag, tenant, state.gen))

    def _live(self, entry: tuple[OrderKey, str, int]) -> bool:
        job = self._jobs.get(entry[1])
        return job is not None and job.push_no == entry[2]

    def _take_head(self, state: _Tenant) -> tuple[str, _Job]:
        while True:
            entry = heapq.heappop(state.jobs)
            if self._live(entry):
                state.waiting -= 1
                if not state.waiting:
                    state.jobs.clear()
                return entry[1], self._jobs.pop(entry[1])

    def _is_head(self, entry: tuple[float, str, int]) -> bool:
        state = self._tenants[entry[1]]
        return state.gen == entry[2] and state.waiting > 0

    def _compact_active(self) -> None:
        if len(self._active) > 2 * self._n_active + _COMPACT_SLACK:
            self._active = [e for e in self._active if self._is_head(e)]
            heapq.heapify(self._active)
