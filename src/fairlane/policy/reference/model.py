"""A reference model of one app's job lifecycle, exactly as the Lua library runs it.

The model is the oracle: ``tests/store/test_model_vs_lua.py`` drives it and the real
scripts (``fairlane/store/lua/fairlane.lua``) with the same operations and requires the
same answers -- the same jobs in the same order with the same fencing tokens and
attempt numbers, the same fenced acks, the same reclaims, the same lane, class and
throttle state. It is pure: no Redis, no asyncio, no clock. Every operation is given
``now=`` (server milliseconds): the time the script would have read with ``TIME``.

It is built from the policy modules, which decide; the model only composes them:
``fairlane.policy.classes.next_class`` chooses the class that starts,
``fairlane.policy.fairkeys.KeyTags`` gives a keyed job its order number,
``fairlane.policy.throttle.Throttles`` admits, parks and wakes jobs on their keys, and
``fairlane.policy.ceilings.tenant_limit`` gives a tenant's limit. The lanes' state and
the steps of one dispatch live in ``fairlane.policy.reference.dispatch``, the leases and
their reclaims in ``fairlane.policy.reference.leases``.

What it covers: enqueue (optionally delayed) with a service class, a width in worker
slots, throttle keys and a fairness key, fetch (an exchange: worker registration, acks,
then the fetch), the hand-off to idle workers, a stopping worker's leave, lease renewal
and heartbeats, acks (``ok``, ``retry``, ``dead``, ``release``, ``handback``) fenced by tokens,
the reclaim sweep and its stale-worker deregistration, lane class tables, tenant weights,
fairness keys' weights and tenant concurrency settings, deadline order (a task's or a
class's). Deadlines count only as they order a job: their refusals and expiry, idempotency
keys, cancellation, redrive, retention trimming, malformed records and the promote limit
are outside it.

Rules, as in the scripts:

* **Lanes, classes, capacity.** A lane has a class table (``declare_lane``; default
  ``fairlane.policy.classes.DEFAULT_CLASSES``). A job names a class of its lane's table
  (default ``standard``; an unknown class is refused, code -2, nothing written) and a
  width ``slots``. The lane's capacity ``C`` is the sum of its registered workers'
  slots. An exchange registers its worker (``slots``, default ``n``) in each lane it
  names where it is not registered yet (the first registration counts) and records the
  heartbeat ``now``; the worker's fleet entry lists every lane it is registered in.
  ``leave`` and the sweep of stale workers (heartbeat at or before ``now - stale_ms``,
  earliest first, ties by name, at most ``limit``) deregister a worker from all those
  lanes. Per class, ``f`` is its running slots and ``d`` its waiting slots (queued jobs
  in tenant queues, woken ones included; parked jobs are not counted).
* **Order within a class.** Tenants share one class of one lane by start-time fair
  queuing, one work unit per job (``fairlane.policy.fairqueue`` derives it). Each
  (lane, class) has a virtual time ``V``, its in-flight work ``run`` (leased jobs not
  yet settled), a start tag for each tenant with waiting work, and the finish tag of
  each idle tenant that has run. A tenant becomes active (its first waiting job
  arrives) with start tag ``max(finish tag, V - run / active tenants)`` (``V`` alone
  when none is active). The class's fair head is the active tenant with the smallest
  tag (ties: smaller name), and its first job (higher priority first, then FIFO by
  ``seq``, its order number). Taking it sets ``V = max(V, tag)`` and
  adds ``1 / weight`` to the tag (weights apply from the next dispatch); a tenant left
  without waiting jobs becomes idle, keeping its tag as its finish tag. A class's
  **head** is its fair head.
* **Order within a tenant: fairness keys.** A job's ``seq`` is its FIFO number (one
  counter for the app, a step per job submitted, refused ones included), unless it
  names a fairness key: then, when it enters its tenant's queue for the first time (at
  its enqueue if due now; at its promotion if scheduled, attempt 0 only), it takes
  ``KeyTags.tag`` of its (lane, class, tenant) -- the head read after the earlier
  pushes of the same call, its FIFO number when the queue is empty, the key's weight
  from ``configure_key`` (absent: 1) -- as its ``seq``. It keeps that ``seq`` for life:
  retries, releases, reclaims and wakes put it back with it. A throttle key's waiter
  group orders by the integer part of ``seq`` (the script's member format).
* **Order within a tenant: deadline order.** A job with a deadline whose submission
  asks for deadline order or whose class has it (``ServiceClass.deadline_order``) takes
  ``fairlane.policy.deadlineorder.deadline_order`` of its deadline as its ``seq`` when
  it is stored (whatever its status), and is never tagged by its key: at its priority
  it comes before every job that is not deadline-ordered, earliest deadline first.
* **Dispatch of a lane** with a budget of ``b`` slots: repeatedly ask
  ``next_class(table, C, f, head widths, demand=d)``; stop when it names no class, or
  when the chosen head is wider than what is left of ``b`` (the lane then stopped *for
  want of budget*). Otherwise take the head (``d`` shrinks by its width): if it holds
  offers (a throttle key woke it) it converts them (``Throttles.try_acquire``, its
  keys those it parked with); else, if it names throttle keys or its tenant has
  concurrency settings, it tries its keys (``Throttles.try_acquire`` with its own
  ``{key: limit}`` and ``tenant:<tenant>`` at ``ceilings.tenant_limit(settings, rate,
  mean duration, C, f + d of the lane, f_min=F_MIN, f_max=F_MAX)``, priority, ``seq``
  and tenant, charge 1). Admitted, it holds the grant and its tenant is charged as
  above; parked, it becomes ``throttled`` (counted), holds nothing and its tenant is
  not charged (nor ``V`` moved). Waiters a call wakes (``Wake``) become ``queued`` in
  their tenant's queue, holding offers (the tenant activated if idle, ``d`` grows).
  A job taken and admitted adds its width to ``f``.
* **Fetch** of ``n`` slots over several lanes: first the worker's inbox (even beyond
  ``n``); if the inbox's slots leave ``left > 0`` of ``n``, the due scheduled jobs of
  its lanes are promoted (``run_at <= now``, earliest first, ties by id) and ``left``
  slots are fetched in rounds: in each round every lane still live is dispatched,
  in the order given, with an even share ``ceil(left / live lanes)`` of what is still
  wanted; a lane stays live only if it stopped for want of budget and gave something.
  All the jobs taken are then leased in order.
* **Releases.** Every end of a running attempt (ack of any kind, reclaim) settles it
  (``f`` and ``run`` shrink) and releases its throttle grant (``Throttles.release``
  with its token), whose wakes enter their tenants' queues; an ack other than
  ``release`` of a tenant with settings feeds its duration (``now - start``) to the
  tenant's ``DurationMean``, and an enqueue feeds its submissions to the tenant's
  ``RateWindow`` (only while the tenant has settings).
* **Attempts** are counted when a job is leased; a ``release`` (a stopping worker
  handing a job back unstarted) gives the attempt back and queues the job again.
* **Fencing.** Every lease draws a new token from one counter, so tokens only grow.
  An ack or a renewal is applied only if the job is running under that very token;
  otherwise the ack is rejected and counted as ``fenced``, unless it is the ack that
  settled the job under that token, sent again (its reply was lost): that one is
  not applied twice, and counted as ``resettled``.
* **Reclaim.** A sweep at ``now`` takes up to ``limit`` leases that expired at or before
  ``now`` (earliest expiry first, ties by id). A reclaim counts as the attempt it
  interrupted: with ``attempts >= max_attempts`` the job is dead-lettered, otherwise it
  is scheduled ``delay_ms`` later (the scripts use the job's backoff; here the delay is
  given).
* **Hand-off.** A fetch that gives a worker nothing, asked with ``idle_ms``, registers
  it idle on its lanes until ``now + idle_ms`` (as ``worker|lease_ms``; the worker's
  next fetch with that lease ends the registration). An enqueue whose batch queued a
  job due now drops the lane's lapsed registrations (lapsing at or before ``now``) and,
  if one is left, dispatches the lane with a budget of 1 slot: the jobs taken (the
  lane's next job by the rules above, not necessarily a new one) are leased to the
  registration that lapses soonest (ties by member), which is then spent, into its
  worker's inbox (a token, an attempt, a lease of the registered length). A fetch
  returns the inbox first, the blocking wait takes its oldest entry, ``leave`` takes
  the whole inbox (to hand it back), and an inbox vanishes once it has been left
  longer than the last lease handed into it.

Invariants (``check_invariants``, by ``fairlane.policy.reference.invariants``):

1. Every job is in exactly one place, matching its status: ``queued`` in its tenant's
   queue, ``throttled`` in one tenant group of one throttle key, ``scheduled`` in its
   lane's delayed set, ``running`` in the
   leases, ``completed`` / ``failed`` / ``expired`` in none (a failed job is in the
   dead-letter set).
2. A tenant is active in a class exactly while it has waiting jobs there; ``run``
   equals the class's running jobs, ``f`` the sum of their widths, ``d`` the sum of
   the widths of its queued jobs.
3. ``0 <= attempts <= max_attempts``; a running job has made at least one attempt.
4. Running jobs hold distinct tokens, none above the counter; only running jobs hold one.
5. A job holds a throttle grant (with its token) only while running, with a ``ttok``;
   offers only while queued; a throttle key with waiters has no room (``Throttles``' I3).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Literal, NamedTuple

from fairlane.policy.admission.reasons import CLASS_NOT_ENTITLED, TENANT_PAUSED
from fairlane.policy.ceilings import (
    RATE_BUCKETS,
    RATE_WIDTH_MS,
    DurationMean,
    RateWindow,
)
from fairlane.policy.classes import Entitlement
from fairlane.policy.deadlineorder import entry_order
from fairlane.policy.reference.dispatch import (
    DEFAULT_CLASS,
    PRIO_SPAN,
    Grant,
    LaneModel,
    ModelJob,
    Status,
)
from fairlane.policy.reference.invariants import check_jobs, check_lanes
from fairlane.policy.reference.leases import Leases
from fairlane.policy.reference.pausing import PauseOps

__all__ = [
    "FINISHED",
    "PRIO_SPAN",
    "Ack",
    "AckKind",
    "Batch",
    "Grant",
    "LaneModel",
    "ModelJob",
    "QueueModel",
    "Status",
    "Submission",
]

AckKind = Literal["ok", "retry", "dead", "expire", "release", "handback"]
FINISHED: frozenset[str] = frozenset({"completed", "failed", "expired"})


class Batch(NamedTuple):
    """What ``fetch`` gives a worker, and the ms until its lanes' next scheduled job."""

    jobs: list[Grant]
    next_due: int | None


class Submission(NamedTuple):
    """A job as an enqueue hands it to the model."""

    id: str
    tenant: str
    prio: int
    max_attempts: int
    delay_ms: int = 0
    cls: str = DEFAULT_CLASS
    slots: int = 1
    limits: tuple[tuple[str, int], ...] = ()
    key: str = ""  # fairness key ('' none)
    deadline_ms: int | None = None  # its deadline, server ms (None: none)
    deadline_order: bool = False  # its task orders by deadline


class Ack(NamedTuple):
    """One outcome an exchange settles before it fetches."""

    id: str
    token: int
    kind: AckKind = "ok"
    delay_ms: int = 0
    window_ms: int = 0  # a hand-back's deploy window


class QueueModel(Leases, PauseOps):
    """The state of one app's jobs and the operations of the Lua library on it."""

    def __init__(self) -> None:
        super().__init__()
        self.seq = 0
        self.handed_back: dict[str, int] = {}  # id -> its first hand-back (field hb)
        # tenant -> the restricted classes it may use (enqueue's gate; none: no entitlement)
        self.entitlements: dict[str, Entitlement] = {}
        # (lane, class, reason) -> jobs refused so: every refusal is counted, in every lane
        self.refusals: Counter[tuple[str, str, str]] = Counter()

    def configure_classes(self, tenant: str, entitlement: Entitlement | None) -> None:
        """A tenant's class entitlement (None: none, so no restricted class)."""
        if entitlement is None:
            self.entitlements.pop(tenant, None)
        else:
            self.entitlements[tenant] = entitlement

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
        key: str = "",
    ) -> None:
        spec = Submission(job_id, tenant, prio, max_attempts, delay_ms, key=key)
        self.enqueue_batch(lane, [spec], now=now)

    def enqueue_batch(self, lane: str, batch: Sequence[Submission], *, now: int) -> list[int]:
        """Enqueue jobs in one call; returns a code per job (1 stored, -2 unknown class,
        -5 a restricted class its tenant is not entitled to, -6 its tenant quarantined).
        Classes are as named."""
        ids = [spec.id for spec in batch]
        if len(set(ids)) < len(ids) or any(i in self.jobs for i in ids):
            raise ValueError(f"job ids must be new: {ids}")
        table = self.lane(lane).table
        codes: list[int] = []
        submitted: Counter[str] = Counter()
        ready = False
        for spec in batch:
            self.seq += 1
            if self.pauses.refuses(spec.tenant, now) is not None:
                codes.append(-6)
                self.refusals[(lane, spec.cls, TENANT_PAUSED)] += 1
                continue
            if spec.cls not in table:
                codes.append(-2)
                continue
            if not self.entitlements.get(spec.tenant, Entitlement()).may_use(table[spec.cls]):
                codes.append(-5)
                self.refusals[(lane, spec.cls, CLASS_NOT_ENTITLED)] += 1
                continue
            run_at = now + spec.delay_ms
            ordered = spec.deadline_order or table[spec.cls].deadline_order
            job = ModelJob(
                spec.id, spec.tenant, lane, spec.prio,
                entry_order(self.seq, spec.deadline_ms, ordered), spec.max_attempts,
                "scheduled" if run_at > now else "queued", run_at,
                cls=spec.cls, slots=spec.slots, limits=tuple(sorted(spec.limits)),
                fkey=spec.key,
            )  # fmt: skip
            self.jobs[spec.id] = job
            if job.status == "scheduled":
                self.lane(lane).delayed[spec.id] = run_at
            else:
                self._fair_order(job)
                self._push_ready(job)
                ready = True
            submitted[spec.tenant] += 1
            codes.append(1)
        for tenant, n in submitted.items():
            if tenant in self.tenant_limits:
                window = self.rates.setdefault(tenant, RateWindow(RATE_BUCKETS, RATE_WIDTH_MS))
                window.add(now, n)
        if ready:
            self._hand_off(lane, now)
        return codes

    def _hand_off(self, name: str, now: int) -> None:
        registered = self.lane(name).idle
        for member, lapses in list(registered.items()):
            if lapses <= now:
                del registered[member]
        if not registered:
            return
        member = min(registered, key=lambda m: (registered[m], m))
        taken, _, _ = self._dispatch(name, 1, now)
        if not taken:
            return
        del registered[member]
        worker, lease = member.rsplit("|", 1)
        lease_ms = int(lease)
        inbox = self.inbox.setdefault(worker, [])
        inbox.extend(self._lease(job, worker, lease_ms, now) for job in taken)
        self.inbox_expiry[worker] = now + lease_ms

    # -- worker -----------------------------------------------------------------------

    def fetch(
        self,
        worker: str,
        lanes: list[str],
        n: int,
        lease_ms: int,
        *,
        now: int,
        idle_ms: int = 0,
        slots: int | None = None,
    ) -> Batch:
        """An exchange without acks."""
        return self.exchange(worker, lanes, n, lease_ms, now=now, idle_ms=idle_ms, slots=slots)[1]

    def exchange(
        self,
        worker: str,
        lanes: list[str],
        n: int,
        lease_ms: int,
        acks: Sequence[Ack] = (),
        *,
        now: int,
        idle_ms: int = 0,
        slots: int | None = None,
    ) -> tuple[list[int], Batch]:
        """Register the worker, settle ``acks``, then fetch up to ``n`` slots of work."""
        self._register(worker, n if slots is None else slots, lanes, now)
        codes = [
            self.ack(a.id, a.token, a.kind, now=now, delay_ms=a.delay_ms, window_ms=a.window_ms)
            for a in acks
        ]
        member = f"{worker}|{lease_ms}"
        for lane in lanes:
            self.lane(lane).idle.pop(member, None)
        handed = self._inbox(worker, now)
        self.inbox.pop(worker, None)
        self.inbox_expiry.pop(worker, None)
        left = n - sum(self.jobs[g.id].slots for g in handed)
        grants: list[Grant] = []
        next_due = None
        if left > 0:
            grants = self._fetch(worker, lanes, left, lease_ms, now)
            next_due = self.next_due(lanes, now=now)
        if not handed and not grants and idle_ms > 0:
            for lane in lanes:
                self.lane(lane).idle[member] = now + idle_ms
        return codes, Batch(handed + grants, next_due)

    def _fetch(self, worker: str, lanes: list[str], want: int, lease: int, now: int) -> list[Grant]:
        for lane in lanes:
            self._promote_due(lane, now)
        return [self._lease(job, worker, lease, now) for job in self._rounds(lanes, want, now)]

    def leave(self, worker: str, lanes: list[str], lease_ms: int, *, now: int) -> list[Grant]:
        """A stopping worker deregisters; returns its inbox (still leased to it) to hand back."""
        for lane in lanes:
            self.lane(lane).idle.pop(f"{worker}|{lease_ms}", None)
        self._deregister(worker)
        self.leased.pop(worker, None)
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
        times = [t for lane in lanes for t in self.lane(lane).delayed.values()]
        return max(0, min(times) - now) if times else None

    def ack(
        self,
        job_id: str,
        token: int,
        kind: AckKind,
        *,
        now: int,
        delay_ms: int = 0,
        window_ms: int = 0,
    ) -> int:
        """Settle an attempt: 1 applied; 2 the settlement this lease made already, sent
        again (not applied twice); 0 fenced, the token being stale. A hand-back (the
        worker could not run the job) is due again ``delay_ms`` later with its attempt
        given back, until ``window_ms`` after the job's first hand-back; then, or at once
        for a window of 0, it is a dead letter. An attempt its worker stopped at the
        job's deadline (``expire``) ends the job expired, never as a failure."""
        if not self._holds(job_id, token):
            job = self.jobs.get(job_id)
            if job is not None and job.status != "running" and job.settled == token:
                self.stats["resettled"] += 1
                return 2
            self.stats["fenced"] += 1
            return 0
        job = self.jobs[job_id]
        self._end_lease(job, lost=False)
        if kind not in ("release", "handback") and job.tenant in self.tenant_limits:
            mean = self.durations.setdefault(job.tenant, DurationMean())
            mean.observe(max(0, now - (job.started_at or now)) / 1000)
        job.settled = token
        if kind == "ok":
            self._finish(job, "completed", now)
        elif kind == "retry" and job.attempts >= job.max_attempts:
            # the store itself holds the budget: a retry past it is a dead letter
            self._dead_letter(job, now)
        elif kind == "retry":
            self._schedule(job, now + delay_ms)
        elif kind == "dead":
            self._dead_letter(job, now)
        elif kind == "expire":  # stopped at its deadline: expired, whatever its budget
            self._finish(job, "expired", now)
        elif kind == "handback":
            self._hand_back(job, now, delay_ms, window_ms)
        else:
            job.attempts -= 1
            job.status = "queued"
            self._push_ready(job)
        return 1

    # -- queries ----------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` naming the first broken invariant (the five above)."""
        jobs, lanes, throttles = self.jobs, self.lanes, self.throttles
        parked = list(self.parked.values())
        check_jobs(
            jobs, lanes, throttles, leases=self.leases, dead=self.dead, fence=self.fence,
            parked=parked,
        )  # fmt: skip
        check_lanes(jobs, lanes, throttles, held=self.held, parked=parked)

    # -- internals --------------------------------------------------------------------

    def _hand_back(self, job: ModelJob, now: int, delay_ms: int, window_ms: int) -> None:
        first = self.handed_back.get(job.id)
        if window_ms == 0 or (first is not None and now - first >= window_ms):
            self.handed_back.pop(job.id, None)
            self._dead_letter(job, now)
            return
        self.handed_back.setdefault(job.id, now)
        self._schedule(job, now + delay_ms, "handed_back")
        job.attempts -= 1
