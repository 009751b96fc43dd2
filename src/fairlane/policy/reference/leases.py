"""The leases of the reference model: fencing tokens, renewals, reclaims and inboxes.

``fairlane.policy.reference.model`` states the rules (**Fencing**, **Reclaim**,
**Hand-off**); this module holds what a worker holds -- each running job's lease and
token, the ids leased to each worker (for its beats), the inboxes of jobs handed to idle
workers -- and the steps that end a lease without an ack: the sweep of expired leases
and stale workers, and a beat's reclaim of silent workers' jobs. A lease that ends
settles the job's slots and throttle grant through ``fairlane.policy.reference.
dispatch``; a job whose attempts are spent is dead-lettered.
"""

from __future__ import annotations

from typing import Literal

from fairlane.policy.reference.dispatch import Grant, LaneDispatch, ModelJob

__all__ = ["Leases"]


class Leases(LaneDispatch):
    """The lanes (``LaneDispatch``) with the leases their jobs run under (``QueueModel``'s
    base)."""

    def __init__(self) -> None:
        super().__init__()
        self.fence = 0
        self.leases: dict[str, int] = {}  # id -> expiry
        self.dead: dict[str, int] = {}  # id -> time dead-lettered
        self.inbox: dict[str, list[Grant]] = {}  # worker -> jobs handed to it, oldest first
        self.inbox_expiry: dict[str, int] = {}  # worker -> when its inbox vanishes
        # worker -> the ids leased to it, as the store keeps them for its beats (an id
        # leaves when its lease ends; the set goes when the worker leaves or is forgotten)
        self.leased: dict[str, set[str]] = {}

    def renew(self, job_id: str, token: int, lease_ms: int, *, now: int) -> bool:
        """Extend the lease if it is still held under ``token``; False when it is lost."""
        if not self._holds(job_id, token):
            return False
        self.leases[job_id] = now + lease_ms
        return True

    def heartbeat(self, worker: str, *, now: int) -> None:
        """A renewal call's heartbeat (it registers no capacity)."""
        self.heartbeats[worker] = now

    def sweep(
        self, limit: int, *, now: int, delay_ms: int = 0, stale_ms: int | None = None
    ) -> tuple[list[str], list[str]]:
        """Reclaim up to ``limit`` expired leases, then deregister up to ``limit`` workers
        whose heartbeat is ``stale_ms`` old (None: none); returns (retried, dead-lettered)."""
        expired = sorted((t, i) for i, t in self.leases.items() if t <= now)[:limit]
        retried: list[str] = []
        dead: list[str] = []
        for _, job_id in expired:
            self._reclaim(self.jobs[job_id], now, delay_ms, retried, dead)
        if stale_ms is not None:
            beats = sorted((t, w) for w, t in self.heartbeats.items() if t <= now - stale_ms)
            for _, worker in beats[:limit]:
                self._forget(worker)
        return retried, dead

    def beat(
        self, worker: str, dead_ms: int, limit: int, *, now: int, delay_ms: int = 0
    ) -> tuple[list[str], list[str], list[str]]:
        """A worker's beat: the jobs of the (at most two first) workers that beat and then
        fell silent for ``dead_ms`` are reclaimed, in id order, up to ``limit``; a dead
        worker with none left is deregistered. Returns (retried, dead-lettered, the dead
        workers looked at)."""
        self.beats[worker] = now
        silent = sorted((t, w) for w, t in self.beats.items() if t <= now - dead_ms)[:2]
        retried: list[str] = []
        dead: list[str] = []
        gone: list[str] = []
        for _, other in silent:
            if other == worker or len(retried) + len(dead) >= limit:
                continue
            gone.append(other)
            members = sorted(self.leased.get(other, ()))
            seen = 0
            for job_id in members:
                if len(retried) + len(dead) >= limit:
                    break
                seen += 1
                job = self.jobs.get(job_id)
                if job is not None and job.status == "running" and job.worker == other:
                    self._reclaim(job, now, delay_ms, retried, dead)
            if seen == len(members):
                self._forget(other)
            else:
                self.leased[other] -= set(members[:seen])
        return retried, dead, gone

    def _forget(self, worker: str) -> None:
        """A worker gone for good (stale, or dead by its beats): its capacity and inbox."""
        self._deregister(worker)
        self.leased.pop(worker, None)
        self.inbox.pop(worker, None)
        self.inbox_expiry.pop(worker, None)

    def _reclaim(
        self, job: ModelJob, now: int, delay_ms: int, retried: list[str], dead: list[str]
    ) -> None:
        self._end_lease(job, lost=True)
        self.stats["reclaimed"] += 1
        if job.attempts >= job.max_attempts:
            self._dead_letter(job, now)
            dead.append(job.id)
        else:
            self._schedule(job, now + delay_ms)
            retried.append(job.id)

    # -- a lease's life ---------------------------------------------------------------

    def _inbox(self, worker: str, now: int) -> list[Grant]:
        if worker in self.inbox_expiry and now > self.inbox_expiry[worker]:
            del self.inbox[worker], self.inbox_expiry[worker]
        return self.inbox.get(worker, [])

    def _lease(self, job: ModelJob, worker: str, lease_ms: int, now: int) -> Grant:
        self.lane(job.lane).cls(job.cls).run += 1
        self.fence += 1
        job.attempts += 1
        job.status, job.token, job.worker, job.started_at = "running", self.fence, worker, now
        job.settled = None
        self.leases[job.id] = now + lease_ms
        self.leased.setdefault(worker, set()).add(job.id)
        return Grant(job.id, self.fence, job.attempts)

    def _end_lease(self, job: ModelJob, *, lost: bool) -> None:
        """A running job's lease ends, settled (``lost=False``) or reclaimed: its slots,
        its in-flight work and its throttle slots go back."""
        del self.leases[job.id]
        if job.worker is not None:
            self.leased.get(job.worker, set()).discard(job.id)
        self._settle_running(job)
        self._release_throttle(job)
        job.token = job.worker = None
        job.lease_lost = lost

    def _holds(self, job_id: str, token: int) -> bool:
        job = self.jobs.get(job_id)
        return job is not None and job.status == "running" and job.token == token

    def _schedule(self, job: ModelJob, run_at: int, counter: str = "retried") -> None:
        job.status, job.run_at = "scheduled", run_at
        self.lane(job.lane).delayed[job.id] = run_at
        self.stats[counter] += 1

    def _finish(
        self, job: ModelJob, status: Literal["completed", "failed", "expired"], now: int
    ) -> None:
        job.status, job.finished_at = status, now
        self.stats[status] += 1

    def _dead_letter(self, job: ModelJob, now: int) -> None:
        self.dead[job.id] = now
        self._finish(job, "failed", now)
