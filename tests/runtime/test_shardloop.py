"""A shard loop and its parts on their own (fairlane.runtime: shardloop, attempts,
settling, shardlink), against a private server and with no Worker.

A loop is built from the parts a worker would give it -- a slot pool, the running
attempts, its settings and a link of signals and counters -- so each rule is checked
where it lives: a burst drains a shard within the slots and settles every outcome; a
loop holding back under pressure leases nothing; a job handed to an idle loop starts
there; an attempt ends as its interruption says (lease lost, cancelled, timed out, shut
down); outcomes are flushed while the fetch loop is idle and dropped once their leases
are known to have ended; the burst ends only when every loop is empty at once. The
attempts run a stand-in for the runner: what is checked is counts and outcomes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Sequence
from typing import cast

import pytest

from fairlane.config.settings import LeaseSettings
from fairlane.policy.backpressure import Bounds, Reading
from fairlane.runtime.attempts import Attempts
from fairlane.runtime.deadlines import ServerClock
from fairlane.runtime.hooks import Hooks, WorkerHooks
from fairlane.runtime.pressure import PressureGauge
from fairlane.runtime.runner import Runner
from fairlane.runtime.settling import Settler
from fairlane.runtime.shardlink import BurstWatch, LoopSettings, Tally, WorkerLink
from fairlane.runtime.shardloop import ShardLoop
from fairlane.runtime.slots import SlotPool
from fairlane.store.api import Store
from fairlane.store.wire import FetchedJob, NewJob, Outcome
from tests.e2e.helpers import eventually

pytestmark = pytest.mark.anyio

LANE = "loop"
LEASE = LeaseSettings(duration=30.0, renew_interval=5.0)


def _job(n: int, *, slots: int = 1, timeout: float = 0) -> NewJob:
    return NewJob(
        f"j{n:04d}", "t", 0, "loop.job", "[]", 3, "0,0,none", timeout, "-1,-1", "-1,-1", slots=slots
    )


class StandIn:
    """Runs attempts for ``Attempts`` in place of the runner: each ends ``ok`` after
    ``hold`` seconds (None: only when interrupted), noting the slots held meanwhile and
    the pool's turns so far when it began."""

    def __init__(self, pool: SlotPool, *, hold: float | None = 0.0, timer: bool = False) -> None:
        self.pool = pool
        self.hold = hold
        self.timer = timer
        self.ran: list[str] = []
        self.turns: dict[str, int] = {}
        self.most_used = 0

    def uses_timer(self, job: FetchedJob) -> bool:
        return self.timer and bool(job.timeout)  # as the runner's: a timeout to time

    async def run(self, job: FetchedJob) -> Outcome:
        self.ran.append(job.id)
        self.turns[job.id] = self.pool.statistics().turns
        self.most_used = max(self.most_used, self.pool.used)
        if self.hold is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.hold or 0)
        return Outcome(job.id, job.token, "ok", "null")

    def timed_out(self, job: FetchedJob) -> Outcome:
        return Outcome(job.id, job.token, "fail", "timed out")

    def expired(self, job: FetchedJob) -> Outcome:
        return Outcome(job.id, job.token, "expire", "past its deadline")


class Told(WorkerHooks):
    """What the hooks were told: jobs started (with the pool's turns so far, when given
    the pool), settled batches' codes and lost leases."""

    def __init__(self, pool: SlotPool | None = None) -> None:
        self.pool = pool
        self.started_at: list[tuple[str, int]] = []
        self.codes: list[int] = []
        self.lost_counts: list[int] = []

    def started(self, jobs: Sequence[FetchedJob]) -> None:
        turns = 0 if self.pool is None else self.pool.statistics().turns
        self.started_at.extend((job.id, turns) for job in jobs)

    def settled(self, outcomes: Sequence[Outcome], codes: Sequence[int]) -> None:
        self.codes.extend(codes)

    def lost(self, n: int) -> None:
        self.lost_counts.append(n)


class Parts:
    """A loop's parts as a worker would give them, for one store."""

    def __init__(
        self,
        store: Store,
        *,
        concurrency: int = 4,
        burst: bool = True,
        hold: float | None = 0.0,
        timer: bool = False,
        pressure: PressureGauge | None = None,
        idle_block: float = 5.0,
    ) -> None:
        self.slots = SlotPool(concurrency, batch=100, pressure=pressure)
        self.told = Told(self.slots)
        self.hooks = Hooks([self.told])
        self.tally = Tally()
        self.attempts = Attempts(self.slots, self.hooks, self.tally)
        self.runner = StandIn(self.slots, hold=hold, timer=timer)
        self.attempts.runner = cast(Runner, self.runner)
        self.settings = LoopSettings(
            worker_id="w1",
            lanes=[LANE],
            concurrency=concurrency,
            lease=LEASE,
            idle_block=idle_block,
            burst=burst,
        )
        self.link = WorkerLink(
            stopping=asyncio.Event(),
            closed=asyncio.Event(),
            tally=self.tally,
            burst=BurstWatch(1),
            on_settled=self.hooks.settled,
            redeclare=self._redeclare,
            grace_left=lambda: 5.0,
        )
        self.redeclared = 0
        self.loop = ShardLoop(store, self.settings, self.slots, self.attempts, self.link)

    async def _redeclare(self) -> None:
        self.redeclared += 1


class Hot:
    """A memory sensor past its hard threshold: the worker takes no new work."""

    name = "hot"

    def read(self) -> Sequence[Reading]:
        return [Reading("memory", 0.95, 0.8, 0.9, stop=True)]


async def _dead_store(namespace: str) -> Store:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return Store.from_url(
        f"redis://127.0.0.1:{port}", namespace, socket_connect_timeout=0.5, socket_timeout=0.5
    )


# -- the fetch loop ------------------------------------------------------------------------


async def test_a_burst_drains_the_shard_within_the_slots_and_settles_every_outcome(
    store: Store,
) -> None:
    await store.enqueue(LANE, [_job(n) for n in range(20)])
    parts = Parts(store, concurrency=4, hold=0.01)
    async with asyncio.TaskGroup() as jobs:
        await parts.loop.fetch_loop(jobs)
    await parts.loop.flush(final=True)
    assert sorted(parts.runner.ran) == [f"j{n:04d}" for n in range(20)]
    assert parts.runner.most_used <= 4
    assert (parts.tally.fetched, parts.tally.settled, parts.tally.fenced) == (20, 20, 0)
    assert parts.told.codes.count(0) == 0 and len(parts.told.codes) == 20
    assert parts.slots.statistics().used == parts.slots.statistics().reserved == 0
    assert parts.loop.running == 0 and not parts.attempts.running
    # the exchanges carried the outcomes: only those left at the end needed an ack
    assert parts.tally.fetch_calls >= 5 and parts.tally.ack_calls <= 1
    again = await store.exchange("w2", [LANE], 10, 1000, slots=10)
    assert again.jobs == []


async def test_a_replys_jobs_hold_their_slots_at_once_and_start_once_the_next_call_is_out(
    store: Store,
) -> None:
    await store.enqueue(LANE, [_job(n) for n in range(6)])
    parts = Parts(store, concurrency=8, hold=0.01)
    async with asyncio.TaskGroup() as jobs:
        await parts.loop.fetch_loop(jobs)
    await parts.loop.flush(final=True)
    # the first (wide) call leased all six; the second was sent before any of them
    # ran, asking only for the two slots they left
    assert parts.runner.turns == {f"j{n:04d}": 2 for n in range(6)}
    assert parts.told.started_at == [(f"j{n:04d}", 2) for n in range(6)]
    assert parts.runner.most_used <= 8
    assert (parts.tally.fetched, parts.tally.settled) == (6, 6)
    assert parts.slots.statistics().used == parts.slots.statistics().reserved == 0
    assert parts.loop.running == 0 and not parts.attempts.running


async def test_a_job_wider_than_a_capped_ask_is_still_leased(store: Store) -> None:
    # with 8 slots a busy loop asks for 4 at most: the 6-wide job needs a wide ask
    await store.enqueue(LANE, [_job(0), _job(1, slots=6)])
    # short idle waits: with both running, the capped ask finds nothing and waits
    parts = Parts(store, concurrency=8, hold=0.01, idle_block=0.2)
    async with asyncio.TaskGroup() as jobs:
        await parts.loop.fetch_loop(jobs)
    await parts.loop.flush(final=True)
    assert sorted(parts.runner.ran) == ["j0000", "j0001"]
    assert parts.tally.settled == 2


async def test_a_loop_holding_back_under_pressure_leases_nothing(store: Store) -> None:
    await store.enqueue(LANE, [_job(n) for n in range(3)])
    gauge = PressureGauge([Hot()], 4, Bounds(min_fraction=0.25), interval=0.01)
    gauge.sample(time.monotonic())
    assert gauge.holding
    parts = Parts(store, pressure=gauge, burst=False)
    async with asyncio.TaskGroup() as jobs:
        fetching = jobs.create_task(parts.loop.fetch_loop(jobs))

        async def held_a_few_times() -> bool:
            return parts.slots.statistics().turns >= 3

        await eventually(held_a_few_times)
        parts.link.stopping.set()
        parts.slots.notify()
        await fetching
    assert parts.tally.fetched == 0 and parts.tally.fetch_calls == 0
    assert parts.runner.ran == []


async def test_a_job_handed_to_an_idle_loop_starts_there(store: Store) -> None:
    parts = Parts(store, burst=False, hold=0.0)
    async with asyncio.TaskGroup() as services:
        services.create_task(parts.loop.settler.ack_loop())
        async with asyncio.TaskGroup() as jobs:
            fetching = jobs.create_task(parts.loop.fetch_loop(jobs))

            async def idle() -> bool:
                return parts.loop.idle_waiter is not None

            await eventually(idle)
            await store.enqueue(LANE, [_job(7)])

            async def settled() -> bool:
                return parts.tally.settled == 1

            await eventually(settled)
            parts.link.stopping.set()
            parts.loop.cancel_idle_wait()
            await fetching
        parts.link.closed.set()
    assert parts.runner.ran == ["j0007"] and parts.tally.fetched == 1
    # started while the loop waited after its first turn, not leased by a second one,
    # and began to run before the loop's next call was sent
    assert parts.told.started_at == [("j0007", 1)]
    assert parts.runner.turns == {"j0007": 1}


# -- attempts ------------------------------------------------------------------------------


class Shard:
    """Where the attempts' outcomes go, in place of a shard loop."""

    def __init__(self) -> None:
        self.running = 0
        self.outcomes: list[Outcome] = []
        self.clock = ServerClock()

    def settle(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)


def _fetched(
    n: int, *, token: str = "1", timeout: float = 0, slots: int = 1, deadline_ms: int = 0
) -> FetchedJob:
    return FetchedJob(
        f"j{n:04d}", token, 1, "t", "[]", timeout, deadline_ms, "acme", 3, "", 0, slots
    )


def _attempts(*, hold: float | None = None, timer: bool = False) -> tuple[Attempts, Told]:
    told = Told()
    pool = SlotPool(8, batch=100)
    attempts = Attempts(pool, Hooks([told]), Tally())
    attempts.runner = cast(Runner, StandIn(pool, hold=hold, timer=timer))
    return attempts, told


async def test_each_interruption_ends_an_attempt_as_it_says() -> None:
    attempts, told = _attempts()
    shard = Shard()
    async with asyncio.TaskGroup() as group:
        attempts.start(group, shard, [_fetched(n, slots=2) for n in range(4)])
        assert (attempts.slots.used, shard.running, attempts.tally.fetched) == (8, 4, 4)
        await asyncio.sleep(0)  # every attempt is running
        stopped = [attempts.running[job_id].task for job_id in ("j0000", "j0002")]
        attempts.lost([("j0000", "1"), ("j0001", "stale")])  # a token not held: ignored
        attempts.cancel_requested(["j0002"])
        await asyncio.wait(stopped)
        await attempts.drain(0.0)  # shuts down what is left: j0001 and j0003
    assert told.lost_counts == [1]
    kinds = {o.id: o.kind for o in shard.outcomes}
    assert kinds == {"j0001": "release", "j0002": "cancel", "j0003": "release"}
    assert (attempts.slots.used, shard.running, attempts.running) == (0, 0, {})


async def test_an_attempt_past_its_timeout_times_out() -> None:
    attempts, _ = _attempts(timer=True)
    shard = Shard()
    async with asyncio.TaskGroup() as group:
        attempts.start(group, shard, [_fetched(0, timeout=0.01)])
    assert [(o.id, o.kind, o.payload) for o in shard.outcomes] == [("j0000", "fail", "timed out")]


async def test_an_attempt_is_stopped_at_the_earlier_of_its_timeout_and_its_deadline() -> None:
    attempts, _ = _attempts(timer=True)
    shard = Shard()
    assert await shard.clock.sync(_clock_of_the_loop)
    now = round(asyncio.get_running_loop().time() * 1000)
    async with asyncio.TaskGroup() as group:
        attempts.start(
            group,
            shard,
            [
                _fetched(0, timeout=60, deadline_ms=now + 10),  # the deadline first
                _fetched(1, timeout=0.01, deadline_ms=now + 60_000),  # the timeout first
                _fetched(2, deadline_ms=now + 10),  # a thread or process task's: no timeout
            ],
        )
    kinds = {o.id: o.kind for o in shard.outcomes}
    assert kinds == {"j0000": "expire", "j0001": "fail", "j0002": "expire"}
    assert (attempts.slots.used, shard.running, attempts.running) == (0, 0, {})


async def test_no_deadline_is_timed_before_the_servers_clock_is_read() -> None:
    attempts, _ = _attempts(hold=0.05)
    shard = Shard()  # its clock never read: the store alone expires the job, later
    async with asyncio.TaskGroup() as group:
        attempts.start(group, shard, [_fetched(0, deadline_ms=1)])
    assert [o.kind for o in shard.outcomes] == ["ok"]


async def _clock_of_the_loop() -> int:
    """A server whose clock is the loop's own (what ``ServerClock.sync`` reads)."""
    return round(asyncio.get_running_loop().time() * 1000)


async def test_held_names_only_the_shards_own_leases() -> None:
    attempts, _ = _attempts()
    mine, other = Shard(), Shard()
    async with asyncio.TaskGroup() as group:
        attempts.start(group, mine, [_fetched(0, token="a")])
        attempts.start(group, other, [_fetched(1, token="b")])
        assert attempts.held(mine) == [("j0000", "a")]
        assert attempts.held(other) == [("j0001", "b")]
        await attempts.drain(0.0)


# -- settling ------------------------------------------------------------------------------


def _settler(store: Store, link: WorkerLink) -> Settler:
    settings = LoopSettings("w1", [LANE], 4, LEASE, 5.0)
    return Settler(store, settings, link, "worker w1")


def _link(tally: Tally, told: Told) -> WorkerLink:
    async def redeclare() -> None:
        return None

    return WorkerLink(
        asyncio.Event(), asyncio.Event(), tally, BurstWatch(1), told.settled, redeclare, lambda: 0.0
    )


async def test_outcomes_wait_for_the_carrier_until_the_fetch_loop_is_idle(store: Store) -> None:
    await store.enqueue(LANE, [_job(0)])
    [job] = (await store.exchange("w1", [LANE], 1, 30_000, slots=4)).jobs
    tally, told = Tally(), Told()
    link = _link(tally, told)
    settler = _settler(store, link)
    settler.settle(Outcome(job.id, job.token, "ok", "null"))
    assert not settler.flush_needed.is_set()  # the next exchange carries it
    async with asyncio.TaskGroup() as group:
        group.create_task(settler.ack_loop())
        settler.idle()

        async def settled() -> bool:
            return tally.settled == 1

        await eventually(settled)
        link.closed.set()
    assert (tally.ack_calls, told.codes, settler.outcomes) == (1, [1], [])


async def test_outcomes_are_dropped_once_their_leases_have_ended(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    dead = await _dead_store(namespace)
    tally, told = Tally(), Told()
    settler = _settler(dead, _link(tally, told))
    try:
        settler.settle(Outcome("j0000", "1", "ok", "null"))
        settler.leases_end = time.monotonic() - 1  # every lease it was fenced by has ended
        with caplog.at_level(logging.WARNING, logger="fairlane.worker"):
            await settler.flush(final=True)
    finally:
        await dead.aclose()
    assert settler.outcomes == [] and tally.ack_calls == 0 and told.codes == []
    assert "dropping 1 unsettled outcome(s)" in caplog.text


async def test_a_final_flush_gives_up_at_the_end_of_the_grace_period(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    dead = await _dead_store(namespace)
    settler = _settler(dead, _link(Tally(), Told()))  # no grace left
    try:
        settler.settle(Outcome("j0000", "1", "ok", "null"))
        with caplog.at_level(logging.WARNING, logger="fairlane.worker"):
            await settler.flush(final=True)
    finally:
        await dead.aclose()
    assert [o.id for o in settler.outcomes] == ["j0000"]  # kept: its lease has not ended
    assert "not settled by the end of the grace period" in caplog.text


async def test_set_aside_and_hand_back_queue_their_outcomes(store: Store) -> None:
    settler = _settler(store, _link(Tally(), Told()))
    settler.set_aside([("j0000", "a")])
    settler.hand_back([_fetched(1, token="b")])
    assert [(o.id, o.token, o.kind) for o in settler.outcomes] == [
        ("j0000", "a", "dead"),
        ("j0001", "b", "release"),
    ]
    assert "MalformedJob" in settler.outcomes[0].payload
    assert settler.flush_needed.is_set()


# -- what the loops share ------------------------------------------------------------------


async def test_the_burst_ends_only_when_every_loop_is_empty_at_once() -> None:
    watch = BurstWatch(2)
    first, second = object(), object()
    assert await watch.drained(first) is False  # the other loop may still have work
    both = await asyncio.gather(watch.drained(first), watch.drained(second))
    assert both == [True, True]


def test_the_tally_counts_late_writes_as_fenced(caplog: pytest.LogCaptureFixture) -> None:
    tally = Tally()
    outcomes = [Outcome(f"j{n}", "1", "ok") for n in range(3)]
    with caplog.at_level(logging.WARNING, logger="fairlane.worker"):
        tally.count_settled(outcomes, [1, 0, 1])
    assert (tally.settled, tally.fenced) == (2, 1)
    assert "1 late write(s) rejected" in caplog.text
