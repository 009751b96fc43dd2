"""Lifecycle events and ``explain`` end to end: one job per cause of waiting.

Each test runs real jobs through a real server and an in-process worker, reads the
job's record and events back (``Store.job_events``) and checks that the explanation
names the cause: a throttle key, its class's capacity borrowed by another class, fair
dispatch sharing its class with other tenants, an admission deferral and its reason,
a retry backoff and its error -- or nothing at all for a plain job, which logs no
event (its record tells it all). Pure tests of ``fairlane.insight.explain`` pin the sentences,
the timeline rebuilt from a record, and events as earlier versions logged them.
Assertions are about causes and order, never about exact timings.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from typer.testing import CliRunner

from fairlane import App, Backoff, Retention, ServiceClass
from fairlane.config.pools import parse_config
from fairlane.insight.explain import Explanation, explain
from fairlane.store.records import Event, decode_event
from tests.e2e.helpers import (
    WAIT,
    app_keys,
    eventually,
    explain_command,
    fast_settings,
    make_app,
    running_worker,
)

pytestmark = pytest.mark.anyio


async def explained(app: App, job_id: str) -> tuple[Explanation, list[Event]]:
    record = await app.store.job_record(job_id)
    events = await app.store.job_events(job_id)
    answer = explain(record, events)
    print(f"{job_id}: {answer.summary}")
    return answer, events


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


# -- 1. a throttle key ------------------------------------------------------------------------


async def test_a_job_parked_on_a_throttle_key_is_explained_by_the_key(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task(limits={"model:big": 1})
    async def hold(seconds: float) -> None:
        await asyncio.sleep(seconds)

    async with app:
        first = await hold.enqueue(0.3, tenant="a")
        second = await hold.enqueue(0.01, tenant="b")
        async with running_worker(app, concurrency=2):
            await first.result(timeout=WAIT)
            await second.result(timeout=WAIT)
        answer, events = await explained(app, second.id)
    assert kinds(events) == ["parked", "granted"]
    assert events[0].detail["key"] == "model:big"
    parked = [s for s in answer.segments if s.what == "parked"]
    assert len(parked) == 1
    assert parked[0].why == "parked on throttle key model:big (limit 1) in its tenant's group"
    assert (parked[0].cause, parked[0].about) == ("throttle", ("model:big",))
    assert parked[0].ms >= 200  # it waited for the first job, which held the key 300 ms
    assert "parked on throttle key model:big (limit 1) in its tenant's group" in answer.summary
    # the release woke it: back in its queue with an offer, waiting for a worker slot
    assert events[1].detail["key"] == "model:big"
    woken = [s for s in answer.segments if s.what == "queued" and s.from_ms == events[1].ms]
    assert len(woken) == 1 and woken[0].why.startswith("woken by throttle key model:big")
    assert "throttle" in answer.causes
    assert answer.summary.endswith("; completed.")


# -- 2. its class's capacity, borrowed by another class ---------------------------------------


async def test_a_job_whose_class_share_was_borrowed_names_the_borrowing_class(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    # four slots, two each; guaranteed lends all of its two while it has nothing to run
    app.lane(
        "default",
        classes=[
            ServiceClass("guaranteed", nominal_share=0.5, lendable=1.0),
            ServiceClass("standard", nominal_share=0.5),
        ],
    )
    running = 0
    all_started = asyncio.Event()

    @app.task
    async def hold(seconds: float) -> None:
        nonlocal running
        running += 1
        if running == 4:
            all_started.set()
        await asyncio.sleep(seconds)

    async with app:
        flood = await hold.enqueue_many([(0.4,)] * 4, tenant="bulk")
        async with running_worker(app, concurrency=4):
            async with asyncio.timeout(WAIT):
                await all_started.wait()  # standard holds all four slots, two of them lent
            urgent = await hold.enqueue(0.0, tenant="vip", service_class="guaranteed")
            await urgent.result(timeout=WAIT)
            for job in flood:
                await job.result(timeout=WAIT)
        answer, events = await explained(app, urgent.id)
    assert events == []  # dispatch's view rides on the record (qw), not on an event
    queued = answer.segments[0]
    assert queued.what == "queued" and queued.cause == "class"
    assert queued.about == ("standard",)
    assert queued.why.startswith("waited for capacity in class guaranteed while class standard")
    assert queued.why.endswith("was borrowing")
    assert queued.ms >= 300  # until the first standard job gave a slot back
    assert "class standard (holding " in answer.summary and ", its share 2)" in answer.summary


# -- 3. fair dispatch: other tenants' work in its class -----------------------------------------


async def test_a_job_behind_other_tenants_is_explained_by_fair_dispatch(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    started = asyncio.Event()

    @app.task
    async def work(seconds: float) -> None:
        started.set()
        await asyncio.sleep(seconds)

    async with app:
        flood = await work.enqueue_many([(0.05,)] * 20, tenant="flood")
        async with running_worker(app, concurrency=1):  # a one-slot lane
            async with asyncio.timeout(WAIT):
                await started.wait()
            quiet = await work.enqueue(0.0, tenant="quiet")
            await quiet.result(timeout=WAIT)
            for job in flood:
                await job.result(timeout=WAIT)
        answer, events = await explained(app, quiet.id)
    assert events == []
    queued = answer.segments[0]
    assert (queued.what, queued.cause) == ("queued", "tenants")
    assert queued.why == (
        "queued behind other tenants' work in class standard "
        "(fair dispatch shared it with 1 other tenant)"
    )
    assert queued.ms > 0  # a flood job held the one slot when it came
    assert answer.summary.startswith("Waited ")
    assert answer.causes == ("tenants",)


# -- 4. admission deferral ---------------------------------------------------------------------


async def test_a_deferred_job_is_explained_by_admission_and_its_reason(
    redis_url: str, namespace: str
) -> None:
    config = parse_config(
        {
            "pools": {
                "default": {
                    "capacity_units": 1,
                    "classes": {
                        "standard": {
                            "nominal_share": 1.0,
                            "max_queue": 100,
                            "response_when_full": "defer",
                        }
                    },
                }
            },
            "estimation": {"safety_multiplier": 1.0},
        }
    )
    app = App(namespace, redis_url=redis_url, settings=fast_settings(), config=config)
    release = asyncio.Event()

    @app.task
    async def blocker() -> None:
        await release.wait()

    @app.task
    async def later() -> None:
        return None

    async with app:
        held = await blocker.submit(tenant="a")
        waiting = await later.submit(tenant="b")
        assert (held.status, waiting.status, waiting.reason) == (
            "accepted",
            "deferred",
            "class_full",
        )
        assert held.job is not None and waiting.job is not None
        async with running_worker(app, concurrency=2):
            await asyncio.sleep(0.2)
            release.set()
            await waiting.job.result(timeout=WAIT)
        answer, events = await explained(app, waiting.job.id)
        held_events = await app.store.job_events(held.job.id)
    assert held_events == []  # the accepted one logged nothing
    assert kinds(events) == ["submitted", "admitted"]
    assert events[0].detail == {"v": "deferred", "why": "class_full", "cls": "standard"}
    deferred = [s for s in answer.segments if s.what == "deferred"]
    assert [s.why for s in deferred] == ["deferred by admission (class_full in standard)"]
    assert (deferred[0].cause, deferred[0].about) == ("admission", ("class_full",))
    assert deferred[0].ms >= 150
    assert "deferred by admission (class_full in standard)" in answer.summary


# -- 5. retry backoff --------------------------------------------------------------------------


async def test_a_retried_job_is_explained_by_its_backoff(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    calls: list[int] = []

    @app.task(attempts=3, backoff=Backoff(0.3, 0.3, "none"))
    async def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first attempt fails")
        return "ok"

    async with app:
        job = await flaky.enqueue(tenant="a")
        async with running_worker(app) as worker:
            assert await job.result(timeout=WAIT) == "ok"
        answer, events = await explained(app, job.id)
    assert kinds(events) == ["retry", "due"]
    retry = events[0].detail
    assert (retry["delay"], retry["err"], retry["att"], retry["wk"]) == (
        300,
        "RuntimeError",
        1,
        worker.id,
    )
    assert retry["start"] <= events[0].ms  # the failed attempt's start, which the record forgot
    assert [s.what for s in answer.segments] == [
        "queued",
        "running",
        "backoff",
        "queued",
        "running",
    ]
    assert (
        answer.segments[1].why
        == f"attempt 1 on worker {answer.segments[1].worker}, failed with RuntimeError"
    )
    backoff = answer.segments[2]
    assert backoff.why == "retry backoff (300 ms after RuntimeError)"
    assert (backoff.cause, backoff.about) == ("backoff", ("RuntimeError",))
    assert backoff.ms >= 300
    assert answer.segments[4].attempt == 2
    assert "(attempt 2 of 3, after a" in answer.summary
    assert "retry backoff (300 ms after RuntimeError)" in answer.summary


# -- 6. a plain job logs nothing; events go with their record ----------------------------------


async def test_a_plain_job_logs_no_event_and_is_explained_from_its_record(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task
    async def plain(n: int) -> int:
        await asyncio.sleep(0.05)
        return n

    async with app:
        job = await plain.enqueue(1, tenant="a")
        async with running_worker(app) as worker:
            assert await job.result(timeout=WAIT) == 1
        answer, events = await explained(app, job.id)
    assert events == []
    assert not await app_keys(redis_url, namespace, f"ev:{job.id}")
    assert [e.kind for e in answer.events] == ["submitted", "dispatched", "completed"]
    assert all(e.derived for e in answer.events)
    assert [s.what for s in answer.segments] == ["queued", "running"]
    assert answer.segments[0].why == "queued for a worker slot in class standard"
    assert answer.segments[1].worker == worker.id
    assert answer.segments[1].ms >= 50
    assert answer.status == "completed"
    assert f"on worker {worker.id} (attempt 1 of " in answer.summary
    assert answer.summary.endswith("; completed.")


async def test_retention_removes_a_jobs_events_with_its_record(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task(retention=Retention(completed=1))
    async def later(n: int) -> int:
        return n

    async with app:
        job = await later.enqueue(1, tenant="a", delay=0.05)
        async with running_worker(app):
            assert await job.result(timeout=WAIT) == 1
            answer, events = await explained(app, job.id)
            assert kinds(events) == ["scheduled", "due"]
            assert answer.segments[0].what == "scheduled"
            await (await later.enqueue(2, tenant="a")).result(timeout=WAIT)

            async def gone() -> bool:
                return not await app_keys(redis_url, namespace, f"ev:{job.id}")

            await eventually(gone)
        assert await app.store.job_record(job.id) == {}


# -- the explanation itself, on synthetic records and events ------------------------------------


def ev(ms: int, kind: str, **detail: Any) -> Event:
    return Event(ms, kind, detail)


def test_explain_rebuilds_attempts_from_the_record_and_the_events_that_ended_them() -> None:
    record = {
        "st": b"completed",
        "cls": b"guaranteed",
        "max": b"3",
        "att": b"2",
        "enq": b"0",
        "start": b"7000",
        "wk": b"w2",
        "fin": b"8100",
        "qw": b'{"by":{"batch":[3,0]},"ten":2}',
        "lim": msgspec.msgpack.encode([["doc:1", 2]]),
    }
    events = [
        ev(0, "submitted", v="deferred", why="class_full", cls="guaranteed"),
        ev(3900, "admitted", at=3900),
        ev(4000, "parked", key="doc:1"),
        ev(4500, "granted", key="doc:1"),
        ev(4700, "retry", delay=2000, err="Timeout", at=6700, start=4600, wk="w1", att=1),
        ev(6700, "due"),
    ]
    answer = explain(record, events)
    assert [(e.ms, e.kind, e.derived) for e in answer.events] == [
        (0, "submitted", False),
        (3900, "admitted", False),
        (4000, "parked", False),
        (4500, "granted", False),
        (4600, "dispatched", True),
        (4700, "retry", False),
        (6700, "due", False),
        (7000, "dispatched", True),
        (8100, "completed", True),
    ]
    assert [(s.from_ms, s.to_ms, s.what, s.cause) for s in answer.segments] == [
        (0, 3900, "deferred", "admission"),
        (3900, 4000, "queued", "slot"),
        (4000, 4500, "parked", "throttle"),
        (4500, 4600, "queued", "slot"),
        (4600, 4700, "running", ""),
        (4700, 6700, "backoff", "backoff"),
        (6700, 7000, "queued", "class"),
        (7000, 8100, "running", ""),
    ]
    assert answer.causes == ("admission", "slot", "throttle", "backoff", "class")
    assert (answer.waited_ms, answer.ran_ms) == (6900, 1200)
    assert answer.summary == (
        "Waited 6.9 s: 3.9 s deferred by admission (class_full in guaranteed), "
        "100 ms queued for a worker slot in class guaranteed, "
        "500 ms parked on throttle key doc:1 (limit 2) in its tenant's group, "
        "100 ms woken by throttle key doc:1 (its waiters served fairly by tenant), back in "
        "its tenant's queue in class guaranteed with an offer on its keys, taking the key's "
        "slot with a worker slot, "
        "2.0 s retry backoff (2.0 s after Timeout), "
        "300 ms waited for capacity in class guaranteed while class batch (holding 3 slots, "
        "its share 0) was borrowing, and fair dispatch shared it with 2 other tenants; "
        "ran 1.1 s on worker w2 (attempt 2 of 3, after a 2.0 s retry backoff, "
        "earlier attempts ran 100 ms); completed."
    )


def test_explain_reads_events_as_earlier_versions_logged_them() -> None:
    record = {"st": b"failed", "cls": b"standard", "max": b"1", "att": b"1", "fin": b"900"}
    events = [
        ev(0, "submitted", v="accepted", cls="standard"),
        ev(100, "dispatched", wk="w1", att=1, cls="standard"),
        ev(900, "failed", err="ValueError"),
    ]
    answer = explain(record, events)
    assert [e.derived for e in answer.events] == [False, False, False]
    assert [(s.what, s.why) for s in answer.segments] == [
        ("queued", "queued for a worker slot in class standard"),
        ("running", "attempt 1 on worker w1, failed (ValueError)"),
    ]


def test_explain_an_attempt_stopped_at_its_deadline_apart_from_an_early_expiry() -> None:
    err = json.dumps({"type": "DeadlineExceeded", "message": "late", "traceback": ""})
    record = {
        "st": b"expired", "cls": b"standard", "enq": b"0", "start": b"100", "wk": b"w1",
        "att": b"1", "max": b"3", "dl": b"2000", "fin": b"2004", "err": err.encode(),
    }  # fmt: skip
    stopped = explain(record, [])
    assert [(s.what, s.why, s.cause) for s in stopped.segments] == [
        ("queued", "queued for a worker slot in class standard", "slot"),
        (
            "running",
            "attempt 1 on worker w1, stopped at its deadline while running, expired "
            "(DeadlineExceeded)",
            "deadline",
        ),
    ]
    assert stopped.summary.endswith("; expired at its deadline while running.")
    # expired before its deadline: a retry that would have come after it
    early = explain({**record, "fin": b"1500"}, [])
    assert early.segments[-1].why == "attempt 1 on worker w1, expired (DeadlineExceeded)"
    assert early.summary.endswith("; expired.")


def test_explain_an_unfinished_job_a_lost_worker_and_a_redrive() -> None:
    waiting = explain({"st": b"queued", "enq": b"1000", "cls": b"standard"}, [], now_ms=3500)
    assert waiting.segments[0].open and waiting.segments[0].ms == 2500
    assert waiting.summary == (
        "Waited 2.5 s so far: 2.5 s queued for a worker slot in class standard; not started yet."
    )
    err = json.dumps({"type": "LeaseExpired", "message": "lost", "traceback": ""})
    record = {"st": b"running", "enq": b"0", "att": b"1", "start": b"5000", "wk": b"w2"}
    events = [
        ev(3000, "reclaimed", wk="w1", att=1, start=10),
        ev(3000, "retry", delay=0, err="LeaseExpired", at=3000, start=10, att=1),
        ev(3000, "due"),
        ev(4000, "redriven", start=3100, wk="w1", att=2, fin=3500, err="LeaseExpired"),
    ]
    answer = explain({**record, "err": err.encode()}, events, now_ms=6000)
    assert [(s.from_ms, s.to_ms, s.what) for s in answer.segments] == [
        (0, 10, "queued"),
        (10, 3000, "running"),
        (3000, 3000, "backoff"),
        (3000, 3100, "queued"),
        (3100, 3500, "running"),
        (4000, 5000, "queued"),
        (5000, 6000, "running"),
    ]
    assert answer.segments[1].why == "attempt 1 on worker w1, lost (its lease expired)"
    assert answer.segments[4].why == "attempt 2 on worker w1, failed (LeaseExpired)"
    assert answer.segments[-1].open


def test_decode_event_reads_what_the_scripts_pack() -> None:
    raw = msgspec.msgpack.encode([12, "parked", {"key": "k"}])
    assert decode_event(raw) == Event(12, "parked", {"key": "k"})
    # an empty Lua table packs as an empty array
    assert decode_event(msgspec.msgpack.encode([5, "completed", []])) == Event(5, "completed", {})


# -- the command --------------------------------------------------------------------------------


def test_the_explain_command_prints_the_answer_and_json(
    tmp_path: Path, namespace: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli, spec = explain_command(tmp_path, monkeypatch, namespace, redis_url)

    async def one_job() -> str:
        app = make_app(namespace, redis_url)

        @app.task
        async def hello(n: int) -> int:
            return n

        async with app:
            job = await hello.enqueue(7, tenant="a")
            async with running_worker(app):
                await job.result(timeout=WAIT)
        return job.id

    job_id = asyncio.run(one_job())
    shown = CliRunner().invoke(cli, ["explain", spec, job_id], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    print(shown.output)
    assert "queued for a worker slot in class standard" in shown.output
    assert shown.output.splitlines()[1].endswith("; completed.")
    as_json = CliRunner().invoke(cli, ["explain", spec, job_id, "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    assert data["status"] == "completed"
    assert [(e["kind"], e["derived"]) for e in data["events"]] == [
        ("submitted", True),
        ("dispatched", True),
        ("completed", True),
    ]
    assert [s["what"] for s in data["segments"]] == ["queued", "running"]
    missing = CliRunner().invoke(cli, ["explain", spec, "nope"])
    assert missing.exit_code == 1
