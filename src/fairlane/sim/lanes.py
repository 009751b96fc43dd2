"""The simulator's lanes: their dispatch queues, throttle keys, and how a free slot takes
its next job.

:class:`Lanes` holds a run's queues -- each tenant's FIFO inside its class's
``FairClass`` under ``fair``, one plain deque per lane under ``fifo``, and the granted
queue of ``waiters=fifo`` -- with each lane's free slots and its classes' in-flight and
waiting slots, and the throttle keys (``fairlane.sim.keys`` or, with a rate or an
adaptive limit in force, ``fairlane.sim.rates.FairRateKeys``). Steps 2 and 3 of a job's
life in ``fairlane.sim.engine`` are its: a job queues, and whenever a lane may have a
free slot ``ClassChooser`` picks the class and its fair head, which takes its keys with
its lane slot or parks. The engine (a ``Lanes``) starts the jobs taken and runs the
clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from fairlane.sim.fastpath import FairClass
from fairlane.sim.keys import FairKeys, FifoKeys
from fairlane.sim.limits import Limits
from fairlane.sim.rates import FairRateKeys
from fairlane.sim.raw import Raw
from fairlane.sim.scenario import Scenario
from fairlane.sim.variants import Settings
from fairlane.sim.world import REM, SEQ, TEN, Job, build

__all__ = ["Lanes"]


class Lanes:
    """A run's queues, slots and throttle keys, and the dispatch that takes from them."""

    _start: Callable[[Job, int, int, int, float], None]
    """Start a taken job on ``width`` slots of its lane (the engine's)."""

    def __init__(self, scenario: Scenario, settings: Settings) -> None:
        self.sc, self.s = scenario, settings
        w = self.w = build(scenario, settings)
        n = w.tenants
        self.fifo = settings.policy == "fifo"
        self.slice = settings.slice
        self.by_time = settings.charge == "time"
        self.cost = [1.0] * n if settings.charge == "jobs" else w.charge
        self.tq: list[deque[Job]] = [deque() for _ in range(n)]
        nq = len(w.queue_lane)
        tags = [0.0] * n
        self.fair = [FairClass(tags, self.tq, w.weight, w.names) for _ in range(nq)]
        self.fifoq: list[deque[Job]] = [deque() for _ in range(nq)]
        self.granted: list[deque[Job]] = [deque() for _ in range(nq)]
        self.free = [lane.slots for lane in w.lanes]
        self.f = [[0] * len(lane.queues) for lane in w.lanes]
        self.d = [[0] * len(lane.queues) for lane in w.lanes]
        # flat aliases for the inner loop
        self.lane_of, self.queue_of, self.width = w.lane_of, w.queue_of, w.width
        self.queue_pos = w.queue_pos
        self.queue_f = [self.f[li] for li in w.queue_lane]
        self.queue_d = [self.d[li] for li in w.queue_lane]
        self.gated = [lane.gate is not None for lane in w.lanes]
        self.lane_ctx = [
            (self.f[li], self.d[li], lane.chooser, lane.queues, lane.uniform)
            for li, lane in enumerate(w.lanes)
        ]
        self.comp: list[tuple[float, int, Job]] = []
        self.queued = 0
        horizon = scenario.horizon
        w0, w1 = scenario.sim.window or (0.0, horizon if horizon > 0 else math.inf)
        self.w0, self.w1 = w0, w1
        self.phases = [(p.start, p.end) for p in scenario.phases]
        self.raw = Raw.empty(settings, w, (w0, w1), scenario.phases)
        # a tenant is throttled with a static cap, floor/ceiling settings or shared keys
        self.fair_keys = settings.waiters == "fair"
        self.keys, self.rk = self._keys()
        self.limits = Limits(w, self.raw, self.phases, self.keys.in_use)
        self.throttled, self.durs = self.limits.throttled, self.limits.durs
        self.own_key = [bool(c) or lim is not None for c, lim in zip(w.cap, w.limits, strict=True)]
        self.woken: list[int] = []  # lanes where a woken job went back into a queue

    def _keys(self) -> tuple[FairKeys | FifoKeys, FairRateKeys | None]:
        """The run's throttle keys; the same keys again when they have rates."""
        w, handoffs = self.w, self.raw.handoffs
        if w.rated:
            rk = FairRateKeys(
                w.key_limit,
                w.keys_of,
                handoffs,
                names=w.names,
                key_names=w.key_names,
                weights=w.weight,
                cost_of=self._charge,
                rates=w.key_rate,
                adaptive=w.key_adaptive,
                units=w.units,
            )
            return rk, rk
        if self.fair_keys:
            keys = FairKeys(
                w.key_limit,
                w.keys_of,
                handoffs,
                names=w.names,
                weights=w.weight,
                cost_of=self._charge,
            )
            return keys, None
        return FifoKeys(w.key_limit, w.keys_of, handoffs), None

    # -- queues -------------------------------------------------------------------------

    def _enqueue(self, job: Job, t: int, now: float, again: bool) -> None:
        """Queue an admitted job; ``again``: a yielded job back in its original order."""
        q = self.queue_of[t]
        if self.fifo:
            self.fifoq[q].append(job)
        elif not again:
            self.fair[q].push(t, job)
        else:
            self._place(job, t, q)
        self.queue_d[q][self.queue_pos[q]] += self.width[t]
        raw = self.raw
        waiting = raw.waiting
        if not waiting[t]:
            raw.since[t] = now
        waiting[t] += 1
        self.queued += 1
        raw.max_queued = max(raw.max_queued, self.queued)

    def _place(self, job: Job, t: int, q: int) -> None:
        """Put ``job`` back into its tenant's queue at its own position (by seq)."""
        mine = self.tq[t]
        if mine and mine[0][SEQ] < job[SEQ]:  # an older job of its tenant waits
            i = 1
            while i < len(mine) and mine[i][SEQ] < job[SEQ]:
                i += 1
            mine.insert(i, job)
        else:
            self.fair[q].push(t, job, True)

    def _requeue(self, job: Job) -> None:
        """A woken job (it holds offers) goes back into its lane; it never left the
        waiting counts, so only the class's waiting slots grow."""
        t = job[TEN]
        q = self.queue_of[t]
        if self.fifo:
            fq = self.fifoq[q]
            i = 0
            while i < len(fq) and fq[i][SEQ] < job[SEQ]:
                i += 1
            fq.insert(i, job)
        else:
            self._place(job, t, q)
        self.queue_d[q][self.queue_pos[q]] += self.width[t]
        self.woken.append(self.lane_of[t])

    def _wake_lanes(self, now: float) -> None:
        woken = self.woken
        while woken:
            li = woken.pop()
            if self.free[li] > 0:
                self._dispatch(li, now)

    def _charge(self, job: Job) -> float:
        """What the fair queue charges ``job``'s tenant for dispatching it."""
        if self.by_time:
            rem = job[REM]
            return rem if rem < self.slice else self.slice
        return self.cost[job[TEN]]

    # -- dispatch -----------------------------------------------------------------------

    def _dispatch(self, li: int, now: float) -> None:
        f, d, chooser, queues, narrow = self.lane_ctx[li]
        free, take, start = self.free, self._take, self._start
        while free[li] > 0:
            if chooser is None:
                q, pos = queues[0], 0
                if not d[0]:
                    return
                wd = 1 if narrow else self._heads(queues)[0]
                if wd > free[li]:
                    return
            elif narrow:
                if not any(d):
                    return
                pos = chooser.choose_narrow(f, d)
                if pos < 0:
                    return
                q, wd = queues[pos], 1
            else:
                w = self._heads(queues)
                pos = chooser.choose(f, w, d)
                if pos < 0:
                    return
                q, wd = queues[pos], w[pos]
            d[pos] -= wd
            job = take(q, li, now)
            if job is not None:
                start(job, li, pos, wd, now)

    def _heads(self, queues: list[int]) -> list[int]:
        width, heads = self.w.width, []
        for q in queues:
            g = self.granted[q]
            if g:
                heads.append(width[g[0][TEN]])
            elif self.fifo:
                fq = self.fifoq[q]
                heads.append(width[fq[0][TEN]] if fq else 0)
            else:
                h = self.fair[q].head()
                heads.append(width[h] if h >= 0 else 0)
        return heads

    def _take(self, q: int, li: int, now: float) -> Job | None:
        """The queue's head job, charged; None if it parked on a throttle key."""
        g = self.granted[q]
        if g:
            return g.popleft()
        if self.fifo:
            fq = self.fifoq[q]
            t = fq[0][TEN]
            if not self.throttled[t]:
                return fq.popleft()
        else:
            fc = self.fair[q]
            t = fc.active[0][2]
            if not self.throttled[t]:
                job = self.tq[t][0]
                if self.by_time:
                    rem = job[REM]
                    fc.pop(rem if rem < self.slice else self.slice)
                else:
                    fc.pop(self.cost[t])
                return job
        if self.fair_keys:
            return self._take_keys(q, li, now, t)
        return self._take_fifo(q, li, now, t)

    def _take_keys(self, q: int, li: int, now: float, t: int) -> Job | None:
        """Rule 1: the head takes its keys with its lane slot, or parks uncharged."""
        out: list[Job] = []
        if self.rk is not None:
            self.rk.at(round(now * 1000))
        if self.own_key[t]:  # a raised limit wakes its waiters, which come first
            limit = self.limits.limit(t, li, now, self.f[li], self.d[li])
            self.keys.set_limit(t, limit, out)
            for other in out:
                self._requeue(other)
            out.clear()
        job = self.fifoq[q][0] if self.fifo else self.tq[t][0]
        admitted = self.keys.take(job, out)
        if self.fifo:
            self.fifoq[q].popleft()
        elif admitted:
            self._pop(self.fair[q], t)
        else:
            self.fair[q].drop()  # parked: its tenant is charged when it is admitted
        for other in out:
            self._requeue(other)
        if admitted:
            self.limits.peak(t)
            return job
        self.raw.parked += 1
        return None

    def _pop(self, fc: FairClass, t: int) -> Job:
        """Dispatch the head tenant's first job, charged as the fair queue charges."""
        if self.by_time:
            rem = self.tq[t][0][REM]
            job: Job = fc.pop(rem if rem < self.slice else self.slice)
        else:
            job = fc.pop(self.cost[t])
        return job

    def _take_fifo(self, q: int, li: int, now: float, t: int) -> Job | None:
        """``waiters=fifo``: the head is charged, then takes its keys or parks."""
        job = self.fifoq[q].popleft() if self.fifo else self._pop(self.fair[q], t)
        out: list[Job] = []
        if self.own_key[t]:
            self.keys.set_limit(t, self.limits.limit(t, li, now, self.f[li], self.d[li]), out)
        admitted = self.keys.take(job, out)
        for other in out:
            self._grant(other)
        if admitted:
            self.limits.peak(t)
            return job
        self.raw.parked += 1
        return None

    def _grant(self, job: Job) -> None:
        t = job[TEN]
        q = self.w.queue_of[t]
        self.granted[q].append(job)
        self.d[self.w.queue_lane[q]][self.w.queue_pos[q]] += self.w.width[t]
        self.limits.peak(t)
