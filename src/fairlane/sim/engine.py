"""The discrete-event engine: one variant of one scenario on a virtual clock.

This module owns the simulation loop; the lanes' queues and their dispatch are
``fairlane.sim.lanes``', the upstream calls and retries ``fairlane.sim.calls``'. Time is
a float of seconds that only the events move; there is no Redis, no asyncio, no wall
clock in any decision. Events are arrivals (a lazy, time-ordered stream from
``fairlane.sim.arrivals``), slice ends (a ``heapq`` of ``(end, seq, job)``, at most one
entry per busy slot) and resubmissions after a rejection (a second, usually empty heap).
At equal times a slice end goes before an arrival, so a freed slot is seen by the
arrival.

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
order, before an arrival at the same time). Upstream calls, 429s, pushbacks and retries
are ``fairlane.sim.calls``'.

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
import time

from fairlane.sim.arrivals import arrivals
from fairlane.sim.calls import Calls
from fairlane.sim.gate import Admission
from fairlane.sim.lanes import Lanes
from fairlane.sim.raw import Raw
from fairlane.sim.scenario import Scenario
from fairlane.sim.variants import Settings
from fairlane.sim.world import ANS, FIRST, REM, RUN, SEQ, SUB, TEN, Job

heappush = heapq.heappush

__all__ = ["Engine", "simulate"]

_SAMPLES = 200


class Engine(Lanes):
    """One run; ``run()`` returns the raw counters for ``fairlane.sim.metrics``."""

    def __init__(self, scenario: Scenario, settings: Settings) -> None:
        super().__init__(scenario, settings)
        self.seq = 0
        horizon = scenario.horizon
        self.dt = scenario.sim.sample or (horizon / _SAMPLES if horizon > 0 else 1.0)
        self.gate = Admission(scenario, self.w, self.raw)
        self.retry = self.gate.retry
        self.calls = calls = Calls(scenario, self.w, self.raw, self.rk, (self.w0, self.w1))
        self.timed, self.whole, self.up_of = calls.timed, calls.whole, calls.up_of

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
        timed, draw, units = self.timed, self.calls.draw, self.w.units
        next_timer = self.calls.next_timer
        while True:
            ct = comp[0][0] if comp else inf
            if (
                timed
                and (lt := next_timer()) <= at
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
            self.queued
            + len(self.comp)
            + self.gate.waiting
            + len(self.retry)
            + len(self.calls.sched)
        )
        if self.rk is not None:
            raw.rate_keys = self.rk
        for t, n in enumerate(raw.pending):
            if n:
                raw.pend_time[t] += self._overlap(raw.pend_since[t], end)
        raw.wall = time.perf_counter() - started

    def _overlap(self, a: float, b: float) -> float:
        a, b = max(a, self.w0), min(b, self.w1)
        return b - a if b > a else 0.0

    # -- submission, and a job on its slots -------------------------------------------

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

    def _start(self, job: Job, li: int, pos: int, wd: int, now: float) -> None:
        t = job[TEN]
        raw = self.raw
        self.f[li][pos] += wd
        self.free[li] -= wd
        rem = job[REM]
        if self.timed and self.whole[t]:
            u = self.up_of[t]
            run = self.calls.call(job, t, u, now, rem) if u >= 0 else rem
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
                self.calls.end_attempt(self.rk, job, t, now, out)
            else:
                self.keys.release(self.w.keys_of[t], out)
            place = self._requeue if self.fair_keys else self._grant
            for other in out:
                place(other)
        if job[ANS]:
            if self.calls.refused(job, t, now):
                self._released(t, li, now)
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
            self._released(t, li, now)
        self._dispatch(li, now)
        if self.woken:
            self._wake_lanes(now)

    def _released(self, t: int, li: int, now: float) -> None:
        """A job of ``t`` is done with (completed or failed): its reservation goes, and
        the deferred jobs the gate then admits are queued."""
        if self.gated[li]:
            for other in self.gate.release(t, li):
                self._enqueue(other, other[TEN], now, False)

    def _fire(self, now: float) -> None:
        """The earliest timer: a key due (its waiters woken) or a job due back."""
        out: list[Job] = []
        job = self.calls.fire(out)
        if job is None:
            for other in out:
                self._requeue(other)
        else:
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
