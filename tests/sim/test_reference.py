"""The engine against a naive simulator built from the policy core's own objects.

``Reference`` below is the simplest event loop that composes ``FairQueue`` (one per
class), ``next_class``, ``admission.decide`` / ``DeferredQueue`` with a ``PoolState``, and the
naive throttle keys of ``tests/sim/naive_keys.py`` for tenant caps and shared keys,
under either rule (``waiters=fair``: keys taken at dispatch, a parked head removed from
its fair queue uncharged, a woken job pushed back at its own position; ``waiters=fifo``:
the head charged, then its keys, and a hand-off granted into the class's granted queue)
-- no fast paths, no memo, O(n) wherever convenient. On random small scenarios
(classes, weights, bursts, Poisson, slicing, jobs several slots wide, a gate with
deferral, caps, shared keys) every tenant's list of start delays must be identical to
the engine's, as must completions and rejections: the fast paths change the speed,
not one decision.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from typing import Any

import pytest

from fairlane.policy.admission import DeferredQueue, PoolState, Verdict, decide, fits, to_milli
from fairlane.policy.classes import next_class
from fairlane.policy.fairqueue import FairQueue, job_order
from fairlane.sim.arrivals import arrivals
from fairlane.sim.engine import simulate
from fairlane.sim.parse import parse_scenario
from fairlane.sim.scenario import Scenario
from fairlane.sim.variants import parse_variant, resolve
from tests.sim.naive_keys import NaiveJob, NaiveKeys


class _Job:
    def __init__(self, seq: int, tenant: int, at: float, size: float) -> None:
        self.seq, self.tenant, self.at, self.rem = seq, tenant, at, size
        self.started = False
        self.id = f"j{seq}"
        self.keyed: NaiveJob | None = None


class Reference:
    """Start delays per tenant, completions and rejections, by the core's objects."""

    def __init__(self, scenario: Scenario, slice_: float, *, gate: bool, fair: bool) -> None:
        lane = scenario.lanes[0]
        self.table, self.capacity = lane.table, lane.slots
        self.pool = lane.pool if gate else None
        self.max_milli = to_milli(scenario.estimation.max_reservation_units)
        self.slice, self.scenario = slice_, scenario
        self.specs = [s for s in scenario.tenants for _ in range(s.count)]
        self.names = [n for s in scenario.tenants for n in s.names()]
        self.queues = {c: FairQueue() for c in self.table.names}
        for name, spec in zip(self.names, self.specs, strict=True):
            self.queues[spec.service_class].set_weight(name, spec.weight)
        self.fair = fair
        caps = zip(self.names, self.specs, strict=True)
        limits = {f"tenant:{n}": s.max_concurrency or 0 for n, s in caps}
        self.keys = NaiveKeys(limits | {k.name: k.limit for k in scenario.keys}, fair=fair)
        self.granted: dict[str, deque[_Job]] = {c: deque() for c in self.table.names}
        self.in_flight, self.waiting = Counter[str](), Counter[str]()
        self.state = PoolState()
        self.deferred: dict[str, DeferredQueue[str]] = {
            c: DeferredQueue() for c in self.table.names
        }
        self.pending: dict[str, _Job] = {}
        self.queued: dict[str, _Job] = {}  # in a fair queue
        self.jobs: dict[str, _Job] = {}
        self.waits: dict[str, list[float]] = {n: [] for n in self.names}
        self.done, self.rejected = Counter[str](), Counter[str]()
        self.running: list[tuple[float, int, _Job, float]] = []

    def run(self) -> dict[str, Any]:
        stream = list(arrivals(self.scenario))
        k = 0
        while k < len(stream) or self.running:
            if self.running and (k == len(stream) or self.running[0][0] <= stream[k][0]):
                now, _, job, run = heapq.heappop(self.running)
                self.end(job, run)
            else:
                now, tenant, size = stream[k]
                job = self.jobs[f"j{k}"] = _Job(k, tenant, now, size)
                k += 1
                self.admit(job)
            self.dispatch(now)
        return {"waits": self.waits, "done": self.done, "rejected": self.rejected}

    def cls(self, job: _Job) -> str:
        return self.specs[job.tenant].service_class

    def width(self, job: _Job) -> int:
        return self.specs[job.tenant].slots

    def push(self, job: _Job) -> None:
        cost = min(job.rem, self.slice)
        self.queues[self.cls(job)].push(self.names[job.tenant], job.id, cost, job_order(0, job.seq))
        self.waiting[self.cls(job)] += self.width(job)
        self.queued[job.id] = job

    def keyed(self, job: _Job) -> NaiveJob | None:
        """The job as the keys see it, or None if it names none."""
        spec, name = self.specs[job.tenant], self.names[job.tenant]
        keys = [*spec.keys, *([f"tenant:{name}"] if spec.max_concurrency else [])]
        if not keys:
            return None
        if job.keyed is None:
            job.keyed = NaiveJob(job.id, name, job.seq, tuple(sorted(keys)), spec.weight)
        job.keyed.cost = min(job.rem, self.slice)  # the fair queue's charge for it
        return job.keyed

    def head_width(self, cls: str) -> int | None:
        if self.granted[cls]:
            return self.width(self.granted[cls][0])
        active = self.queues[cls].active_tenants()
        return self.specs[self.names.index(active[0])].slots if active else None

    def head(self, cls: str) -> _Job:
        """The fair head: the first job (least seq) of the least-tag active tenant."""
        tenant = self.queues[cls].active_tenants()[0]
        mine = [j for j in self.queued.values() if self.names[j.tenant] == tenant]
        return min(mine, key=lambda j: j.seq)

    def take(self, chosen: str) -> _Job | None:
        """The class's head: a granted job, else its fair head if its keys admit it."""
        if self.granted[chosen]:
            return self.granted[chosen].popleft()
        job = self.head(chosen)
        keyed = self.keyed(job)
        if keyed is None or not self.fair:
            dispatched = self.queues[chosen].pop()
            assert dispatched is not None and dispatched.job_id == job.id
            del self.queued[job.id]
            if keyed is None:
                return job
            admitted, woken = self.keys.take(keyed)
            self.hand(woken)
            return job if admitted else None
        admitted, woken = self.keys.take(keyed)
        if admitted:
            dispatched = self.queues[chosen].pop()
            assert dispatched is not None and dispatched.job_id == job.id
        else:  # parked: out of its fair queue, its tenant not charged
            assert self.queues[chosen].remove(job.id)
        del self.queued[job.id]
        self.hand(woken)
        return job if admitted else None

    def dispatch(self, now: float) -> None:
        while True:
            widths = {c: self.head_width(c) for c in self.table.names}
            chosen = next_class(
                self.table, self.capacity, dict(self.in_flight), widths,
                demand=dict(self.waiting),
            )  # fmt: skip
            if chosen is None:
                return
            self.waiting[chosen] -= widths[chosen] or 0
            job = self.take(chosen)
            if job is None:
                continue
            self.in_flight[chosen] += self.width(job)
            if not job.started:
                job.started = True
                self.waits[self.names[job.tenant]].append(now - job.at)
            run = min(job.rem, self.slice)
            heapq.heappush(self.running, (now + run, job.seq, job, run))

    def hand(self, woken: list[NaiveJob]) -> None:
        """Woken jobs: back into their fair queues (fair), or granted (fifo)."""
        for keyed in woken:
            job = self.jobs[keyed.id]
            if self.fair:
                self.push(job)
            else:
                self.granted[self.cls(job)].append(job)
                self.waiting[self.cls(job)] += self.width(job)

    def admit(self, job: _Job) -> None:
        cls, tenant = self.cls(job), self.names[job.tenant]
        if self.pool is None:
            self.push(job)
            return
        mu = to_milli(self.specs[job.tenant].units)
        decision = decide(
            self.table, self.pool, self.state, service_class=cls, tenant=tenant,
            milli_units=mu, fresh=True, deadline_ms=None, now_ms=0,
            max_reservation_milli=self.max_milli, held=self.deferred[cls].held,
        )  # fmt: skip
        if decision.status == "accepted":
            self.state.accept(cls, tenant, mu)
            self.deferred[cls].note_admitted()
            self.push(job)
        elif decision.status == "deferred":
            self.state.defer(cls)
            self.deferred[cls].push(tenant, str(job.seq), job.seq, mu)
            self.pending[str(job.seq)] = job
        else:
            self.rejected[tenant] += 1

    def end(self, job: _Job, run: float) -> None:
        cls, tenant = self.cls(job), self.names[job.tenant]
        self.in_flight[cls] -= self.width(job)
        if job.keyed is not None:
            self.hand(self.keys.release(job.keyed))
        job.rem -= run
        if job.rem > 0:
            self.push(job)
            return
        self.done[tenant] += 1
        if self.pool is not None:
            self.state.release(cls, tenant, to_milli(self.specs[job.tenant].units))
            for c in self.table.names:
                for r in self.deferred[c].readmit(self.judge(c), self.weight):
                    self.push(self.pending.pop(r.job_id))

    def weight(self, name: str) -> float:
        return self.specs[self.names.index(name)].weight

    def judge(self, cls: str) -> Any:
        assert self.pool is not None
        pool = self.pool

        def verdict(job_id: str, tenant: str, mu: int) -> Verdict:
            kw: Any = {"service_class": cls, "tenant": tenant, "milli_units": mu, "fresh": True}
            if fits(self.table, pool, self.state, **kw) is None:
                self.state.undefer(cls)
                self.state.accept(cls, tenant, mu)
                return "admit"
            return "wait" if fits(self.table, pool, PoolState(), **kw) is None else "never"

        return verdict


def _scenario(rng: random.Random, *, wide: bool) -> dict[str, Any]:
    tenants = []
    for i in range(rng.randint(2, 6)):
        tenant: dict[str, Any] = {
            "name": f"t{i}",
            "class": rng.choice(["guaranteed", "standard", "standard", "batch"]),
            "weight": rng.choice([1, 1, 2, 5]),
            "size": rng.choice(
                [0.3, {"dist": "exponential", "mean": 0.4}, {"dist": "pareto", "mean": 1.0}]
            ),
        }
        if rng.random() < 0.6:
            tenant |= {"rate": rng.uniform(0.5, 4.0), "stop": 40}
        if rng.random() < 0.5 or "rate" not in tenant:
            tenant["bursts"] = [[rng.uniform(0, 20), rng.randint(1, 60), rng.uniform(0, 5)]]
        if rng.random() < 0.25:
            tenant["max_concurrency"] = rng.randint(1, 3)
        if wide and rng.random() < 0.5:
            tenant["slots"] = rng.randint(2, 3)
        tenants.append(tenant)
    slots = rng.randint(3, 8) if wide else rng.randint(1, 6)
    return {"seed": rng.randint(0, 10**6), "lanes": {"x": {"slots": slots}},
            "tenants": tenants}  # fmt: skip


def _shared_keys(rng: random.Random, data: dict[str, Any]) -> None:
    """Shared keys in half the cases: each tenant names none, one or both."""
    if rng.random() < 0.5:
        return
    data["keys"] = [{"name": "model:x", "limit": rng.randint(1, 3)},
                    {"name": "db:y", "limit": rng.randint(1, 2)}]  # fmt: skip
    for tenant in data["tenants"]:
        tenant["keys"] = rng.choice([[], ["model:x"], ["model:x"], ["db:y", "model:x"]])


def _pool(rng: random.Random) -> dict[str, Any]:
    when = ["reject", "defer"]
    return {"x": {
        "capacity_units": rng.choice([3, 5, 8]),
        "classes": {
            "guaranteed": {"nominal_share": 0.5, "lendable": rng.choice([0.0, 0.5, 1.0]),
                           "response_when_full": rng.choice(when),
                           "max_queue": rng.choice([4, 50])},
            "standard": {"nominal_share": 0.4, "response_when_full": rng.choice(when),
                         "tenant_max_queue": rng.choice([2, 100])},
            "batch": {"batch": True},
        },
    }}  # fmt: skip


@pytest.mark.parametrize("waiters", ["fair", "fifo"])
@pytest.mark.parametrize("case", range(32))
def test_engine_matches_reference_built_from_the_core(case: int, waiters: str) -> None:
    rng = random.Random(case)
    data = _scenario(rng, wide=case % 4 >= 2)  # a quarter of the jobs 2-3 slots wide
    _shared_keys(random.Random(-case - 1), data)
    gate = case % 2 == 1
    if gate:
        data["pools"] = _pool(rng)
    scenario = parse_scenario(data, source=f"case {case}")
    slice_ = rng.choice([math.inf, 0.5, 1.0])
    text = f"fair+waiters={waiters}" + ("" if math.isinf(slice_) else f"+slice={slice_}")
    raw = simulate(scenario, resolve(parse_variant(text), scenario))
    want = Reference(scenario, slice_, gate=gate, fair=waiters == "fair").run()
    names = raw.world.names
    assert {n: raw.waits[t] for t, n in enumerate(names)} == want["waits"]
    assert {n: raw.completed[t] for t, n in enumerate(names) if raw.completed[t]} == want["done"]
    assert {n: raw.rejected[t] for t, n in enumerate(names) if raw.rejected[t]} == want["rejected"]
