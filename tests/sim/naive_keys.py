"""Throttle keys as the rules of issue 16 state them, written the slow and obvious way.

The simulator's ``fairlane.sim.keys`` keeps heaps and integer indices for speed; this
model keeps jobs by id in plain lists and re-derives every choice by sorting, straight
from the rules (fair waiters: keys taken at dispatch with offers, waiters grouped by
tenant, start-time fair wakes; fifo: the rule before, one FIFO per key and grants at
hand-off). Tests drive both with the same operations and require the same answers.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass
class NaiveJob:
    id: str
    tenant: str
    seq: int
    keys: tuple[str, ...]  # sorted
    weight: float = 1.0
    cost: float = 1.0
    offered: bool = False


class NaiveKeys:
    """One table of keys; ``fair`` picks the rule (issue 16's, or the FIFO one before)."""

    def __init__(self, limits: dict[str, int], *, fair: bool) -> None:
        self.fair = fair
        self.limits = dict(limits)
        self.in_use: Counter[str] = Counter()
        self.offers: Counter[str] = Counter()
        self.waiting: dict[str, list[NaiveJob]] = {}
        self.vt: dict[str, float] = {}
        self.tag: dict[tuple[str, str], float] = {}

    def room(self, key: str) -> int:
        return self.limits[key] - self.in_use[key] - self.offers[key]

    def full(self, key: str) -> bool:
        if self.fair:
            return self.room(key) <= 0
        return self.in_use[key] >= self.limits[key]

    def set_limit(self, key: str, limit: int) -> list[NaiveJob]:
        raised = limit > self.limits[key]
        self.limits[key] = limit
        return self.wake(key) if raised else []

    def take(self, job: NaiveJob) -> tuple[bool, list[NaiveJob]]:
        """Admit ``job`` on all its keys, or park it; and the jobs woken meanwhile."""
        if job.offered:
            job.offered = False
            for k in job.keys:
                self.offers[k] -= 1
            if all(self.in_use[k] < self.limits[k] for k in job.keys):
                for k in job.keys:
                    self.in_use[k] += 1
                return True, []
            self.park(job, next(k for k in job.keys if self.full(k)))
            woken: list[NaiveJob] = []
            for k in job.keys:
                woken += self.wake(k)
            return False, woken
        blocked = [k for k in job.keys if self.full(k)]
        if blocked:
            self.park(job, blocked[0])
            return False, []
        for k in job.keys:
            self.in_use[k] += 1
        return True, []

    def release(self, job: NaiveJob) -> list[NaiveJob]:
        for k in job.keys:
            self.in_use[k] -= 1
        woken: list[NaiveJob] = []
        for k in job.keys:
            woken += self.wake(k)
        return woken

    def park(self, job: NaiveJob, key: str) -> None:
        queue = self.waiting.setdefault(key, [])
        if self.fair and not any(w.tenant == job.tenant for w in queue):
            v = self.vt.get(key, 0.0)
            self.tag[key, job.tenant] = max(self.tag.get((key, job.tenant), v), v)
        queue.append(job)

    def wake(self, key: str) -> list[NaiveJob]:
        woken: list[NaiveJob] = []
        while self.waiting.get(key) and not self.full(key):
            queue = self.waiting[key]
            if self.fair:
                tenant = min({w.tenant for w in queue}, key=lambda t: (self.tag[key, t], t))
                job = min((w for w in queue if w.tenant == tenant), key=lambda w: w.seq)
            else:
                job = min(queue, key=lambda w: w.seq)
            queue.remove(job)
            blocked = [k for k in job.keys if self.full(k)]
            if blocked:  # it moves, holding nothing (uncharged)
                self.park(job, blocked[0])
                continue
            if self.fair:
                tag = self.tag[key, job.tenant]
                self.vt[key] = max(self.vt.get(key, 0.0), tag)
                self.tag[key, job.tenant] = tag + job.cost / job.weight
                for k in job.keys:
                    self.offers[k] += 1
                job.offered = True
            else:
                for k in job.keys:
                    self.in_use[k] += 1
            woken.append(job)
        return woken
