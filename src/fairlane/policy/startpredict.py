"""When will a waiting job start? The prediction, its basis and its error model.

An estimate, not a promise. It is worked out from what the store holds at the moment
it is asked (``store/lua/estimate.lua`` reads it in one call): the queues as they
stand, the lengths and charges workers learned, and what each tenant used lately. It
assumes the lane keeps its workers and every job takes its learned mean.

The basis
---------
*Class slots.* A lane of ``C`` live slots is shared by its service classes as dispatch
shares it (``policy/classes.py``): each class with demand (slots in flight or waiting)
first gets its floor (``min_slots``, up to its demand), then what is left goes to the
classes by nominal share, weighted max-min (a class never gets more than its demand;
what it cannot use flows to the others); batch classes share only what the others
leave. ``S`` is what the job's class gets.

*Fair order.* Inside the class tenants are served by start-time fair queuing
(``policy/fairqueue.py``): each start charges its tenant ``c / w`` -- ``c`` one unit
per job, or in a lane that charges by cost the job's units (by default its run time:
a task that reports nothing is charged its wall time) -- so while tenants ``i`` and
``t`` both wait, the virtual time moves by the same amount for each. A job with ``k``
jobs of its own tenant ahead of it starts when its tenant has started ``k`` of them;
by then the virtual time has moved by ``v = (k + 1/2) c_t / w_t`` (the half: on average
a job starts half a job's spacing after the ``k``-th start, as the slots free at evenly
spread moments). Another tenant ``i`` is entitled to ``w_i v / c_i`` starts meanwhile,
``X_i = w_i v d_i / c_i`` slot-seconds of its jobs (``d_i`` their learned mean).

*What the others take.* A tenant with ``n_i`` jobs waiting takes at most its
entitlement, and at most what it has, ``n_i d_i``, plus what it keeps submitting: the
slot-seconds per second it used over the last whole usage window, ``u_i``, over the
wait ``T``. Tenants with nothing waiting (not in the class's fair set) take what they
used, ``u_rest`` (the class's use less the tenants read; at most ``REST_CAP`` of the
slots). The class works through all of it at ``S`` slots, so ``T`` solves

    S T = (k + 1/2) d_t + sum_i min(X_i, n_i d_i + u_i T) + u_rest T

whose right side grows more slowly than the left past every cap: one root, found by
bisection, one term per waiting tenant. This is the fluid (GPS) time of the fair order.
A class with slots free now starts the job at once when the starts ahead of it fit.

Tenants the read did not reach (beyond ``MAX_TENANTS``) are counted as backlogged
tenants of weight 1 at the class's mean job: more work ahead, never less.

Deadlines
---------
A job is expected to finish by ``wait + DEADLINE_SAFETY * own length``; a submission
that is not is refused (``deadline_unmeetable``) unless the caller takes it anyway, and
dispatch expires a waiting job whose ``DEADLINE_SAFETY * own length`` no longer fits
before its deadline (:func:`unmeetable`, twin of ``runnable`` in ``lua/lease.lua``).
Submissions estimated at the same moment saw the same queue: enqueue adds
``per_job_wait`` for each job their tenant queued since (:func:`needs_at_enqueue`,
twin of the gate in ``lua/enqueue.lua``).

Error model
-----------
What moves the real start away from the estimate, and which way:

* arrivals that change: a tenant that starts submitting after the estimate takes its
  share as it does (the job starts later than estimated); one that stops leaves its
  share to the others (sooner). ``u_i`` is the last window's use, not the next's.
* durations: a job's length varies around its learned mean; the sum over the ``m``
  jobs ahead varies by about ``1/sqrt(m)`` of its own spread, so deep queues estimate
  better than shallow ones. A tenant whose jobs changed length lately is learned
  again within about ``1 / DURATION_ALPHA`` attempts.
* capacity: workers that join or leave change ``C`` from then on.
* the discrete start: a job near its queue's head waits for one slot to free; the half
  job in ``k + 1/2`` is that wait's mean, the real one lies anywhere in ``[0, d / S]``.
  Estimates of a few job lengths or less are the least accurate in relative terms.
* charges: a lane charging by cost charges a start its expected units and corrects the
  tag when the job ends (``policy/fairqueue.py`` rule 4: a refund never goes below the
  present); the rule uses each tenant's learned mean charge.
* priority: a later job of the same tenant with a higher priority goes ahead of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import msgspec

__all__ = [
    "DEADLINE_SAFETY",
    "DURATION_ALPHA",
    "MAX_TENANTS",
    "REST_CAP",
    "USAGE_WINDOW_MS",
    "Backlog",
    "ClassLoad",
    "Prediction",
    "Situation",
    "class_slots",
    "fold_mean",
    "latest_start_ms",
    "needs_at_enqueue",
    "per_job_wait",
    "predict",
    "unmeetable",
]

#: how much of a learned mean one more attempt moves: the learned mean forgets a
#: change of length within about 1 / DURATION_ALPHA attempts
DURATION_ALPHA = 0.1
#: active tenants of a class whose queues an estimate reads; the rest are counted as
#: backlogged at the class's mean job
MAX_TENANTS = 64
#: the window over which what tenants use is measured (ms)
USAGE_WINDOW_MS = 5000
#: the most of a class's slots that tenants with no queue are taken to keep using
REST_CAP = 0.9
#: a job's learned length is taken this many times over when a deadline is judged: a job
#: up to this much longer than its mean still finishes in time once started
DEADLINE_SAFETY = 1.25


class Backlog(msgspec.Struct, frozen=True):
    """A waiting tenant of the class: its weight, its waiting jobs and their mean
    slot-seconds (learned)."""

    tenant: str
    weight: float
    jobs: int
    slot_seconds: float
    use: float = 0.0  # slot-seconds per second its jobs finished lately
    charge: float = 0.0  # units a start of its is charged (learned; 0 unknown)


class ClassLoad(msgspec.Struct, frozen=True):
    """A class of the lane: its declared share and floor, and its slots now."""

    name: str
    share: float
    min_slots: int
    batch: bool
    in_flight: int
    waiting: int

    @property
    def demand(self) -> int:
        return max(0, self.in_flight) + max(0, self.waiting)


class Situation(msgspec.Struct, frozen=True):
    """What the store says of a waiting job's surroundings, at one moment."""

    capacity: int  # the lane's live slots
    classes: tuple[ClassLoad, ...]
    cls: str
    tenant: str
    ahead: int  # jobs of its own tenant ahead of it in its queue
    backlogs: tuple[Backlog, ...]  # the waiting tenants read (its own among them)
    unread: int  # waiting tenants beyond those read
    class_slot_seconds: float | None  # the class's mean job; None: nothing learned yet
    class_use: float = 0.0  # slot-seconds per second the class's jobs finished lately
    charge_by_cost: bool = False  # the lane charges a start its cost, not one unit


class Prediction(msgspec.Struct, frozen=True):
    """How long until the job starts, and what the figure rests on."""

    wait_s: float
    work_ahead: float  # slot-seconds the class serves before it
    slots: float  # what its class gets of the lane
    share: float  # its tenant's share of the class's starts now (w_t / sum w)
    ahead: int  # jobs of its own tenant ahead of it
    tenants: int  # waiting tenants of its class


def class_slots(capacity: int, classes: Sequence[ClassLoad], cls: str) -> float:
    """The slots class ``cls`` gets of a lane of ``capacity`` (the module's rule)."""
    wanting = {c.name: c for c in classes if c.demand > 0 or c.name == cls}
    if cls not in wanting:
        return 0.0
    got = {name: 0.0 for name in wanting}
    left = float(max(0, capacity))
    for batch in (False, True):
        tier = [c for c in wanting.values() if c.batch == batch]
        for c in tier:
            floor = min(float(c.min_slots), _demand(c, cls), left)
            got[c.name] += floor
            left -= floor
        left = _share_out(tier, got, left, cls)
    return got[cls]


def _demand(c: ClassLoad, cls: str) -> float:
    # the asking class wants as much as it can get: its whole queue is behind the job
    return math.inf if c.name == cls else float(c.demand)


def _share_out(tier: list[ClassLoad], got: dict[str, float], left: float, cls: str) -> float:
    """Weighted max-min of ``left`` slots over ``tier`` by share; returns what is left."""
    open_ = [c for c in tier if got[c.name] < _demand(c, cls) and c.share > 0]
    while open_ and left > 1e-9:
        total = sum(c.share for c in open_)
        filled = []
        given = 0.0
        for c in open_:
            room = _demand(c, cls) - got[c.name]
            part = left * c.share / total
            if part >= room:
                got[c.name] += room
                given += room
                filled.append(c)
        if not filled:
            for c in open_:
                got[c.name] += left * c.share / total
            return 0.0
        left -= given
        open_ = [c for c in open_ if c not in filled]
    return left


def predict(s: Situation, *, immediate: bool = True) -> Prediction | None:
    """The job's expected wait, or None where nothing can be said: no live slot for its
    class, or no learned duration for the work ahead of it. ``immediate=False`` leaves
    out the start at once into free slots (the fluid wait alone, as a marginal needs)."""
    slots = class_slots(s.capacity, s.classes, s.cls)
    own = next((b for b in s.backlogs if b.tenant == s.tenant), None)
    if slots <= 0 or own is None or own.weight <= 0:
        return None
    fallback = s.class_slot_seconds
    charge = _charges(s, fallback)
    own_d = own.slot_seconds if own.slot_seconds > 0 else fallback
    if own_d is None:
        return None
    v = (s.ahead + 0.5) * charge(own, own_d) / own.weight
    fixed = (s.ahead + 0.5) * own_d  # slot-seconds ahead of it that do not grow with the wait
    others: list[tuple[float, float, float]] = []  # (entitled, waiting, use) of each other
    starts, total_weight, read_use = s.ahead + 0.5, own.weight, max(0.0, own.use)
    for b in s.backlogs:
        if b is own:
            continue
        d = b.slot_seconds if b.slot_seconds > 0 else fallback
        entitled = b.weight * v / charge(b, d) if d is not None else 0.0
        if d is None:
            if b.jobs > 0:
                return None
            continue
        others.append((entitled * d, b.jobs * d, max(0.0, b.use)))
        starts += min(float(b.jobs), entitled)
        total_weight += b.weight
        read_use += max(0.0, b.use)
    if s.unread > 0:
        if fallback is None:
            return None
        entitled = v / charge(None, fallback)
        fixed += s.unread * entitled * fallback
        starts += s.unread * entitled
        total_weight += s.unread
    rest = min(max(0.0, s.class_use - read_use), REST_CAP * slots)
    in_flight = next((c.in_flight for c in s.classes if c.name == s.cls), 0)
    # the starts before it, and itself, fit in the slots free now: it starts at once
    at_once = immediate and in_flight + (starts - 0.5) + 1 <= slots + 1e-9
    wait = 0.0 if at_once else _fluid_wait(slots, fixed, others, rest)
    return Prediction(
        wait_s=wait,
        work_ahead=wait * slots,
        slots=slots,
        share=own.weight / total_weight if total_weight > 0 else 1.0,
        ahead=s.ahead,
        tenants=len(s.backlogs) + s.unread,
    )


def _charges(s: Situation, fallback: float | None) -> Callable[[Backlog | None, float], float]:
    """What a start of a tenant is charged in its tag: one unit per job, or in a lane that
    charges by cost its learned units (a tenant not learned yet: the mean of those that
    are, per slot-second of its jobs; with none learned, its slot-seconds themselves, as
    wall time is what a task that reports nothing is charged by)."""
    if not s.charge_by_cost:
        return lambda b, d: 1.0
    known = [(b.charge, b.slot_seconds) for b in s.backlogs if b.charge > 0 and b.slot_seconds > 0]
    per_slot_second = sum(c for c, _ in known) / sum(d for _, d in known) if known else 1.0

    def charge(b: Backlog | None, d: float) -> float:
        if b is not None and b.charge > 0:
            return b.charge
        return max(d * per_slot_second, 1e-9)

    return charge


def _fluid_wait(
    slots: float, fixed: float, others: list[tuple[float, float, float]], rest: float
) -> float:
    """The ``T`` at which the class has served, at ``slots``, the work ahead of the job:
    ``slots * T = fixed + sum min(entitled, waiting + use * T) + rest * T``. The right
    side grows more slowly than the left once ``T`` is past every tenant's cap (``rest``
    is kept below ``slots``), so the one root is found by bisection."""

    def excess(t: float) -> float:
        taken = sum(min(cap, waiting + use * t) for cap, waiting, use in others)
        return fixed + taken + rest * t - slots * t

    lo, hi = 0.0, (fixed + sum(cap for cap, _, _ in others)) / (slots - rest)
    for _ in range(60):
        mid = (lo + hi) / 2
        if excess(mid) > 0:
            lo = mid
        else:
            hi = mid
    return hi


def per_job_wait(s: Situation) -> float:
    """What one more job of its own tenant ahead of it adds to a job's wait: the fluid
    wait's step, free slots left out (in a burst they are soon taken)."""
    here = predict(s, immediate=False)
    behind = predict(msgspec.structs.replace(s, ahead=s.ahead + 1), immediate=False)
    if here is None or behind is None:
        return 0.0
    return max(0.0, behind.wait_s - here.wait_s)


def fold_mean(mean: float | None, count: int, batch_mean: float) -> float:
    """A learned mean after ``count`` more observations averaging ``batch_mean``: as if
    each had moved it by ``DURATION_ALPHA`` in turn (the first ever sets it)."""
    if mean is None:
        return batch_mean
    if count <= 0:
        return mean
    keep = (1 - DURATION_ALPHA) ** count
    return keep * mean + (1 - keep) * batch_mean


def latest_start_ms(deadline_ms: int, expected_ms: float) -> float:
    """The last moment a job expected to run ``expected_ms`` can start and still finish
    by its deadline, its learned length taken ``DEADLINE_SAFETY`` times over."""
    return deadline_ms - expected_ms * DEADLINE_SAFETY


def needs_at_enqueue(needs_ms: int, seen: int, queued: int, per_job_ms: int) -> int:
    """How long a submission is expected to take to finish, as enqueue judges it: its
    estimate ``needs_ms`` made when its tenant had ``seen`` jobs queued, plus
    ``per_job_ms`` for each job queued since (``queued`` now). Submissions estimated at
    the same moment all saw the same queue; each sees the others at enqueue."""
    if needs_ms <= 0 or seen < 0:
        return needs_ms
    return needs_ms + max(0, queued - seen) * per_job_ms


def unmeetable(now_ms: float, deadline_ms: int, expected_ms: float | None) -> bool:
    """Whether a job starting at ``now_ms`` is expected to miss ``deadline_ms``: its
    learned length no longer fits before it (no learned length: only a deadline already
    past). Dispatch applies the same rule before a job takes a slot
    (``lua/lease.lua``, ``runnable``)."""
    if expected_ms is None:
        return now_ms > deadline_ms
    return now_ms > latest_start_ms(deadline_ms, expected_ms)
