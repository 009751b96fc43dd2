"""The lanes of the reference model: capacity, service classes, fair queues and dispatch.

``fairlane.policy.reference.model`` states the rules; this module holds the per-lane
state and the steps the scripts run inside one call (``dispatch_lane`` and the fetch's
rounds, ``push_ready``, ``enter_woken``, the throttle release, worker registration
(``worker.lua``) and promotion (``lease.lua``)), and the declarations a lane and its
tenants take (class table, weights, fairness keys' weights, concurrency settings). The
decisions are the policy modules' own: ``fairlane.policy.classes.next_class`` picks the
class, ``fairlane.policy.fairkeys.KeyTags`` gives a keyed job its order number in its tenant's
queue, ``fairlane.policy.throttle.Throttles`` admits, parks and wakes,
``fairlane.policy.ceilings`` gives a tenant's limit. This module only composes them.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, TypeVar

from fairlane.policy import ceilings
from fairlane.policy.ceilings import DurationMean, RateWindow, TenantLimits
from fairlane.policy.classes import ClassTable, next_class
from fairlane.policy.deadlineorder import is_deadline_ordered
from fairlane.policy.fairkeys import KeyTags, order_score, present_order
from fairlane.policy.pauses import PauseTable, Scope
from fairlane.policy.throttle import Acquired, Throttles, Wake

__all__ = [
    "DEFAULT_CLASS",
    "PRIO_SPAN",
    "ClassQueue",
    "Grant",
    "Head",
    "LaneDispatch",
    "LaneModel",
    "ModelJob",
    "Status",
]

Status = Literal["queued", "throttled", "scheduled", "running", "completed", "failed", "expired"]

#: The order score of a queued job is ``-prio * PRIO_SPAN + seq`` (``order_score`` in Lua).
PRIO_SPAN: int = 1 << 40
DEFAULT_CLASS = "standard"
#: the one task of the model's jobs (a task pause names it)
TASK = "model.job"
T = TypeVar("T")


class Grant(NamedTuple):
    """A job leased to a worker: by ``fetch``, or handed to its inbox by an enqueue."""

    id: str
    token: int
    attempt: int


@dataclass(slots=True)
class ModelJob:
    id: str
    tenant: str
    lane: str
    prio: int
    seq: float  # its order number: its FIFO number, its fairness key's tag or a deadline order
    max_attempts: int
    status: Status
    run_at: int
    cls: str = DEFAULT_CLASS
    slots: int = 1
    limits: tuple[tuple[str, int], ...] = ()  # its own throttle keys and limits
    fkey: str = ""  # its fairness key ('' none)
    attempts: int = 0
    token: int | None = None
    settled: int | None = None  # the token whose ack last settled it (until its next lease)
    worker: str | None = None
    started_at: int | None = None  # when its last attempt was leased
    ttok: int | None = None  # the throttle grant it holds (only while running)
    finished_at: int | None = None
    lease_lost: bool = False  # the last failure was a reclaimed lease


@dataclass(slots=True)
class ClassQueue:
    """One class of one lane: its tenants' fair queue."""

    fair: dict[str, float] = field(default_factory=dict)  # active tenant -> start tag
    finish: dict[str, float] = field(default_factory=dict)  # idle tenant -> finish tag
    vtime: float = 0.0  # V
    run: int = 0  # leased jobs not yet settled
    queues: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # sorted
    keys: dict[str, KeyTags] = field(default_factory=dict)  # tenant -> its keys' next tags

    def queue_ids(self, tenant: str) -> list[str]:
        return [job_id for _, job_id in self.queues.get(tenant, [])]


@dataclass(slots=True)
class LaneModel:
    """One lane: its class table, capacity, class slots, classes, delayed and idle sets."""

    table: ClassTable = field(default_factory=ClassTable)
    cap: dict[str, int] = field(default_factory=dict)  # registered worker -> slots
    in_flight: Counter[str] = field(default_factory=Counter)  # class -> running slots
    waiting: Counter[str] = field(default_factory=Counter)  # class -> queued slots
    classes: dict[str, ClassQueue] = field(default_factory=dict)
    delayed: dict[str, int] = field(default_factory=dict)  # id -> run_at
    idle: dict[str, int] = field(default_factory=dict)  # 'worker|lease_ms' -> lapses at

    @property
    def capacity(self) -> int:
        """``C``: the slots of the workers registered in the lane."""
        return sum(self.cap.values())

    def cls(self, name: str) -> ClassQueue:
        return self.classes.setdefault(name, ClassQueue())


class Head(NamedTuple):
    """A class's head job: its fair head tenant's first job."""

    id: str
    width: int
    tenant: str
    tag: float


def _set_or_drop(settings: dict[str, T], tenant: str, value: T | None) -> None:
    """A tenant's setting set, or dropped back to the default (as the scripts HDEL it)."""
    if value is None:
        settings.pop(tenant, None)
    else:
        settings[tenant] = value


class LaneDispatch:
    """The state of the lanes and the steps of one call on them (``QueueModel``'s base)."""

    def __init__(self) -> None:
        self.jobs: dict[str, ModelJob] = {}
        self.lanes: dict[str, LaneModel] = {}
        self.weights: dict[str, float] = {}  # tenant -> fair-share weight (absent: 1)
        self.key_weights: dict[str, dict[str, float]] = {}  # tenant -> key -> weight (absent: 1)
        self.throttles = Throttles(self.weights)  # a key's wakes read the weights too
        self.tenant_limits: dict[str, TenantLimits] = {}
        self.rates: dict[str, RateWindow] = {}  # tenant -> submissions (while it has limits)
        self.durations: dict[str, DurationMean] = {}  # tenant -> attempt durations (s)
        self.stats: Counter[str] = Counter()
        self.heartbeats: dict[str, int] = {}  # worker -> last heartbeat
        self.beats: dict[str, int] = {}  # worker -> last beat, for the workers that beat
        self.fleet: dict[str, tuple[int, list[str]]] = {}  # worker -> (slots, its lanes)
        # an operator's pauses (fairlane.policy.pauses): the tenants dispatch held out of
        # a class's fair set (P2), the jobs it parked by scope, id -> order score (P3)
        self.pauses = PauseTable()
        self.held: dict[tuple[str, str], set[str]] = {}
        self.parked: dict[Scope, dict[str, float]] = {}
        self.now = 0  # the instant of the call being carried out (pauses end by it)

    def lane(self, name: str) -> LaneModel:
        return self.lanes.setdefault(name, LaneModel())

    def lane_name(self, lane: LaneModel) -> str:
        return next(name for name, model in self.lanes.items() if model is lane)

    # -- declarations -----------------------------------------------------------------

    def declare_lane(self, lane: str, table: ClassTable) -> None:
        """A lane's class table; applies from the next decision."""
        self.lane(lane).table = table

    def configure(self, tenant: str, weight: float | None) -> None:
        """A tenant's fair-share weight (None: the default, 1); applies from its next dispatch."""
        _set_or_drop(self.weights, tenant, weight)

    def configure_key(self, tenant: str, key: str, weight: float | None) -> None:
        """A fairness key's weight in its tenant (None or 1: the default, dropped as the
        script drops it); applies from the key's next tag."""
        weights = self.key_weights.setdefault(tenant, {})
        _set_or_drop(weights, key, None if weight == 1 else weight)
        if not weights:
            del self.key_weights[tenant]

    def configure_limits(self, tenant: str, limits: TenantLimits | None) -> None:
        """A tenant's concurrency settings (None: none; its signals are kept)."""
        _set_or_drop(self.tenant_limits, tenant, limits)

    def queue_ids(self, lane: str, tenant: str, cls: str = DEFAULT_CLASS) -> list[str]:
        """A tenant's waiting jobs in one class, in the order they will run."""
        return self.lane(lane).cls(cls).queue_ids(tenant)

    # -- fair queues ------------------------------------------------------------------

    def _push_ready(self, job: ModelJob) -> None:
        lane = self.lane(job.lane)
        cq = lane.cls(job.cls)
        queue = cq.queues.setdefault(job.tenant, [])
        if not queue:
            self._activate(cq, job.tenant)
        bisect.insort(queue, (order_score(job.prio, job.seq), job.id))
        lane.waiting[job.cls] += job.slots

    def _fair_order(self, job: ModelJob) -> None:
        """A keyed job entering its tenant's queue for the first time takes its key's
        order number (``KeyTags.tag``, rule 1 of ``fairlane.policy.fairkeys``) against
        the queue as it stands, the earlier pushes of the same call included; its FIFO
        number is the present when the queue holds no job that is not deadline-ordered.
        No key, or a deadline order: the order number it has stays."""
        if not job.fkey or is_deadline_ordered(job.seq):
            return
        cq = self.lane(job.lane).cls(job.cls)
        head = present_order(score for score, _ in cq.queues.get(job.tenant, []))
        weight = self.key_weights.get(job.tenant, {}).get(job.fkey, 1.0)
        tags = cq.keys.setdefault(job.tenant, KeyTags())
        job.seq = tags.tag(job.fkey, weight, head, int(job.seq))

    @staticmethod
    def _activate(cq: ClassQueue, tenant: str) -> None:
        start = cq.vtime
        if cq.fair:
            start -= cq.run / len(cq.fair)
        finish = cq.finish.pop(tenant, None)
        if finish is not None and finish > start:
            start = finish
        cq.fair[tenant] = start

    def _head(self, lane: LaneModel, cls: str, name: str) -> Head | None:
        """The class's head; a paused tenant that comes to it is held (P2) first."""
        cq = lane.cls(cls)
        if self.pauses.class_held(name, cls, self.now):
            return None
        while cq.fair:
            tenant = min(cq.fair, key=lambda t: (cq.fair[t], t))
            if not self.pauses.tenant_held(tenant, self.now):
                break
            cq.finish[tenant] = cq.fair.pop(tenant)
            self.held.setdefault((name, cls), set()).add(tenant)
        if not cq.fair:
            return None
        job = self.jobs[cq.queues[tenant][0][1]]
        return Head(job.id, job.slots, tenant, cq.fair[tenant])

    def _take_fair_head(self, cq: ClassQueue, head: Head, *, charged: bool) -> None:
        """Pop the head; if it starts (``charged``: it passed its throttle keys), move V up
        to the tenant's tag and charge it ``1 / weight``. A job that parks costs nothing."""
        queue = cq.queues[head.tenant]
        queue.pop(0)
        tag = head.tag
        if charged:
            cq.vtime = max(cq.vtime, head.tag)
            tag += 1 / self.weights.get(head.tenant, 1.0)
        if queue:
            cq.fair[head.tenant] = tag
        else:
            del cq.fair[head.tenant]
            cq.finish[head.tenant] = tag

    # -- throttles --------------------------------------------------------------------

    def tenant_limit(self, tenant: str, capacity: int, load: int, *, now: int) -> int | None:
        """The tenant's concurrency limit now (``ceilings.tenant_limit``); None: no settings."""
        settings = self.tenant_limits.get(tenant)
        if settings is None:
            return None
        window = self.rates.get(tenant)
        rate = window.per_minute(now) if window is not None else 0.0
        mean = self.durations[tenant].value() if tenant in self.durations else 0.0
        return ceilings.tenant_limit(
            settings, rate, mean, capacity, load, f_min=ceilings.F_MIN, f_max=ceilings.F_MAX
        )

    def _acquire(self, job: ModelJob, lane: LaneModel, now: int) -> tuple[bool, tuple[Wake, ...]]:
        """The job's throttle keys (its own, and its tenant's), with its lane slot: its
        offers converted or it admitted, or parked; and the waiters woken on the way."""
        offered = self.throttles.offered(job.id) is not None
        limits: dict[str, int] = {}
        if not offered:  # a woken job keeps the keys it parked with
            limits = dict(job.limits)
            load = sum(lane.in_flight.values()) + sum(lane.waiting.values())
            own = self.tenant_limit(job.tenant, lane.capacity, load, now=now)
            if own is not None:
                limits[f"tenant:{job.tenant}"] = own
            if not limits:
                return True, ()
        # a waiter group orders by the integer part of the order number (the script's
        # member format, %d): a keyed job's fractional tag ties with the integer below it
        seq = int(job.seq)
        result = self.throttles.try_acquire(job.id, limits, job.prio, seq, tenant=job.tenant)
        if isinstance(result, Acquired):
            job.ttok = result.token
            return True, result.wakes
        job.status = "throttled"
        self.stats["throttled"] += 1
        return False, result.wakes

    def _enter_woken(self, wakes: tuple[Wake, ...] | list[Wake]) -> None:
        """Woken waiters go back into their tenants' queues, holding offers; one whose
        scope is paused gives them back at once, and the waiters that wakes enter in
        turn (P4)."""
        todo = list(wakes)
        for wake in todo:
            job = self.jobs[wake.job_id]
            job.status = "queued"
            if self.pauses.blocks(
                job.lane, job.cls, task=TASK, tenant=job.tenant, key=job.fkey, now_ms=self.now
            ):
                todo.extend(self.throttles.cancel(job.id))
            self._push_ready(job)

    def _release_throttle(self, job: ModelJob) -> None:
        if job.ttok is not None:
            token, job.ttok = job.ttok, None
            self._enter_woken(self.throttles.release(job.id, token))

    # -- dispatch ---------------------------------------------------------------------

    def choose(self, lane: LaneModel) -> tuple[str | None, dict[str, Head | None]]:
        """The class ``next_class`` lets start now in ``lane``, and every class's head."""
        heads = {c: self._head(lane, c, self.lane_name(lane)) for c in lane.table.names}
        widths = {name: (h.width if h else None) for name, h in heads.items()}
        chosen = next_class(
            lane.table,
            lane.capacity,
            {name: max(0, lane.in_flight[name]) for name in lane.table.names},
            widths,
            demand={name: max(0, lane.waiting[name]) for name in lane.table.names},
        )
        return chosen, heads

    def _dispatch(self, name: str, budget: int, now: int) -> tuple[list[ModelJob], int, bool]:
        """Up to ``budget`` slots of ``name``'s work; returns the jobs taken, their slots,
        and whether the lane stopped for want of budget."""
        lane = self.lane(name)
        taken: list[ModelJob] = []
        given = 0
        self.now = now
        if self.pauses.class_held(name, "", now):
            return taken, given, False
        while True:
            chosen, heads = self.choose(lane)
            if chosen is None:
                return taken, given, False
            head = heads[chosen]
            assert head is not None
            if head.width > budget - given:
                return taken, given, True
            lane.waiting[chosen] -= head.width
            job, cq = self.jobs[head.id], lane.cls(chosen)
            scope = self.pauses.job_scope(TASK, job.tenant, job.fkey, now)
            if scope is not None:  # P3: parked, uncharged, its offers given back
                self.parked.setdefault(scope, {})[job.id] = order_score(job.prio, job.seq)
                wakes = tuple(self.throttles.cancel(job.id))
                self._take_fair_head(cq, head, charged=False)
                self._enter_woken(wakes)
                continue
            # the job is tried on its keys before its tenant is charged; the waiters
            # woken on the way enter their queues once the pop is settled
            admitted, wakes = self._acquire(job, lane, now)
            self._take_fair_head(cq, head, charged=admitted)
            self._enter_woken(wakes)
            if admitted:
                taken.append(job)
                given += head.width
                lane.in_flight[chosen] += head.width

    def _settle_running(self, job: ModelJob) -> None:
        lane = self.lane(job.lane)
        lane.cls(job.cls).run -= 1
        lane.in_flight[job.cls] -= job.slots

    def _rounds(self, lanes: list[str], want: int, now: int) -> list[ModelJob]:
        """The jobs a fetch of ``want`` slots takes from ``lanes``, in rounds of even shares."""
        taken: list[ModelJob] = []
        live, given = list(lanes), 0
        while given < want and live:
            still = []
            for lane in live:
                share = -(-(want - given) // len(live))
                if share > 0:
                    jobs, got, more = self._dispatch(lane, share, now)
                    taken += jobs
                    given += got
                    if more and got > 0:
                        still.append(lane)
            live = still
        return taken

    # -- capacity ---------------------------------------------------------------------

    def _register(self, worker: str, slots: int, lanes: list[str], now: int) -> None:
        self.heartbeats[worker] = now
        added = [lane for lane in lanes if worker not in self.lane(lane).cap]
        for lane in added:
            self.lane(lane).cap[worker] = slots
        if added:
            known = self.fleet.get(worker, (slots, []))[1]
            self.fleet[worker] = (slots, known + [lane for lane in lanes if lane not in known])

    def _deregister(self, worker: str) -> None:
        self.heartbeats.pop(worker, None)
        self.beats.pop(worker, None)
        entry = self.fleet.pop(worker, None)
        for lane in entry[1] if entry else []:
            self.lane(lane).cap.pop(worker, None)

    # -- scheduled jobs ---------------------------------------------------------------

    def delayed_ids(self, lane: str) -> list[tuple[str, int]]:
        """A lane's scheduled jobs with their run times, in promotion order."""
        items = self.lane(lane).delayed
        return sorted(items.items(), key=lambda item: (item[1], item[0]))

    def _promote_due(self, lane: str, now: int) -> None:
        for job_id, run_at in self.delayed_ids(lane):
            if run_at > now:
                break
            del self.lane(lane).delayed[job_id]
            job = self.jobs[job_id]
            job.status = "queued"
            if job.attempts == 0:  # its first entry (a retry keeps the order it has)
                self._fair_order(job)
            self._push_ready(job)
