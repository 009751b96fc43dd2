"""The discrete-event engine: one variant of one scenario on a virtual clock.

This module owns the simulation loop. Time is a float of seconds that only the events
move; there is no Redis, no asyncio, no wall clock in any decision. Events are
arrivals (a lazy, time-ordered stream from ``fairlane.sim.arrivals``), slice ends (a
``heapq`` of ``(end, seq, job)``, at most one entry per busy slot) and resubmissions
after a rejection (a second, usually empty heap). At equal times a slice end goes
before an arrival, so a freed slot is seen by the arrival.

A job is a list ``[seq, tenant, submitted, remaining, first start, rejections, run,
offered, parked, failed attempts, pushbacks, used, answer]`` (``fairlane.sim.world.Job``).
Its life, under ``fair``:

1. **Submit.** With a gate, ``fairlane.sim.gate`` decides (``admission.fits``):
   accepted, the job reserves its tenant's units until it completes; full, it is
   deferred or rejected with the reason, and maybe resubmitted after a Retry-After.
2. **Queue.** It joins its tenant's FIFO in its class's ``FairClass`` (rule 1 of the
   fair queue: an idle tenant comes back at ``max(V, tag)``).
3. **Dispatch**, whenever a lane may have a free slot: ``ClassChooser`` picks the class
   (``classes.next_class`` on in-flight and waiting slots and head widths) and its
   fair head. A job with throttle keys (its tenant's own key ``tenant:<t>`` when the
   tenant has a cap or floor/ceiling settings, at ``ceilings.tenant_limit`` for
   settings; and the shared keys it names) takes them in the same step as its lane
   slot (``fairlane.sim.keys.FairKeys``): admitted, it is charged and starts; else it
   parks, holding nothing, and its tenant is not charged. When a key gains room its
   waiters are woken tenant-fairly; a woken job holds an offer on each of its keys and
   goes back into its tenant's queue at its own position. Under ``waiters=fifo`` (the
   rule before issue 16, ``FifoKeys``) the fair head is charged and takes its keys, a
   release grants the slots to the key's first waiter at once, and the granted job
   joins the class's granted queue, which goes before the fair head, holding its keys
   while it waits for a lane slot.
4. **Run** ``min(remaining, slice)`` seconds. At the end its slot (and its keys) are
   freed; a job with work left *yields*: it re-enters its tenant's queue in its
   original order (a job keeps its seq, as in the store), so the fair queue decides
   when it resumes. A finished job releases its reservation, and the deferred jobs
   the gate then admits are queued.

**Rate keys and upstreams.** When a key has a rate or an adaptive limit in force, the
keys are ``fairlane.sim.rates.FairRateKeys`` (the same rules, with buckets, pauses and
due times: a key that must wait for tokens is due at a timer the loop fires, in due
order, before an arrival at the same time). A job whose tenant names a key with an
``upstream`` *calls* it when it starts (``fairlane.sim.rates.Upstream``): served, it
runs its size; a 429 holds its slot for the upstream's ``reject_time`` and then ends
its attempt. On a key the job holds that is a pushback (the key paused until the
Retry-After; the job due again at the pause's end, without spending an attempt, up to
``MAX_PUSHBACKS``; past that an ordinary failure, backed off at least until the pause's
end); on a key it does not hold, an ordinary failure: a retry after
``[retry]``'s backoff, or a failed job once ``max_attempts`` failed. A job on a rate key
or calling an upstream is never sliced (an attempt is one call). When an attempt ends
its keys get, in order, the correction by what it used (a 429 reports nothing), the
adaptive growth on success, the pushback and the release.

Under ``fifo`` a lane has one plain deque: a job starts when it is first and a slot is
free; a yielding job goes to the back (at the front it would simply run on).

Start delay (the wait) is the first start minus the submission the gate took (accepted
or deferred): time spent deferred counts, a rejected client's backoff before it
resubmits does not (rejections, resubmissions and lost jobs are counted apart). Per
tenant the engine also accrues service (slot-seconds of slices, clipped to the
measurement window) and backlogged time (time with work admitted but not started);
``fairlane.sim.metrics`` turns them into shares, Jain's index and utilisation.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import deque
from collections.abc import Callable

from fairlane.policy.rates import MAX_PUSHBACKS
from fairlane.sim.arrivals import arrivals
from fairlane.sim.fastpath import FairClass
from fairlane.sim.gate import Admission
from fairlane.sim.keys import FairKeys, FifoKeys
from fairlane.sim.limits import Limits
from fairlane.sim.metrics import Raw
from fairlane.sim.rates import FairRateKeys, Upstream
from fairlane.sim.scenario import Scenario
from fairlane.sim.variants import Settings
from fairlane.sim.world import (
    ANS,
    ATT,
    FIRST,
    PB,
    REM,
    RUN,
    SEQ,
    SUB,
    TEN,
    USED,
    Job,
    build,
)

heappush = heapq.heappush

__all__ = ["Engine", "simulate"]

_SAMPLES = 200


class Engine:
    """One run; ``run()`` returns the raw counters for ``fairlane.sim.metrics``."""

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
        self.seq = 0
        horizon = scenario.horizon
        w0, w1 = scenario.sim.window or (0.0, horizon if horizon > 0 else math.inf)
        self.w0, self.w1 = w0, w1
        self.dt = scenario.sim.sample or (horizon / _SAMPLES if horizon > 0 else 1.0)
        self.phases = [(p.start, p.end) for p in scenario.phases]
        self.raw = Raw.empty(settings, w, (w0, w1), scenario.phases)
        # a tenant is throttled with a static cap, floor/ceiling settings or shared keys
        self.fair_keys = settings.waiters == "fair"
        self.rated = w.rated
        self.keys: FairKeys | FifoKeys | FairRateKeys
        self.rk: FairRateKeys | None = None
        if self.rated:
            self.keys = self.rk = FairRateKeys(
                w.key_limit,
                w.keys_of,
                self.raw.handoffs,
                names=w.names,
                key_names=w.key_names,
                weights=w.weight,
                cost_of=self._charge,
                rates=w.key_rate,
                adaptive=w.key_adaptive,
                units=w.units,
            )
        else:
            self.keys = (
                FairKeys(
                    w.key_limit,
                    w.keys_of,
                    self.raw.handoffs,
                    names=w.names,
                    weights=w.weight,
                    cost_of=self._charge,
                )
                if self.fair_keys
                else FifoKeys(w.key_limit, w.keys_of, self.raw.handoffs)
            )
        self.limits = Limits(w, self.raw, self.phases, self.keys.in_use)
        self.throttled, self.durs = self.limits.throttled, self.limits.durs
        self.own_key = [bool(c) or lim is not None for c, lim in zip(w.cap, w.limits, strict=True)]
        self.woken: list[int] = []  # lanes where a woken job went back into a queue
        self.gate = Admission(scenario, w, self.raw)
        self.retry = self.gate.retry
        self.queued = 0
        self._calls(scenario)

    def _calls(self, scenario: Scenario) -> None:
        """Upstreams, what jobs really use, and retries after a 429."""
        w = self.w
        self.up = [Upstream(spec) for spec in w.upstreams]
        self.up_of, self.up_key = w.upstream_of, w.upstream_key
        # a job on a rate key or calling an upstream is one call: never sliced
        self.whole = [
            u >= 0 or any(w.key_rate[k] is not None for k in keys)
            for u, keys in zip(w.upstream_of, w.keys_of, strict=True)
        ]
        self.sched: list[tuple[float, int, Job]] = []
        """Jobs due back in their tenant's queue: ``(when, seq, job)`` (pushback, backoff)."""
        self.timed = self.rated or bool(self.up)
        samplers: dict[int, Callable[[], float]] = {}
        self.draw: list[Callable[[], float] | None] = []
        for t, dist in enumerate(w.used):
            if dist is None:
                self.draw.append(None)
                continue
            source = w.source_of[t]
            if source not in samplers:
                rng = random.Random(f"{scenario.seed}:{source}:used")
                samplers[source] = dist.sampler(rng)
            self.draw.append(samplers[source])
        self.backoff = scenario.retry.backoff
        self.attempts = scenario.retry.max_attempts
        self.jitter = random.Random(f"{scenario.seed}:backoff")

    # -- the loop ---------------------------------------------------------------------

    def run(self) -> Raw:
        started = time.perf_counter()
        heappop = heapq.heappop
        comp, retry, raw = self.comp, self.retry, self.raw
        inf = math.inf
        source = arrivals(self.sc)
        nxt = next(source, None)
        at = nxt[0] if nxt is not None else inf
        until = self.sc.sim.until if self.sc.sim.until is not None else inf
        end_slice, submit = self._end_slice, self._submit
        sample_at, dt = 0.0, self.dt
        now = 0.0
        timed, draw, units = self.timed, self.draw, self.w.units
        while True:
            ct = comp[0][0] if comp else inf
            if (
                timed
                and (lt := self._next_timer()) <= at
                and lt < ct
                and not (retry and retry[0][0] < lt)
            ):
                now = lt
                if now > until:
                    break
                self._fire(now)
            elif retry and retry[0][0] < at and retry[0][0] < ct:
                now = retry[0][0]
                if now > until:
                    break
                self._resubmit(now)
            elif ct <= at:
                if ct == inf:
                    break
                now = ct
                if now > until:
                    break
                end_slice(heappop(comp)[2], now)
            else:
                now = at
                assert nxt is not None
                seq = self.seq
                self.seq = seq + 1
                t = nxt[1]
                raw.submitted[t] += 1
                if timed and self.up_of[t] >= 0:
                    raw.pend(t, now)
                d = draw[t]
                used = d() if d is not None else units[t]
                submit([seq, t, now, nxt[2], -1.0, 0, 0.0, 0, None, 0, 0, used, 0.0], now)
                nxt = next(source, None)
                at = nxt[0] if nxt is not None else inf
            if now >= sample_at:
                raw.series.append((now, self.queued, len(comp), self.gate.waiting))
                sample_at = (math.floor(now / dt) + 1) * dt
        self._finish(min(now, until), started)
        return raw

    def _resubmit(self, now: float) -> None:
        """The first rejected job due to resubmit does, at ``now``."""
        job = heapq.heappop(self.retry)[2]
        job[SEQ] = self.seq  # a resubmission queues as a new job would,
        job[SUB] = now  # and its wait counts from here
        self.seq += 1
        self._submit(job, now)

    def _finish(self, end: float, started: float) -> None:
        raw = self.raw
        raw.makespan = end
        for t, n in enumerate(raw.waiting):
            if n:
                raw.backlog[t] += self._overlap(raw.since[t], end)
        raw.unfinished = (
            self.queued + len(self.comp) + self.gate.waiting + len(self.retry) + len(self.sched)
        )
        if isinstance(self.keys, FairRateKeys):
            raw.rate_keys = self.keys
        for t, n in enumerate(raw.pending):
            if n:
                raw.pend_time[t] += self._overlap(raw.pend_since[t], end)
        raw.wall = time.perf_counter() - started

    def _overlap(self, a: float, b: float) -> float:
        a, b = max(a, self.w0), min(b, self.w1)
        return b - a if b > a else 0.0

    # -- submission and admission -----------------------------------------------------

    def _submit(self, job: Job, now: float) -> None:
        t = job[TEN]
        self.limits.submitted(t, now)
        li = self.lane_of[t]
        if self.gated[li] and not self.gate.offer(job, li, now):
            return
        self._enqueue(job, t, now, False)
        if self.free[li] > 0:
            self._dispatch(li, now)
        if self.woken:
            self._wake_lanes(now)

    # -- queues and dispatch ----------------------------------------------------------

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

    def _start(self, job: Job, li: int, pos: int, wd: int, now: float) -> None:
        t = job[TEN]
        raw = self.raw
        self.f[li][pos] += wd
        self.free[li] -= wd
        rem = job[REM]
        if self.timed and self.whole[t]:
            u = self.up_of[t]
            run = self._call(job, t, u, now, rem) if u >= 0 else rem
        else:
            run = rem if rem <= self.slice else self.slice
        job[RUN] = run
        if job[FIRST] < 0:
            job[FIRST] = now
            raw.waits[t].append(now - job[SUB])
            if self.phases:
                self._phase_wait(t, job[SUB], now - job[SUB])
        w0, w1 = self.w0, self.w1
        waiting = raw.waiting
        waiting[t] -= 1
        if not waiting[t]:  # backlogged time, clipped to the window
            a = raw.since[t]
            a = a if a > w0 else w0
            b = now if now < w1 else w1
            if b > a:
                raw.backlog[t] += b - a
        self.queued -= 1
        end = now + run
        a = now if now > w0 else w0
        b = end if end < w1 else w1
        if b > a:
            raw.served[t] += (b - a) * wd
        if self.phases:
            self._phase_service(t, now, end, wd)
        heappush(self.comp, (end, job[SEQ], job))

    def _phase_wait(self, t: int, submitted: float, wait: float) -> None:
        for k, (p0, p1) in enumerate(self.phases):
            if p0 <= submitted < p1:
                self.raw.phase_waits[self.w.ckey_of[t]][k].append(wait)
                return

    def _phase_service(self, t: int, start: float, end: float, wd: int) -> None:
        served = self.raw.phase_served[t]
        for k, (p0, p1) in enumerate(self.phases):
            x, y = max(start, p0), min(end, p1)
            if y > x:
                served[k] += (y - x) * wd

    def _end_slice(self, job: Job, now: float) -> None:
        t = job[TEN]
        li, q, wd = self.lane_of[t], self.queue_of[t], self.width[t]
        self.queue_f[q][self.queue_pos[q]] -= wd
        self.free[li] += wd
        if self.throttled[t]:
            self.durs[t].observe(job[RUN])
            out: list[Job] = []
            if self.rk is not None:
                self._end_attempt(self.rk, job, t, now, out)
            else:
                self.keys.release(self.w.keys_of[t], out)
            place = self._requeue if self.fair_keys else self._grant
            for other in out:
                place(other)
        if job[ANS]:
            self._refused(job, t, li, now)
            self._dispatch(li, now)
            if self.woken:
                self._wake_lanes(now)
            return
        rem = job[REM] - job[RUN]
        if rem > 0:
            job[REM] = rem
            self.raw.yields += 1
            self._enqueue(job, t, now, True)
        else:
            raw = self.raw
            raw.completed[t] += 1
            raw.resp[t] += now - job[SUB]
            if self.timed:  # completion times are reported with upstreams and rate keys
                raw.done[t].append(now - job[SUB])
            if self.gated[li]:
                for other in self.gate.release(t, li):
                    self._enqueue(other, other[TEN], now, False)
        self._dispatch(li, now)
        if self.woken:
            self._wake_lanes(now)

    # -- upstream calls, pushback and retries -------------------------------------------

    def _call(self, job: Job, t: int, u: int, now: float, rem: float) -> float:
        """``job`` calls its upstream as it starts: how long the attempt holds its slot."""
        up, raw = self.up[u], self.raw
        tokens = up.largest(job[USED])
        after = up.call(round(now * 1000), tokens)
        inside = self.w0 <= now < self.w1
        if inside:
            raw.up_calls[u] += 1
        if after:
            job[ANS] = after
            if inside:
                raw.up_429[u] += 1
            return up.spec.reject_time
        if inside:
            raw.up_ok[u] += 1
            raw.up_tokens[u] += tokens
            raw.got_calls[t] += 1
            raw.got_tokens[t] += tokens
        raw.unpend(t, now)
        return rem

    def _end_attempt(
        self, keys: FairRateKeys, job: Job, t: int, now: float, out: list[Job]
    ) -> None:
        """The attempt's end on its keys: correction, growth, pushback, release."""
        ms = round(now * 1000)
        keys.at(ms)
        after = job[ANS]
        push = self.up_key[t] if after else -1
        until = ms + math.ceil(after * 1000) if push >= 0 else 0
        used = None if after else job[USED]  # a 429 reports nothing used
        keys.end(job, out, used=used, succeeded=not after, push=push, until=until)

    def _refused(self, job: Job, t: int, li: int, now: float) -> None:
        """After a 429: back due at the pause's end (a pushback), a retry after backoff,
        or, its attempts spent, a failed job."""
        job[ANS] = 0.0
        k, raw = self.up_key[t], self.raw
        resume = now
        if k >= 0:
            assert self.rk is not None
            resume = self.rk.bucket[k].paused_until / 1000.0
            if job[PB] < MAX_PUSHBACKS:
                job[PB] += 1
                raw.pushed[t] += 1
                heappush(self.sched, (resume, job[SEQ], job))
                return
        job[ATT] += 1
        if job[ATT] >= self.attempts:
            raw.failed[t] += 1
            raw.unpend(t, now)
            if self.gated[li]:
                for other in self.gate.release(t, li):
                    self._enqueue(other, other[TEN], now, False)
            return
        raw.retried[t] += 1
        delay = self.backoff.delay(job[ATT], self.jitter.random())
        heappush(self.sched, (max(now + delay, resume), job[SEQ], job))

    def _next_timer(self) -> float:
        sched = self.sched
        lt = sched[0][0] if sched else math.inf
        if self.rk is not None:
            due = self.rk.next_due()
            if due is not None and due / 1000.0 < lt:
                lt = due / 1000.0
        return lt

    def _fire(self, now: float) -> None:
        """The earliest timer: a key due (its waiters woken) or a job due back."""
        sched, rk = self.sched, self.rk
        due = rk.next_due() if rk is not None else None
        if rk is not None and due is not None and (not sched or due / 1000.0 <= sched[0][0]):
            rk.at(due)
            out: list[Job] = []
            rk.fire(out)
            for other in out:
                self._requeue(other)
        else:
            job = heapq.heappop(sched)[2]
            t = job[TEN]
            self._enqueue(job, t, now, True)
            li = self.lane_of[t]
            if self.free[li] > 0:
                self._dispatch(li, now)
        if self.woken:
            self._wake_lanes(now)


def simulate(scenario: Scenario, settings: Settings) -> Raw:
    """Run one variant of ``scenario`` to the end; the raw counters of the run."""
    return Engine(scenario, settings).run()
