"""Throttle keys in the simulator: the issue-16 rules (fair waiters) and the rule before.

A key has a limit, holders (``in_use``) and waiters. Keys are integers (the world's
``key_names``: each tenant's own ``tenant:<name>`` first, then the scenario's shared
keys); a job's keys are its tenant's ``keys_of``, in sorted name order, taken all or
nothing. Both tables answer the engine the same way: ``take`` admits a job on all its
keys or parks it (holding nothing) at its first full key; ``release`` frees a job's
keys; jobs a key lets go of are appended to ``out`` for the engine to place.

:class:`FairKeys` -- the rules of issue 16 (the store's after it, ``waiters=fair``):

1. A key is taken only at dispatch, by a job that also has a lane slot. A woken job
   holds one *offer* on each of its keys and converts them into holds if each key then
   has ``in_use < limit``; any other job is admitted iff ``room(k) = limit - in_use -
   offers > 0`` on every key. A job that is not admitted parks; its tenant is not
   charged in the lane's fair queue for it (the engine drops it uncharged).
2. A key's waiters are grouped by tenant, FIFO (by ``seq``) within a group; between
   groups, start-time fair queuing per key: a group that becomes non-empty starts at
   ``max(F(t), V)``; waking a waiter of ``t`` sets ``V = max(V, S(t))`` and adds
   ``charge / weight(t)`` to ``S(t)``, the charge being the one the lane's fair queue
   takes for the job (``cost_of``). Ties go to the smaller tenant name.
3. While ``room(k) > 0`` and ``k`` has waiters, the least-tag group's head is tried on
   all its keys: one without room gets it (it *moves*, holding nothing, uncharged);
   otherwise it takes an offer on each key and is handed to the engine, which puts it
   back into its tenant's queue at its own position. So a key with waiters has no
   room (no barging), and an offer is never made beyond the limit.

:class:`FifoKeys` -- the store's rule before issue 16 (``waiters=fifo``): a job takes
its keys when the fair queue dispatches it (charged either way), one FIFO of waiters
per key across tenants, and a release hands its slot straight to the head waiter,
which holds it while it waits for a lane slot (the engine's granted queue).

Both count each key's *hand-offs* (every time a job takes a slot on it) and, for a job
that parked, record how many hand-offs of the key it first parked at went by until it
took its keys, itself included (1: it got the very next slot), in ``waited`` by tenant.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["FairKeys", "FifoKeys"]

_SEQ, _TEN, _OFF, _PARK = 0, 1, 7, 8  # the job fields used here (fairlane.sim.world's)


def _took(job: Any, keys: tuple[int, ...], handoffs: list[int], waited: list[list[int]]) -> None:
    """``job`` took a slot on each of ``keys``: count the hand-offs, and what it waited."""
    for k in keys:
        handoffs[k] += 1
    parked = job[_PARK]
    if parked is not None:
        k, before = parked
        waited[job[_TEN]].append(handoffs[k] - before)
        job[_PARK] = None


class FairKeys:
    """Keys taken at dispatch; waiters by tenant, woken start-time fairly, with offers.

    The simulator's one fast path of tenant-fair waiters: :class:`fairlane.sim.rates.
    FairRateKeys` adds rates, adaptive limits and pauses to it and keeps its groups,
    tags, offers and wakes."""

    __slots__ = ("active", "cost_of", "groups", "handoffs", "in_use", "keys_of", "limit",
                 "offers", "tags", "tenant_names", "vt", "waited", "weights")  # fmt: skip

    def __init__(
        self,
        limits: Sequence[int],
        keys_of: Sequence[tuple[int, ...]],
        waited: list[list[int]],
        *,
        names: Sequence[str],
        weights: Sequence[float],
        cost_of: Callable[[Any], float],
    ) -> None:
        n = len(limits)
        self.limit, self.in_use, self.offers = list(limits), [0] * n, [0] * n
        self.handoffs, self.waited = [0] * n, waited
        self.keys_of, self.weights, self.cost_of = keys_of, weights, cost_of
        self.tenant_names = names
        self.groups: list[dict[int, list[tuple[int, Any]]]] = [{} for _ in range(n)]
        self.active: list[list[tuple[float, str, int]]] = [[] for _ in range(n)]
        self.tags: list[dict[int, float]] = [{} for _ in range(n)]
        self.vt = [0.0] * n

    def set_limit(self, k: int, limit: int, out: list[Any]) -> None:
        """The limit given with a dispatch is in force at once; a raise wakes waiters."""
        raised = limit > self.limit[k]
        self.limit[k] = limit
        if raised and self.active[k]:
            self.wake(k, out)

    def room(self, k: int) -> int:
        return self.limit[k] - self.in_use[k] - self.offers[k]

    def take(self, job: Any, out: list[Any]) -> bool:
        """Admit ``job`` on all its keys (rule 1), or park it at its first full key."""
        keys = self.keys_of[job[_TEN]]
        if job[_OFF]:
            return self._convert(job, keys, out)
        limit, in_use, offers = self.limit, self.in_use, self.offers
        for k in keys:
            if limit[k] - in_use[k] - offers[k] <= 0:
                self._park(k, job)
                return False
        for k in keys:
            in_use[k] += 1
        _took(job, keys, self.handoffs, self.waited)
        return True

    def release(self, keys: tuple[int, ...], out: list[Any]) -> None:
        """Free one slot on each of ``keys``, then wake each key that has room."""
        for k in keys:
            self.in_use[k] -= 1
        for k in keys:
            if self.active[k] and self.room(k) > 0:
                self.wake(k, out)

    def wake(self, k: int, out: list[Any]) -> None:
        """Rule 3: offers to the least-tag groups' heads while ``k`` has room."""
        active, groups = self.active[k], self.groups[k]
        while active and self.room(k) > 0:
            t = active[0][2]
            job = heapq.heappop(groups[t])[1]
            keys = self.keys_of[t]
            blocker = next((j for j in keys if self.room(j) <= 0), -1)
            if blocker >= 0:
                self._move(k, t, blocker, job)
                continue
            self._offer(k, t, job, self.cost_of(job), out)

    def waiting(self, k: int) -> int:
        return sum(len(g) for g in self.groups[k].values())

    # -- the waiters' pieces, the same with rates ----------------------------------------

    def _blocks(self, k: int, t: int, waking: int) -> bool:
        """Whether key ``k`` keeps tenant ``t``'s job from taking it (no room)."""
        return self.limit[k] - self.in_use[k] - self.offers[k] <= 0

    def _give_back(self, k: int, t: int) -> None:
        """A woken job of tenant ``t`` that cannot start returns its offer on ``k``."""
        self.offers[k] -= 1

    def _convert(self, job: Any, keys: tuple[int, ...], out: list[Any]) -> bool:
        """A woken job turns its offers into holds if every key still has a free slot."""
        job[_OFF] = 0
        limit, in_use, offers = self.limit, self.in_use, self.offers
        if all(in_use[k] < limit[k] for k in keys):
            for k in keys:
                offers[k] -= 1
                in_use[k] += 1
            _took(job, keys, self.handoffs, self.waited)
            return True
        t = job[_TEN]
        for k in keys:  # a lowered limit: the offers go back, and it waits again
            self._give_back(k, t)
        self._park(next(k for k in keys if self._blocks(k, t, -1)), job)
        for k in keys:
            if self.active[k] and self.room(k) > 0:
                self.wake(k, out)
        return False

    def _move(self, k: int, t: int, blocker: int, job: Any) -> None:
        """The head of ``t``'s group on ``k`` is blocked on ``blocker``: it moves there,
        uncharged; its tenant keeps its tag on ``k``."""
        if not self.groups[k][t]:
            del self.groups[k][t]
            heapq.heappop(self.active[k])
        self._park(blocker, job)

    def _offer(self, k: int, t: int, job: Any, charge: float, out: list[Any]) -> None:
        """The head of ``t``'s group on ``k`` leaves with an offer on each of its keys;
        ``V`` reaches its tag, and the tag grows by ``charge / weight``."""
        active, group = self.active[k], self.groups[k][t]
        tag, name, _ = active[0]
        self.vt[k] = max(self.vt[k], tag)
        tag += charge / self.weights[t]
        self.tags[k][t] = tag
        if group:
            heapq.heapreplace(active, (tag, name, t))
        else:
            del self.groups[k][t]
            heapq.heappop(active)
        for j in self.keys_of[t]:
            self.offers[j] += 1
        job[_OFF] = 1
        out.append(job)

    def _park(self, k: int, job: Any) -> None:
        t = job[_TEN]
        if job[_PARK] is None:
            job[_PARK] = (k, self.handoffs[k])
        group = self.groups[k].get(t)
        if group is None:
            group = self.groups[k][t] = []
            v = self.vt[k]
            tag = self.tags[k].get(t, v)
            if tag < v:  # a finish tag at or below V says nothing more than V
                tag = v
                self.tags[k].pop(t, None)
            heapq.heappush(self.active[k], (tag, self.tenant_names[t], t))
        heapq.heappush(group, (job[_SEQ], job))


class FifoKeys:
    """Keys taken when the fair queue dispatches; one FIFO of waiters per key, and a
    hand-off that grants the slots at once (held while the job waits for a lane slot)."""

    __slots__ = ("handoffs", "in_use", "keys_of", "limit", "waited", "waiters")

    def __init__(
        self, limits: Sequence[int], keys_of: Sequence[tuple[int, ...]], waited: list[list[int]]
    ) -> None:
        n = len(limits)
        self.limit, self.in_use, self.keys_of = list(limits), [0] * n, keys_of
        self.handoffs, self.waited = [0] * n, waited
        self.waiters: list[list[tuple[int, Any]]] = [[] for _ in range(n)]

    def set_limit(self, k: int, limit: int, out: list[Any]) -> None:
        """The limit given with an acquire is in force at once; a raise drains first."""
        raised = limit > self.limit[k]
        self.limit[k] = limit
        if raised and self.waiters[k]:
            self._drain(k, out)

    def take(self, job: Any, out: list[Any]) -> bool:
        keys = self.keys_of[job[_TEN]]
        limit, in_use = self.limit, self.in_use
        for k in keys:
            if in_use[k] >= limit[k]:
                self._park(k, job)
                return False
        for k in keys:
            in_use[k] += 1
        _took(job, keys, self.handoffs, self.waited)
        return True

    def release(self, keys: tuple[int, ...], out: list[Any]) -> None:
        """Free one slot on each key; each freed key hands its room to its waiters."""
        limit, in_use, waiters = self.limit, self.in_use, self.waiters
        for k in keys:
            in_use[k] -= 1
        for k in [k for k in keys if waiters[k] and in_use[k] < limit[k]]:
            self._drain(k, out)

    def waiting(self, k: int) -> int:
        return len(self.waiters[k])

    def _drain(self, k: int, out: list[Any]) -> None:
        limit, in_use, queue = self.limit, self.in_use, self.waiters[k]
        while queue and in_use[k] < limit[k]:
            job = heapq.heappop(queue)[1]
            keys = self.keys_of[job[_TEN]]
            blocker = next((j for j in keys if in_use[j] >= limit[j]), -1)
            if blocker >= 0:
                self._park(blocker, job)
                continue
            for j in keys:
                in_use[j] += 1
            _took(job, keys, self.handoffs, self.waited)
            out.append(job)

    def _park(self, k: int, job: Any) -> None:
        if job[_PARK] is None:
            job[_PARK] = (k, self.handoffs[k])
        heapq.heappush(self.waiters[k], (job[_SEQ], job))
