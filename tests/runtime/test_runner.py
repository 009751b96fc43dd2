"""The runner (fairlane.runtime.runner.Runner) on its own: one attempt of a leased job
turned into its ``Outcome``, on a private server and with no worker.

Tasks are declared on an ``App`` (the way users declare them) and the runner is given
the app's registry and stores, a thread executor and, where a test needs one, a process
pool. Jobs are made by the task's own ``encode_args`` / ``new_job``, enqueued and leased
from the store with ``exchange``, so each attempt carries what a worker would be handed
(its attempt number, budget, backoff and timeout). What is checked is the outcome: its
kind, its payload (a result, or the error recorded with its type name), the retry delay
the task's backoff gives, and what the attempt cost -- never how long it took.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

import fairlane
from fairlane import App, Backoff
from fairlane.app.declaring import TaskDecorator
from fairlane.codec import ErrorInfo, decode_error
from fairlane.codec.refs import PayloadRef, encode_ref, is_ref
from fairlane.policy.admission import work_units
from fairlane.registry import TaskDefinition
from fairlane.runtime.executors import ProcessExecutor, ThreadExecutor
from fairlane.runtime.runner import Runner
from fairlane.store.wire import FetchedJob, Outcome
from tests.e2e.helpers import fast_settings
from tests.runtime import _runner_funcs
from tests.runtime.leasing import LEASE_MS, WORKER, lease_one

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
LANE = "runner"
TENANT = "acme"
#: the worker's size: a test may hold a few leases at once
SLOTS = 8
#: 1.5 s doubling per attempt, at most 4 s, with no jitter: each delay is exact
STEADY = Backoff(base=1.5, cap=4.0, jitter="none")
NO_WAIT = Backoff(base=0.0, cap=0.0, jitter="none")


class Flaky(Exception):
    """A task's failure its ``retry_on`` names."""


class Tasks:
    """The tasks every runner test can lease a job of, and how often each was called."""

    def __init__(self, app: App) -> None:
        self.calls: Counter[str] = Counter()
        #: a blocked thread task returns once this is set
        self.release = threading.Event()
        #: set once the "untimed" task has started
        self.started = asyncio.Event()
        self.contexts: list[fairlane.JobContext] = []
        self._completing(app)
        self._failing(app)
        self._unfit(app)
        self._timed(app)
        self._in_processes(app)
        self.by_name: dict[str, TaskDefinition[Any, Any]] = dict(app.registry.tasks)

    def __getitem__(self, name: str) -> TaskDefinition[Any, Any]:
        return self.by_name[f"runner.{name}"]

    def _completing(self, app: App) -> None:
        calls = self.calls

        @app.task(name="runner.add", lane=LANE)
        async def add(a: int, b: int) -> int:
            calls["add"] += 1
            return a + b

        @app.task(name="runner.words", lane=LANE, executor="thread")
        def words(text: str) -> list[str]:
            calls["words"] += 1
            return text.split()

        @app.task(name="runner.metered", lane=LANE)
        async def metered() -> int:
            ctx = fairlane.context()
            self.contexts.append(ctx)
            ctx.report_usage(input_tokens=1500, output_tokens=500, tool_calls=3)
            fairlane.report_usage(tool_seconds=90.0)
            return ctx.attempt

    def _failing(self, app: App) -> None:
        calls = self.calls

        @app.task(name="runner.flaky", lane=LANE, attempts=4, backoff=STEADY, retry_on=[Flaky])
        async def flaky(reason: str) -> None:
            calls["flaky"] += 1
            raise Flaky(reason)

        @app.task(name="runner.jittered", lane=LANE, backoff=Backoff(1.5, 4.0, "full"))
        async def jittered() -> None:
            raise Flaky("again")

        @app.task(name="runner.picky", lane=LANE, backoff=STEADY, retry_on=[Flaky])
        async def picky(key: str) -> None:
            calls["picky"] += 1
            raise KeyError(key)

        @app.task(name="runner.picky_thread", lane=LANE, executor="thread", retry_on=[Flaky])
        def picky_thread(key: str) -> None:
            raise KeyError(key)

        @app.task(name="runner.exits", lane=LANE)
        async def exits(code: int) -> None:
            sys.exit(code)

        @app.task(name="runner.twice", lane=LANE, attempts=2, backoff=NO_WAIT)
        async def twice() -> None:
            calls["twice"] += 1
            raise Flaky("no luck")

    def _unfit(self, app: App) -> None:
        """Tasks whose arguments or results do not fit: what they are given or return."""
        calls = self.calls

        @app.task(name="runner.opaque", lane=LANE)
        async def opaque() -> Any:
            return object()

        @app.task(name="runner.opaque_thread", lane=LANE, executor="thread")
        def opaque_thread() -> Any:
            return object()

        @app.task(name="runner.echo", lane=LANE)
        async def echo(text: str) -> str:
            calls["echo"] += 1
            return text

        @app.task(name="runner.repeat", lane=LANE)
        async def repeat(char: str, n: int) -> str:
            return char * n

    def _timed(self, app: App) -> None:
        @app.task(name="runner.slow", lane=LANE, timeout=0.05, backoff=STEADY)
        async def slow() -> None:
            await asyncio.Event().wait()

        @app.task(name="runner.untimed", lane=LANE, timeout=None)
        async def untimed() -> None:
            self.started.set()
            await asyncio.Event().wait()

        @app.task(name="runner.stuck", lane=LANE, executor="thread", timeout=0.05, backoff=STEADY)
        def stuck() -> str:
            self.release.wait(30)
            return "late"

    @staticmethod
    def _in_processes(app: App) -> None:
        # a process task's child imports its function by path: these are module-level
        def in_a_process(name: str, **options: Any) -> TaskDecorator:
            return app.task(name=f"runner.{name}", lane=LANE, executor="process", **options)

        in_a_process("square", timeout=30)(_runner_funcs.square)
        in_a_process("refuse", retry_on=[Flaky])(_runner_funcs.refuse)
        in_a_process("refuse_retried", retry_on=[_runner_funcs.Refused], backoff=STEADY)(
            _runner_funcs.refuse
        )
        in_a_process("crash", backoff=STEADY)(_runner_funcs.crash)


class Bench:
    """A connected app with the tests' tasks, and a runner of its registry and stores."""

    def __init__(self, app: App, tasks: Tasks, runner: Runner) -> None:
        self.app = app
        self.tasks = tasks
        self.runner = runner

    async def lease(self, name: str, *args: Any, **kwargs: Any) -> FetchedJob:
        """Enqueue one job of task ``name`` and lease it as worker ``w1``."""
        return await lease_one(
            self.app, self.tasks[name], LANE, args, kwargs, tenant=TENANT, slots=SLOTS
        )

    async def again(self, outcome: Outcome) -> FetchedJob:
        """Settle a retried attempt (its delay spent) and lease the job's next one."""
        store = self.app.sharded.store_for_job(outcome.id)
        settled = msgspec.structs.replace(outcome, delay_ms=0)
        fetched = await store.exchange(WORKER, [LANE], 1, LEASE_MS, outcomes=[settled], slots=SLOTS)
        assert [j.id for j in fetched.jobs] == [outcome.id]
        return fetched.jobs[0]

    async def run(self, name: str, *args: Any, **kwargs: Any) -> Outcome:
        job = await self.lease(name, *args, **kwargs)
        outcome = await self.runner.run(job)
        assert (outcome.id, outcome.token) == (job.id, job.token)
        return outcome


@asynccontextmanager
async def _bench(
    namespace: str,
    redis_url: str,
    *,
    processes: bool = False,
    **settings: Any,
) -> AsyncIterator[Bench]:
    app = App(namespace, redis_url=redis_url, settings=fast_settings(**settings))
    tasks = Tasks(app)
    threads = ThreadExecutor(2)
    pool: ProcessExecutor | None = None
    try:
        async with app:
            if processes:
                pool = ProcessExecutor(1, "fairlane.runtime.invoke:invoke_sync")
                await pool.start()
            runner = Runner(app.registry, app.sharded, threads, pool, WORKER)
            try:
                yield Bench(app, tasks, runner)
            finally:
                await runner.aclose()
    finally:
        tasks.release.set()  # a thread still blocked in a task returns now
        if pool is not None:
            await pool.aclose()
        await threads.aclose()


@pytest.fixture
async def bench(namespace: str, redis_url: str) -> AsyncIterator[Bench]:
    async with _bench(namespace, redis_url) as made:
        yield made


def _error(outcome: Outcome) -> ErrorInfo:
    return decode_error(outcome.payload.encode())


# -- completed attempts ----------------------------------------------------------------------


async def test_a_completed_async_attempt_carries_its_encoded_result(bench: Bench) -> None:
    outcome = await bench.run("add", 2, b=40)
    assert outcome.kind == "ok"
    assert bench.tasks["add"].codec.decode_result(outcome.payload.encode()) == 42
    assert outcome.delay_ms == 0
    assert bench.tasks.calls == Counter({"add": 1})
    # it ran: what it cost is priced, never the "did not run" mark
    assert outcome.cost >= 0


async def test_a_sync_task_runs_on_the_thread_executor(bench: Bench) -> None:
    outcome = await bench.run("words", "one two  three")
    assert outcome.kind == "ok"
    assert msgspec.json.decode(outcome.payload) == ["one", "two", "three"]
    assert bench.tasks.calls == Counter({"words": 1})


async def test_the_cost_prices_the_usage_the_task_reported(bench: Bench) -> None:
    job = await bench.lease("metered")
    outcome = await bench.runner.run(job)
    assert outcome.kind == "ok" and msgspec.json.decode(outcome.payload) == 1
    (seen,) = bench.tasks.contexts
    assert (seen.id, seen.tenant, seen.attempt) == (job.id, TENANT, 1)
    # reported tool seconds outweigh the attempt's wall time, so the price is exact
    expected = work_units(
        bench.app.registry.pricing.coefficients, tokens=2000, tool_calls=3, tool_seconds=90.0
    )
    assert expected > 0
    assert outcome.cost == pytest.approx(expected)
    # the attempt's context is gone once it has ended
    with pytest.raises(RuntimeError):
        fairlane.context()


# -- failed attempts: retry or dead-letter ---------------------------------------------------


async def test_a_retryable_failure_is_retried_after_the_declared_backoff(bench: Bench) -> None:
    outcome = await bench.run("flaky", "not yet")
    assert outcome.kind == "retry"
    assert outcome.delay_ms == 1500  # base 1.5 s, no jitter, after attempt 1
    error = _error(outcome)
    assert error.type == "tests.runtime.test_runner.Flaky"
    assert error.message == "not yet"
    assert "raise Flaky(reason)" in error.traceback
    assert outcome.cost >= 0


async def test_each_attempt_doubles_the_delay_up_to_the_cap(bench: Bench) -> None:
    job = await bench.lease("flaky", "again")
    delays = []
    for attempt in (1, 2, 3):
        outcome = await bench.runner.run(msgspec.structs.replace(job, attempt=attempt))
        assert outcome.kind == "retry"
        delays.append(outcome.delay_ms)
    assert delays == [1500, 3000, 4000]
    # the fourth of its four attempts is its last: dead-lettered, not retried
    last = await bench.runner.run(msgspec.structs.replace(job, attempt=4))
    assert (last.kind, last.delay_ms) == ("dead", 0)
    assert _error(last).type == "tests.runtime.test_runner.Flaky"
    assert bench.tasks.calls == Counter({"flaky": 4})


async def test_full_jitter_draws_each_delay_within_the_raw_delay(bench: Bench) -> None:
    job = await bench.lease("jittered")
    delays = [(await bench.runner.run(job)).delay_ms for _ in range(20)]
    assert all(0 <= delay <= 1500 for delay in delays), delays
    assert len(set(delays)) > 1, "twenty draws gave one delay: no jitter was applied"


async def test_a_failure_retry_on_does_not_name_is_dead_at_once(bench: Bench) -> None:
    outcome = await bench.run("picky", "missing")
    assert (outcome.kind, outcome.delay_ms) == ("dead", 0)
    error = _error(outcome)
    assert (error.type, error.message) == ("KeyError", "'missing'")
    assert bench.tasks.calls == Counter({"picky": 1})
    # the same rule for a thread task's own exception
    threaded = await bench.run("picky_thread", "gone")
    assert threaded.kind == "dead" and _error(threaded).type == "KeyError"


async def test_sys_exit_in_a_task_fails_the_attempt_not_the_runner(bench: Bench) -> None:
    outcome = await bench.run("exits", 3)
    # SystemExit is no Exception: retry_on's default does not name it
    assert outcome.kind == "dead"
    assert _error(outcome).type == "SystemExit"
    # the runner goes on
    assert (await bench.run("add", 1, 1)).kind == "ok"


async def test_an_attempt_out_of_its_budget_is_dead_lettered(bench: Bench) -> None:
    first = await bench.runner.run(await bench.lease("twice"))
    assert (first.kind, first.delay_ms) == ("retry", 0)
    job = await bench.again(first)
    assert (job.attempt, job.max_attempts) == (2, 2)
    second = await bench.runner.run(job)
    assert second.kind == "dead"
    assert (_error(first).type, _error(second).type) == ("tests.runtime.test_runner.Flaky",) * 2
    assert bench.tasks.calls == Counter({"twice": 2})


# -- attempts that never reach the function --------------------------------------------------


def _handed_back(outcome: Outcome) -> tuple[int, ErrorInfo, ErrorInfo]:
    """A hand-back's deploy window (ms), its error now and its error past the window."""
    window, now, final = outcome.payload.split("\n")
    return int(window), decode_error(now.encode()), decode_error(final.encode())


async def test_an_unknown_task_is_handed_back_for_another_worker(bench: Bench) -> None:
    job = msgspec.structs.replace(await bench.lease("add", 1, 2), task="runner.nowhere")
    outcome = await bench.runner.run(job)
    # another worker may know the task: the job waits for one, spending no attempt
    assert (outcome.kind, outcome.delay_ms, outcome.cost) == ("handback", 5000, -1.0)
    window, now, final = _handed_back(outcome)
    assert window == 300_000  # worker.deploy_window
    assert now.type == final.type == "UnknownTask"
    reason = f"no task named 'runner.nowhere' in this worker (app {bench.app.name!r})"
    assert now.message == f"{reason}; handed back for another worker (worker.deploy_window)"
    assert final.message == (
        f"no worker ran the job within the deploy window (300s, worker.deploy_window): {reason}"
    )
    # the last attempt too: the store, not the worker, decides when the window is over
    last = await bench.runner.run(msgspec.structs.replace(job, attempt=job.max_attempts))
    assert last.kind == "handback"
    assert bench.tasks.calls == Counter()
    assert not bench.runner.uses_timer(job)


async def test_a_task_named_after_main_is_handed_back_with_the_fix(bench: Bench) -> None:
    job = msgspec.structs.replace(await bench.lease("add", 1, 2), task="__main__.send")
    _, _, final = _handed_back(await bench.runner.run(job))
    assert final.message.endswith('@app.task(name="<module>.<function>")')


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ('{"a":"one","b":2}', "Expected `int`, got `str`"),  # a value of the wrong type
        ('{"a":1}', "missing required field `b`"),  # a parameter missing
        ('{"a":1,"b":2,"c":3}', "unknown field `c`"),  # one the function does not take
    ],
    ids=["wrong-type", "missing", "unknown"],
)
async def test_arguments_another_version_may_take_are_handed_back(
    bench: Bench, args: str, says: str
) -> None:
    job = msgspec.structs.replace(await bench.lease("add", 1, 2), args=args)
    outcome = await bench.runner.run(job)
    assert (outcome.kind, outcome.delay_ms) == ("handback", 5000)
    _, now, final = _handed_back(outcome)
    assert now.type == final.type == "MalformedArguments"
    assert now.message.startswith("the stored arguments do not fit task ")
    assert says in now.message and says in final.message
    # the way out is shown only where it helps: an argument the function does not take
    assert ('unknown_kwargs="drop"' in final.message) == (says == "unknown field `c`")
    assert bench.tasks.calls == Counter()


@pytest.mark.parametrize(
    "args",
    [
        "not json",
        "[1, 2]",  # JSON, but no version of any task stores its arguments so
    ],
    ids=["not-json", "not-an-object"],
)
async def test_malformed_arguments_are_dead_without_calling_the_task(
    bench: Bench, args: str
) -> None:
    job = msgspec.structs.replace(await bench.lease("add", 1, 2), args=args)
    outcome = await bench.runner.run(job)
    assert (outcome.kind, outcome.delay_ms) == ("dead", 0)
    error = _error(outcome)
    assert error.type == "MalformedArguments"
    assert error.message.startswith("stored arguments do not fit the task's signature: ")
    assert bench.tasks.calls == Counter()


@pytest.mark.parametrize("task", ["opaque", "opaque_thread"])
async def test_a_result_that_cannot_be_encoded_is_dead(bench: Bench, task: str) -> None:
    outcome = await bench.run(task)
    assert (outcome.kind, outcome.delay_ms) == ("dead", 0)
    assert _error(outcome).type == "ResultNotSerializable"


async def test_a_result_over_the_size_limit_is_dead(namespace: str, redis_url: str) -> None:
    async with _bench(namespace, redis_url, max_payload_bytes=200) as small:
        outcome = await small.run("repeat", "x", 198)
        assert outcome.kind == "ok" and len(outcome.payload) == 200
        too_big = await small.run("repeat", "x", 199)  # 201 bytes with its quotes
        assert too_big.kind == "dead"
        error = _error(too_big)
        assert error.type == "fairlane.codec.PayloadTooLarge"
        assert error.message == "the result is 201 bytes, over the 200-byte limit"


# -- timeouts --------------------------------------------------------------------------------


async def test_the_worker_times_an_async_attempt_and_the_runner_says_how_it_ended(
    bench: Bench,
) -> None:
    job = await bench.lease("slow")
    assert job.timeout == pytest.approx(0.05)
    # an async attempt is timed by the worker, one timer per job
    assert bench.runner.uses_timer(job)
    outcome = bench.runner.timed_out(job)
    assert (outcome.id, outcome.token) == (job.id, job.token)
    assert (outcome.kind, outcome.delay_ms) == ("retry", 1500)
    error = _error(outcome)
    assert error.type == "TimeoutError"
    assert error.message == "the attempt exceeded its timeout of 0.05s"
    last = bench.runner.timed_out(msgspec.structs.replace(job, attempt=job.max_attempts))
    assert last.kind == "dead" and _error(last).type == "TimeoutError"


async def test_no_timer_for_an_untimed_task_nor_one_an_executor_times(bench: Bench) -> None:
    assert not bench.runner.uses_timer(await bench.lease("untimed"))
    stuck = await bench.lease("stuck")
    assert stuck.timeout == pytest.approx(0.05)
    assert not bench.runner.uses_timer(stuck)


async def test_a_thread_attempt_past_its_timeout_ends_as_timed_out(bench: Bench) -> None:
    job = await bench.lease("stuck")
    outcome = await bench.runner.run(job)
    assert (outcome.kind, outcome.delay_ms) == ("retry", 1500)
    error = _error(outcome)
    assert error.type == "TimeoutError"
    assert error.message == "the attempt exceeded its timeout of 0.05s"


async def test_a_cancelled_attempt_raises_to_its_caller(bench: Bench) -> None:
    job = await bench.lease("untimed")
    attempt = asyncio.create_task(bench.runner.run(job))
    await bench.tasks.started.wait()  # the attempt has started, and waits
    attempt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await attempt
    # the caller knows why it cancelled: the runner made no outcome of it
    assert (await bench.run("add", 2, 3)).kind == "ok"


# -- process tasks ---------------------------------------------------------------------------


@pytest.fixture
def _children_can_import_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spawned children must be able to import ``tests.runtime._runner_funcs``."""
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{path}" if path else str(ROOT))


@pytest.mark.embedded_only
@pytest.mark.usefixtures("_children_can_import_tests")
async def test_process_attempts_end_as_their_child_says(namespace: str, redis_url: str) -> None:
    async with _bench(namespace, redis_url, processes=True) as made:
        done = await made.run("square", 12)
        assert done.kind == "ok" and msgspec.json.decode(done.payload) == 144
        # the child's exception is matched to retry_on by its type's name
        refused = await made.run("refuse", "no")
        assert (refused.kind, refused.delay_ms) == ("dead", 0)
        error = _error(refused)
        assert error.type == "tests.runtime._runner_funcs.Refused"
        assert "raise Refused(reason)" in error.traceback
        retried = await made.run("refuse_retried", "later")
        assert (retried.kind, retried.delay_ms) == ("retry", 1500)
        assert _error(retried).type == "tests.runtime._runner_funcs.Refused"
        # a child that dies mid-call is retried: the next child may get through
        crashed = await made.run("crash", 3)
        assert (crashed.kind, crashed.delay_ms) == ("retry", 1500)
        assert _error(crashed).type == "ChildCrashed"
        # the pool replaced its child: the runner goes on
        assert msgspec.json.decode((await made.run("square", 3)).payload) == 9


# -- large payloads --------------------------------------------------------------------------


def _payload_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


async def test_large_arguments_and_results_travel_by_reference(
    namespace: str, redis_url: str, tmp_path: Path
) -> None:
    url = f"file://{tmp_path}"
    async with _bench(namespace, redis_url, payloads={"url": url, "threshold_bytes": 64}) as made:
        text = "word " * 40
        job = await made.lease("echo", text)
        assert is_ref(job.args)  # offloaded when it was enqueued
        outcome = await made.runner.run(job)
        assert outcome.kind == "ok"
        # the result is over the threshold too: it settles as a reference
        assert is_ref(outcome.payload)
        payloads = made.app.registry.payloads
        assert payloads is not None
        assert msgspec.json.decode(await payloads.resolve(outcome.payload)) == text
        assert len(_payload_files(tmp_path)) == 2  # the arguments and the result
        # a small result stays in the server
        small = await made.run("add", 1, 2)
        assert small.payload == "3"


async def test_arguments_whose_payload_is_gone_are_unavailable_and_retried(
    namespace: str, redis_url: str, tmp_path: Path
) -> None:
    url = f"file://{tmp_path}"
    async with _bench(namespace, redis_url, payloads={"url": url, "threshold_bytes": 64}) as made:
        job = await made.lease("echo", "word " * 40)
        for path in _payload_files(tmp_path):
            path.unlink()
        outcome = await made.runner.run(job)
        assert outcome.kind == "retry"
        error = _error(outcome)
        assert error.type == "PayloadUnavailable"
        assert error.message.startswith("the job's arguments cannot be read: ")
        assert made.tasks.calls == Counter()


async def test_a_damaged_reference_is_malformed_arguments(
    namespace: str, redis_url: str, tmp_path: Path
) -> None:
    url = f"file://{tmp_path}"
    async with _bench(namespace, redis_url, payloads={"url": url, "threshold_bytes": 64}) as made:
        job = await made.lease("echo", "short")
        damaged = msgspec.structs.replace(job, args='{"$fl_ref":"../elsewhere","size":1}')
        outcome = await made.runner.run(damaged)
        assert (outcome.kind, outcome.delay_ms) == ("dead", 0)
        assert _error(outcome).type == "MalformedArguments"
        assert made.tasks.calls == Counter()


async def test_a_reference_on_a_worker_without_a_payload_store_is_unavailable(
    bench: Bench,
) -> None:
    job = await bench.lease("echo", "short")
    ref = encode_ref(PayloadRef("t.args.0123", 5, "0" * 64)).decode()
    outcome = await bench.runner.run(msgspec.structs.replace(job, args=ref))
    assert outcome.kind == "retry"
    error = _error(outcome)
    assert error.type == "PayloadUnavailable"
    assert "this worker has none" in error.message
    assert bench.tasks.calls == Counter()
