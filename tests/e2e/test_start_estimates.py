"""Start-time estimates and deadlines that act before the fact, with a real worker.

The worker learns its attempts' lengths and sends them (``runtime/durations.py``; the
tests send at once instead of waiting for the interval); the estimate of a waiting job
then rests on its place, its tenant's weight, the other tenants' backlogs and the
learned lengths (``fairlane.policy.startpredict``). Jobs are held by an event, so the
queues stand still while the tests read them: the assertions are on counts and on the
order of estimates, never on timing.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from fairlane import App
from fairlane.app.admission import Rejected
from fairlane.app.task import Task
from fairlane.insight.explain import explain
from fairlane.store.durations import task_field
from tests.e2e.helpers import WAIT, eventually, make_app, running_workers

pytestmark = pytest.mark.anyio

SLOTS = 4
LEARN_MS = 30


def _gated_app(namespace: str, redis_url: str) -> tuple[App, asyncio.Event, Task[..., None]]:
    """An app whose task sleeps the ms it is given, once ``gate`` is open (it is)."""
    app = make_app(namespace, redis_url)
    gate = asyncio.Event()
    gate.set()

    @app.task
    async def work(ms: int) -> None:
        await gate.wait()
        await asyncio.sleep(ms / 1000)

    return app, gate, work


async def test_estimates_follow_place_weight_and_learned_lengths(
    redis_url: str, namespace: str
) -> None:
    app, gate, work = _gated_app(namespace, redis_url)
    async with app, running_workers(app, concurrency=SLOTS) as (worker,):
        await app.tenants.configure("b", weight=2.0)
        # learn: every tenant's jobs of LEARN_MS
        learned = await work.enqueue_many([(LEARN_MS,)] * 8, tenant="a")
        learned += await work.enqueue_many([(LEARN_MS,)] * 8, tenant="b")
        for job in learned:
            await job.result(timeout=WAIT)
        assert await worker.durations.send() > 0
        gate.clear()  # from here jobs hold their slots: the queues stand still
        held = await work.enqueue_many([(LEARN_MS,)] * SLOTS, tenant="c")

        async def all_running() -> bool:
            return all([(await j.info()).status == "running" for j in held])

        await eventually(all_running)
        a_jobs = await work.enqueue_many([(LEARN_MS,)] * 6, tenant="a")
        b_jobs = await work.enqueue_many([(LEARN_MS,)] * 6, tenant="b")
        a = [await j.start_estimate() for j in a_jobs]
        b = [await j.start_estimate() for j in b_jobs]
        last = a_jobs[-1].id
        record = await app.store.read_job(last)
        assert record is not None
        told = explain(record, await app.store.job_events(last), start=a[-1])
        assert "expected to start in" in told.summary, told.summary
        assert "slot-seconds ahead of it in default/standard" in told.summary
        assert told.estimated_start == a[-1].at
        gate.set()
    for est in a + b:
        assert est.at is not None and est.prediction is not None, est.why_none
        assert est.prediction.slots == SLOTS
        assert est.expected_run_s is not None and est.expected_run_s >= LEARN_MS / 1000
    waits_a = [e.wait_s for e in a]
    waits_b = [e.wait_s for e in b]
    # later in its tenant's queue: later; the heavier tenant's k-th job: sooner
    assert waits_a == sorted(waits_a) and waits_b == sorted(waits_b)
    assert all(
        wb is not None and wa is not None and wb < wa
        for wa, wb in zip(waits_a, waits_b, strict=True)
    )
    # b weighs 2: its 3rd job (2.5 units of virtual time) is as far as a's 2nd (1.5 x 2 ≈ 3)
    pa, pb = a[0].prediction, b[0].prediction
    assert pa is not None and pb is not None
    assert pa.ahead == 0 and b[5].prediction is not None and b[5].prediction.ahead == 5
    assert pa.share == pytest.approx(1 / 3) and pb.share == pytest.approx(2 / 3)


async def test_info_and_submit_carry_the_estimate_and_deadlines_act_before_the_fact(
    redis_url: str, namespace: str
) -> None:
    app, gate, work = _gated_app(namespace, redis_url)
    async with app, running_workers(app, concurrency=2) as (worker,):
        for job in await work.enqueue_many([(200,)] * 4, tenant="a"):
            await job.result(timeout=WAIT)
        await worker.durations.send()
        gate.clear()
        await work.enqueue_many([(200,)] * 2, tenant="a")  # hold both slots
        backlog = await work.enqueue_many([(200,)] * 10, tenant="a")
        info = await backlog[-1].info()
        assert info.estimated_start is not None
        assert info.estimated_start > datetime.now(UTC)
        # ten jobs of ~0.2 s on two slots lie ahead: ~1 s; a deadline of 0.5 s cannot be met
        soon = timedelta(milliseconds=500)
        refused = await work.submit(200, tenant="a", deadline=soon)
        assert refused.status == "rejected" and refused.reason == "deadline_unmeetable"
        assert refused.estimated_start is not None and refused.retry_after is None
        with pytest.raises(Rejected) as raised:
            await work.enqueue(200, tenant="a", deadline=soon)
        assert raised.value.reason == "deadline_unmeetable"
        assert raised.value.estimated_start is not None
        taken = await work.submit(200, tenant="a", deadline=soon, on_unmeetable="accept")
        assert taken.status == "accepted" and taken.job is not None
        asked = await work.submit(200, tenant="b", estimate_start=True)
        assert asked.estimated_start is not None
        plain = await work.submit(200, tenant="b")
        assert plain.estimated_start is None  # not asked: no read was made
        with pytest.raises(ValueError, match="on_unmeetable"):
            await work.submit(200, tenant="a", on_unmeetable="maybe")  # type: ignore[arg-type]
        gate.set()
        # the accepted job is expired before it takes a slot (its deadline passed, or
        # its learned length no longer fit), and never ran
        assert taken.job is not None
        await eventually(lambda: _status_is(taken.job, "expired"))
        assert (await taken.job.info()).attempts == 0
        # a task learned to take 10 s, given 5: dispatch expires it at once, saying why
        store = app.sharded.store_for_tenant("z")
        await store.learn_durations([(task_field(work.name, "z"), 1, 10_000.0)])
        late = await work.submit(0, tenant="z", deadline=5.0, on_unmeetable="accept")
        assert late.job is not None
        await eventually(lambda: _status_is(late.job, "expired"))
        info = await late.job.info()
        assert info.attempts == 0 and info.error is not None
        assert "expected to run 10000 ms" in info.error and "before its deadline" in info.error


async def _status_is(job: object, status: str) -> bool:
    return (await job.info()).status == status  # type: ignore[attr-defined]


async def test_nothing_is_said_without_a_worker_or_anything_learned(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task
    async def work() -> None:
        return None

    async with app:
        job = await work.enqueue(tenant="a")
        est = await job.start_estimate()
        assert est.at is None and est.why_none
        assert (await job.info()).estimated_start is None
        # a deadline with nothing to estimate by is taken (only a past one is refused)
        answer = await work.submit(tenant="a", deadline=timedelta(seconds=5))
        assert answer.status == "accepted" and answer.estimated_start is None
