"""A reference model of one app's job lifecycle, exactly as the Lua library runs it.

The model is the oracle: ``tests/store/test_model_vs_lua.py`` drives it and the real
scripts (``fairlane/store/lua/fairlane.lua``) with the same operations and requires the
same answers -- the same jobs in the same order with the same fencing tokens and
attempt numbers, the same fenced acks, the same reclaims. It is pure: no Redis, no
asyncio, no clock. Every operation is given ``now=`` (server milliseconds): the time
the script would have read with ``TIME``.

What it covers: enqueue (optionally delayed), fetch, lease renewal, acks (``ok``,
``retry``, ``dead``, ``release``) fenced by tokens, and the reclaim sweep. Deadlines,
idempotency keys, cancellation, retention trimming and malformed records are outside
it: the scripts' handling of those is tested on its own.

Rules, as in the scripts:

* **Order.** Each lane keeps a rotation of the tenants that have waiting work; a fetch
  pops the tenant at the head, takes that tenant's best job and puts the tenant at the
  tail if it has more. Within a tenant, higher priority first, then FIFO by ``seq``
  (a job keeps its ``seq`` for life, so a retried or released job goes back to its
  original place). A fetch over several lanes takes one job per lane in turn and stops
  when it has ``n`` jobs or every lane came up empty.
* **Attempts** are counted when a job is fetched; a ``release`` (a stopping worker
  handing a job back unstarted) gives the attempt back.
* **Fencing.** Every fetch draws a new token from one counter, so tokens only grow.
  An ack or a renewal is applied only if the job is running under that very token;
  otherwise the ack is rejected and counted as ``fenced``.
* **Reclaim.** A sweep at ``now`` takes up to ``limit`` leases that expired at or before
  ``now`` (earliest expiry first, ties by id). A reclaim counts as the attempt it
  interrupted: with ``attempts >= max_attempts`` the job is dead-lettered, otherwise it
  is scheduled ``delay_ms`` later (the scripts use the job's backoff; here the delay is
  given).
* **Promotion.** A fetch first moves the due scheduled jobs (``run_at <= now``, earliest
  first, ties by id) of its lanes back into their tenants' queues.

Invariants (``check_invariants``):

1. Every job is in exactly one place, matching its status: ``queued`` in its tenant's
   queue, ``scheduled`` in its lane's delayed set, ``running`` in the leases, and
   ``completed`` / ``failed`` in none of them (a failed job is in the dead-letter set).
   No job is lost and none is both finished and pending.
2. A tenant is in its lane's rotation exactly once while it has waiting jobs, else not.
3. ``0 <= attempts <= max_attempts``; a running job has made at least one attempt.
4. Running jobs hold distinct tokens, none above the counter; only running jobs hold one.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = ["AckKind", "Grant", "ModelJob", "QueueModel", "Status"]

Status = Literal["queued", "scheduled", "running", "completed", "failed"]
AckKind = Literal["ok", "retry", "dead", "release"]

#: The order score of a queued job is ``-prio * PRIO_SPAN + seq`` (``order_score`` in Lua).
PRIO_SPAN = 1 << 40
FINISHED: frozenset[str] = frozenset({"completed", "failed"})


class Grant(NamedTuple):
    """A job handed to a worker by ``fetch``."""

    id: str
    token: int
    attempt: int


@dataclass(slots=True)
class ModelJob:
    id: str
    tenant: str
    lane: str
    prio: int
    seq: int
    max_attempts: int
    status: Status
    run_at: int
    attempts: int = 0
    token: int | None = None
    worker: str | None = None
    finished_at: int | None = None
    lease_lost: bool = False  # the last failure was a reclaimed lease


class QueueModel:
    """The state of one app's jobs and the operations of the Lua library on it."""

    def __init__(self) -> None:
        self.jobs: dict[str, ModelJob] = {}
        self.seq = 0
        self.fence = 0
        self.rotation: dict[str, list[str]] = {}  # lane -> tenants with waiting work
        self.queues: dict[tuple[str, str], list[tuple[int, str]]] = {}  # sorted (score, id)
        self.delayed: dict[str, dict[str, int]] = {}  # lane -> id -> run_at
        self.leases: dict[str, int] = {}  # id -> expiry
        self.dead: dict[str, int] = {}  # id -> time dead-lettered
        self.stats: Counter[str] = Counter()

    # -- producer ---------------------------------------------------------------------

    def enqueue(
        self,
        job_id: str,
        tenant: str,
        lane: str,
        prio: int,
        max_attempts: int,
        *,
        now: int,
        delay_ms: int = 0,
    ) -> None:
        if job_id in self.jobs:
            raise ValueError(f"job {job_id} already exists")
        self.seq += 1
        run_at = now + delay_ms
        job = ModelJob(
            job_id, tenant, lane, prio, self.seq, max_attempts,
            "scheduled" if run_at > now else "queued", run_at,
        )  # fmt: skip
        self.jobs[job_id] = job
        if job.status == "scheduled":
            self.delayed.setdefault(lane, {})[job_id] = run_at
        else:
            self._push_ready(job)

    # -- worker -----------------------------------------------------------------------

    def fetch(
        self, worker: str, lanes: list[str], n: int, lease_ms: int, *, now: int
    ) -> list[Grant]:
        for lane in lanes:
            self._promote_due(lane, now)
        grants: list[Grant] = []
        empty, li = 0, -1
        while len(grants) < n and empty < len(lanes):
            li = (li + 1) % len(lanes)
            job = self._pop(lanes[li])
            if job is None:
                empty += 1
                continue
            empty = 0
            self.fence += 1
            job.attempts += 1
            job.status, job.token, job.worker = "running", self.fence, worker
            self.leases[job.id] = now + lease_ms
            grants.append(Grant(job.id, self.fence, job.attempts))
        return grants

    def next_due(self, lanes: list[str], *, now: int) -> int | None:
        """Milliseconds until the next scheduled job of ``lanes`` is due (after a fetch)."""
        times = [t for lane in lanes for t in self.delayed.get(lane, {}).values()]
        return max(0, min(times) - now) if times else None

    def renew(self, job_id: str, token: int, lease_ms: int, *, now: int) -> bool:
        """Extend the lease if it is still held under ``token``; False when it is lost."""
        if not self._holds(job_id, token):
            return False
        self.leases[job_id] = now + lease_ms
        return True

    def ack(self, job_id: str, token: int, kind: AckKind, *, now: int, delay_ms: int = 0) -> bool:
        """Settle an attempt; False when the token is stale (the ack is fenced)."""
        if not self._holds(job_id, token):
            self.stats["fenced"] += 1
            return False
        job = self.jobs[job_id]
        del self.leases[job_id]
        job.token = job.worker = None
        job.lease_lost = False
        if kind == "ok":
            self._finish(job, "completed", now)
        elif kind == "retry":
            self._schedule(job, now + delay_ms)
        elif kind == "dead":
            self._dead_letter(job, now)
        else:
            job.attempts -= 1
            job.status = "queued"
            self._push_ready(job)
        return True

    def sweep(self, limit: int, *, now: int, delay_ms: int = 0) -> tuple[list[str], list[str]]:
        """Reclaim up to ``limit`` expired leases; returns (ids retried, ids dead-lettered)."""
        expired = sorted((t, i) for i, t in self.leases.items() if t <= now)[:limit]
        retried: list[str] = []
        dead: list[str] = []
        for _, job_id in expired:
            job = self.jobs[job_id]
            del self.leases[job_id]
            job.token = job.worker = None
            job.lease_lost = True
            self.stats["reclaimed"] += 1
            if job.attempts >= job.max_attempts:
                self._dead_letter(job, now)
                dead.append(job_id)
            else:
                self._schedule(job, now + delay_ms)
                retried.append(job_id)
        return retried, dead

    # -- queries ----------------------------------------------------------------------

    def queue_ids(self, lane: str, tenant: str) -> list[str]:
        """A tenant's waiting jobs in the order they will run."""
        return [job_id for _, job_id in self.queues.get((lane, tenant), [])]

    def delayed_ids(self, lane: str) -> list[tuple[str, int]]:
        """A lane's scheduled jobs with their run times, in promotion order."""
        items = self.delayed.get(lane, {})
        return sorted(items.items(), key=lambda item: (item[1], item[0]))

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` naming the first broken invariant."""
        queued = Counter(i for q in self.queues.values() for _, i in q)
        scheduled = Counter(i for d in self.delayed.values() for i in d)
        for job in self.jobs.values():
            places = (queued[job.id], scheduled[job.id], int(job.id in self.leases))
            expected = {
                "queued": (1, 0, 0), "scheduled": (0, 1, 0), "running": (0, 0, 1),
            }.get(job.status, (0, 0, 0))  # fmt: skip
            assert places == expected, f"{job.id} ({job.status}) is in {places}"
            assert (job.id in self.dead) == (job.status == "failed"), f"{job.id} dead set"
            assert 0 <= job.attempts <= job.max_attempts, f"{job.id} attempts {job.attempts}"
            assert (job.token is not None) == (job.status == "running"), f"{job.id} token"
            assert job.status != "running" or job.attempts >= 1, f"{job.id} runs unattempted"
        for (lane, tenant), queue in self.queues.items():
            count = self.rotation.get(lane, []).count(tenant)
            assert count == (1 if queue else 0), f"tenant {tenant} of {lane} in rotation {count}x"
        for lane, tenants in self.rotation.items():
            for tenant in tenants:
                assert self.queues.get((lane, tenant)), f"idle tenant {tenant} in {lane} rotation"
        tokens = [j.token for j in self.jobs.values() if j.token is not None]
        assert len(tokens) == len(set(tokens)), "two running jobs share a token"
        assert all(t <= self.fence for t in tokens), "a token above the counter"

    # -- internals --------------------------------------------------------------------

    def _holds(self, job_id: str, token: int) -> bool:
        job = self.jobs.get(job_id)
        return job is not None and job.status == "running" and job.token == token

    def _push_ready(self, job: ModelJob) -> None:
        queue = self.queues.setdefault((job.lane, job.tenant), [])
        if not queue:
            self.rotation.setdefault(job.lane, []).append(job.tenant)
        bisect.insort(queue, (-job.prio * PRIO_SPAN + job.seq, job.id))

    def _pop(self, lane: str) -> ModelJob | None:
        tenants = self.rotation.get(lane, [])
        while tenants:
            tenant = tenants.pop(0)
            queue = self.queues[(lane, tenant)]
            _, job_id = queue.pop(0)
            if queue:
                tenants.append(tenant)
            job = self.jobs[job_id]
            if job.status == "queued":
                return job
        return None

    def _promote_due(self, lane: str, now: int) -> None:
        for job_id, run_at in self.delayed_ids(lane):
            if run_at > now:
                break
            del self.delayed[lane][job_id]
            job = self.jobs[job_id]
            job.status = "queued"
            self._push_ready(job)

    def _schedule(self, job: ModelJob, run_at: int) -> None:
        job.status, job.run_at = "scheduled", run_at
        self.delayed.setdefault(job.lane, {})[job.id] = run_at
        self.stats["retried"] += 1

    def _finish(self, job: ModelJob, status: Literal["completed", "failed"], now: int) -> None:
        job.status, job.finished_at = status, now
        self.stats[status] += 1

    def _dead_letter(self, job: ModelJob, now: int) -> None:
        self.dead[job.id] = now
        self._finish(job, "failed", now)
