"""The Lua library against its reference model (``fairlane.policy.reference.model``), step by step.

A hypothesis state machine drives the real scripts (through ``fairlane.store.api.Store``
on the real server) and ``QueueModel`` with the same operations -- enqueue (with service
classes, widths of 1-3 slots, throttle keys, fairness keys, and deadlines ordered by
the task's option or lane b's standard class, or not), exchanges (registering
workers of 1, 2 and 3 slots, settling the worker's jobs in the same call or not,
registering the worker idle when it gets nothing), the blocking wait that takes a job
handed to an idle worker, a stopping worker's leave, renew, acks of every kind, acks
with stale tokens, tenant weights, fairness keys' weights and concurrency settings,
worker crashes, reclaim sweeps (with or without the stale-worker sweep), an operator's
pauses and resumes (of a tenant, a fairness key, the task, a lane or one class of it, and
a tenant's quarantine), and a drain (every pause resumed first) --
and requires the same replies: the same jobs in the same order with the same tokens,
attempt numbers and widths, the same fenced acks, the same reclaims. After every step
the whole store is compared with the model (every job's status, attempts, token,
throttle grant, offers and order number ``seq``; tenant queues in order, fair tags and
virtual times per class; lane capacity, registrations and in-flight/waiting slots per
class; throttle keys with their limits, use, offers, references, holders, virtual times,
tenant waiter groups in order and their start and finish tags; every tenant queue's
fairness-key tags ``fk:``; delayed sets, idle registrations, inboxes, heartbeats,
leases, dead letters, counters; the pauses in force, the tenants each class holds and
the jobs each pause parked, in order) and checked on its own:

* every job is in exactly one place (a parked job is queued, in its pause's parked set),
  none over its attempt budget;
* a class's in-flight slots are its running jobs' widths, its waiting slots its queued
  jobs' widths but the parked ones', ``C`` the sum of its registered workers' slots;
* no throttle key is over its limit, and a key with waiters has no room (held + offers
  >= limit); a throttle grant is held only by a running job, offers only by a queued one;
* no slot idles while an eligible job waits: when ``next_class`` (on the store's own
  state) names a class, the lane's next dispatch starts that class's head job, unless
  its throttle keys park it (while nothing is paused: a pause holds heads back);
* a drain (a worker of 6 slots on both lanes, every running job acked) finishes every
  job that is not scheduled for later: the ``drain`` rule, and at the end of every run.

Lane ``a`` runs the default classes, whose ``guaranteed`` is restricted: only ``t1`` is
entitled to it, so the others' jobs there are refused (-5) by both; lane ``b`` a table
with a reserve and a borrowing cap. Entitlements stay as set, so no retry loses its
class (``tests/app/test_entitlements.py`` checks that). Tenant limits are static
(floor == max_concurrency, no burst), so they do not depend on the signals' timing;
``test_ceilings_lua.py`` checks the time-dependent ones.

Time is exact, not approximate. The scripts read the server clock; the model is told the
same instant, read back from what the script wrote (an exchange's or renewal's heartbeat,
a retry's ``run``, a finish's ``fin``, an enqueue's ``enq``). Where a call writes no
time the instant cannot matter: leases are either long (10 min, never expiring during a
run) or 1 ms, and before a sweep the test waits until every 1 ms lease has expired, so
the sweep reclaims all of them (and so writes its time) or has nothing to reclaim.
Retries are due at once (backoff ``0,0,none``, ack delay 0) or in 10 minutes; new jobs
at once, in 1 ms (promoted by a later fetch, which writes its instant: a keyed one takes
its fair order number then) or in 10 minutes.
"""

from __future__ import annotations

import copy
import os
import secrets
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import msgspec
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from fairlane.policy.backoff import Backoff
from fairlane.policy.ceilings import TenantLimits
from fairlane.policy.classes import ClassTable, Entitlement, ServiceClass, next_class
from fairlane.policy.pauses import Scope, ScopeKind
from fairlane.policy.reference.model import (
    FINISHED,
    Ack,
    AckKind,
    Batch,
    Grant,
    QueueModel,
    Submission,
)
from fairlane.policy.retry import after_failure
from fairlane.store.keys import RECORD_DEFAULTS
from fairlane.store.pausing import field_scope, scope_field
from fairlane.store.records import DEFAULT_CLASS
from fairlane.store.views.totals import DECISION_PREFIX, split_stats
from fairlane.store.wire import FetchedJob, NewJob, Outcome
from tests.store.harness import StoreMachine

T = TypeVar("T")

LANES = ("a", "b")
CUSTOM = ClassTable((
    ServiceClass("gold", nominal_share=0.5, min_slots=1, lendable=0.5, borrowable=0.5),
    ServiceClass("standard", nominal_share=0.3, min_slots=1, deadline_order=True),
    ServiceClass("bulk", batch=True),
))  # fmt: skip
TABLES = {"a": ClassTable(), "b": CUSTOM}
TENANTS = ("t1", "t2", "t3")
FAIRNESS_KEYS = ("u1", "u2", "u3")
KEY_WEIGHTS = (None, 0.5, 2.0, 3.0)  # None: back to 1
WORKERS = {"w1": 1, "w2": 2, "w3": 3}  # worker -> its slots
DRAINER, DRAIN_SLOTS = "wd", 6
STATIC = {"t2": TenantLimits(floor=2, max_concurrency=2)}  # floor == max: static
ENTITLED = Entitlement(frozenset({"guaranteed"}))  # t1's: the others may not use guaranteed
KEY_LIMITS = {"k1": 1, "k2": 2}  # fixed limits; k3 is given 1 or 2 by each job
LONG = 600_000  # ms: a lease, renewal or delay that never runs out during a test
SHORT = 1  # ms: a lease that has run out by the next sweep
# deadlines far past any run (none expires, and none is unmeetable), apart by whole ticks
# and by less than one (a tie, by job id); lane b's standard class orders by deadline
DEADLINES = (3 * LONG, 3 * LONG + 3, 3 * LONG + 1000, 3 * LONG + 5000)
TASK = "model.job"
ERROR = '{"type":"Boom","message":"failed","traceback":""}'
NO_WAIT = Backoff(0, 0, "none")
COUNTERS = (
    "fenced",
    "resettled",
    "reclaimed",
    "retried",
    "completed",
    "failed",
    "expired",
    "throttled",
    "handed_back",
)

# every scope the pause rules name
SCOPES = (
    *(Scope(ScopeKind.TENANT, tenant=t) for t in TENANTS),
    Scope(ScopeKind.KEY, tenant="t1", key="u1"),
    Scope(ScopeKind.KEY, tenant="t2", key="u2"),
    Scope(ScopeKind.TASK, task=TASK),
    Scope(ScopeKind.LANE, lane="a"),
    Scope(ScopeKind.LANE, lane="b", cls="gold"),
    Scope(ScopeKind.REFUSE, tenant="t3"),
)

lane_orders = st.sampled_from([("a",), ("b",), ("a", "b"), ("b", "a")])
limit_sets = st.sampled_from([
    (), (), (), (("k1", 1),), (("k2", 2),), (("k1", 1), ("k2", 2)), (("k3", 1),),
    (("k1", 1), ("k3", 2)), (("k2", 2), ("k3", 1)),
])  # fmt: skip
new_jobs = st.lists(
    st.tuples(
        st.sampled_from(TENANTS),
        st.integers(-1, 1),  # priority
        st.integers(1, 3),  # attempts
        st.sampled_from([0, 0, 0, SHORT, LONG]),  # delay: due now, 1 ms later or never
        st.sampled_from([0, 0, 1, 1, 2, 3]),  # class: an index in the lane's table (3: unknown)
        st.sampled_from([1, 1, 2, 3]),  # width in slots
        limit_sets,
        st.sampled_from(["", "", *FAIRNESS_KEYS]),  # fairness key ('' none)
        st.sampled_from([None, None, *DEADLINES]),  # deadline, ms after the enqueue
        st.booleans(),  # the task's deadline order
    ),
    min_size=1,
    max_size=4,
)
JobSpec = tuple[str, int, int, int, int, int, tuple[tuple[str, int], ...], str, int | None, bool]


def _ms(reply: Any) -> int:
    return int(float(reply))


def _s(value: bytes) -> str:
    return value.decode()


class LuaVsModel(StoreMachine):
    prefix: ClassVar[str] = "m"
    # every throttle key a job can name: the snapshot reads their tags
    throttle_keys: ClassVar[tuple[str, ...]] = (
        *KEY_LIMITS,
        "k3",
        *(f"tenant:{t}" for t in TENANTS),
    )

    def __init__(self) -> None:
        super().__init__()
        self.model = QueueModel()
        self.ids: list[str] = []  # every job id stored
        self.next_id = 0
        # worker -> id -> (token, attempt) of the jobs it believes it holds
        self.held: dict[str, dict[str, tuple[str, int]]] = {w: {} for w in [*WORKERS, DRAINER]}
        self.issued: list[tuple[str, str]] = []  # every (id, token) a fetch handed out
        self.now = 0
        self.clean = False  # the last step was checked and agreed
        self.run(self.store.declare_lane("b", CUSTOM))
        self.model.declare_lane("b", CUSTOM)
        for tenant, limits in STATIC.items():
            self.run(self.store.configure_tenant_limits(tenant, limits))
            self.model.configure_limits(tenant, limits)
        # lane a's guaranteed class is restricted: t1's jobs may use it, the others' are refused
        self.run(self.store.configure_tenant_classes("t1", ENTITLED.classes))
        self.model.configure_classes("t1", ENTITLED)

    def teardown(self) -> None:
        try:
            if self.clean:  # a run that agreed so far must also drain
                self.drain_all()
        finally:
            self.close()

    # -- time -------------------------------------------------------------------------

    def server_ms(self) -> int:
        sec, usec = self.client.time()
        return int(sec) * 1000 + int(usec) // 1000

    def at(self, written: int | None) -> int:
        """The instant of the last call: what it wrote, else the server clock since."""
        now = written if written is not None else self.server_ms()
        assert now >= self.now, "the server clock went backwards"
        self.now = now
        return now

    def field_ms(self, job_id: str, name: str) -> int:
        value = self.client.hget(self.keys.job(job_id), name)
        assert value is not None, f"{job_id} has no {name}"
        return int(value)

    def beat_ms(self, worker: str) -> int:
        """The heartbeat the last exchange or renewal of ``worker`` wrote: its instant."""
        return _ms(self.client.zscore(self.keys.workers, worker))

    # -- operations -------------------------------------------------------------------

    def _pending(self) -> int:
        return sum(1 for job in self.model.jobs.values() if job.status not in FINISHED)

    @precondition(lambda self: self._pending() < 16)
    @rule(lane=st.sampled_from(LANES), specs=new_jobs)
    def enqueue(self, lane: str, specs: list[JobSpec]) -> None:
        self.clean = False
        names = TABLES[lane].names
        jobs = []
        for tenant, prio, attempts, delay, cls, width, limits, key, deadline, ordered in specs:
            job_id = f"j{self.next_id:03d}"
            self.next_id += 1
            jobs.append(
                NewJob(
                    id=job_id,
                    tenant=tenant,
                    priority=prio,
                    task=TASK,
                    args=b"{}",
                    max_attempts=attempts,
                    backoff="0,0,none",
                    timeout=0,
                    keep_completed="-1,-1",
                    keep_failed="-1,-1",
                    delay_ms=delay,
                    service_class=names[cls] if cls < len(names) else "unknown",
                    slots=width,
                    limits=list(limits),
                    fairness_key=key,
                    deadline="" if deadline is None else f"+{deadline}",
                    deadline_order=int(ordered),
                )
            )
        replies = self.run(self.store.enqueue(lane, jobs))
        stored = [j.id for j, (_, code) in zip(jobs, replies, strict=True) if code == 1]
        self.ids += stored
        now = self.at(self.field_ms(stored[0], "enq") if stored else None)
        batch = [
            Submission(
                j.id,
                j.tenant,
                j.priority,
                j.max_attempts,
                j.delay_ms or 0,
                j.service_class,
                j.slots,
                tuple(j.limits),
                j.fairness_key,
                None if not j.deadline else now + int(j.deadline[1:]),
                bool(j.deadline_order),
            )
            for j in jobs
        ]
        codes = self.model.enqueue_batch(lane, batch, now=now)
        assert replies == [(j.id, c) for j, c in zip(jobs, codes, strict=True)]

    @rule(
        worker=st.sampled_from(sorted(WORKERS)),
        lanes=lane_orders,
        n=st.integers(1, 3),
        short=st.booleans(),
        settle=st.booleans(),
        idle_ms=st.sampled_from([0, 1, LONG, LONG]),
    )
    def fetch(  # noqa: PLR0917 - the rule's drawn arguments
        self, worker: str, lanes: tuple[str, ...], n: int, short: bool, settle: bool, idle_ms: int
    ) -> None:
        """One exchange: settle the worker's jobs as done (or not), take its inbox, fetch;
        if it got nothing, register it idle (only with long leases, whose inbox never
        expires during a test)."""
        self.clean = False
        self.exchange(worker, lanes, n, SHORT if short else LONG, settle=settle, idle_ms=idle_ms)

    def exchange(
        self,
        worker: str,
        lanes: tuple[str, ...],
        n: int,
        lease: int,
        *,
        settle: bool,
        idle_ms: int,
    ) -> list[FetchedJob]:
        idle_ms = 0 if lease == SHORT else idle_ms
        slots = WORKERS.get(worker, DRAIN_SLOTS)
        held = self.held[worker]
        outcomes = [Outcome(i, tok, "ok", "1") for i, (tok, _) in held.items()] if settle else []
        fetched = self.run(
            self.store.exchange(
                worker, list(lanes), n, lease, outcomes, idle_ms=idle_ms, slots=slots
            )
        )
        now = self.at(self.beat_ms(worker))
        acks = [Ack(o.id, int(o.token)) for o in outcomes]
        codes, expected = self.model.exchange(
            worker, list(lanes), n, lease, acks, now=now, idle_ms=idle_ms, slots=slots
        )
        assert fetched.ack_codes == [int(c) for c in codes]
        if settle:
            held.clear()
        got = [Grant(j.id, int(j.token), j.attempt) for j in fetched.jobs]
        assert got == expected.jobs, f"fetch: lua {got} != model {expected.jobs}"
        assert fetched.next_due_ms == expected.next_due
        for job in fetched.jobs:
            model_job = self.model.jobs[job.id]
            assert job.task == TASK and job.max_attempts == model_job.max_attempts
            assert job.slots == model_job.slots, f"{job.id} width"
            self._take(worker, job.id, job.token, job.attempt)
        return fetched.jobs

    def _take(self, worker: str, job_id: str, token: str, attempt: int) -> None:
        self.held[worker][job_id] = (token, attempt)
        self.issued.append((job_id, token))

    @precondition(lambda self: any(self.model.inbox.values()))
    @rule(data=st.data())
    def wait(self, data: st.DataObject) -> None:
        """The blocking wait of a worker that was handed a job: it gets the oldest one.
        (Only for non-empty inboxes: an empty wait blocks for the server's timer tick.)"""
        self.clean = False
        worker = data.draw(st.sampled_from(sorted(w for w, i in self.model.inbox.items() if i)))
        reply = self.run(self.store.wait_for_work(LANES, 0.001, worker))
        expected = self.model.take_handed(worker, now=self.at(None))
        assert expected is not None
        assert isinstance(reply, FetchedJob), f"{worker} got {reply}, model: {expected}"
        assert Grant(reply.id, int(reply.token), reply.attempt) == expected
        self._take(worker, reply.id, reply.token, reply.attempt)

    @rule(worker=st.sampled_from(sorted(WORKERS)), short=st.booleans())
    def leave(self, worker: str, short: bool) -> None:
        """A stopping worker deregisters and takes back what was handed to it meanwhile."""
        self.clean = False
        self._leave(worker, SHORT if short else LONG)

    def _leave(self, worker: str, lease: int) -> None:
        handed = self.run(self.store.leave(worker, lease, list(LANES)))
        expected = self.model.leave(worker, list(LANES), lease, now=self.at(None))
        assert [Grant(j.id, int(j.token), j.attempt) for j in handed] == expected
        for job in handed:
            self._take(worker, job.id, job.token, job.attempt)

    def _held_jobs(self) -> list[tuple[str, str]]:
        return sorted((w, i) for w, jobs in self.held.items() for i in jobs)

    @precondition(lambda self: self._held_jobs())
    @rule(
        data=st.data(),
        result=st.sampled_from(["ok", "failed", "fatal", "expire", "release", "handback"]),
        delay=st.sampled_from([0, 0, LONG]),
        window=st.sampled_from([0, LONG]),
    )
    def ack(self, data: st.DataObject, result: str, delay: int, window: int) -> None:
        """Settle a held job as a worker would: done, failed (retried while attempts are
        left, as ``after_failure`` decides), failed for good, stopped at its deadline
        (expired), handed back unstarted, or handed back as one it cannot run (due again
        after ``delay``, within a deploy window of ``window`` ms: 0 dead-letters it, LONG
        never runs out here)."""
        self.clean = False
        worker, job_id = data.draw(st.sampled_from(self._held_jobs()), label="job")
        self.settle(worker, job_id, result, delay, window)

    def settle(self, worker: str, job_id: str, result: str, delay: int, window: int = 0) -> None:
        token, attempt = self.held[worker].pop(job_id)
        kind: AckKind = "ok" if result == "ok" else "release" if result == "release" else "dead"
        if result == "handback":
            kind = "handback"
        if result == "expire":
            kind = "expire"
        if result == "failed":
            max_attempts = self.model.jobs[job_id].max_attempts
            kind = after_failure(attempt, max_attempts, retryable=True, backoff=NO_WAIT, u=0).kind
        payload = ERROR if kind in ("retry", "dead", "expire") else "1"
        if kind == "handback":
            payload = f"{window}\n{ERROR}\n{ERROR}"
        delayed = kind in ("retry", "handback")
        outcome = Outcome(job_id, token, kind, payload, delay if delayed else 0)
        (code,) = self.run(self.store.ack(LANES, [outcome], worker))
        written = None  # code 2 (a re-send of a settlement) and 0 (fenced) write nothing
        if code == 1 and kind in ("ok", "dead", "expire"):
            written = self.field_ms(job_id, "fin")
        elif code == 1 and kind == "handback":
            field = "fin" if window == 0 else "run"
            written = self.field_ms(job_id, field) - (outcome.delay_ms if window else 0)
        elif code == 1 and kind == "retry":
            written = self.field_ms(job_id, "run") - outcome.delay_ms
        now = self.at(written)
        applied = self.model.ack(
            job_id, int(token), kind, now=now, delay_ms=outcome.delay_ms, window_ms=window
        )
        assert code == int(applied), f"ack {kind} of {job_id}: lua {code}, model {applied}"

    def _stale(self) -> list[tuple[str, str]]:
        jobs = self.model.jobs
        return [(i, t) for i, t in self.issued if jobs[i].token != int(t)]

    @precondition(lambda self: self._stale())
    @rule(data=st.data(), kind=st.sampled_from(["ok", "retry", "dead", "release", "handback"]))
    def ack_stale(self, data: st.DataObject, kind: AckKind) -> None:
        """A write under a token that is no longer the job's is always refused: fenced,
        or, when that token's own settlement is sent again, counted as a re-send."""
        self.clean = False
        job_id, token = data.draw(st.sampled_from(self._stale()), label="stale")
        before = self.run(self.store.stats())
        (code,) = self.run(self.store.ack(LANES, [Outcome(job_id, token, kind, ERROR)]))
        expected = self.model.ack(job_id, int(token), kind, now=self.at(None))
        assert code == expected != 1, f"a stale {kind} ack of {job_id}: lua {code}"
        counter = "fenced" if code == 0 else "resettled"
        assert self.run(self.store.stats())[counter] == before.get(counter, 0) + 1
        for jobs in self.held.values():
            if jobs.get(job_id, ("", 0))[0] == token:
                del jobs[job_id]

    @precondition(lambda self: any(self.held.values()))
    @rule(
        tenant=st.sampled_from(TENANTS),
        weight=st.sampled_from([None, 0.5, 1.0, 2.0, 3.0, 7.5]),
    )
    def configure(self, tenant: str, weight: float | None) -> None:
        """A tenant's weight changes at run time: both sides apply it from its next dispatch."""
        self.clean = False
        self.run(self.store.configure_tenant(tenant, weight))
        self.model.configure(tenant, weight)

    @rule(
        tenant=st.sampled_from(TENANTS),
        key=st.sampled_from(FAIRNESS_KEYS),
        weight=st.sampled_from(KEY_WEIGHTS),
    )
    def configure_key(self, tenant: str, key: str, weight: float | None) -> None:
        """A fairness key's weight changes: both sides tag the key's next job with it."""
        self.clean = False
        self.run(self.store.configure_key_weight(tenant, key, 1.0 if weight is None else weight))
        self.model.configure_key(tenant, key, weight)

    @precondition(lambda self: any(self.held.values()))
    @rule(limit=st.sampled_from([None, 1, 2]))
    def configure_limits(self, limit: int | None) -> None:
        """Tenant t3's concurrency settings come and go (static: floor == max)."""
        self.clean = False
        limits = None if limit is None else TenantLimits(floor=limit, max_concurrency=limit)
        self.run(self.store.configure_tenant_limits("t3", limits))
        self.model.configure_limits("t3", limits)

    @rule(scope=st.sampled_from(SCOPES))
    def pause(self, scope: Scope) -> None:
        self.run(self.store.pause(scope, lanes=list(LANES)))
        self.model.pause(scope)

    @rule(scope=st.sampled_from(SCOPES))
    def resume(self, scope: Scope) -> None:
        was = self._resume(scope)
        assert was == self.model.resume(scope), f"resume of {scope}"

    def _resume(self, scope: Scope) -> bool:
        """Resume on the store, chunk by chunk (two parked jobs a call)."""
        was, left = self.run(self.store.resume_step(scope, budget=2))
        while left:
            _, left = self.run(self.store.resume_step(scope, budget=2))
        return was

    @rule(worker=st.sampled_from(sorted(WORKERS)))
    def renew(self, worker: str) -> None:
        self.clean = False
        held = self.held[worker]
        tokens = [(i, tok) for i, (tok, _) in held.items()]
        lost, cancel = self.run(self.store.renew(worker, LONG, tokens))
        assert cancel == []
        now = self.at(self.beat_ms(worker))
        self.model.heartbeat(worker, now=now)
        expected = [
            i for i, (tok, _) in held.items() if not self.model.renew(i, int(tok), LONG, now=now)
        ]
        assert lost == expected, f"renew: lua lost {lost}, model lost {expected}"
        for job_id in lost:
            del held[job_id]

    @precondition(lambda self: any(self.held.values()))
    @rule(worker=st.sampled_from(sorted(WORKERS)))
    def crash(self, worker: str) -> None:
        """The worker dies: its jobs stay leased until their leases run out."""
        self.clean = False
        self.held[worker].clear()

    @precondition(lambda self: self.model.leases or self.model.heartbeats)
    @rule(limit=st.integers(1, 4), stale=st.booleans())
    def sweep(self, limit: int, stale: bool) -> None:
        """Reclaim expired leases; with ``stale``, every worker counts as stale (its
        heartbeat is at or before now) and up to ``limit`` of them are deregistered."""
        self.clean = False
        short = [t for t in self.model.leases.values() if t < self.now + LONG // 2]
        if short:  # let every short lease run out first
            deadline = time.monotonic() + 5
            while self.server_ms() < max(short):
                assert time.monotonic() < deadline, "the server clock does not advance"
                time.sleep(0.001)
        stale_ms = 0 if stale else 10**9
        retried, dead = self.run(self.store.sweep(limit, secrets.randbits(31), stale_ms))
        if retried:
            written: int | None = self.field_ms(retried[0], "run")
        elif dead:
            written = self.field_ms(dead[0], "fin")
        else:
            written = None
        expected = self.model.sweep(
            limit, now=self.at(written), delay_ms=0, stale_ms=0 if stale else None
        )
        assert (retried, dead) == expected, f"sweep: lua {(retried, dead)}, model {expected}"

    @rule(worker=st.sampled_from(sorted(WORKERS)), limit=st.integers(1, 4), dead=st.booleans())
    def beat(self, worker: str, limit: int, dead: bool) -> None:
        """A worker beats; with ``dead``, every other worker that beat counts as dead
        (silent for 0 ms) and up to ``limit`` of its jobs are taken back at once."""
        self.clean = False
        dead_ms = 0 if dead else 10**9
        reply = self.run(self.store.beat(worker, dead_ms, limit, secrets.randbits(31)))
        now = self.at(_ms(self.client.zscore(self.keys.beats, worker)))
        expected = self.model.beat(worker, dead_ms, limit, now=now, delay_ms=0)
        assert reply == expected, f"beat: lua {reply}, model {expected}"

    @precondition(lambda self: self._pending() >= 6)
    @rule()
    def drain(self) -> None:
        self.clean = False
        self.drain_all()

    def drain_all(self) -> None:
        """With capacity (a worker of 6 slots on both lanes), every pause resumed and every
        running job acked, every job that is not scheduled for later finishes."""
        for scope in list(self.model.pauses.entries):
            assert self._resume(scope) and self.model.resume(scope)
        for _ in range(100):
            running = sorted(
                (j.id, j.token) for j in self.model.jobs.values() if j.token is not None
            )
            # each worker settles its own jobs (so that its set of leased ids stays exact)
            holders: dict[str, list[tuple[str, int]]] = {}
            for i, tok in running:
                holders.setdefault(self.model.jobs[i].worker or "", []).append((i, tok))
            for holder, held in sorted(holders.items()):
                outcomes = [Outcome(i, str(tok), "ok", "1") for i, tok in held]
                codes = self.run(self.store.ack(LANES, outcomes, holder))
                now = self.at(self.field_ms(held[0][0], "fin"))
                assert codes == [int(self.model.ack(i, tok, "ok", now=now)) for i, tok in held]
            if running:
                for jobs in self.held.values():
                    for i in [
                        i for i, (tok, _) in jobs.items() if self.model.jobs[i].token != int(tok)
                    ]:
                        del jobs[i]
            given = self.exchange(DRAINER, LANES, DRAIN_SLOTS, LONG, settle=False, idle_ms=0)
            self.check_all()
            if not running and not given:
                break
        self.held[DRAINER].clear()
        for job in self.model.jobs.values():
            later = job.status == "scheduled" and job.run_at > self.now
            assert job.status in FINISHED or later, f"{job.id} is left {job.status} by a drain"
        self._leave(DRAINER, LONG)
        self.check_all()

    # -- the whole store, after every step ---------------------------------------------

    def snapshot(self) -> Snapshot:
        """Every key of the app, read atomically."""
        k, pipe = self.keys, self.client.pipeline(transaction=True)
        for job_id in self.ids:
            pipe.hmget(
                k.job(job_id),
                ["st", "att", "max", "tok", "ttok", "cls", "sl", "lane", "toff", "seq"],
            )
        units = [(lane, cls) for lane in LANES for cls in TABLES[lane].names]
        for lane, cls in units:
            for tenant in TENANTS:
                pipe.zrange(k.tenant_queue(lane, cls, tenant), 0, -1)
                pipe.zrange(k.fairness_tags(lane, cls, tenant), 0, -1, withscores=True)
            pipe.zrange(k.class_key(lane, cls, "fair"), 0, -1, withscores=True)
            pipe.hgetall(k.class_key(lane, cls, "vt"))
        for lane in LANES:
            pipe.hgetall(k.lane(lane).state)
            pipe.hgetall(k.lane(lane).cap)
            pipe.zrange(k.lane(lane).delayed, 0, -1, withscores=True)
            pipe.zrange(k.lane(lane).idle, 0, -1, withscores=True)
        for worker in [*WORKERS, DRAINER]:
            pipe.lrange(k.inbox(worker), 0, -1)
        pipe.zrange(k.leases, 0, -1, withscores=True)
        pipe.zrange(k.dead, 0, -1, withscores=True)
        pipe.hgetall(k.stats)
        pipe.get(k.fence)
        pipe.zrange(k.workers, 0, -1, withscores=True)
        pipe.hgetall(k.fleet)
        self._ask_throttles(pipe)
        self._ask_pauses(pipe, units)
        replies = iter(pipe.execute())
        snap = Snapshot()
        self._read_jobs(snap, replies)
        for lane, cls in units:
            for tenant in TENANTS:
                snap.queues[(lane, cls, tenant)] = [_s(i) for i in next(replies)]
                tags = {_s(key): float(f) for key, f in next(replies)}
                if tags:
                    snap.key_tags[(lane, cls, tenant)] = tags
            snap.fair[(lane, cls)] = {_s(t): float(tag) for t, tag in next(replies)}
            snap.vt[(lane, cls)] = {_s(f): float(v) for f, v in next(replies).items()}
        for lane in LANES:
            state = {_s(f): _s(v) for f, v in next(replies).items()}
            # the declarations (classes, charge mode) are inputs, not state the model keeps;
            # `P` flags a shard with pauses (pauses_match)
            declared, snap.flagged[lane] = ("table", "charge", "adm", "utable", "P"), "P" in state
            snap.state[lane] = {
                f: int(v) for f, v in state.items() if f not in declared and f[:2] != "W:"
            }
            # each class's waiting weight (policy/shardshare.py), which the model does not keep
            snap.waiting_weight[lane] = {f[2:]: float(v) for f, v in state.items() if f[:2] == "W:"}
            snap.cap[lane] = {_s(w): int(v) for w, v in next(replies).items()}
            snap.delayed[lane] = [(_s(i), _ms(s)) for i, s in next(replies)]
            snap.idle[lane] = {_s(m): _ms(s) for m, s in next(replies)}
        for worker in [*WORKERS, DRAINER]:
            rows = [msgspec.msgpack.decode(r, type=FetchedJob) for r in next(replies)]
            snap.inboxes[worker] = [Grant(j.id, int(j.token), j.attempt) for j in rows]
        snap.leases = {_s(i): _ms(s) for i, s in next(replies)}
        snap.dead = {_s(i): _ms(s) for i, s in next(replies)}
        snap.stats = {_s(key): int(v) for key, v in next(replies).items()}
        snap.fence = int(next(replies) or 0)
        snap.workers = {_s(w): _ms(s) for w, s in next(replies)}
        snap.fleet = {_s(w): _s(v) for w, v in next(replies).items()}
        self._read_throttles(snap, replies)
        self._read_pauses(snap, replies, units)
        return snap

    def _read_jobs(self, snap: Snapshot, replies: Iterator[Any]) -> None:
        """The jobs' records: their rows, and the grants the running ones hold."""
        for job_id in self.ids:
            st_, att, max_, tok, ttok, cls, sl, lane, toff, seq = next(replies)
            # a running job's grant: 'rate cost<TAB>key..' (store layout 4)
            if ttok:
                snap.grants[job_id] = _s(ttok).split("\t", 1)[1]
            # fields the record leaves out at their defaults (store layout 3)
            snap.jobs[job_id] = JobRow(
                _s(st_), int(att or 0), int(max_ or RECORD_DEFAULTS["max"]), tok and int(tok),
                ttok is not None, _s(cls or DEFAULT_CLASS.encode()), int(sl or 1),
                _s(lane or RECORD_DEFAULTS["lane"].encode()), toff is not None, float(seq),
            )  # fmt: skip

    def _ask_throttles(self, pipe: Any) -> None:
        pipe.hgetall(self.keys.throttles)
        pipe.zrange(self.keys.throttle_waiters, 0, -1)
        for key in self.throttle_keys:
            pipe.zrange(self.keys.throttle_tags(key, "s"), 0, -1, withscores=True)
            pipe.zrange(self.keys.throttle_tags(key, "f"), 0, -1, withscores=True)

    def _ask_pauses(self, pipe: Any, units: list[tuple[str, str]]) -> None:
        pipe.hgetall(self.keys.pauses)
        for scope in SCOPES:
            pipe.zrange(self.keys.parked(scope_field(scope)), 0, -1, withscores=True)
        for lane, cls in units:
            pipe.smembers(self.keys.class_key(lane, cls, "held"))

    def _read_pauses(
        self, snap: Snapshot, replies: Iterator[Any], units: list[tuple[str, str]]
    ) -> None:
        snap.pauses = {field_scope(_s(f)): int(v) for f, v in next(replies).items()}
        for scope in SCOPES:
            parked = {_s(i): float(score) for i, score in next(replies)}
            if parked:
                snap.parked[scope] = parked
        for lane, cls in units:
            held = {_s(t) for t in next(replies)}
            if held:
                snap.held[(lane, cls)] = held

    def _read_throttles(self, snap: Snapshot, replies: Iterator[Any]) -> None:
        snap.thr = {_s(f): _s(v) for f, v in next(replies).items()}
        for member in next(replies):
            key, tenant, _, job_id = _s(member).split("\0")
            snap.waiters.setdefault(key, {}).setdefault(tenant, []).append(job_id)
        for key in self.throttle_keys:
            for which in ("s", "f"):
                tags = {_s(t): float(tag) for t, tag in next(replies)}
                if tags:
                    snap.tags[(key, which)] = tags

    @invariant()
    def check_all(self) -> None:
        snap = self.snapshot()
        self.every_job_in_one_place(snap)
        self.store_matches_model(snap)
        self.pauses_match(snap)
        self.no_slot_idles(snap)
        self.clean = True

    def every_job_in_one_place(self, snap: Snapshot) -> None:
        """On the store alone: each job in exactly one place that matches its status,
        none over its attempt budget, the lanes' slots and the throttle keys consistent
        (whatever the model says)."""
        queued = Counter(i for q in snap.queues.values() for i in q)
        parked_ids = Counter(i for p in snap.parked.values() for i in p)
        queued.update(parked_ids)
        parked = Counter(i for w in snap.waiters.values() for g in w.values() for i in g)
        scheduled = Counter(i for d in snap.delayed.values() for i, _ in d)
        for job_id, row in snap.jobs.items():
            finished = row.status in ("completed", "failed", "cancelled", "expired")
            places = [
                queued[job_id], parked[job_id], scheduled[job_id],
                int(job_id in snap.leases), int(finished),
            ]  # fmt: skip
            assert sorted(places) == [0, 0, 0, 0, 1], f"{job_id} ({row.status}) is in {places}"
            expected = {"queued": 0, "throttled": 1, "scheduled": 2, "running": 3}
            assert places[expected.get(row.status, 4)] == 1, f"{job_id} is {row.status}: {places}"
            # a throttle slot is held only by running work; offers only wait in a queue
            assert not row.grant or row.status == "running", f"{job_id} holds while waiting"
            assert not row.toff or row.status == "queued", f"{job_id} offered while {row.status}"
            assert row.attempts <= row.max_attempts, f"{job_id}: over its attempt budget"
            # a finished job may keep its last token: its status alone fences that token
            assert row.token is not None or row.status != "running", f"{job_id} has no token"
        for lane in LANES:
            state = snap.state[lane]
            assert state.get("C", 0) == sum(snap.cap[lane].values()), f"capacity of {lane}"
            for cls in TABLES[lane].names:
                mine = [r for r in snap.jobs.values() if (r.lane, r.cls) == (lane, cls)]
                f = sum(r.slots for r in mine if r.status == "running")
                d = sum(
                    r.slots for i, r in snap.jobs.items()
                    if (r.lane, r.cls) == (lane, cls) and r.status == "queued" and not parked_ids[i]
                )  # fmt: skip
                assert state.get(f"f:{cls}", 0) == f, f"in-flight slots of {lane}/{cls}"
                assert state.get(f"d:{cls}", 0) == d, f"waiting slots of {lane}/{cls}"
        for key, use in snap.throttle_use().items():
            limit = int(snap.thr[f"l:{key}"])
            fixed = KEY_LIMITS.get(key) or (
                STATIC.get(key[7:]) if key.startswith("tenant:") else None
            )
            # a key whose limit moves (k3, t3's key) may hold more than its latest limit:
            # lowering a limit preempts nobody -- but never more than the highest it had
            offers = int(snap.thr.get(f"o:{key}", 0))
            assert use + offers <= (limit if fixed else 2), f"key {key}: {use}+{offers} > {limit}"
            room = limit - use - offers
            assert not snap.waiters.get(key) or room <= 0, f"key {key} idles with waiters"

    def store_matches_model(self, snap: Snapshot) -> None:
        model = self.model
        model.check_invariants()
        for job_id, row in snap.jobs.items():
            job = model.jobs[job_id]
            assert (row.status, row.attempts) == (job.status, job.attempts), f"{job_id}: {row}"
            assert row.status != "running" or row.token == job.token, f"{job_id} token: {job}"
            assert (row.cls, row.slots) == (job.cls, job.slots), f"{job_id} class: {row}"
            # the store fences a grant by the job's lease, the policy by a grant token
            assert row.grant == (job.ttok is not None), f"{job_id} throttle grant: {row}, {job}"
            offered = model.throttles.offered(job_id) is not None
            assert row.toff == offered, f"{job_id} offers: {row}"
            assert row.seq == job.seq, f"{job_id} order number: lua {row.seq}, model {job.seq}"
        for lane in LANES:
            lm = model.lane(lane)
            for cls in TABLES[lane].names:
                cq = lm.cls(cls)
                for tenant in TENANTS:
                    assert snap.queues[(lane, cls, tenant)] == cq.queue_ids(tenant), (lane, cls)
                    tags = cq.keys[tenant].next_tag if tenant in cq.keys else {}
                    lua_tags = snap.key_tags.get((lane, cls, tenant), {})
                    assert lua_tags == tags, f"fairness-key tags of {lane}/{cls}/{tenant}"
                assert snap.fair[(lane, cls)] == cq.fair, f"fair tags of {lane}/{cls}"
                vt = snap.vt[(lane, cls)]
                assert vt.get("V", 0.0) == cq.vtime, f"virtual time of {lane}/{cls}"
                assert vt.get("run", 0.0) == cq.run, f"in-flight work of {lane}/{cls}"
                finish = {f[2:]: v for f, v in vt.items() if f.startswith("f:")}
                assert finish == cq.finish, f"finish tags of {lane}/{cls}"
                if not cq.fair:  # an empty fair set's waiting weight starts again from 0
                    weight = snap.waiting_weight[lane].get(cls, 0.0)
                    assert weight == 0.0, f"waiting weight of {lane}/{cls}: {weight}"
            state = {f: v for f, v in snap.state[lane].items() if v}
            expected = {f"f:{c}": v for c, v in lm.in_flight.items() if v}
            expected.update({f"d:{c}": v for c, v in lm.waiting.items() if v})
            if lm.capacity:
                expected["C"] = lm.capacity
            assert state == expected, f"state of {lane}: {state} != {expected}"
            assert snap.cap[lane] == lm.cap, f"registrations of {lane}"
            assert snap.delayed[lane] == model.delayed_ids(lane), f"delayed set of {lane}"
            assert snap.idle[lane] == lm.idle, f"idle workers of {lane}"
        for worker in [*WORKERS, DRAINER]:
            assert snap.inboxes[worker] == model.inbox.get(worker, []), f"inbox of {worker}"
        assert snap.leases == model.leases
        assert snap.dead == model.dead
        assert snap.fence == model.fence
        assert snap.workers == model.heartbeats
        fleet = {w: f"{s}|{','.join(lanes)}" for w, (s, lanes) in model.fleet.items()}
        assert snap.fleet == fleet
        counters = {c: snap.stats.get(c, 0) for c in COUNTERS}
        assert counters == {c: model.stats[c] for c in COUNTERS}
        # the refusals, with their reasons, are the decision counter's (every lane counts them)
        _, decisions = split_stats(snap.stats)
        refused = {
            (lane, cls, "rejected", why): n for (lane, cls, why), n in model.refusals.items()
        }
        assert decisions == refused, "admission decisions"
        named = {f for f in snap.stats if f.startswith(DECISION_PREFIX)}
        assert not set(snap.stats) - named - {*COUNTERS, "fifo"}, (
            f"unexpected counters: {snap.stats}"
        )
        assert snap.stats.get("fifo", 0) == model.seq
        self.throttles_match(snap)

    def pauses_match(self, snap: Snapshot) -> None:
        """The pauses in force, the tenants each class holds, the jobs each pause parked
        (with their order scores), and the lanes flagged while any pause is in force."""
        model = self.model
        assert snap.pauses == model.pauses.entries, f"pauses: {snap.pauses}"
        held = {unit: tenants for unit, tenants in model.held.items() if tenants}
        assert snap.held == held, f"held tenants: lua {snap.held}, model {held}"
        parked = {scope: jobs for scope, jobs in model.parked.items() if jobs}
        assert snap.parked == parked, f"parked jobs: lua {snap.parked}, model {parked}"
        for lane in LANES:
            assert snap.flagged[lane] == bool(model.pauses.entries), f"{lane}'s pause flag"
        # how often the runs reach the states that matter (--hypothesis-show-statistics)
        if held:
            event("a paused tenant held out of a fair set")
        if parked:
            event("a paused task's or key's job parked")

    def throttles_match(self, snap: Snapshot) -> None:
        """Keys, references, holders, offers, tenant groups, tags and counters."""
        thr, stats = self.model.throttles, self.model.throttles.statistics()
        keys = {s.key: (s.in_use, s.offers, s.limit) for s in stats.keys}
        lua_keys = {
            k[2:]: (int(snap.thr.get(f"u:{k[2:]}", 0)), int(snap.thr.get(f"o:{k[2:]}", 0)), int(v))
            for k, v in snap.thr.items()
            if k.startswith("l:")
        }
        assert lua_keys == keys, f"throttle keys: lua {lua_keys}, model {keys}"
        assert set(keys) <= set(self.throttle_keys), "a key the snapshot does not read"
        refs: Counter[str] = Counter()
        for job_id in self.model.jobs:
            refs.update(thr.holds(job_id) or thr.wants(job_id) or thr.offered(job_id) or ())
        lua_refs = {k[2:]: int(v) for k, v in snap.thr.items() if k.startswith("r:") and int(v)}
        assert lua_refs == dict(refs), "throttle references"
        groups = {s.key: {t: list(g) for t, g in thr.groups(s.key).items()} for s in stats.keys}
        groups = {k: g for k, g in groups.items() if g}
        assert snap.waiters == groups, f"waiter groups: lua {snap.waiters}, model {groups}"
        for key in keys:
            assert float(snap.thr.get(f"v:{key}", 0)) == thr.vtime(key), f"V of key {key}"
            assert snap.tags.get((key, "s"), {}) == thr.start_tags(key), f"start tags of {key}"
            assert snap.tags.get((key, "f"), {}) == thr.finish_tags(key), f"finish tags of {key}"
        assert not {k for k, _ in snap.tags} - set(keys), "tags of a forgotten key"
        held, offered, parked = {}, {}, {}
        for job_id in self.model.jobs:
            if thr.holds(job_id) is not None:
                held[job_id] = "\t".join(thr.holds(job_id) or ())
            if thr.offered(job_id) is not None:
                offered[job_id] = "\t".join(thr.offered(job_id) or ())
            waiter = thr.waiter(job_id)
            if waiter is not None:
                parked[job_id] = (waiter[0], waiter[3], thr.wants(job_id))
        assert snap.grants == held, f"grants: lua {snap.grants}, model {held}"
        assert {k[2:]: v for k, v in snap.thr.items() if k.startswith("w:")} == offered
        lua_parked = {}
        for k, v in snap.thr.items():
            if k.startswith("p:"):
                at, _, _, tenant, _, _, _, *names = v.split("\t")
                lua_parked[k[2:]] = (at, tenant, tuple(names))
        assert lua_parked == parked
        assert int(snap.thr.get("wakes", 0)) == stats.wakes
        assert int(snap.thr.get("moves", 0)) == stats.moves

    def no_slot_idles(self, snap: Snapshot) -> None:
        """When the class rules (``next_class`` on the store's own lane state and heads)
        let a class start, the lane's next dispatch starts that class's head job (and
        so gives something) -- unless its throttle keys park it. So no slot idles while
        an eligible job waits for anything but a fetch."""
        if self.model.pauses.entries:
            return
        for lane in LANES:
            table, state = TABLES[lane], snap.state[lane]
            heads: dict[str, str | None] = {}
            for cls in table.names:
                fair = snap.fair[(lane, cls)]
                if fair:
                    tenant = min(fair, key=lambda t: (fair[t], t))
                    heads[cls] = snap.queues[(lane, cls, tenant)][0]
                else:
                    heads[cls] = None
            chosen = next_class(
                table,
                state.get("C", 0),
                {c: state.get(f"f:{c}", 0) for c in table.names},
                {c: snap.jobs[h].slots if h else None for c, h in heads.items()},
                demand={c: state.get(f"d:{c}", 0) for c in table.names},
            )
            if chosen is None:
                continue
            head = heads[chosen]
            assert head is not None
            probe = copy.deepcopy(self.model)
            taken, _, _ = probe._dispatch(lane, 10**6, self.now)
            started = [job.id for job in taken]
            # parked, it holds nothing, and may be woken again in the same dispatch (by
            # a later job raising a key's limit) without starting in it
            parked = probe.jobs[head].status == "throttled" or (
                probe.throttles.offered(head) is not None
                and head in probe.queue_ids(lane, probe.jobs[head].tenant, chosen)
            )
            assert head in started or parked, (
                f"{lane}: class {chosen} may start {head}, the next fetch starts {started}"
            )


@dataclass
class JobRow:
    status: str
    attempts: int
    max_attempts: int
    token: int | None
    grant: bool
    cls: str
    slots: int
    lane: str
    toff: bool
    seq: float


@dataclass
class Snapshot:
    jobs: dict[str, JobRow] = field(default_factory=dict)
    queues: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    fair: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    vt: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    state: dict[str, dict[str, int]] = field(default_factory=dict)
    waiting_weight: dict[str, dict[str, float]] = field(default_factory=dict)
    cap: dict[str, dict[str, int]] = field(default_factory=dict)
    delayed: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    idle: dict[str, dict[str, int]] = field(default_factory=dict)
    inboxes: dict[str, list[Grant]] = field(default_factory=dict)
    leases: dict[str, int] = field(default_factory=dict)
    dead: dict[str, int] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    fence: int = 0
    workers: dict[str, int] = field(default_factory=dict)
    fleet: dict[str, str] = field(default_factory=dict)
    thr: dict[str, str] = field(default_factory=dict)
    grants: dict[str, str] = field(default_factory=dict)  # job -> its grant's keys
    waiters: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # key -> groups
    tags: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    key_tags: dict[tuple[str, str, str], dict[str, float]] = field(default_factory=dict)
    pauses: dict[Scope, int] = field(default_factory=dict)
    parked: dict[Scope, dict[str, float]] = field(default_factory=dict)
    held: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    flagged: dict[str, bool] = field(default_factory=dict)

    def throttle_use(self) -> dict[str, int]:
        """Every live throttle key's slots in use."""
        return {k[2:]: int(self.thr.get(f"u:{k[2:]}", 0)) for k in self.thr if k.startswith("l:")}


def check(machine: LuaVsModel) -> None:
    machine.check_all()


def _examples(redis_url: str) -> int:
    # On a cluster the question is routing, not the rules; on another server (the
    # external backend) it is whether that server runs the same scripts the same way.
    # The rules' depth is the embedded server's 250 runs: fewer runs answer the others.
    if "+cluster://" in redis_url:
        return 12
    if redis_url == os.environ.get("FAIRLANE_TEST_REDIS_URL"):
        return 60
    return 250


@pytest.mark.contract
@pytest.mark.timeout(600)  # a pass takes about a minute; shrinking a failure can take longer
def test_lua_agrees_with_model(redis_url: str) -> None:
    machine = type("LuaVsModelOn", (LuaVsModel,), {"redis_url": redis_url})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=_examples(redis_url),
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_model_order_and_reclaim() -> None:
    """The oracle's own rules on a hand-checked case: fair order, priority, FIFO, dead-letter."""
    model = QueueModel()
    for n, tenant in enumerate(["t1", "t1", "t2"]):
        model.enqueue(f"j{n}", tenant, "a", 0, 1, now=0)
    model.enqueue("j3", "t1", "a", 1, 1, now=0)
    grants = model.fetch("w", ["a"], 4, 10, now=0).jobs
    # fair order: t1 and t2 both start at tag 0 (ties by name): t1 gives j3 (priority),
    # then t2 (tag 0 < t1's 1) gives j2, then t1 gives j0 and j1
    assert [g.id for g in grants] == ["j3", "j2", "j0", "j1"]
    assert [g.token for g in grants] == [1, 2, 3, 4]
    assert model.sweep(10, now=9) == ([], [])
    assert model.sweep(10, now=10) == ([], ["j0", "j1", "j2", "j3"])  # expiry, then id
    assert model.jobs["j0"].status == "failed" and model.jobs["j0"].lease_lost
    model.check_invariants()


@pytest.mark.parametrize("limit", [1, 3])
def test_model_sweep_bounds_and_fences(limit: int) -> None:
    model = QueueModel()
    for n in range(3):
        model.enqueue(f"j{n}", "t", "a", 0, 2, now=0)
    first = model.fetch("w", ["a"], 3, 5, now=0).jobs
    retried, dead = model.sweep(limit, now=5)
    assert (retried, dead) == ([g.id for g in first][:limit], [])
    stale = first[0]
    assert not model.ack(stale.id, stale.token, "ok", now=6)
    assert model.stats["fenced"] == 1
    again = model.fetch("w2", ["a"], 3, 5, now=6).jobs
    assert again[0].id == stale.id and again[0].attempt == 2 and again[0].token > stale.token
    model.check_invariants()


def test_model_hand_off_to_an_idle_worker() -> None:
    model = QueueModel()
    assert model.fetch("w", ["a"], 2, 100, now=0, idle_ms=50) == Batch([], None)
    assert model.lane("a").idle == {"w|100": 50} and model.lane("a").capacity == 2
    batch = [
        Submission("j0", "t", 0, 1, 10),
        Submission("j1", "t", 0, 1),
        Submission("j2", "t", 0, 1),
    ]
    model.enqueue_batch("a", batch, now=1)
    # the lane's next job goes to the idle worker, leased; the registration is spent
    assert model.inbox == {"w": [Grant("j1", 1, 1)]} and model.lane("a").idle == {}
    assert model.leases == {"j1": 101} and model.queue_ids("a", "t") == ["j2"]
    assert model.take_handed("w", now=2) == Grant("j1", 1, 1)
    assert model.take_handed("w", now=2) is None
    assert model.fetch("v", ["a"], 1, 100, now=2).jobs == [Grant("j2", 2, 1)]
    assert model.fetch("v", ["a"], 1, 100, now=3, idle_ms=5) == Batch([], 8)  # j0 due at 11
    model.enqueue("j3", "t", "a", 0, 1, now=8)  # v's registration lapsed at 8
    assert model.queue_ids("a", "t") == ["j3"] and not model.inbox
    model.check_invariants()


def test_model_classes_widths_and_throttles() -> None:
    """Classes, widths and throttle keys on hand-checked cases."""
    model = QueueModel()
    model.fetch("w", ["a"], 1, 100, now=0, slots=3)  # C = 3: guaranteed and standard a = 1
    for tenant in ("t", "u"):
        model.configure_classes(tenant, ENTITLED)
    jobs = [
        Submission("wide", "t", 0, 1, slots=3),
        Submission("g1", "t", 0, 1, cls="guaranteed"),
        Submission("g2", "u", 0, 1, cls="guaranteed"),
    ]
    assert model.enqueue_batch("a", jobs, now=1) == [1, 1, 1]
    assert model.enqueue_batch("a", [Submission("x", "t", 0, 1, cls="nope")], now=1) == [-2]
    refused = [Submission("v1", "v", 0, 1, cls="guaranteed")]
    assert model.enqueue_batch("a", refused, now=1) == [-5]  # v is not entitled: nothing kept
    assert "v1" not in model.jobs
    # g1 starts within guaranteed's assured slot; then the wide standard head (ranked
    # first, f/a = 0) is blocked for free slots and holds them: g2 may not borrow
    assert [g.id for g in model.fetch("w", ["a"], 3, 100, now=2).jobs] == ["g1"]
    assert model.lane("a").in_flight["guaranteed"] == 1
    assert model.lane("a").waiting == {"standard": 3, "guaranteed": 1}
    token = model.jobs["g1"].token
    assert token is not None and model.ack("g1", token, "ok", now=3)
    # g2 is owed its assured slot (its claim leaves the wide job no spare)
    assert [g.id for g in model.fetch("w", ["a"], 3, 100, now=4).jobs] == ["g2"]
    token = model.jobs["g2"].token
    assert token is not None and model.ack("g2", token, "ok", now=5)
    assert [g.id for g in model.fetch("w", ["a"], 3, 100, now=6).jobs] == ["wide"]
    model.check_invariants()

    model = QueueModel()
    keyed = [Submission(f"k{n}", "t", 0, 1, limits=(("k", 1),)) for n in range(2)]
    model.enqueue_batch("a", keyed, now=0)
    # k0 takes k's only slot, k1 parks on k (holding nothing); the budget is not spent
    assert [g.id for g in model.fetch("w", ["a"], 2, 100, now=1).jobs] == ["k0"]
    assert model.jobs["k1"].status == "throttled" and model.throttles.waiters("k") == ("k1",)
    assert model.stats["throttled"] == 1 and model.lane("a").waiting["standard"] == 0
    token = model.jobs["k0"].token
    assert token is not None and model.ack("k0", token, "ok", now=2)
    # k0's release wakes k1: back in its tenant's queue with an offer on k, holding nothing
    assert model.jobs["k1"].status == "queued" and model.jobs["k1"].ttok is None
    assert model.throttles.offered("k1") == ("k",) and model.throttles.in_use("k") == 0
    assert model.queue_ids("a", "t") == ["k1"] and model.lane("a").waiting["standard"] == 1
    # an arrival finds no room (the offer reserves it): it parks behind, not ahead
    model.enqueue_batch("a", [Submission("k2", "t", 9, 1, limits=(("k", 1),))], now=3)
    # dispatch takes k2 first (priority 9) and parks it; k1 then converts its offer
    assert [g.id for g in model.fetch("w", ["a"], 2, 100, now=4).jobs] == ["k1"]
    assert model.jobs["k1"].ttok == 2 and model.throttles.in_use("k") == 1
    assert model.jobs["k2"].status == "throttled"
    model.check_invariants()


@pytest.mark.contract
def test_hand_off_edges(redis_url: str) -> None:
    """Fixed steps through the hand-off's corners, on the real store and the model."""
    machine = type("LuaVsModelOn", (LuaVsModel,), {"redis_url": redis_url})()
    plain = ((), 0, 1)  # limits, class index, width

    def jobs(*specs: tuple[str, int, int, int]) -> list[JobSpec]:
        return [(t, p, a, d, plain[1], plain[2], plain[0], "", None, False) for t, p, a, d in specs]

    # the steps put t2's jobs in lane a's guaranteed class too: it is entitled here
    machine.run(machine.store.configure_tenant_classes("t2", ENTITLED.classes))
    machine.model.configure_classes("t2", ENTITLED)
    try:
        machine.fetch("w1", ("a",), 1, short=False, settle=False, idle_ms=LONG)  # idle on a
        check(machine)
        # the delayed job does not count; the lane's next job goes to w1, the rest queue
        machine.enqueue("a", jobs(("t1", 0, 2, LONG), ("t1", 0, 2, 0), ("t2", 0, 2, 0)))
        check(machine)
        assert machine.model.inbox == {"w1": [Grant("j001", 1, 1)]}
        machine.fetch("w2", ("a",), 1, short=False, settle=False, idle_ms=0)  # j002
        machine.settle("w2", "j002", "failed", 0)  # retried, due at once
        check(machine)
        # w1 asks for no more than its inbox holds: nothing else moves, not even j002
        machine.fetch("w1", ("a",), 1, short=False, settle=False, idle_ms=LONG)
        check(machine)
        assert machine.model.delayed_ids("a")[0][0] == "j002"
        # an enqueue of only delayed jobs claims nobody: the next due job goes to w3
        machine.fetch("w3", ("b",), 2, short=False, settle=False, idle_ms=LONG)
        machine.enqueue("b", jobs(("t1", 0, 1, LONG)))
        machine.enqueue("b", jobs(("t1", 0, 1, 0)))
        check(machine)
        assert machine.model.inbox.get("w3") and not machine.model.queue_ids("b", "t1", "gold")
        # a registration with a 1 ms life has lapsed by the next millisecond
        machine.fetch("w3", ("b", "a"), 3, short=False, settle=True, idle_ms=0)
        machine.fetch("w3", ("b",), 1, short=False, settle=True, idle_ms=1)
        check(machine)
        time.sleep(0.003)
        machine.enqueue("b", jobs(("t1", 0, 1, 0)))
        check(machine)
        assert not machine.model.inbox.get("w3")
        # a worker registered on a then b, then gone, is uncounted in both
        machine.exchange("w2", ("b",), 1, LONG, settle=True, idle_ms=0)
        check(machine)
        machine.leave("w2", short=False)
        check(machine)
        assert "w2" not in machine.model.lane("a").cap and "w2" not in machine.model.lane("b").cap
        machine.drain()
    finally:
        machine.teardown()
