"""Rate keys as the rate contract states them, written the slow and obvious way.

``fairlane.sim.rates.FairRateKeys`` keeps heaps, integer indices and a lazy timer heap; this
model keeps jobs by id and keys by name in plain dicts and lists and re-derives every
choice by sorting, straight from ``docs/contracts/rates.md`` ("Blocking and waking",
"When an attempt ends"), with a pause blocking a key without a rate too. The bucket and
adaptive arithmetic is ``fairlane.policy.rates``'s own, as in the fast path.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from fairlane.policy.rates import (
    Adaptive,
    Bucket,
    Rate,
    adaptive_cut,
    adaptive_grow,
    adaptive_limit,
    correct,
    due_at,
    fits,
    job_cost,
    pause,
    take,
)


@dataclass
class RJob:
    id: int
    tenant: str
    seq: int
    keys: tuple[str, ...]  # sorted
    weight: float = 1.0
    charge: float = 1.0
    units: float = 1.0
    offered: bool = False


class NaiveRates:
    def __init__(
        self, limits: dict[str, int], rates: dict[str, Rate], adaptive: dict[str, Adaptive]
    ) -> None:
        self.limits = dict(limits)
        self.rates, self.adaptive = rates, adaptive
        self.value = {k: float(a.max) for k, a in adaptive.items()}
        for k, v in self.value.items():
            self.limits[k] = adaptive_limit(v)
        self.bucket = {k: Bucket.full(self.rates[k], 0) if k in rates else Bucket(0.0, 0)
                       for k in limits}  # fmt: skip
        self.in_use: Counter[str] = Counter()
        self.offers: Counter[str] = Counter()
        self.waiting: dict[str, list[RJob]] = {k: [] for k in limits}
        self.vt: dict[str, float] = {}
        self.tag: dict[tuple[str, str], float] = {}
        self.due: dict[str, int] = {}
        self.now = 0

    def room(self, k: str) -> int:
        return self.limits[k] - self.in_use[k] - self.offers[k]

    def cost(self, k: str, job: RJob) -> float:
        return job_cost(self.rates[k], job.units) if k in self.rates else 0.0

    def blocks(self, k: str, job: RJob, waking: str | None = None) -> bool:
        if self.room(k) <= 0:
            return True
        if k not in self.rates:
            return self.now < self.bucket[k].paused_until
        if not fits(self.rates[k], self.bucket[k], self.cost(k, job), self.now):
            return True
        return bool(self.waiting[k]) and k != waking

    def set_limit(self, k: str, limit: int) -> list[RJob]:
        raised = limit > self.limits[k]
        self.limits[k] = limit
        return self.wake(k) if raised and self.waiting[k] else []

    def take_tokens(self, job: RJob) -> None:
        for k in job.keys:
            if k in self.rates:
                self.bucket[k] = take(self.rates[k], self.bucket[k], self.cost(k, job), self.now)

    def take(self, job: RJob) -> tuple[bool, list[RJob]]:
        if job.offered:
            job.offered = False
            for k in job.keys:
                self.offers[k] -= 1
            if all(self.in_use[k] < self.limits[k] for k in job.keys):
                for k in job.keys:
                    self.in_use[k] += 1
                return True, []
            for k in job.keys:
                if k in self.rates:
                    self.bucket[k] = correct(
                        self.rates[k], self.bucket[k], self.cost(k, job), self.now
                    )
            self.park(job, next(k for k in job.keys if self.blocks(k, job)))
            woken: list[RJob] = []
            for k in job.keys:
                if self.waiting[k] and self.room(k) > 0:
                    woken += self.wake(k)
            return False, woken
        blocked = [k for k in job.keys if self.blocks(k, job)]
        if blocked:
            self.park(job, blocked[0])
            return False, []
        for k in job.keys:
            self.in_use[k] += 1
        self.take_tokens(job)
        return True, []

    def park(self, job: RJob, k: str) -> None:
        queue = self.waiting[k]
        if not any(w.tenant == job.tenant for w in queue):
            v = self.vt.get(k, 0.0)
            self.tag[k, job.tenant] = max(self.tag.get((k, job.tenant), v), v)
        queue.append(job)
        if self.room(k) > 0:  # blocked by the rate or the pause
            if k in self.rates:
                due = due_at(self.rates[k], self.bucket[k], self.cost(k, job), self.now)
            else:
                due = self.bucket[k].paused_until
            self.due[k] = min(self.due.get(k, due), due)

    def wake(self, k: str) -> list[RJob]:
        woken: list[RJob] = []
        while self.waiting[k] and self.room(k) > 0:
            queue = self.waiting[k]
            tenant = min({w.tenant for w in queue}, key=lambda t: (self.tag[k, t], t))
            job = min((w for w in queue if w.tenant == tenant), key=lambda w: w.seq)
            bucket = self.bucket[k]
            if k in self.rates and not fits(self.rates[k], bucket, self.cost(k, job), self.now):
                self.due[k] = due_at(self.rates[k], bucket, self.cost(k, job), self.now)
                return woken
            if self.now < bucket.paused_until:
                self.due[k] = bucket.paused_until
                return woken
            queue.remove(job)
            blocked = [j for j in job.keys if self.blocks(j, job, waking=k)]
            if blocked:
                self.park(job, blocked[0])
                continue
            tag = self.tag[k, job.tenant]
            self.vt[k] = max(self.vt.get(k, 0.0), tag)
            charge = self.cost(k, job) if k in self.rates else job.charge
            self.tag[k, job.tenant] = tag + charge / job.weight
            for j in job.keys:
                self.offers[j] += 1
            self.take_tokens(job)
            job.offered = True
            woken.append(job)
        self.due.pop(k, None)
        return woken

    def end(
        self, job: RJob, *, used: float | None, succeeded: bool, push: str | None, until: int
    ) -> tuple[bool, list[RJob]]:
        woken: list[RJob] = []
        if used is not None:
            for k in job.keys:
                if k in self.rates and self.rates[k].units:
                    self.bucket[k] = correct(
                        self.rates[k], self.bucket[k], job.units - used, self.now
                    )
        if succeeded:
            for k in job.keys:
                if k in self.adaptive:
                    self.value[k] = adaptive_grow(self.value[k], self.adaptive[k])
                    woken += self.set_limit(k, adaptive_limit(self.value[k]))
        cut = False
        if push is not None:
            self.bucket[push] = pause(self.bucket[push], until)
            if push in self.adaptive:
                self.value[push] = adaptive_cut(self.value[push], self.adaptive[push])
                self.limits[push] = adaptive_limit(self.value[push])
                cut = True
            if self.waiting[push]:
                self.due[push] = self.bucket[push].paused_until
        for k in job.keys:
            self.in_use[k] -= 1
        for k in job.keys:
            if self.waiting[k] and self.room(k) > 0:
                woken += self.wake(k)
        return cut, woken

    def fire(self, upto: int) -> tuple[int, list[RJob]] | None:
        """Wake the key due first (then by name) if it is due by ``upto``."""
        if not self.due:
            return None
        due, k = min((d, k) for k, d in self.due.items())
        if due > upto:
            return None
        self.now = due
        del self.due[k]
        return due, self.wake(k)
