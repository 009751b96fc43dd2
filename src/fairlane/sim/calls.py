"""Upstream calls, pushbacks and retries in the simulator, and the timers they set.

A job whose tenant names a key with an ``upstream`` *calls* it when it starts
(``fairlane.sim.rates.Upstream``): served, it runs its size; a 429 holds its slot for
the upstream's ``reject_time`` and then ends its attempt. On a key the job holds that is
a pushback (the key paused until the Retry-After; the job due again at the pause's end,
without spending an attempt, up to ``MAX_PUSHBACKS``; past that an ordinary failure,
backed off at least until the pause's end); on a key it does not hold, an ordinary
failure: a retry after ``[retry]``'s backoff, or a failed job once ``max_attempts``
failed. A job on a rate key or calling an upstream is never sliced (an attempt is one
call). When an attempt ends its keys get, in order, the correction by what it used (a
429 reports nothing), the adaptive growth on success, the pushback and the release.

:class:`Calls` owns these and the two kinds of timer the engine's loop fires in due
order: a rate key due (its waiters woken) and a job due back in its tenant's queue.
It also draws what each job really uses, at its arrival.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable

from fairlane.policy.rates import MAX_PUSHBACKS
from fairlane.sim.rates import FairRateKeys, Upstream
from fairlane.sim.raw import Raw
from fairlane.sim.scenario import Scenario
from fairlane.sim.world import ANS, ATT, PB, SEQ, USED, Job, World

__all__ = ["Calls"]


class Calls:
    """Upstreams, what jobs really use, and retries after a 429, for one run."""

    def __init__(
        self,
        scenario: Scenario,
        w: World,
        raw: Raw,
        rk: FairRateKeys | None,
        window: tuple[float, float],
    ) -> None:
        self.raw, self.rk = raw, rk
        self.w0, self.w1 = window
        self.up = [Upstream(spec) for spec in w.upstreams]
        self.up_of, self.up_key = w.upstream_of, w.upstream_key
        # a job on a rate key or calling an upstream is one call: never sliced
        self.whole = [
            u >= 0 or any(w.key_rate[k] is not None for k in keys)
            for u, keys in zip(w.upstream_of, w.keys_of, strict=True)
        ]
        self.sched: list[tuple[float, int, Job]] = []
        """Jobs due back in their tenant's queue: ``(when, seq, job)`` (pushback, backoff)."""
        self.timed = w.rated or bool(self.up)
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

    def call(self, job: Job, t: int, u: int, now: float, rem: float) -> float:
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

    def end_attempt(self, keys: FairRateKeys, job: Job, t: int, now: float, out: list[Job]) -> None:
        """The attempt's end on its keys: correction, growth, pushback, release."""
        ms = round(now * 1000)
        keys.at(ms)
        after = job[ANS]
        push = self.up_key[t] if after else -1
        until = ms + math.ceil(after * 1000) if push >= 0 else 0
        used = None if after else job[USED]  # a 429 reports nothing used
        keys.end(job, out, used=used, succeeded=not after, push=push, until=until)

    def refused(self, job: Job, t: int, now: float) -> bool:
        """After a 429: back due at the pause's end (a pushback), a retry after backoff,
        or, its attempts spent, a failed job (True: its reservation is to be released)."""
        job[ANS] = 0.0
        k, raw = self.up_key[t], self.raw
        resume = now
        if k >= 0:
            assert self.rk is not None
            resume = self.rk.bucket[k].paused_until / 1000.0
            if job[PB] < MAX_PUSHBACKS:
                job[PB] += 1
                raw.pushed[t] += 1
                heapq.heappush(self.sched, (resume, job[SEQ], job))
                return False
        job[ATT] += 1
        if job[ATT] >= self.attempts:
            raw.failed[t] += 1
            raw.unpend(t, now)
            return True
        raw.retried[t] += 1
        delay = self.backoff.delay(job[ATT], self.jitter.random())
        heapq.heappush(self.sched, (max(now + delay, resume), job[SEQ], job))
        return False

    def next_timer(self) -> float:
        sched = self.sched
        lt = sched[0][0] if sched else math.inf
        if self.rk is not None:
            due = self.rk.next_due()
            if due is not None and due / 1000.0 < lt:
                lt = due / 1000.0
        return lt

    def fire(self, out: list[Job]) -> Job | None:
        """The earliest timer: a key due wakes its waiters into ``out`` (None), or the job
        due back in its tenant's queue leaves the timers (returned)."""
        sched, rk = self.sched, self.rk
        due = rk.next_due() if rk is not None else None
        if rk is not None and due is not None and (not sched or due / 1000.0 <= sched[0][0]):
            rk.at(due)
            rk.fire(out)
            return None
        job: Job = heapq.heappop(sched)[2]
        return job
