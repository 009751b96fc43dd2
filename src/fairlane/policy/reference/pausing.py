"""An operator's pauses in the reference model: pause, resume, and what a resume gives
back (``fairlane.policy.pauses`` states the rules; ``store/lua/pauses.lua`` is the twin).
Dispatch's side -- holding a paused tenant, parking a paused task's or key's job, a
woken job giving its offers back -- is in ``fairlane.policy.reference.dispatch``."""

from __future__ import annotations

from fairlane.policy.fairkeys import order_score
from fairlane.policy.pauses import Scope, ScopeKind
from fairlane.policy.reference.dispatch import TASK, LaneDispatch, ModelJob

__all__ = ["PauseOps"]


class PauseOps(LaneDispatch):
    """Pause and resume, on the model's lanes."""

    def pause(self, scope: Scope, until_ms: int = 0, *, now: int = 0) -> None:
        """The scope's pause in force (its end replaced when it was paused already); the
        jobs it holds that wait with a throttle key's offers give them back, in the order
        of their ids (P4)."""
        self.pauses.pause(scope, until_ms)
        if scope.kind == ScopeKind.REFUSE:
            return
        for job_id in sorted(self.jobs):
            job = self.jobs[job_id]
            offered = self.throttles.offered(job_id) is not None
            if offered and job.status == "queued" and self._held_back(job, now):
                self._enter_woken(self.throttles.cancel(job_id))

    def resume(self, scope: Scope) -> bool:
        """End the scope's pause and give back what it held; whether it was paused."""
        if not self.pauses.resume(scope):
            return False
        if scope.kind == ScopeKind.TENANT:
            self._lift_tenant(scope.tenant)
        elif scope.kind in (ScopeKind.KEY, ScopeKind.TASK):
            parked = self.parked.pop(scope, {})
            for job_id in sorted(parked, key=lambda i: (parked[i], i)):
                job = self.jobs[job_id]
                assert parked[job_id] == order_score(job.prio, job.seq)
                if job.status == "queued":
                    self._push_ready(job)
        return True

    def _held_back(self, job: ModelJob, now: int) -> bool:
        return self.pauses.blocks(
            job.lane, job.cls, task=TASK, tenant=job.tenant, key=job.fkey, now_ms=now
        )

    def _lift_tenant(self, tenant: str) -> None:
        """P2: each class that held the tenant activates it again, if it has work there."""
        for (lane, cls), tenants in self.held.items():
            if tenant not in tenants:
                continue
            tenants.discard(tenant)
            cq = self.lane(lane).cls(cls)
            if cq.queues.get(tenant) and tenant not in cq.fair:
                self._activate(cq, tenant)

    def parked_ids(self, scope: Scope) -> list[str]:
        """The jobs a pause of ``scope`` parked, in the order a resume gives them back."""
        parked = self.parked.get(scope, {})
        return sorted(parked, key=lambda i: (parked[i], i))
