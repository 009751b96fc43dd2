"""Lifecycle events and ``explain`` end to end: one job per cause of waiting.

Each test runs real jobs through a real server and an in-process worker, reads the
job's record and events back (``Store.job_events``) and checks that the explanation
names the cause: a throttle key, an admission deferral and its reason, a retry
backoff, fair dispatch within a class, or nothing at all (a plain job). A pure test
of ``fairlane.explain`` on synthetic events pins the sentence itself. Assertions are
about causes and order, never about exact timings.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import typer
from typer.testing import CliRunner

from fairlane import App, Backoff, Retention
from fairlane.cli.explain import explain as explain_command
from fairlane.explain import Event, Explanation, decode_event, explain
from fairlane.pools import parse_config
from tests.e2e.helpers import WAIT, app_keys, eventually, fast_settings, make_app, running_worker

pytestmark = pytest.mark.anyio

APP_SOURCE = """
from fairlane import App
from tests.e2e.helpers import fast_settings

app = App({name!r}, redis_url={url!r}, settings=fast_settings())


@app.task
async def hello(n: int) -> int:
    return n
"""


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

    @app.task(limits={"k": 1})
    async def hold(seconds: float) -> None:
        await asyncio.sleep(seconds)

    async with app:
        first = await hold.enqueue(0.3, tenant="a")
        second = await hold.enqueue(0.01, tenant="b")
        async with running_worker(app, concurrency=2):
            await first.result(timeout=WAIT)
            await second.result(timeout=WAIT)
        answer, events = await explained(app, second.id)
    assert kinds(events) == ["submitted", "parked", "granted", "dispatched", "completed"]
    assert events[1].detail["key"] == "k"
    parked = [s for s in answer.segments if s.what == "parked"]
    assert len(parked) == 1 and parked[0].why == "parked on throttle key k"
    assert "parked on throttle key k" in answer.summary
    assert answer.summary.endswith("; completed.")


# -- 2. admission deferral ---------------------------------------------------------------------


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
    assert kinds(events) == ["submitted", "admitted", "dispatched", "completed"]
    assert events[0].detail == {"v": "deferred", "why": "class_full", "cls": "standard"}
    deferred = [s for s in answer.segments if s.what == "deferred"]
    assert [s.why for s in deferred] == ["deferred by admission (class_full in standard)"]
    assert deferred[0].ms >= 150
    assert "deferred by admission (class_full in standard)" in answer.summary


# -- 3. retry backoff --------------------------------------------------------------------------


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
        async with running_worker(app):
            assert await job.result(timeout=WAIT) == "ok"
        answer, events = await explained(app, job.id)
    assert kinds(events) == [
        "submitted",
        "dispatched",
        "retry",
        "due",
        "dispatched",
        "completed",
    ]
    assert events[2].detail["delay"] == 300
    assert events[2].detail["err"] == "RuntimeError"
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
    assert answer.segments[2].why == "retry backoff (300 ms after RuntimeError)"
    assert answer.segments[2].ms >= 300
    assert "(attempt 2 of 3, after a" in answer.summary
    assert "retry backoff" in answer.summary


# -- 4. fair dispatch within a class ------------------------------------------------------------


async def test_a_job_behind_a_flood_is_explained_by_fair_dispatch(
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
    assert kinds(events) == ["submitted", "dispatched", "completed"]
    queued = answer.segments[0]
    assert (queued.what, queued.why) == ("queued", "queued behind fair dispatch in class standard")
    assert queued.ms > 0  # a flood job held the one slot when it came
    assert answer.summary.startswith("Waited ")
    assert "queued behind fair dispatch in class standard" in answer.summary


# -- 5. a plain job, and its events going with its record --------------------------------------


async def test_a_plain_job_is_submitted_dispatched_completed_and_its_events_expire_with_it(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task(retention=Retention(completed=1))
    async def plain(n: int) -> int:
        await asyncio.sleep(0.05)
        return n

    async with app:
        job = await plain.enqueue(1, tenant="a")
        async with running_worker(app) as worker:
            assert await job.result(timeout=WAIT) == 1
        answer, events = await explained(app, job.id)
        assert kinds(events) == ["submitted", "dispatched", "completed"]
        assert events[1].detail == {"wk": worker.id, "att": 1, "cls": "standard"}
        assert [s.what for s in answer.segments] == ["queued", "running"]
        assert answer.segments[1].worker == worker.id
        assert answer.segments[1].ms >= 50
        assert answer.status == "completed"
        assert f"on worker {worker.id} (attempt 1 of " in answer.summary
        assert answer.summary.endswith("; completed.")
        # retention removes the record and its events together
        async with running_worker(app):
            await (await plain.enqueue(2, tenant="a")).result(timeout=WAIT)

            async def gone() -> bool:
                return not await app_keys(redis_url, namespace, f"ev:{job.id}")

            await eventually(gone)
        assert await app.store.job_record(job.id) == {}


# -- the explanation itself, on synthetic events ------------------------------------------------


def ev(ms: int, kind: str, **detail: Any) -> Event:
    return Event(ms, kind, detail)


def test_explain_adds_up_every_cause_in_one_sentence() -> None:
    record = {"st": b"completed", "cls": b"guaranteed", "max": b"3", "att": b"2"}
    events = [
        ev(0, "submitted", v="deferred", why="class_full", cls="guaranteed"),
        ev(3900, "admitted", at=3900),
        ev(4000, "parked", key="doc:1"),
        ev(4500, "granted", tok=7),
        ev(4600, "dispatched", wk="w1", att=1, cls="guaranteed"),
        ev(4700, "retry", delay=2000, err="Timeout", at=6700),
        ev(6700, "due"),
        ev(7000, "dispatched", wk="w1", att=2, cls="guaranteed"),
        ev(8100, "completed"),
    ]
    answer = explain(record, events)
    assert [(s.from_ms, s.to_ms, s.what) for s in answer.segments] == [
        (0, 3900, "deferred"),
        (3900, 4000, "queued"),
        (4000, 4500, "parked"),
        (4500, 4600, "queued"),
        (4600, 4700, "running"),
        (4700, 6700, "backoff"),
        (6700, 7000, "queued"),
        (7000, 8100, "running"),
    ]
    assert (answer.waited_ms, answer.ran_ms) == (6900, 1200)
    assert answer.summary == (
        "Waited 6.9 s: 3.9 s deferred by admission (class_full in guaranteed), "
        "400 ms queued behind fair dispatch in class guaranteed, "
        "500 ms parked on throttle key doc:1, "
        "100 ms waiting for a worker slot in class guaranteed after its throttle grant, "
        "2.0 s retry backoff (2.0 s after Timeout); "
        "ran 1.1 s on worker w1 (attempt 2 of 3, after a 2.0 s retry backoff, "
        "earlier attempts ran 100 ms); completed."
    )


def test_explain_an_unfinished_job_and_a_record_without_events() -> None:
    waiting = explain(
        {"st": b"queued"}, [ev(1000, "submitted", v="accepted", cls="standard")], now_ms=3500
    )
    assert waiting.segments[0].open and waiting.segments[0].ms == 2500
    assert waiting.summary == (
        "Waited 2.5 s so far: 2.5 s queued behind fair dispatch in class standard; not started yet."
    )
    old = explain(
        {"st": b"completed", "enq": b"0", "start": b"250", "fin": b"1250", "wk": b"w"}, []
    )
    assert [s.what for s in old.segments] == ["queued", "running"]
    assert old.ran_ms == 1000


def test_decode_event_reads_what_the_scripts_pack() -> None:
    raw = msgspec.msgpack.encode([12, "parked", {"key": "k"}])
    assert decode_event(raw) == Event(12, "parked", {"key": "k"})
    # an empty Lua table packs as an empty array
    assert decode_event(msgspec.msgpack.encode([5, "completed", []])) == Event(5, "completed", {})


# -- the command --------------------------------------------------------------------------------


def test_the_explain_command_prints_the_answer_and_json(
    tmp_path: Path, namespace: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"explained_{namespace}"
    (tmp_path / f"{module}.py").write_text(APP_SOURCE.format(name=namespace, url=redis_url))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])

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
    cli = typer.Typer()
    cli.command("explain")(explain_command)
    cli.command("noop")(lambda: None)  # two commands: the first is a subcommand, not the app
    spec = f"{module}:app"
    shown = CliRunner().invoke(cli, ["explain", spec, job_id], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    print(shown.output)
    assert "queued behind fair dispatch in class standard" in shown.output
    assert shown.output.splitlines()[1].endswith("; completed.")
    as_json = CliRunner().invoke(cli, ["explain", spec, job_id, "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    assert data["status"] == "completed"
    assert [e["kind"] for e in data["events"]] == ["submitted", "dispatched", "completed"]
    assert [s["what"] for s in data["segments"]] == ["queued", "running"]
    missing = CliRunner().invoke(cli, ["explain", spec, "nope"])
    assert missing.exit_code == 1
