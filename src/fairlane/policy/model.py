"""A reference model of one app's job lifecycle, exactly as the Lua library runs it.

The model is the oracle: ``tests/store/test_model_vs_lua.py`` drives it and the real
scripts (``fairlane/store/lua/fairlane.lua``) with the same operations and requires the
same answers -- the same jobs in the same order with the same fencing tokens and
attempt numbers, the same fenced acks, the same reclaims. It is pure: no Redis, no
asyncio, no clock. Every operation is given ``now=`` (server milliseconds): the time
the script would have read with ``TIME``.

What it covers: enqueue (optionally delayed), fetch, the hand-off of new jobs to idle
workers, lease renewal, acks (``ok``, ``retry``, ``dead``, ``release``) fenced by
tokens, and the reclaim sweep. Deadlines, idempotency keys, cancellation, retention
trimming, worker heartbeats and malformed records are outside it.

Rules, as in the scripts:

* **Order.** Tenants share a lane by start-time fair queuing, one work unit per job
  (``fairlane.policy.fairqueue`` derives it and its bounds). Each lane has a virtual
  time ``V``, its in-flight work ``run`` (leased jobs not yet settled), a start tag for
  each tenant with waiting work, and the finish tag of each idle tenant that has run.
  A tenant becomes active (its first waiting job arrives) with start tag
  ``max(finish tag, V - run / active tenants)`` (``V`` alone when none is active): it
  starts level with the work the others have finished, not merely dispatched, and an
  idle tenant's credit is bounded by the work in flight. A lane asked for ``want`` jobs
  repeatedly takes the active tenant with the smallest tag (ties: smaller name): a sole
  active tenant gives up to ``want`` jobs at once, otherwise one; each job dispatched
  sets ``V = max(V, tag)`` and adds ``1 / weight`` to the tag (weights are set with
  ``configure``, default 1, and apply from the next dispatch); a tenant left without waiting jobs
  becomes idle and keeps its tag as its finish tag. A fetch of ``n`` jobs over several
  lanes goes in rounds: in each round every lane still giving work is asked, in the
  order given, for an even share ``ceil(left / lanes)`` of what is still wanted; a lane
  with no active tenant drops out. Within a tenant, higher priority first, then FIFO by
  ``seq`` (a job keeps its ``seq`` for life, so a retried or released job goes back to
  its original place). ``run`` grows as jobs are leased and shrinks as they settle
  (after all the acks of one call) or are reclaimed.
* **Attempts** are counted when a job is leased (fetched or handed off); a ``release``
  (a stopping worker handing a job back unstarted) gives the attempt back.
* **Fencing.** Every lease draws a new token from one counter, so tokens only grow.
  An ack or a renewal is applied only if the job is running under that very token;
  otherwise the ack is rejected and counted as ``fenced``.
* **Reclaim.** A sweep at ``now`` takes up to ``limit`` leases that expired at or before
  ``now`` (earliest expiry first, ties by id). A reclaim counts as the attempt it
  interrupted: with ``attempts >= max_attempts`` the job is dead-lettered, otherwise it
  is scheduled ``delay_ms`` later (the scripts use the job's backoff; here the delay is
  given).
* **Hand-off.** A fetch that gives a worker nothing, asked with ``idle_ms``, registers
  it idle on its lanes until ``now + idle_ms`` (as ``worker|lease_ms``; the worker's
  next fetch with that lease ends the registration). At the batch's first job that
  is due now, an enqueue claims the lane's registration that lapses soonest (dropping
  lapsed ones, ties by member) and leases that job straight to the worker -- a token,
  an attempt, a lease of the registered length -- into its inbox instead of a queue.
  A batch of only scheduled jobs claims nobody. A fetch returns the worker's inbox
  first (even beyond ``n``, and then fetches only ``n`` minus those), the worker's
  blocking wait takes the inbox's oldest entry, a stopping worker's ``leave`` ends its
  registrations and takes its whole inbox (to hand it back), and an inbox vanishes once
  it has been left longer than the last lease handed into it.
* **Promotion.** A fetch first moves the due scheduled jobs (``run_at <= now``, earliest
  first, ties by id) of its lanes back into their tenants' queues (the scripts cap this
  at a promote limit per call, 1000 by default; the model has no cap).

Invariants (``check_invariants``):

1. Every job is in exactly one place, matching its status: ``queued`` in its tenant's
   queue, ``scheduled`` in its lane's delayed set, ``running`` in the leases, and
   ``completed`` / ``failed`` in none of them (a failed job is in the dead-letter set).
   No job is lost and none is both finished and pending.
2. A tenant is active in its lane exactly while it has waiting jobs; ``run`` equals the
   lane's running jobs.
3. ``0 <= attempts <= max_attempts``; a running job has made at least one attempt.
4. Running jobs hold distinct tokens, none above the counter; only running jobs hold one.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = ["AckKind", "Batch", "Grant", "ModelJob", "NewJob", "QueueModel", "Status"]

Status = Literal["queued", "scheduled", "running", "completed", "failed"]
AckKind = Literal["ok", "retry", "dead", "release"]

#: The order score of a queued job is ``-prio * PRIO_SPAN + seq`` (``order_score`` in Lua).
PRIO_SPAN = 1 << 40
FINISHED: frozenset[str] = frozenset({"completed", "failed"})


class Grant(NamedTuple):
    """A job leased to a worker: by ``fetch``, or handed to its inbox by an enqueue."""

    id: str
    token: int
    attempt: int


class Batch(NamedTuple):
    """What ``fetch`` gives a worker, and the ms until its lanes' next scheduled job."""

    jobs: list[Grant]
    next_due: int | None


class NewJob(NamedTuple):
    id: str
    tenant: str
    prio: int
    max_attempts: int
    delay_ms: int = 0


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
        self.fair: dict[str, dict[str, float]] = {}  # lane -> active tenant -> start tag
        self.finish: dict[str, dict[str, float]] = {}  # lane -> idle tenant -> finish tag
        self.vtime: dict[str, float] = {}  # lane -> V
        self.running: Counter[str] = Counter()  # lane -> in-flight jobs
        self.weights: dict[str, float] = {}  # tenant -> fair-share weight (absent: 1)
        self.queues: dict[tuple[str, str], list[tuple[int, str]]] = {}  # sorted (score, id)
        self.delayed: dict[str, dict[str, int]] = {}  # lane -> id -> run_at
        self.leases: dict[str, int] = {}  # id -> expiry
        self.dead: dict[str, int] = {}  # id -> time dead-lettered
        self.idle: dict[str, dict[str, int]] = {}  # lane -> 'worker|lease_ms' -> lapses at
        self.inbox: dict[str, list[Grant]] = {}  # worker -> jobs handed to it, oldest first
        self.inbox_expiry: dict[str, int] = {}  # worker -> when its inbox vanishes
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
        self.enqueue_batch(lane, [NewJob(job_id, tenant, prio, max_attempts, delay_ms)], now=now)

    def enqueue_batch(self, lane: str, batch: list[NewJob], *, now: int) -> None:
        """Enqueue jobs in one call (at most one idle worker is handed a job)."""
        ids = [spec.id for spec in batch]
        if len(set(ids)) < len(ids) or any(i in self.jobs for i in ids):
            raise ValueError(f"job ids must be new: {ids}")
        can_hand_off = True
        for spec in batch:
            self.seq += 1
            run_at = now + spec.delay_ms
            job = ModelJob(
                spec.id, spec.tenant, lane, spec.prio, self.seq, spec.max_attempts,
                "scheduled" if run_at > now else "queued", run_at,
            )  # fmt: skip
            self.jobs[spec.id] = job
            if job.status == "scheduled":
                self.delayed.setdefault(lane, {})[spec.id] = run_at
                continue
            idle = self._claim_idle(lane, now) if can_hand_off else None
            can_hand_off = False
            if idle is not None:
                worker, lease_ms = idle
                self.inbox.setdefault(worker, []).append(self._lease(job, worker, lease_ms, now))
                self.inbox_expiry[worker] = now + lease_ms
            else:
                self._push_ready(job)

    def configure(self, tenant: str, weight: float | None) -> None:
        """A tenant's fair-share weight (None: the default, 1); applies from its next dispatch."""
        if weight is None:
            self.weights.pop(tenant, None)
        else:
            self.weights[tenant] = weight

    # -- worker -----------------------------------------------------------------------

    def fetch(
        self, worker: str, lanes: list[str], n: int, lease_ms: int, *, now: int, idle_ms: int = 0
    ) -> Batch:
        member = f"{worker}|{lease_ms}"
        for lane in lanes:
            self.idle.get(lane, {}).pop(member, None)
        handed = self._inbox(worker, now)
        self.inbox.pop(worker, None)
        self.inbox_expiry.pop(worker, None)
        if n <= len(handed):
            return Batch(handed, None)
        for lane in lanes:
            self._promote_due(lane, now)
        grants: list[Grant] = []
        live, want = list(lanes), n - len(handed)
        while len(grants) < want and live:
            still = []
            for lane in live:
                share = -(-(want - len(grants)) // len(live))
                if share > 0 and self._pop_fair(lane, share, grants, worker, lease_ms, now):
                    still.append(lane)
            live = still
        if not handed and not grants and idle_ms > 0:
            for lane in lanes:
                self.idle.setdefault(lane, {})[member] = now + idle_ms
        return Batch(handed + grants, self.next_due(lanes, now=now))

    def leave(self, worker: str, lanes: list[str], lease_ms: int, *, now: int) -> list[Grant]:
        """A stopping worker deregisters; returns its inbox (still leased to it) to hand back."""
        for lane in lanes:
            self.idle.get(lane, {}).pop(f"{worker}|{lease_ms}", None)
        handed = self._inbox(worker, now)
        self.inbox.pop(worker, None)
        self.inbox_expiry.pop(worker, None)
        return handed

    def take_handed(self, worker: str, *, now: int) -> Grant | None:
        """The worker's blocking wait: the oldest job in its inbox, if any."""
        handed = self._inbox(worker, now)
        if not handed:
            return None
        grant = handed.pop(0)
        if not handed:
            del self.inbox[worker], self.inbox_expiry[worker]
        return grant

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
        self.running[job.lane] -= 1
        job.token = job.worker = None
        job.lease_lost = False
        if kind == "ok":
            self._finish(job, "completed", now)
        elif kind == "retry" and job.attempts >= job.max_attempts:
            # the store itself holds the budget: a retry past it is a dead letter
            self._dead_letter(job, now)
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
            self.running[job.lane] -= 1
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
            active = tenant in self.fair.get(lane, {})
            assert active == bool(queue), f"tenant {tenant} of {lane}: active {active}"
        lanes = Counter(j.lane for j in self.jobs.values() if j.status == "running")
        for lane in set(lanes) | set(self.running):
            assert self.running[lane] == lanes[lane], f"in-flight count of {lane}"
        tokens = [j.token for j in self.jobs.values() if j.token is not None]
        assert len(tokens) == len(set(tokens)), "two running jobs share a token"
        assert all(t <= self.fence for t in tokens), "a token above the counter"

    # -- internals --------------------------------------------------------------------

    def _claim_idle(self, lane: str, now: int) -> tuple[str, int] | None:
        registered = self.idle.get(lane, {})
        for member, lapses in list(registered.items()):
            if lapses <= now:
                del registered[member]
        if not registered:
            return None
        member = min(registered, key=lambda m: (registered[m], m))
        del registered[member]
        worker, lease_ms = member.rsplit("|", 1)
        return worker, int(lease_ms)

    def _inbox(self, worker: str, now: int) -> list[Grant]:
        if worker in self.inbox_expiry and now > self.inbox_expiry[worker]:
            del self.inbox[worker], self.inbox_expiry[worker]
        return self.inbox.get(worker, [])

    def _lease(self, job: ModelJob, worker: str, lease_ms: int, now: int) -> Grant:
        self.running[job.lane] += 1
        self.fence += 1
        job.attempts += 1
        job.status, job.token, job.worker = "running", self.fence, worker
        self.leases[job.id] = now + lease_ms
        return Grant(job.id, self.fence, job.attempts)

    def _holds(self, job_id: str, token: int) -> bool:
        job = self.jobs.get(job_id)
        return job is not None and job.status == "running" and job.token == token

    def _push_ready(self, job: ModelJob) -> None:
        queue = self.queues.setdefault((job.lane, job.tenant), [])
        if not queue:
            self._activate(job.lane, job.tenant)
        bisect.insort(queue, (-job.prio * PRIO_SPAN + job.seq, job.id))

    def _activate(self, lane: str, tenant: str) -> None:
        active = self.fair.setdefault(lane, {})
        start = self.vtime.get(lane, 0.0)
        if active:
            start -= self.running[lane] / len(active)
        finish = self.finish.get(lane, {}).pop(tenant, None)
        if finish is not None and finish > start:
            start = finish
        active[tenant] = start

    def _deactivate(self, lane: str, tenant: str, tag: float) -> None:
        del self.fair[lane][tenant]
        self.finish.setdefault(lane, {})[tenant] = tag

    def _pop_fair(  # noqa: PLR0917 - a fetch's own arguments, passed on
        self, lane: str, want: int, grants: list[Grant], worker: str, lease_ms: int, now: int
    ) -> bool:
        """Up to ``want`` jobs in fair order (``pop_fair`` in Lua); False if none is active."""
        active = self.fair.get(lane, {})
        v = self.vtime.get(lane, 0.0)
        got, any_active = 0, False
        while got < want and active:
            any_active = True
            tenant = min(active, key=lambda t: (active[t], t))
            tag = active[tenant]
            step = 1 / self.weights.get(tenant, 1.0)
            take = want - got if len(active) == 1 else 1
            queue = self.queues[(lane, tenant)]
            taken = queue[:take]
            del queue[: len(taken)]
            for _, job_id in taken:
                job = self.jobs[job_id]
                if job.status == "queued":
                    grants.append(self._lease(job, worker, lease_ms, now))
                    got += 1
                    v = max(v, tag)
                    tag += step
            if queue:
                active[tenant] = tag
            else:
                self._deactivate(lane, tenant, tag)
        self.vtime[lane] = v
        return any_active

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
