"""Durable workflows end to end: checkpoints and replay, signals, durable waits that hold
no slot, children under ``max_children``, non-determinism, step attempts, tenant slots.

Every test runs real workers in this event loop against a real server; the workflows'
steps and children run in-process, so they record what happened in plain Python
objects. Checks count things (invocations, slices, peaks of concurrency), and every
wait is bounded.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest

import fairlane
from fairlane import App, Backoff, ChildFailed, Context, RunNotFound, TaskFailed
from tests.e2e.helpers import WAIT, eventually, make_app, running_worker

pytestmark = pytest.mark.anyio

QUICK = Backoff(base=0.05, cap=0.1, jitter="none")


async def _field(app: App, job_id: str, name: str) -> str | None:
    (value,) = await app.store.job_fields(job_id, name)
    return value.decode() if value is not None else None


async def _leased(app: App, job_id: str) -> bool:
    return await app.store.client.zscore(app.store.keys.leases, job_id) is not None


async def _waiting_for(app: App, job_id: str, wait: str) -> bool:
    return (
        await _field(app, job_id, "st") == "scheduled" and await _field(app, job_id, "wf") == wait
    )


@dataclass
class Peaks:
    """How many of each label run at once now, and the most ever."""

    running: Counter[str] = field(default_factory=Counter)
    peak: Counter[str] = field(default_factory=Counter)
    spans: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    async def hold(self, label: str, seconds: float) -> None:
        self.running[label] += 1
        self.peak[label] = max(self.peak[label], self.running[label])
        start = time.monotonic()
        try:
            await asyncio.sleep(seconds)
        finally:
            self.running[label] -= 1
            self.spans.setdefault(label, []).append((start, time.monotonic()))


# -- 1. checkpoints and replay ------------------------------------------------------------


@pytest.mark.contract
async def test_steps_run_once_across_slices_and_history_lists_them(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    calls: Counter[str] = Counter()
    entered = 0

    async def add(name: str, total: int, n: int) -> int:
        calls[name] += 1
        return total + n

    def times_two(name: str, value: int) -> int:  # a thread step
        calls[name] += 1
        return value * 2

    @app.workflow(slice_steps=2)
    async def flow(ctx: Context, n: int) -> dict[str, int]:
        nonlocal entered
        entered += 1
        total = 0
        for i in range(n):
            total = await ctx.step(f"add-{i}", add, f"add-{i}", total, i)
        doubled = await ctx.step("double", times_two, "double", total)
        return {"total": total, "doubled": doubled}

    async with app, running_worker(app):
        job = await flow.enqueue(5)
        result = await job.result(timeout=WAIT)
        history = await app.store.runs.history(job.id)

    assert result == {"total": 10, "doubled": 20}
    names = [f"add-{i}" for i in range(5)] + ["double"]
    assert calls == dict.fromkeys(names, 1), "every step ran exactly once"
    assert [(s.kind, s.name, s.status) for s in history.steps] == [
        ("step", name, "ok") for name in names
    ]
    assert [int(s.value) for s in history.steps] == [0, 1, 3, 6, 10, 20]
    # six new steps, two per slice: three slices, the first two yielding their slot
    kinds = [(e.kind, e.detail) for e in history.log if e.kind != "slice"]
    assert kinds == [("suspend", "yield"), ("suspend", "yield"), ("end", "completed")]
    assert sum(e.kind == "slice" for e in history.log) == 3
    assert entered == 3, "each slice re-entered the function and replayed its checkpoints"


# -- 2. signals ---------------------------------------------------------------------------


@pytest.mark.contract
async def test_a_signal_sent_before_the_run_waits_is_kept(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)

    async def prepare() -> str:
        return "ready"

    @app.workflow()
    async def flow(ctx: Context) -> list[object]:
        state = await ctx.step("prepare", prepare)
        await ctx.sleep(0.2)
        payload = await ctx.wait_for_signal("go", timeout=WAIT)
        return [state, payload]

    async with app:
        job = await flow.enqueue()
        # the run has not even started: the signal waits for the run's wait
        assert await app.signal(job.id, "go", {"n": 7}) == "delivered"
        started = time.monotonic()
        async with running_worker(app):
            result = await job.result(timeout=WAIT)
        history = await app.store.runs.history(job.id)

    assert result == ["ready", {"n": 7}]
    assert time.monotonic() - started < WAIT / 2, "the wait took the kept signal, no timeout"
    assert [(s.kind, s.status) for s in history.steps] == [
        ("step", "ok"),
        ("sleep", "ok"),
        ("signal", "ok"),
    ]
    assert history.pending_signals == 0


async def test_a_wait_times_out_and_a_late_signal_finds_the_run_finished(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.workflow()
    async def flow(ctx: Context) -> str:
        payload = await ctx.wait_for_signal("go", timeout=0.3)
        return "timed out" if payload is None else f"got {payload}"

    async with app, running_worker(app):
        started = time.monotonic()
        job = await flow.enqueue()
        assert await job.result(timeout=WAIT) == "timed out"
        elapsed = time.monotonic() - started
        history = await app.store.runs.history(job.id)
        assert await app.signal(job.id, "go", 1) == "finished"
        assert (await app.store.runs.history(job.id)).pending_signals == 0

    assert elapsed >= 0.3
    assert [(s.kind, s.name, s.status) for s in history.steps] == [("signal", "go", "timeout")]
    # the run suspended while it waited, then a second slice saw the timeout
    assert [e.detail for e in history.log if e.kind == "suspend"] == ["signal:go"]


async def test_signals_are_taken_in_order_and_a_repeated_id_once(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.workflow()
    async def flow(ctx: Context) -> list[int | None]:
        first = await ctx.wait_for_signal("x", type=int)
        second = await ctx.wait_for_signal("x", type=int)
        third = await ctx.wait_for_signal("x", timeout=0.3, type=int)
        return [first, second, third]

    async with app, running_worker(app):
        job = await flow.enqueue()
        await eventually(lambda: _waiting_for(app, job.id, "signal:x"))
        assert await app.signal(job.id, "x", 1, signal_id="s-1") == "delivered"
        assert await app.signal(job.id, "x", 99, signal_id="s-1") == "duplicate"
        assert await app.signal(job.id, "x", 2) == "delivered"
        result = await job.result(timeout=WAIT)
        history = await app.store.runs.history(job.id)

    assert result == [1, 2, None], "the duplicate was dropped, the others taken in order"
    assert [(s.name, s.status) for s in history.steps] == [
        ("x", "ok"),
        ("x", "ok"),
        ("x", "timeout"),
    ]
    assert history.pending_signals == 0


async def test_signal_to_an_unknown_run_or_with_a_bad_payload_raises(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.workflow()
    async def flow(ctx: Context) -> None:
        await ctx.wait_for_signal("x", timeout=0.1)

    async with app:
        with pytest.raises(RunNotFound):
            await app.signal("no-such-run", "x", 1)
        job = await flow.enqueue()
        with pytest.raises(TypeError):
            await app.signal(job.id, "x", object())
        with pytest.raises(ValueError, match="signal name"):
            await app.signal(job.id, "", 1)
        history = await app.store.runs.history(job.id)
    assert history.pending_signals == 0, "a refused signal keeps nothing"


# -- 3. a waiting run holds no slot -------------------------------------------------------

RUNS = 1000


async def test_a_thousand_waiting_runs_hold_no_slot(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)

    @app.workflow(lane="narrow")
    async def flow(ctx: Context, n: int) -> int:
        payload = await ctx.wait_for_signal("go", type=int)
        return n + payload

    @app.task(lane="narrow")
    async def quick(n: int) -> int:
        return n * 2

    async with app, running_worker(app, lanes=["narrow"], concurrency=2):
        jobs = await flow.enqueue_many([(i,) for i in range(RUNS)])

        async def all_suspended() -> bool:
            return (await app.stats()).get("suspended", 0) >= RUNS

        await eventually(all_suspended, timeout=40, every=0.2)
        # every run is scheduled, waiting for its signal, and none holds a lease
        async with app.store.client.pipeline(transaction=False) as pipe:
            for j in jobs:
                pipe.hmget(app.store.keys.job(j.id), "st", "wf")
            fields = await pipe.execute()
        assert Counter((st.decode(), wf.decode()) for st, wf in fields) == {
            ("scheduled", "signal:go"): RUNS
        }
        assert await app.store.client.zcard(app.store.keys.leases) == 0

        started = time.monotonic()
        short = await quick.enqueue(21)
        assert await short.result(timeout=10) == 42
        assert time.monotonic() - started < 10

        picked = jobs[:: RUNS // 5]
        for i, job in enumerate(picked):
            assert await app.signal(job.id, "go", i) == "delivered"
        results = await asyncio.wait_for(
            asyncio.gather(*(j.result() for j in picked)), timeout=WAIT
        )
        assert results == [k * (RUNS // 5) + k for k in range(5)]
        assert await jobs[1].status() == "scheduled", "runs not signalled keep waiting"


# -- 4. durable sleep ---------------------------------------------------------------------


async def test_a_durable_sleep_holds_no_lease(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    woke: list[float] = []

    async def stamp() -> float:
        woke.append(time.monotonic())
        return time.time()

    @app.workflow()
    async def flow(ctx: Context) -> float:
        before = await ctx.step("before", stamp)
        await ctx.sleep(0.5)
        after = await ctx.step("after", stamp)
        return after - before

    async with app, running_worker(app):
        job = await flow.enqueue()
        await eventually(lambda: _waiting_for(app, job.id, "sleep"), every=0.01)
        assert await job.status() == "scheduled"
        assert (await job.info()).waiting_for == "sleep"
        assert not await _leased(app, job.id), "a sleeping run holds no lease"
        slept = await job.result(timeout=WAIT)
        history = await app.store.runs.history(job.id)

    assert slept >= 0.45
    assert len(woke) == 2 and woke[1] - woke[0] >= 0.45
    assert [(s.kind, s.status) for s in history.steps] == [
        ("step", "ok"),
        ("sleep", "ok"),
        ("step", "ok"),
    ]
    assert [e.detail for e in history.log if e.kind == "suspend"] == ["sleep"]


TEXT = 'caf\u00e9 / "quoted" \\ \u2603'


# -- 5. children --------------------------------------------------------------------------


@pytest.mark.contract
async def test_children_run_at_most_max_children_at_once(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    peaks = Peaks()
    caught: list[str] = []

    @app.task
    async def child(n: int) -> int:
        await peaks.hold("children", 0.4 - 0.05 * n)  # later children finish sooner
        return n * 10

    @app.task(attempts=1)
    async def broken(n: int) -> int:
        raise LookupError(f"child {n} broke")

    @app.task
    async def echo(text: str) -> str:
        return text

    @app.workflow(max_children=2)
    async def flow(ctx: Context) -> dict[str, object]:
        results = await ctx.gather(*(ctx.call(child, n) for n in range(5)))
        try:
            await ctx.run(broken, 7)
        except ChildFailed as exc:
            caught.append(f"{exc.type_name}: {exc.message}")
        text = await ctx.run(echo, TEXT)
        await ctx.sleep(0.05)  # one more slice: every child result above is replayed
        return {"results": results, "caught": caught[-1], "text": text}

    async with app, running_worker(app, concurrency=8):
        job = await flow.enqueue(tenant="acme")
        result = await job.result(timeout=WAIT)
        history = await app.store.runs.history(job.id)
        child_tenants = {await _field(app, f"{job.id}.0.{i}", "tenant") for i in range(5)}

    assert result == {
        "results": [0, 10, 20, 30, 40],
        "caught": "LookupError: child 7 broke",
        "text": TEXT,
    }
    # caught when the child settled, then again in each later slice's replay
    assert caught == ["LookupError: child 7 broke"] * 3
    assert peaks.peak["children"] == 2, "children overlapped, but never more than two"
    assert child_tenants == {"acme"}, "children are the run's tenant's jobs"
    assert [(s.kind, s.name) for s in history.steps] == [
        ("children", ",".join([child.name] * 5)),
        ("children", broken.name),
        ("children", echo.name),
        ("sleep", "sleep:3"),
    ]


# -- 6. non-determinism -------------------------------------------------------------------


async def test_a_run_whose_code_changed_fails_without_retry(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    flipped = {"flag": False}
    calls: Counter[str] = Counter()

    async def flip(name: str) -> None:
        calls[name] += 1
        flipped["flag"] = True  # the next slice takes another path

    @app.workflow(slice_steps=1, attempts=3, backoff=QUICK)
    async def flow(ctx: Context) -> str:
        first = "second-path" if flipped["flag"] else "first-path"
        await ctx.step(first, flip, first)
        await ctx.step("then", flip, "then")
        return "done"

    async with app, running_worker(app):
        job = await flow.enqueue()
        with pytest.raises(TaskFailed) as failed:
            await job.result(timeout=WAIT)
        await asyncio.sleep(0.5)  # room for a retry, if one were (wrongly) scheduled
        info = await job.info()
        dead_letters = await app.dead_letters()
        history = await app.store.runs.history(job.id)

    assert "NonDeterminismError" in failed.value.type_name
    assert "first-path" in failed.value.message and "second-path" in failed.value.message
    # failed for good in its first counted attempt: the slice that yielded does not
    # count, and no retry was made although the run had 3 attempts
    assert (info.status, info.attempts, info.max_attempts) == ("failed", 1, 3)
    assert job.id in [dead for dead, _ in dead_letters]
    assert calls == {"first-path": 1}, "no step ran after the divergence"
    slices = [e for e in history.log if e.kind == "slice"]
    assert len(slices) == 2, "the slice that diverged was not retried"
    assert [s.name for s in history.steps] == ["first-path"]


# -- 7. step attempts ---------------------------------------------------------------------


async def test_a_failed_step_gets_a_new_attempt_key(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    keys: list[str] = []
    predicted: list[str] = []

    async def charge() -> str:
        key = fairlane.current_step().key
        keys.append(key)
        if len(keys) == 1:
            raise ConnectionError("the first call fails")
        return key

    @app.workflow(attempts=3, backoff=QUICK)
    async def flow(ctx: Context) -> str:
        predicted.append(ctx.step_key("charge"))
        return await ctx.step("charge", charge)

    async with app, running_worker(app):
        job = await flow.enqueue()
        result = await job.result(timeout=WAIT)
        info = await job.info()

    assert keys == [f"{job.id}:charge:1", f"{job.id}:charge:2"]
    assert predicted == keys, "step_key names the attempt the step is about to make"
    assert result == keys[1]
    assert info.attempts == 2


# -- 8. tenant slots ----------------------------------------------------------------------


async def test_tenant_slots_cap_one_tenants_runs(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    peaks = Peaks()

    async def work(tenant: str) -> None:
        await peaks.hold(tenant, 0.4)

    @app.workflow(tenant_slots=1)
    async def flow(ctx: Context) -> str:
        await ctx.step("work", work, ctx.tenant)
        return ctx.tenant

    async with app, running_worker(app, concurrency=3):
        a_runs = [await flow.enqueue(tenant="A") for _ in range(3)]
        b_run = await flow.enqueue(tenant="B")
        results = await asyncio.wait_for(
            asyncio.gather(*(j.result() for j in [*a_runs, b_run])), timeout=WAIT
        )

    assert results == ["A", "A", "A", "B"]
    assert peaks.peak["A"] == 1, "tenant A's runs never ran at once"
    a_spans, (b_span,) = peaks.spans["A"], peaks.spans["B"]
    assert len(a_spans) == 3
    assert any(start < b_span[1] and b_span[0] < end for start, end in a_spans), (
        "tenant B's run went on while one of A's ran"
    )
    assert b_span[1] < max(end for _, end in a_spans), "B did not queue behind all of A's runs"
