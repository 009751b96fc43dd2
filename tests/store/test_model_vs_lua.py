"""The Lua library against its reference model (``fairlane.policy.model``), step by step.

A hypothesis state machine drives the real scripts (through ``fairlane.store.redis.Store``
on the real server) and ``QueueModel`` with the same operations -- enqueue, fetch (with or
without settling the worker's jobs in the same call, and registering the worker idle when
it gets nothing), the blocking wait that takes a job handed to an idle worker, a
stopping worker's leave, renew,
acks of every kind, acks with stale tokens, worker crashes and reclaim sweeps -- and
requires the same replies: the same jobs in the same order with the same tokens and
attempt numbers, the same fenced acks, the same reclaims. After every step the whole
store is compared with the model (every job's status and attempts, tenant queues in
order, fair tags and virtual times, delayed sets, idle registrations, inboxes, leases
and dead letters with their times, counters) and checked on its own: every job is in
exactly one place, none over its attempt budget. ``test_hand_off_edges`` walks fixed
steps through the hand-off's corners, which random runs reach rarely.

Time is exact, not approximate. The scripts read the server clock; the model is told the
same instant, read back from what the script wrote (a fetch's ``start``, a retry's
``run``, a finish's ``fin``, a renewed lease's expiry, an idle registration's end). Where
a call writes no time the instant cannot matter: leases are either long (10 min, never
expiring during a run) or 1 ms, and before a sweep the test waits until every 1 ms lease
has expired, so the sweep reclaims all of them (and so writes its time) or has nothing
to reclaim. Retries are due at once (backoff ``0,0,none``, ack delay 0) or in 10 minutes.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import msgspec
import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from fairlane.policy.backoff import Backoff
from fairlane.policy.model import FINISHED, AckKind, Batch, Grant, QueueModel
from fairlane.policy.model import NewJob as ModelNewJob
from fairlane.policy.retry import after_failure
from fairlane.store.redis import FetchedJob, NewJob, Outcome, Store

T = TypeVar("T")

LANES = ("a", "b")
TENANTS = ("t1", "t2", "t3")
WORKERS = ("w1", "w2", "w3")
LONG = 600_000  # ms: a lease, renewal or delay that never runs out during a test
SHORT = 1  # ms: a lease that has run out by the next sweep
TASK = "model.job"
ERROR = '{"type":"Boom","message":"failed","traceback":""}'
NO_WAIT = Backoff(0, 0, "none")
PAIRS = [(lane, tenant) for lane in LANES for tenant in TENANTS]
COUNTERS = ("fenced", "reclaimed", "retried", "completed", "failed")

lane_orders = st.sampled_from([("a",), ("b",), ("a", "b"), ("b", "a")])
new_jobs = st.lists(
    st.tuples(
        st.sampled_from(TENANTS),
        st.integers(-1, 1),  # priority
        st.integers(1, 3),  # attempts
        st.sampled_from([0, 0, 0, LONG]),  # delay
    ),
    min_size=1,
    max_size=3,
)


def _ms(reply: Any) -> int:
    return int(float(reply))


class LuaVsModel(RuleBasedStateMachine):
    redis_url: ClassVar[str] = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.app = "m_" + secrets.token_hex(4)
        self.store = Store.from_url(self.redis_url, self.app, max_connections=4)
        self.keys = self.store.keys
        self.client = redis.Redis.from_url(self.redis_url)
        self.run(self.store.connect())
        self.model = QueueModel()
        self.ids: list[str] = []
        # worker -> id -> (token, attempt) of the jobs it believes it holds
        self.held: dict[str, dict[str, tuple[str, int]]] = {w: {} for w in WORKERS}
        self.issued: list[tuple[str, str]] = []  # every (id, token) a fetch handed out
        self.now = 0

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            keys = list(self.client.scan_iter(match=self.keys.match_all(), count=500))
            if keys:
                self.client.delete(*keys)
        finally:
            self.client.close()
            self.run(self.store.aclose())
            self.loop.close()

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

    # -- operations -------------------------------------------------------------------

    def _pending(self) -> int:
        return sum(1 for job in self.model.jobs.values() if job.status not in FINISHED)

    @precondition(lambda self: self._pending() < 12)
    @rule(lane=st.sampled_from(LANES), specs=new_jobs)
    def enqueue(self, lane: str, specs: list[tuple[str, int, int, int]]) -> None:
        jobs = []
        for tenant, prio, attempts, delay in specs:
            job_id = f"j{len(self.ids):03d}"
            self.ids.append(job_id)
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
                )
            )
        replies = self.run(self.store.enqueue(lane, jobs))
        assert replies == [(job.id, 1) for job in jobs]
        now = self.at(self.field_ms(jobs[0].id, "enq"))
        specs = [
            ModelNewJob(j.id, j.tenant, j.priority, j.max_attempts, j.delay_ms or 0) for j in jobs
        ]
        self.model.enqueue_batch(lane, specs, now=now)

    @rule(
        worker=st.sampled_from(WORKERS),
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
        lease = SHORT if short else LONG
        idle_ms = 0 if short else idle_ms
        held = self.held[worker]
        outcomes = [Outcome(i, tok, "ok", "1") for i, (tok, _) in held.items()] if settle else []
        in_inbox = len(self.model.inbox.get(worker, []))
        fetched = self.run(
            self.store.exchange(worker, list(lanes), n, lease, outcomes, idle_ms=idle_ms)
        )
        assert len(fetched.ack_codes) == len(outcomes)
        applied = [o.id for o, c in zip(outcomes, fetched.ack_codes, strict=True) if c]
        if fetched.jobs[in_inbox:]:  # leased by this call (inbox jobs were leased before)
            written: int | None = self.field_ms(fetched.jobs[in_inbox].id, "start")
        elif applied:
            written = self.field_ms(applied[0], "fin")
        elif not fetched.jobs and idle_ms:
            idle = self.client.zscore(self.keys.lane(lanes[0]).idle, f"{worker}|{lease}")
            written = _ms(idle) - idle_ms
        else:
            written = None
        now = self.at(written)
        expected_codes = [int(self.model.ack(o.id, int(o.token), "ok", now=now)) for o in outcomes]
        assert fetched.ack_codes == expected_codes
        if settle:
            held.clear()
        expected = self.model.fetch(worker, list(lanes), n, lease, now=now, idle_ms=idle_ms)
        got = [Grant(j.id, int(j.token), j.attempt) for j in fetched.jobs]
        assert got == expected.jobs, f"fetch: lua {got} != model {expected.jobs}"
        assert (fetched.next_due_ms is None) == (expected.next_due is None)
        if written is not None:  # the instant is exact, so is the wait
            assert fetched.next_due_ms == expected.next_due
        for job in fetched.jobs:
            assert job.task == TASK and job.max_attempts == self.model.jobs[job.id].max_attempts
            self._take(worker, job.id, job.token, job.attempt)

    def _take(self, worker: str, job_id: str, token: str, attempt: int) -> None:
        self.held[worker][job_id] = (token, attempt)
        self.issued.append((job_id, token))

    @precondition(lambda self: any(self.model.inbox.values()))
    @rule(data=st.data())
    def wait(self, data: st.DataObject) -> None:
        """The blocking wait of a worker that was handed a job: it gets the oldest one.
        (Only for non-empty inboxes: an empty wait blocks for the server's timer tick.)"""
        self.take_handed(
            data.draw(st.sampled_from(sorted(w for w, i in self.model.inbox.items() if i)))
        )

    def take_handed(self, worker: str) -> None:
        reply = self.run(self.store.wait_for_work(LANES, 0.001, worker))
        expected = self.model.take_handed(worker, now=self.at(None))
        assert expected is not None
        assert isinstance(reply, FetchedJob), f"{worker} got {reply}, model: {expected}"
        assert Grant(reply.id, int(reply.token), reply.attempt) == expected
        self._take(worker, reply.id, reply.token, reply.attempt)

    @rule(worker=st.sampled_from(WORKERS), short=st.booleans())
    def leave(self, worker: str, short: bool) -> None:
        """A stopping worker deregisters and takes back what was handed to it meanwhile."""
        lease = SHORT if short else LONG
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
        result=st.sampled_from(["ok", "failed", "fatal", "release"]),
        delay=st.sampled_from([0, 0, LONG]),
    )
    def ack(self, data: st.DataObject, result: str, delay: int) -> None:
        """Settle a held job as a worker would: done, failed (retried while attempts are
        left, as ``after_failure`` decides), failed for good, or handed back unstarted."""
        worker, job_id = data.draw(st.sampled_from(self._held_jobs()), label="job")
        self.settle(worker, job_id, result, delay)

    def settle(self, worker: str, job_id: str, result: str, delay: int) -> None:
        token, attempt = self.held[worker].pop(job_id)
        kind: AckKind = "ok" if result == "ok" else "release" if result == "release" else "dead"
        if result == "failed":
            max_attempts = self.model.jobs[job_id].max_attempts
            kind = after_failure(attempt, max_attempts, retryable=True, backoff=NO_WAIT, u=0).kind
        payload = ERROR if kind in ("retry", "dead") else "1"
        outcome = Outcome(job_id, token, kind, payload, delay if kind == "retry" else 0)
        (code,) = self.run(self.store.ack(LANES, [outcome]))
        written = None
        if code and kind in ("ok", "dead"):
            written = self.field_ms(job_id, "fin")
        elif code and kind == "retry":
            written = self.field_ms(job_id, "run") - outcome.delay_ms
        now = self.at(written)
        applied = self.model.ack(job_id, int(token), kind, now=now, delay_ms=outcome.delay_ms)
        assert code == int(applied), f"ack {kind} of {job_id}: lua {code}, model {applied}"

    def _stale(self) -> list[tuple[str, str]]:
        jobs = self.model.jobs
        return [(i, t) for i, t in self.issued if jobs[i].token != int(t)]

    @precondition(lambda self: self._stale())
    @rule(data=st.data(), kind=st.sampled_from(["ok", "retry", "dead", "release"]))
    def ack_stale(self, data: st.DataObject, kind: AckKind) -> None:
        """A write under a token that is no longer the job's is always refused."""
        job_id, token = data.draw(st.sampled_from(self._stale()), label="stale")
        before = self.run(self.store.stats()).get("fenced", 0)
        (code,) = self.run(self.store.ack(LANES, [Outcome(job_id, token, kind, ERROR)]))
        assert code == 0, f"a stale {kind} ack of {job_id} was applied"
        assert self.run(self.store.stats())["fenced"] == before + 1
        assert not self.model.ack(job_id, int(token), kind, now=self.at(None))
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
        self.run(self.store.configure_tenant(tenant, weight))
        self.model.configure(tenant, weight)

    @rule(worker=st.sampled_from(WORKERS))
    def renew(self, worker: str) -> None:
        held = self.held[worker]
        tokens = [(i, tok) for i, (tok, _) in held.items()]
        lost, cancel = self.run(self.store.renew(worker, LONG, tokens))
        assert cancel == []
        kept = [i for i in held if i not in lost]
        now = self.at(_ms(self.client.zscore(self.keys.leases, kept[0])) - LONG if kept else None)
        expected = [
            i for i, (tok, _) in held.items() if not self.model.renew(i, int(tok), LONG, now=now)
        ]
        assert lost == expected, f"renew: lua lost {lost}, model lost {expected}"
        for job_id in lost:
            del held[job_id]

    @precondition(lambda self: any(self.held.values()))
    @rule(worker=st.sampled_from(WORKERS))
    def crash(self, worker: str) -> None:
        """The worker dies: its jobs stay leased until their leases run out."""
        self.held[worker].clear()

    @precondition(lambda self: self.model.leases)
    @rule(limit=st.integers(1, 4))
    def sweep(self, limit: int) -> None:
        short = [t for t in self.model.leases.values() if t < self.now + LONG // 2]
        if short:  # let every short lease run out first
            deadline = time.monotonic() + 5
            while self.server_ms() < max(short):
                assert time.monotonic() < deadline, "the server clock does not advance"
                time.sleep(0.001)
        retried, dead = self.run(self.store.sweep(limit, secrets.randbits(31), 10**9))
        if retried:
            written: int | None = self.field_ms(retried[0], "run")
        elif dead:
            written = self.field_ms(dead[0], "fin")
        else:
            written = None
        expected = self.model.sweep(limit, now=self.at(written), delay_ms=0)
        assert (retried, dead) == expected, f"sweep: lua {(retried, dead)}, model {expected}"

    # -- the whole store, after every step ---------------------------------------------

    def snapshot(self) -> Snapshot:
        """Every key of the app, read atomically."""
        k, pipe = self.keys, self.client.pipeline(transaction=True)
        for job_id in self.ids:
            pipe.hmget(k.job(job_id), ["st", "att", "max", "tok"])
        for lane, tenant in PAIRS:
            pipe.zrange(k.tenant_queue(lane, tenant), 0, -1)
        for lane in LANES:
            pipe.zrange(k.lane(lane).fair, 0, -1, withscores=True)
            pipe.hgetall(k.lane(lane).vt)
            pipe.zrange(k.lane(lane).delayed, 0, -1, withscores=True)
            pipe.zrange(k.lane(lane).idle, 0, -1, withscores=True)
        for worker in WORKERS:
            pipe.lrange(k.inbox(worker), 0, -1)
        pipe.zrange(k.leases, 0, -1, withscores=True)
        pipe.zrange(k.dead, 0, -1, withscores=True)
        pipe.hgetall(k.stats)
        pipe.get(k.fence)
        replies = pipe.execute()
        snap = Snapshot()
        for job_id, (st_, att, max_, tok) in zip(self.ids, replies, strict=False):
            snap.jobs[job_id] = (st_.decode(), int(att), int(max_), tok and int(tok))
        rest = iter(replies[len(self.ids) :])
        snap.queues = {pair: [i.decode() for i in next(rest)] for pair in PAIRS}
        for lane in LANES:
            snap.fair[lane] = {t.decode(): float(tag) for t, tag in next(rest)}
            snap.vt[lane] = {f.decode(): float(v) for f, v in next(rest).items()}
            snap.delayed[lane] = [(i.decode(), _ms(s)) for i, s in next(rest)]
            snap.idle[lane] = {m.decode(): _ms(s) for m, s in next(rest)}
        for worker in WORKERS:
            rows = [msgspec.msgpack.decode(r, type=FetchedJob) for r in next(rest)]
            snap.inboxes[worker] = [Grant(j.id, int(j.token), j.attempt) for j in rows]
        snap.leases = {i.decode(): _ms(s) for i, s in next(rest)}
        snap.dead = {i.decode(): _ms(s) for i, s in next(rest)}
        snap.stats = {key.decode(): int(v) for key, v in next(rest).items()}
        snap.fence = int(next(rest) or 0)
        return snap

    @invariant()
    def every_job_in_one_place(self) -> None:
        """On the store alone: each job in exactly one place that matches its status,
        none over its attempt budget (whatever the model says)."""
        snap = self.snapshot()
        queued = Counter(i for q in snap.queues.values() for i in q)
        scheduled = Counter(i for d in snap.delayed.values() for i, _ in d)
        for job_id, (status, att, max_, tok) in snap.jobs.items():
            finished = status in ("completed", "failed", "cancelled", "expired")
            places = [queued[job_id], scheduled[job_id], int(job_id in snap.leases), int(finished)]
            assert sorted(places) == [0, 0, 0, 1], f"{job_id} ({status}) is in {places}"
            expected = {"queued": 0, "scheduled": 1, "running": 2}.get(status, 3)
            assert places[expected] == 1, f"{job_id} is {status} but in {places}"
            assert att <= max_, f"{job_id}: {att} attempts over {max_}"
            # a finished job may keep its last token: its status alone fences that token
            assert tok is not None or status != "running", f"{job_id} runs without a token"

    @invariant()
    def store_matches_model(self) -> None:
        model, snap = self.model, self.snapshot()
        model.check_invariants()
        for job_id, (status, att, _, tok) in snap.jobs.items():
            job = model.jobs[job_id]
            assert (status, att) == (job.status, job.attempts), f"{job_id}: {snap.jobs[job_id]}"
            assert status != "running" or tok == job.token, f"{job_id} token {tok} != {job}"
        for lane, tenant in PAIRS:
            assert snap.queues[(lane, tenant)] == model.queue_ids(lane, tenant), (lane, tenant)
        for lane in LANES:
            assert snap.fair[lane] == model.fair.get(lane, {}), f"fair tags of {lane}"
            vt = snap.vt[lane]
            assert vt.get("V", 0.0) == model.vtime.get(lane, 0.0), f"virtual time of {lane}"
            assert vt.get("run", 0.0) == model.running[lane], f"in-flight work of {lane}"
            finish = {f[2:]: v for f, v in vt.items() if f.startswith("f:")}
            assert finish == model.finish.get(lane, {}), f"finish tags of {lane}"
            assert snap.delayed[lane] == model.delayed_ids(lane), f"delayed set of {lane}"
            assert snap.idle[lane] == model.idle.get(lane, {}), f"idle workers of {lane}"
        for worker in WORKERS:
            assert snap.inboxes[worker] == model.inbox.get(worker, []), f"inbox of {worker}"
        assert snap.leases == model.leases
        assert snap.dead == model.dead
        assert snap.fence == model.fence
        counters = {c: snap.stats.get(c, 0) for c in COUNTERS}
        assert counters == {c: model.stats[c] for c in COUNTERS}
        assert not set(snap.stats) - {*COUNTERS, "seq"}, f"unexpected counters: {snap.stats}"
        assert snap.stats.get("seq", 0) == model.seq


def check(machine: LuaVsModel) -> None:
    machine.every_job_in_one_place()
    machine.store_matches_model()


@dataclass
class Snapshot:
    jobs: dict[str, tuple[str, int, int, int | None]] = field(default_factory=dict)
    queues: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    fair: dict[str, dict[str, float]] = field(default_factory=dict)
    vt: dict[str, dict[str, float]] = field(default_factory=dict)
    delayed: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    idle: dict[str, dict[str, int]] = field(default_factory=dict)
    inboxes: dict[str, list[Grant]] = field(default_factory=dict)
    leases: dict[str, int] = field(default_factory=dict)
    dead: dict[str, int] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    fence: int = 0


@pytest.mark.timeout(600)  # a pass takes seconds; shrinking a failure can take minutes
def test_lua_agrees_with_model(redis_url: str) -> None:
    machine = type("LuaVsModelOn", (LuaVsModel,), {"redis_url": redis_url})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=100,
            stateful_step_count=40,
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
    # then t2 (tag 0 < t1's 1) gives j2, then t1, alone, gives j0 and j1
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
    assert model.idle == {"a": {"w|100": 50}}
    batch = [
        ModelNewJob("j0", "t", 0, 1, 10),
        ModelNewJob("j1", "t", 0, 1),
        ModelNewJob("j2", "t", 0, 1),
    ]
    model.enqueue_batch("a", batch, now=1)
    # the first job due now goes to the idle worker, leased; the claim is spent
    assert model.inbox == {"w": [Grant("j1", 1, 1)]} and model.idle == {"a": {}}
    assert model.leases == {"j1": 101} and model.queue_ids("a", "t") == ["j2"]
    assert model.take_handed("w", now=2) == Grant("j1", 1, 1)
    assert model.take_handed("w", now=2) is None
    assert model.fetch("v", ["a"], 1, 100, now=2).jobs == [Grant("j2", 2, 1)]
    assert model.fetch("v", ["a"], 1, 100, now=3, idle_ms=5) == Batch([], 8)  # j0 due at 11
    model.enqueue("j3", "t", "a", 0, 1, now=8)  # v's registration lapsed at 8
    assert model.queue_ids("a", "t") == ["j3"] and not model.inbox
    model.check_invariants()


def test_hand_off_edges(redis_url: str) -> None:
    """Fixed steps through the hand-off's corners, on the real store and the model."""
    machine = type("LuaVsModelOn", (LuaVsModel,), {"redis_url": redis_url})()
    try:
        machine.fetch("w1", ("a",), 1, short=False, settle=False, idle_ms=LONG)  # idle on a
        check(machine)
        # the delayed job does not count; the first due one goes to w1, the rest queue
        machine.enqueue("a", [("t1", 0, 2, LONG), ("t1", 0, 2, 0), ("t2", 0, 2, 0)])
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
        machine.enqueue("b", [("t1", 0, 1, LONG)])
        machine.enqueue("b", [("t1", 0, 1, 0)])
        check(machine)
        assert machine.model.inbox.get("w3") and not machine.model.queue_ids("b", "t1")
        # a registration with a 1 ms life has lapsed by the next millisecond
        machine.fetch("w3", ("b", "a"), 3, short=False, settle=True, idle_ms=0)
        machine.fetch("w3", ("b",), 1, short=False, settle=True, idle_ms=1)
        check(machine)
        time.sleep(0.003)
        machine.enqueue("b", [("t1", 0, 1, 0)])
        check(machine)
        assert not machine.model.inbox.get("w3")
    finally:
        machine.teardown()
