"""Fair deferral: in which order a class's deferred jobs are admitted again.

The section Fair deferral of the admission contract (``docs/contracts/admission.md``).
One :class:`DeferredQueue` holds one class's deferred jobs in one lane; its store twin
is ``defer`` and ``readmit_class`` in ``lua/admission.lua`` (called by
``admit_deferred`` in ``lua/records.lua``).

Rules
-----
* **Groups.** The jobs wait grouped by tenant, each group FIFO by the job's submission
  ``seq`` (ties by job id, the order of a Redis sorted set).
* **Tenants by weight.** The same start-time fair rule as the lane's fair queue
  (``fairlane.policy.fairqueue``): a tenant whose group goes from empty to one job
  starts at ``max(V, F_t)`` (``F_t`` its finish tag, 0 if none); readmission tries the
  tenant with the least ``(tag, tenant)``; admitting its head sets ``V <- max(V, tag)``
  and charges ``tag <- tag + units / w_t``, where ``units`` is the job's reservation in
  units and never less than ``MIN_CHARGE_MILLI`` milli-units (a free job still moves
  its tenant on), and ``w_t`` the tenant's weight (the lane's weights, 1 unless set).
* **No head-of-line blocking across tenants.** A head that does not fit is passed over
  for the rest of the pass (room only shrinks within a pass, so it cannot fit later in
  it) and the next tenant by tag is tried: a smaller job of another tenant gets in.
* **Overtake bound.** The first head found not to fit while none is pinned becomes the
  class's *pinned* head -- unless it could not fit even in an empty pool (``never``:
  wider than its tenant's or class's unit bound, than the class rules ever give the
  class, or than the pool leaves a fresh job above the recovery reserve), which is
  passed over but never pinned, so that it cannot hold its class for good. Every job
  of the class admitted while the pinned head waits (from the deferred queue, or a
  fresh submission that fits, see :meth:`note_admitted`) is one overtake. After
  ``OVERTAKE_LIMIT`` overtakes the class is *held*: readmission tries the pinned head
  only and stops at it while it does not fit, and the gate gives nothing else of the
  class room (``fits(..., held=True)`` is ``class_full``), so the room that frees is
  kept for the pinned head. Once it is admitted (or leaves: cancelled, expired) the
  pin and its count are cleared. So a wide head waits for at most ``OVERTAKE_LIMIT``
  admissions of its class past it, then for room to free.
* **Bounded pass.** One pass tries at most ``PASS_BUDGET`` heads of a class (admitted,
  passed over or dropped); the rest waits for the next release.
* **Leaving without admission** (``drop``: a job cancelled or expired while it waited,
  found when a pass reaches it): the job leaves its group uncharged; if it was pinned,
  the pin is cleared.
* **State left behind.** An empty group leaves nothing; a tenant whose group empties
  keeps its tag as ``F_t`` only while it is above ``V``, and finish tags at or below
  ``V`` are deleted after every pass (rule 1 reads ``F_t`` only through ``max(V, F_t)``,
  so deleting them changes no decision). A pass that leaves no deferred job deletes
  ``V``, the finish tags and the pin: the queue's state lives only as long as some
  job waits in it. What that forgives a returning tenant is its last charge above
  ``V`` (at most one job's ``units / w_t``), and only when nobody was left waiting.

What a pinned head can lose: ``OVERTAKE_LIMIT`` admissions of its class (plus what
other classes take under the class rules). What a backlogged tenant can lose to
another in the queue is the fair queue's bound, ``c_i^max / w_i + c_j^max / w_j`` in
tag units, plus the jobs admitted past its head while that head did not fit.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Generic, Literal, TypeVar

import msgspec

from fairlane.policy.admission.cost import MIN_CHARGE_MILLI

__all__ = [
    "OVERTAKE_LIMIT",
    "PASS_BUDGET",
    "DeferredQueue",
    "Readmission",
    "Verdict",
    "charge_units",
]

OVERTAKE_LIMIT = 8
"""Admissions of its class a pinned (waiting, not fitting) deferred head lets past."""
PASS_BUDGET = 32
"""Heads of one class one readmission pass tries at most."""

Verdict = Literal["admit", "wait", "never", "drop"]
T = TypeVar("T", str, int)


def charge_units(milli_units: int) -> float:
    """What admitting a deferred job charges its tenant's tag (before the weight)."""
    return max(milli_units, MIN_CHARGE_MILLI) / 1000


class Readmission(msgspec.Struct, Generic[T], frozen=True):
    """A head a pass took out of the queue: admitted, or dropped (left uncharged)."""

    job_id: str
    tenant: T
    milli_units: int
    admitted: bool


class _Entry(msgspec.Struct, Generic[T]):
    seq: int
    job_id: str
    tenant: T
    milli_units: int


class DeferredQueue(msgspec.Struct, Generic[T]):
    """One class's deferred jobs: tenant groups, their tags, ``V`` and the pin."""

    v: float = 0.0
    tags: dict[T, float] = msgspec.field(default_factory=dict)
    """Active tenants' start tags (their groups are non-empty)."""
    finish: dict[T, float] = msgspec.field(default_factory=dict)
    """Idle tenants' finish tags, only those above ``v``."""
    groups: dict[T, list[tuple[int, str]]] = msgspec.field(default_factory=dict)
    jobs: dict[str, _Entry[T]] = msgspec.field(default_factory=dict)
    pin: str | None = None
    overtakes: int = 0

    def __len__(self) -> int:
        return len(self.jobs)

    @property
    def held(self) -> bool:
        """Whether the pinned head has been overtaken ``OVERTAKE_LIMIT`` times."""
        return self.pin is not None and self.overtakes >= OVERTAKE_LIMIT

    def push(self, tenant: T, job_id: str, seq: int, milli_units: int) -> None:
        """A job is deferred (or deferred again); its tenant activates if it had none."""
        if job_id in self.jobs:
            raise ValueError(f"job {job_id!r} is already deferred")
        self.jobs[job_id] = _Entry(seq, job_id, tenant, milli_units)
        group = self.groups.get(tenant)
        if group is None:
            group = self.groups[tenant] = []
            self.tags[tenant] = max(self.v, self.finish.pop(tenant, 0.0))
        bisect.insort(group, (seq, job_id))

    def order(self) -> list[str]:
        """Every deferred job id by ``(seq, id)``: the class's deferred index."""
        return [e.job_id for e in sorted(self.jobs.values(), key=lambda e: (e.seq, e.job_id))]

    def note_admitted(self) -> None:
        """A job of the class was admitted while the pinned head waits: one overtake."""
        if self.pin is not None:
            self.overtakes += 1

    def readmit(
        self,
        judge: Callable[[str, T, int], Verdict],
        weight: Callable[[T], float],
        budget: int = PASS_BUDGET,
    ) -> list[Readmission[T]]:
        """One pass after a release. ``judge(job_id, tenant, milli_units)`` says whether
        a head fits now (``admit``: the caller reserves it before the next call), does
        not (``wait``), could not even in an empty pool (``never``) or leaves uncharged
        (``drop``). Returns the heads taken, in order."""
        out: list[Readmission[T]] = []
        passed: set[T] = set()
        tried = 0
        while tried < budget and self.jobs:
            if self.held:
                assert self.pin is not None
                entry = self.jobs[self.pin]
                tried += 1
                verdict = judge(entry.job_id, entry.tenant, entry.milli_units)
                if verdict in ("wait", "never"):
                    break
                out.append(self._take(entry, verdict == "admit", weight))
                continue
            tenant = self._next(passed)
            if tenant is None:
                break
            entry = self.jobs[self.groups[tenant][0][1]]
            tried += 1
            verdict = judge(entry.job_id, entry.tenant, entry.milli_units)
            if verdict in ("wait", "never"):
                passed.add(tenant)
                if self.pin is None and verdict == "wait":
                    self.pin, self.overtakes = entry.job_id, 0
                continue
            out.append(self._take(entry, verdict == "admit", weight))
        self._prune()
        return out

    def check_invariants(self) -> None:
        assert set(self.tags) == set(self.groups), "active tenants differ from groups"
        assert not set(self.finish) & set(self.tags), "a tenant both active and idle"
        assert all(f > self.v for f in self.finish.values()), "a finish tag at or below V"
        assert sum(len(g) for g in self.groups.values()) == len(self.jobs)
        assert all(self.groups.values()), "an empty group was left behind"
        assert self.pin is None or self.pin in self.jobs, "the pin names no deferred job"

    # -- internals -----------------------------------------------------------------------

    def _next(self, passed: set[T]) -> T | None:
        best: tuple[float, T] | None = None
        for tenant, tag in self.tags.items():
            if tenant not in passed and (best is None or (tag, tenant) < best):
                best = (tag, tenant)
        return None if best is None else best[1]

    def _take(
        self, entry: _Entry[T], admitted: bool, weight: Callable[[T], float]
    ) -> Readmission[T]:
        del self.jobs[entry.job_id]
        group = self.groups[entry.tenant]
        group.remove((entry.seq, entry.job_id))
        tag = self.tags[entry.tenant]
        if admitted:
            self.v = max(self.v, tag)
            # the weight is read at the charge (as the fair queue's rule 5)
            tag = tag + charge_units(entry.milli_units) / weight(entry.tenant)
            self.tags[entry.tenant] = tag
            if self.pin is not None and self.pin != entry.job_id:
                self.overtakes += 1
        if self.pin == entry.job_id:
            self._unpin()
        if not group:
            del self.groups[entry.tenant]
            del self.tags[entry.tenant]
            if tag > self.v:
                self.finish[entry.tenant] = tag
        return Readmission(entry.job_id, entry.tenant, entry.milli_units, admitted)

    def _unpin(self) -> None:
        self.pin, self.overtakes = None, 0

    def _prune(self) -> None:
        self.finish = {t: f for t, f in self.finish.items() if f > self.v}
        if not self.jobs:
            self.v, self.finish = 0.0, {}
            self._unpin()
