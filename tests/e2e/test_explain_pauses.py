"""``explain`` of a job an operator's pause holds: ``paused by an operator at <time>:
<reason>``, with the scope, who and until when.

End to end with a real server and worker: a paused tenant's job waits in its queue while
another tenant's runs; a paused lane class is named before the tenant (dispatch's order);
a paused task's job is parked by dispatch (its ``paused`` event and its record's ``pz``),
and once resumed and run its parked stretch is still told; a paused fairness key's job
likewise. Then ``fairlane explain`` prints the line, and a pure test pins the sentence.
Assertions are about causes and order, never about timings.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fairlane import App
from fairlane.insight.explain import Explanation, explain
from fairlane.policy.pauses import Scope, ScopeKind
from fairlane.store.pausing import PauseEntry
from fairlane.store.records import Event, JobRecord
from tests.e2e.helpers import WAIT, eventually, explain_command, make_app, running_worker

pytestmark = pytest.mark.anyio


def _app(namespace: str, redis_url: str) -> App:
    app = make_app(namespace, redis_url)

    @app.task(name="hello")
    async def hello(n: int) -> int:
        return n

    return app


async def explained(app: App, job_id: str) -> Explanation:
    """The answer ``fairlane explain`` gives now: the record, events and pause table."""
    store = app.store_for_job(job_id)
    record = await store.read_job(job_id)
    assert record is not None
    events = await store.job_events(job_id)
    now = await store.server_time_ms()
    answer = explain(record, events, now_ms=now, pauses=await store.pause_entries())
    print(f"{job_id}: {answer.summary}")
    return answer


async def test_a_paused_tenants_job_and_a_paused_class_are_explained(
    redis_url: str, namespace: str
) -> None:
    app = _app(namespace, redis_url)
    hello = app.get_task("hello")
    async with app:
        held = await hello.enqueue(1, tenant="acme")
        # segments are cut by the server's ms: each step below is a few ms after the last,
        # so that none of them is a segment of no length (which the walk leaves out)
        await asyncio.sleep(0.005)
        await app.tenants.pause("acme", reason="runaway loop", for_=600, by="ops:alice")
        other = await hello.enqueue(2, tenant="beta")
        async with running_worker(app):
            await other.result(timeout=WAIT)  # dispatch ran, and held acme back
        assert await held.status() == "queued"
        answer = await explained(app, held.id)
        first, last = answer.segments[0], answer.segments[-1]
        assert first.what == "queued" and not first.open  # until the pause began
        assert (last.what, last.cause, last.open) == ("paused", "operator", True)
        assert last.why.startswith("paused by an operator at 20")
        assert ": runaway loop (tenant acme, by ops:alice, until 20" in last.why
        assert "paused by an operator at" in answer.summary
        # a lane's or class's pause decides before a tenant's (P5): it is the one named
        await asyncio.sleep(0.005)
        await app.pauses.pause(app.pauses.scope(lane="default", cls="standard"), by="ops:bob")
        await asyncio.sleep(0.005)
        both = (await explained(app, held.id)).segments
        assert [s.what for s in both] == ["queued", "paused", "paused"]
        assert "(tenant acme" in both[1].why and not both[1].open
        assert ": no reason given (lane default/standard, by ops:bob)" in both[2].why
        await app.pauses.resume(app.pauses.scope(lane="default", cls="standard"))
        await app.tenants.resume("acme")
        await asyncio.sleep(0.005)
        last = (await explained(app, held.id)).segments[-1]
        assert (last.what, last.cause) == ("queued", "slot")


async def test_a_parked_task_and_fairness_key_are_explained_then_and_after(
    redis_url: str, namespace: str
) -> None:
    app = _app(namespace, redis_url)
    hello = app.get_task("hello")
    async with app:
        await hello.enqueue(0, tenant="acme", fairness_key="u2")
        await app.pauses.pause(app.pauses.scope(task="hello"), reason="bad deploy", by="ops:c")
        key = app.pauses.scope(tenant="acme", fairness_key="u1")
        await app.pauses.pause(key, reason="one user's loop", by="ops:d")
        by_task = await hello.enqueue(1, tenant="beta")
        by_key = await hello.enqueue(2, tenant="acme", fairness_key="u1")
        async with running_worker(app):

            async def parked() -> bool:
                kinds = [e.kind for e in await app.store.job_events(by_task.id)]
                keyed = [e.kind for e in await app.store.job_events(by_key.id)]
                return "paused" in kinds and "paused" in keyed

            await eventually(parked)
            record = await app.store.read_job(by_key.id)
            assert record is not None and record.paused_under and record.status == "queued"
            task_wait = (await explained(app, by_task.id)).segments[-1]
            assert (task_wait.what, task_wait.cause) == ("paused", "operator")
            assert ": bad deploy (task hello, by ops:c)" in task_wait.why
            key_wait = (await explained(app, by_key.id)).segments[-1]
            # the key decides before the task (P5)
            assert ": one user's loop (fairness key u1 of tenant acme, by ops:d)" in key_wait.why
            await app.pauses.resume(key)
            await app.pauses.resume(app.pauses.scope(task="hello"))
            assert await by_task.result(timeout=WAIT) == 1
            assert await by_key.result(timeout=WAIT) == 2
        done = await explained(app, by_task.id)
        assert [s.what for s in done.segments][-2:] == ["paused", "running"]
        assert done.segments[-2].why == "parked by an operator's pause of task hello"
        assert "operator" in done.causes


def test_the_explain_command_prints_the_operators_pause(
    tmp_path: Path, namespace: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli, spec = explain_command(tmp_path, monkeypatch, namespace, redis_url)

    async def held_job() -> str:
        app = _app(namespace, redis_url)
        async with app:
            job = await app.get_task("hello").enqueue(7, tenant="acme")
            await app.tenants.pause("acme", reason="invoice dispute", by="ops:erin")
        return job.id

    job_id = asyncio.run(held_job())
    shown = CliRunner().invoke(cli, ["explain", spec, job_id], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    print(shown.output)
    assert "paused by an operator at " in shown.output
    assert ": invoice dispute (tenant acme, by ops:erin)" in shown.output


def test_the_sentence_names_the_time_the_reason_who_and_until() -> None:
    record = JobRecord("j", task="t", tenant="acme", lane="l", status="queued", enqueued_ms=1000)
    events = [Event(1000, "submitted", {"v": "accepted"})]
    start = 1_767_225_600_000  # 2026-01-01 00:00:00 UTC
    entry = PauseEntry(
        Scope(ScopeKind.TENANT, tenant="acme"), start + 3_600_000, "audit", "ops", start, 0
    )
    answer = explain(record, events, now_ms=start + 5000, pauses=[entry])
    assert [(s.what, s.from_ms, s.to_ms) for s in answer.segments] == [
        ("queued", 1000, start),
        ("paused", start, start + 5000),
    ]
    assert answer.segments[-1].why == (
        "paused by an operator at 2026-01-01 00:00:00 UTC: audit "
        "(tenant acme, by ops, until 2026-01-01 01:00:00 UTC)"
    )
    # a class paused later decides from its start on (P5), the tenant's pause before it
    later = PauseEntry(Scope(ScopeKind.LANE, lane="l"), 0, "", "", start + 2000, 0)
    answer = explain(record, events, now_ms=start + 5000, pauses=[entry, later])
    assert [(s.what, s.from_ms, s.cause) for s in answer.segments] == [
        ("queued", 1000, "slot"),
        ("paused", start, "operator"),
        ("paused", start + 2000, "operator"),
    ]
    assert answer.segments[-1].why.endswith(": no reason given (lane l)")
    # an ended pause (1: being lifted) or one past its end holds nothing
    for until in (1, start + 4000):
        ended = PauseEntry(entry.scope, until, "audit", "ops", start, 0)
        answer = explain(record, events, now_ms=start + 5000, pauses=[ended])
        assert [s.what for s in answer.segments] == ["queued"]
    # parked by a task's pause that has since ended
    parked = [*events, Event(2000, "paused", {"scope": "j:t"})]
    answer = explain(record, parked, now_ms=3000, pauses=[])
    assert answer.segments[-1].why == (
        "parked by an operator's pause of task t; its pause has ended since"
    )
