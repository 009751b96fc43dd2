"""One slice of a workflow run (fairlane.runtime.slices.run_slice) on a private server,
with no worker.

Workflows are declared with ``@app.workflow`` on an ``App``; each run is enqueued with
the workflow's own ``new_job`` and leased from the store with ``exchange``, and each
slice is run by calling ``run_slice`` (or the ``Runner``, which turns how a slice ended
into its outcome). Between slices the test settles the suspended run as a worker would
and leases it again. What is checked is what ran (each step function counts its calls),
what the run's history holds, and how each slice ended: the run's value, ``Suspend``
with what it waits for, ``LeaseLost``, ``NonDeterminismError`` or the workflow's own
error -- never how long anything took.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
import pytest

from fairlane import App, Context
from fairlane.codec import decode_error
from fairlane.policy.retention import Retention
from fairlane.registry import TaskDefinition
from fairlane.runtime.context import LeaseLost, NonDeterminismError, Suspend
from fairlane.runtime.executors import ProcessExecutor, ThreadExecutor
from fairlane.runtime.hooks import WorkerHooks
from fairlane.runtime.runner import Runner
from fairlane.runtime.slices import run_slice
from fairlane.store.api import Store
from fairlane.store.wire import FetchedJob, Outcome
from tests.e2e.helpers import fast_settings
from tests.runtime.leasing import LEASE_MS, WORKER, lease_one

pytestmark = pytest.mark.anyio

LANE = "slices"
TENANT = "acme"
SLOTS = 4
KEEP_ALL = Retention(completed=None, failed=None)


async def _nothing() -> None:
    pass


async def _no_process_pool() -> ProcessExecutor:
    raise AssertionError("no step of these workflows runs in a process")


class Flows:
    """The workflows the tests run, and what their steps did."""

    def __init__(self, app: App) -> None:
        self.calls: Counter[str] = Counter()
        #: the name the "changing" workflow gives its first step
        self.first_name = "first"
        #: how many steps the "shrinking" workflow asks for
        self.steps = 3
        #: step keys as the "failing" workflow's step saw them
        self.keys: list[str] = []
        #: what happens elsewhere while the "fenced" workflow's step runs
        self.meanwhile: Callable[[], Awaitable[None]] = _nothing
        self._going_on(app)
        self._changing(app)
        self._failing(app)
        self.by_name: dict[str, TaskDefinition[Any, Any]] = dict(app.registry.tasks)

    def __getitem__(self, name: str) -> TaskDefinition[Any, Any]:
        return self.by_name[f"slices.{name}"]

    async def count(self, name: str) -> str:
        """A step: counts its call, returns its name in capitals."""
        self.calls[name] += 1
        return name.upper()

    def count_in_thread(self, name: str) -> str:
        self.calls[name] += 1
        return name.upper()

    def _going_on(self, app: App) -> None:
        """Runs that finish, yield or wait."""
        count, count_in_thread, flow = self.count, self.count_in_thread, app.workflow

        @flow(name="slices.three", lane=LANE, retention=KEEP_ALL)
        async def three(ctx: Context, prefix: str) -> list[str]:
            a = await ctx.step("a", count, f"{prefix}-a")
            b = await ctx.step("b", count_in_thread, f"{prefix}-b")
            c = await ctx.step("c", count, f"{prefix}-c")
            return [a, b, c]

        @flow(name="slices.five", lane=LANE, slice_steps=2, retention=KEEP_ALL)
        async def five(ctx: Context) -> int:
            done = [await ctx.step(f"s{n}", count, f"s{n}") for n in range(5)]
            return len(done)

        @flow(name="slices.signal", lane=LANE, retention=KEEP_ALL)
        async def signal(ctx: Context) -> str:
            await ctx.step("before", count, "before")
            word = await ctx.wait_for_signal("go", type=str)
            return await ctx.step("after", count, f"after-{word}")

        @flow(name="slices.sleep", lane=LANE, retention=KEEP_ALL)
        async def sleep(ctx: Context) -> str:
            await ctx.step("a", count, "a")
            await ctx.sleep(60)
            return await ctx.step("b", count, "b")

    def _changing(self, app: App) -> None:
        """Runs whose code changes between slices (as the tests set it)."""
        count, flow = self.count, app.workflow

        @flow(name="slices.changing", lane=LANE, slice_steps=1, retention=KEEP_ALL)
        async def changing(ctx: Context) -> None:
            await ctx.step(self.first_name, count, "first")
            await ctx.step("second", count, "second")

        @flow(name="slices.shrinking", lane=LANE, slice_steps=2, retention=KEEP_ALL)
        async def shrinking(ctx: Context) -> int:
            for n in range(self.steps):
                await ctx.step(f"s{n}", count, f"s{n}")
            return self.steps

    def _failing(self, app: App) -> None:
        """Runs whose step fails once, or outlives the run's lease."""
        calls, flow = self.calls, app.workflow

        @flow(name="slices.failing", lane=LANE, retention=KEEP_ALL)
        async def failing(ctx: Context) -> str:
            async def once() -> str:
                self.keys.append(ctx.step_key("once"))
                calls["once"] += 1
                if calls["once"] == 1:
                    raise ValueError("first time")
                return "second time"

            return await ctx.step("once", once)

        @flow(name="slices.fenced", lane=LANE, retention=KEEP_ALL)
        async def fenced(ctx: Context) -> str:
            async def outlived() -> str:
                calls["outlived"] += 1
                await self.meanwhile()
                return "too late"

            return await ctx.step("outlived", outlived)


class Runs:
    """A connected app with the tests' workflows: lease a run, run a slice, lease again."""

    def __init__(self, app: App, flows: Flows) -> None:
        self.app = app
        self.flows = flows

    def store(self, job: FetchedJob) -> Store:
        return self.app.sharded.store_for_job(job.id)

    async def lease(self, name: str, *args: Any) -> FetchedJob:
        """Enqueue a run of workflow ``name`` and lease it as worker ``w1``."""
        return await lease_one(
            self.app, self.flows[name], LANE, args, {}, tenant=TENANT, slots=SLOTS
        )

    async def slice(self, name: str, job: FetchedJob) -> Any:
        return await run_slice(
            self.flows[name],
            job,
            store=self.store(job),
            worker=WORKER,
            process_pool=_no_process_pool,
            durability=self.app.registry.durability,
            hooks=WorkerHooks(),
        )

    async def settle(self, outcome: Outcome) -> list[FetchedJob]:
        """Settle an outcome as the worker would; the jobs leased in the same exchange."""
        store = self.app.sharded.store_for_job(outcome.id)
        fetched = await store.exchange(WORKER, [LANE], 1, LEASE_MS, outcomes=[outcome], slots=SLOTS)
        assert fetched.ack_codes == [1], fetched.ack_codes
        return fetched.jobs

    async def suspend(self, job: FetchedJob, end: Suspend) -> list[FetchedJob]:
        """Settle a slice that ended with ``end``; the run's next lease if it is due."""
        return await self.settle(Outcome(job.id, job.token, "suspend", end.wait, end.delay_ms))

    async def next_slice(self, job: FetchedJob, end: Suspend) -> FetchedJob:
        """Settle a slice that yielded its slot and lease the run's next slice."""
        assert (end.wait, end.delay_ms) == ("yield", 0)
        again = await self.suspend(job, end)
        assert [j.id for j in again] == [job.id]
        assert again[0].token != job.token  # a new lease
        return again[0]

    async def steps(self, job: FetchedJob) -> list[str]:
        """The names of the run's checkpointed operations, in order."""
        history = await self.store(job).runs.history(job.id)
        return [entry.name for entry in history.steps]


@pytest.fixture
async def runs(namespace: str, redis_url: str) -> AsyncIterator[Runs]:
    app = App(namespace, redis_url=redis_url, settings=fast_settings())
    flows = Flows(app)
    async with app:
        yield Runs(app, flows)


# -- a slice's end ---------------------------------------------------------------------------


async def test_a_slice_within_its_budget_runs_every_step_and_returns_the_value(
    runs: Runs,
) -> None:
    job = await runs.lease("three", "x")
    assert await runs.slice("three", job) == ["X-A", "X-B", "X-C"]
    assert runs.flows.calls == Counter({"x-a": 1, "x-b": 1, "x-c": 1})
    assert await runs.steps(job) == ["a", "b", "c"]
    history = await runs.store(job).runs.history(job.id)
    # the results were checkpointed as each step's JSON, by this worker
    assert [msgspec.json.decode(e.value) for e in history.steps] == ["X-A", "X-B", "X-C"]
    assert {e.worker for e in history.steps} == {WORKER}
    assert [e.kind for e in history.log] == ["slice"]


async def test_a_slice_yields_when_its_steps_are_spent_and_the_next_replays(
    runs: Runs,
) -> None:
    job = await runs.lease("five")
    with pytest.raises(Suspend) as first:
        await runs.slice("five", job)
    # two new steps, then the third asks for more than the slice may do
    assert runs.flows.calls == Counter({"s0": 1, "s1": 1})
    assert await runs.steps(job) == ["s0", "s1"]

    job = await runs.next_slice(job, first.value)
    with pytest.raises(Suspend) as second:
        await runs.slice("five", job)
    # s0 and s1 were replayed from their checkpoints, not run again
    assert runs.flows.calls == Counter({"s0": 1, "s1": 1, "s2": 1, "s3": 1})

    job = await runs.next_slice(job, second.value)
    assert await runs.slice("five", job) == 5
    assert runs.flows.calls == Counter({f"s{n}": 1 for n in range(5)})
    assert await runs.steps(job) == [f"s{n}" for n in range(5)]
    history = await runs.store(job).runs.history(job.id)
    assert [e.kind for e in history.log] == ["slice", "suspend", "slice", "suspend", "slice"]


async def test_a_run_waiting_for_a_signal_suspends_until_it_is_sent(runs: Runs) -> None:
    job = await runs.lease("signal")
    with pytest.raises(Suspend) as waiting:
        await runs.slice("signal", job)
    assert waiting.value.wait == "signal:go"
    assert waiting.value.delay_ms > 365 * 86_400_000  # no timeout: as good as forever
    assert runs.flows.calls == Counter({"before": 1})
    # suspended, the run holds no lease and is not leased again until the signal comes
    assert await runs.suspend(job, waiting.value) == []
    store = runs.store(job)
    assert await store.runs.signal(job.id, "go", '"now"') == 1
    again = await store.exchange(WORKER, [LANE], 1, LEASE_MS, slots=SLOTS)
    assert [j.id for j in again.jobs] == [job.id]
    assert await runs.slice("signal", again.jobs[0]) == "AFTER-NOW"
    assert runs.flows.calls == Counter({"before": 1, "after-now": 1})
    assert await runs.steps(job) == ["before", "go", "after"]


async def test_a_durable_sleep_suspends_for_what_is_left_of_it(runs: Runs) -> None:
    job = await runs.lease("sleep")
    with pytest.raises(Suspend) as sleeping:
        await runs.slice("sleep", job)
    assert sleeping.value.wait == "sleep"
    assert 59_000 <= sleeping.value.delay_ms <= 60_000
    assert runs.flows.calls == Counter({"a": 1})
    # the sleep is not over: nothing is leased, and step b has not run
    assert await runs.suspend(job, sleeping.value) == []
    assert await runs.steps(job) == ["a"]


# -- slices that cannot go on ----------------------------------------------------------------


async def test_a_slice_under_a_lease_it_does_not_hold_is_lease_lost(runs: Runs) -> None:
    job = await runs.lease("three", "y")
    stale = msgspec.structs.replace(job, token="not-its-token")
    with pytest.raises(LeaseLost):
        await runs.slice("three", stale)
    assert runs.flows.calls == Counter()
    assert await runs.steps(job) == []


async def test_a_checkpoint_after_the_lease_moved_on_is_fenced(runs: Runs) -> None:
    job = await runs.lease("fenced")
    store = runs.store(job)
    taken: list[FetchedJob] = []

    async def another_worker_takes_the_run() -> None:
        # the lease ends while the step runs, and another worker leases the run
        assert await store.ack([LANE], [Outcome(job.id, job.token, "release")]) == [1]
        fetched = await store.exchange("w2", [LANE], 1, LEASE_MS, slots=SLOTS)
        taken.extend(fetched.jobs)

    runs.flows.meanwhile = another_worker_takes_the_run
    with pytest.raises(LeaseLost):
        await runs.slice("fenced", job)
    assert [j.id for j in taken] == [job.id]
    # the step ran, but its result was not checkpointed under the old lease
    assert runs.flows.calls == Counter({"outlived": 1})
    assert await runs.steps(job) == []


async def test_a_replay_that_asks_for_another_step_is_non_deterministic(runs: Runs) -> None:
    job = await runs.lease("changing")
    with pytest.raises(Suspend) as first:
        await runs.slice("changing", job)
    assert await runs.steps(job) == ["first"]
    job = await runs.next_slice(job, first.value)
    runs.flows.first_name = "renamed"  # the workflow's code changed between slices
    with pytest.raises(NonDeterminismError, match=r"'first'.*'renamed'"):
        await runs.slice("changing", job)
    assert runs.flows.calls == Counter({"first": 1})
    assert await runs.steps(job) == ["first"]


async def test_a_replay_that_returns_before_its_history_ends_is_non_deterministic(
    runs: Runs,
) -> None:
    job = await runs.lease("shrinking")
    with pytest.raises(Suspend) as first:
        await runs.slice("shrinking", job)
    assert await runs.steps(job) == ["s0", "s1"]
    job = await runs.next_slice(job, first.value)
    runs.flows.steps = 1  # now the run returns after replaying s0 alone
    with pytest.raises(NonDeterminismError, match="with 1 checkpointed operations not asked for"):
        await runs.slice("shrinking", job)
    assert runs.flows.calls == Counter({"s0": 1, "s1": 1})


async def test_a_failed_step_fails_the_slice_and_runs_again_as_its_next_attempt(
    runs: Runs,
) -> None:
    job = await runs.lease("failing")
    with pytest.raises(ValueError, match="first time"):
        await runs.slice("failing", job)
    assert await runs.steps(job) == []
    # retried as a failed attempt of the run, the next slice runs the step again
    again = await runs.settle(Outcome(job.id, job.token, "retry", '{"type":"ValueError"}', 0))
    assert [j.id for j in again] == [job.id] and again[0].attempt == 2
    assert await runs.slice("failing", again[0]) == "second time"
    assert runs.flows.keys == [f"{job.id}:once:1", f"{job.id}:once:2"]
    assert await runs.steps(job) == ["once"]


# -- how the runner settles a slice ----------------------------------------------------------


@pytest.fixture
async def runner(runs: Runs) -> AsyncIterator[Runner]:
    threads = ThreadExecutor(2)
    made = Runner(runs.app.registry, runs.app.sharded, threads, None, WORKER)
    try:
        yield made
    finally:
        await made.aclose()
        await threads.aclose()


async def test_the_runner_settles_each_end_of_a_slice_as_its_outcome(
    runs: Runs, runner: Runner
) -> None:
    job = await runs.lease("five")
    yielded = await runner.run(job)
    assert (yielded.kind, yielded.payload, yielded.delay_ms) == ("suspend", "yield", 0)
    assert yielded.cost >= 0
    again = await runs.settle(yielded)
    assert [j.id for j in again] == [job.id]
    # a stale lease: another worker may own the run, so the runner hands it back unwritten
    stale = await runner.run(msgspec.structs.replace(again[0], token="not-its-token"))
    assert (stale.kind, stale.payload) == ("release", "")
    assert runs.flows.calls == Counter({"s0": 1, "s1": 1})
    # a run that finishes completes with its value
    done = await runner.run(await runs.lease("three", "z"))
    assert done.kind == "ok" and msgspec.json.decode(done.payload) == ["Z-A", "Z-B", "Z-C"]


async def test_the_runner_dead_letters_a_diverged_run_and_retries_a_failed_slice(
    runs: Runs, runner: Runner
) -> None:
    job = await runs.lease("changing")
    first = await runner.run(job)
    assert first.kind == "suspend"
    (job,) = await runs.settle(first)
    runs.flows.first_name = "renamed"
    diverged = await runner.run(job)
    # replaying again would diverge again: no retry can help
    assert diverged.kind == "dead"
    assert decode_error(diverged.payload.encode()).type == (
        "fairlane.runtime.context.NonDeterminismError"
    )
    failed = await runner.run(await runs.lease("failing"))
    assert failed.kind == "retry"
    assert decode_error(failed.payload.encode()).type == "ValueError"
