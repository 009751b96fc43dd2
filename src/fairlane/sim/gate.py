"""The admission gate in a run: reservations, deferral, rejection and resubmission.

This module owns the gate's state -- what ``fairlane.policy.admission.PoolState`` keeps,
as lists by class position and tenant index -- and what happens at the gate:

* **offer** (a submission): ``fastpath.Gate.fits`` (``admission.fits``, after the
  ``too_wide`` check of ``admission.decide``; the simulator has no deadlines) decides.
  Accepted, the job reserves its tenant's milli-units until it completes. Full, it is
  deferred when its class says ``when_full = "defer"`` and the deferred queue has room,
  else rejected with the reason; a rejected job is resubmitted after
  ``admission.retry_after`` (its tenant's rejections in the last 60 s, a seeded draw)
  while it has retries left, and otherwise lost.
* **release** (a job finished): the reservation is given back and each class's
  deferred queue makes one readmission pass, classes in table order, by fair deferral
  (``admission.DeferredQueue``, as the store): tenants by weighted start-time fair
  tags, FIFO within a tenant, a head that does not fit passed over for the pass, a
  pinned head held for after ``admission.OVERTAKE_LIMIT`` overtakes (then the class
  gives nothing else room, fresh submissions included), at most
  ``admission.PASS_BUDGET`` heads per pass.

Only fresh submissions reach the gate here (a yielding job keeps its reservation).
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable

from fairlane.policy.admission import DeferredQueue, Verdict, retry_after, to_milli
from fairlane.sim.raw import Raw
from fairlane.sim.scenario import Scenario
from fairlane.sim.world import REJ, SEQ, TEN, Job, World

__all__ = ["Admission"]

_MINUTE = 60.0


class Admission:
    """The gates of every lane that has one (lanes without a gate are never offered)."""

    def __init__(self, scenario: Scenario, world: World, raw: Raw) -> None:
        self.w, self.raw = world, raw
        lanes = world.lanes
        self.reserved = [[0] * len(lane.table) for lane in lanes]
        self.admitted = [[0] * len(lane.table) for lane in lanes]
        self.deferred: list[list[DeferredQueue[str]]] = [
            [DeferredQueue() for _ in lane.table] for lane in lanes
        ]
        self.pending: dict[str, Job] = {}
        """Deferred jobs by id (``str(seq)``)."""
        self.t_adm, self.t_res = [0] * world.tenants, [0] * world.tenants
        self.max_milli = to_milli(scenario.estimation.max_reservation_units)
        self.policy = scenario.retry.retry_after_policy
        self.rng = random.Random(f"{scenario.seed}:retry")
        self.recent: dict[int, deque[float]] = {}
        self.retry: list[tuple[float, int, Job]] = []
        """Rejected jobs waiting to resubmit: ``(when, seq, job)``."""
        self.waiting = 0
        """Deferred jobs, all lanes."""
        self.index = {name: t for t, name in enumerate(world.names)}

    def offer(self, job: Job, li: int, now: float) -> bool:
        """A submission to lane ``li``'s gate; True if accepted (the caller queues it)."""
        t = job[TEN]
        lane, apos, mu = self.w.lanes[li], self.w.apos_of[t], self.w.mu[t]
        assert lane.gate is not None
        if mu > self.max_milli:
            self._reject(job, t, "too_wide", now)
            return False
        queue = self.deferred[li][apos]
        reason = lane.gate.fits(
            apos, mu, self.reserved[li], self.admitted[li],
            tenant_admitted=self.t_adm[t], tenant_reserved=self.t_res[t],
        )  # fmt: skip
        if reason is None and queue.held:
            reason = "class_full"  # the class's room is kept for its pinned deferred head
        if reason is None:
            self._accept(t, li, apos, mu)
            queue.note_admitted()
            return True
        spec = lane.specs[apos]
        if spec.when_full == "defer" and len(queue) < spec.deferred_limit:
            job_id = str(job[SEQ])
            queue.push(self.w.names[t], job_id, job[SEQ], mu)
            self.pending[job_id] = job
            self.waiting += 1
            self.raw.max_deferred = max(self.raw.max_deferred, self.waiting)
            self.raw.deferrals[reason] += 1
        else:
            self._reject(job, t, reason, now)
        return False

    def release(self, t: int, li: int) -> list[Job]:
        """A job of ``t`` finished: give back its reservation; the deferred jobs now
        admitted, in admission order (the caller queues them)."""
        apos, mu = self.w.apos_of[t], self.w.mu[t]
        self.reserved[li][apos] -= mu
        self.admitted[li][apos] -= 1
        self.t_adm[t] -= 1
        self.t_res[t] -= mu
        if not self.waiting:
            return []
        gate = self.w.lanes[li].gate
        assert gate is not None
        admitted: list[Job] = []
        for pos, queue in enumerate(self.deferred[li]):
            if not queue:
                continue
            for r in queue.readmit(self._judge(li, pos), self._weight):
                admitted.append(self.pending.pop(r.job_id))
                self.waiting -= 1
        return admitted

    def _weight(self, name: str) -> float:
        return self.w.weight[self.index[name]]

    def _judge(self, li: int, pos: int) -> Callable[[str, str, int], Verdict]:
        """Whether a deferred head of lane ``li``'s class ``pos`` fits now (then it is
        reserved at once), could once its room frees, or never could."""
        gate = self.w.lanes[li].gate
        assert gate is not None
        empty = [0] * len(self.reserved[li])

        def judge(job_id: str, name: str, mu: int) -> Verdict:
            u = self.index[name]
            full = gate.fits(
                pos, mu, self.reserved[li], self.admitted[li],
                tenant_admitted=self.t_adm[u], tenant_reserved=self.t_res[u],
            )  # fmt: skip
            if not full:
                self._accept(u, li, pos, mu)
                return "admit"
            if gate.fits(pos, mu, empty, empty, tenant_admitted=0, tenant_reserved=0):
                return "never"
            return "wait"

        return judge

    def _accept(self, t: int, li: int, apos: int, mu: int) -> None:
        self.reserved[li][apos] += mu
        self.admitted[li][apos] += 1
        self.t_adm[t] += 1
        self.t_res[t] += mu

    def _reject(self, job: Job, t: int, reason: str, now: float) -> None:
        raw = self.raw
        raw.rejections[reason] += 1
        raw.rejected[t] += 1
        if job[REJ] >= self.w.retries[t]:
            raw.lost[t] += 1
            raw.unpend(t, now)
            return
        job[REJ] += 1
        recent = self.recent.setdefault(t, deque())
        recent.append(now)
        while recent[0] <= now - _MINUTE:
            recent.popleft()
        delay = retry_after(len(recent), self.rng.random(), self.policy)
        heapq.heappush(self.retry, (now + delay, job[SEQ], job))
