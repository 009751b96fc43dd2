"""``explain`` on what a job's attempts took of their own time, and what other jobs'
retries took of its wait -- end to end, through a real server and worker.

* An attempt whose task reports its time in model and tool calls (``report_usage``) is
  told how much of its run that was: the ack carries the two times, an attempt that
  ended in a retry keeps them in its event, the attempt that ended the job on its
  record (``use``); a job that reports nothing keeps nothing.
* A retry due at once starts again in the call that settled its failure, in the same
  millisecond: the timeline keeps the two attempts apart (the event names the start it
  ended).
* A job queued behind a retry storm in its class (one tenant's failing jobs, their
  retries keeping their place at the head of its queue) is told how many retry attempts
  of other jobs started in its class while it waited and their share of the starts
  there, read from the class's ring of starts (``lane:<l>:c:<c>:starts``), through
  ``fairlane explain`` and its ``--json``.
* The ring keeps no more than its span: seconds past it are dropped by the first start
  of a new second.

Counts and sentences, never timings: the figures asserted are the ones the tasks report
and the starts the test makes; a run's own length is only matched as a duration.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fairlane
from fairlane import App, Backoff
from fairlane.app.task import Task
from fairlane.insight.explain import explain
from fairlane.policy.starts import BUCKETS, RETRY_START, bucket_of, unpack
from fairlane.store.records import Event
from fairlane.store.views.starts import class_starts
from tests.e2e.helpers import WAIT, explain_command, make_app, raw_client, running_worker

pytestmark = pytest.mark.anyio

#: one run's length as the sentences write it
RAN = r"ran \d+(\.\d)? m?s"


def _app(namespace: str, redis_url: str) -> tuple[App, Task[[], str]]:
    """An app with a task that reports tokens but no time."""
    app = make_app(namespace, redis_url)

    @app.task
    async def quiet() -> str:
        fairlane.context().report_usage(input_tokens=10)
        return "ok"

    return app, quiet


async def test_an_attempt_is_told_the_time_it_reported_in_model_and_tool_calls(
    redis_url: str, namespace: str
) -> None:
    app, quiet = _app(namespace, redis_url)

    @app.task(attempts=2, backoff=Backoff(0, 0, "none"))
    async def think() -> str:
        ctx = fairlane.context()
        # each attempt runs at least 300 ms: more than it reports
        if ctx.attempt == 1:
            ctx.report_usage(model_seconds=0.2, tool_seconds=0.05)
            await asyncio.sleep(0.3)
            raise ValueError("the model said no")
        ctx.report_usage(model_seconds=0.1, input_tokens=10)
        await asyncio.sleep(0.3)
        return "ok"

    async with app:
        job = await think.enqueue(tenant="acme")
        plain = await quiet.enqueue(tenant="acme")
        async with running_worker(app, concurrency=2):
            assert await job.result(timeout=WAIT) == "ok"
            assert await plain.result(timeout=WAIT) == "ok"
        record = await app.store.read_job(job.id)
        events = await app.store.job_events(job.id)
        kept = await app.store.job_record(plain.id)
        assert kept["st"] == b"completed" and "use" not in kept
    assert record is not None and record.reported_ms == (100, 0)
    [retry] = [e for e in events if e.kind == "retry"]
    assert retry.detail["use"] == "200,50"
    answer = explain(record, events)
    print(answer.summary)
    runs = [s for s in answer.segments if s.what == "running"]
    assert [(s.attempt, s.reported_ms) for s in runs] == [(1, (200, 50)), (2, (100, 0))]
    first = "of which 250 ms in model and tool calls it reported (200 ms model, 50 ms tools)"
    assert re.search(rf"failed with ValueError; {RAN}, {re.escape(first)}$", runs[0].why)
    assert re.search(rf"; {RAN}, of which 100 ms in model calls it reported$", runs[1].why)
    assert re.search(rf"its attempt 1 {RAN}, {re.escape(first)}", answer.summary)
    assert re.search(rf"its attempt 2 {RAN}, of which 100 ms in model calls", answer.summary)
    assert answer.summary.endswith("; completed.")


def test_a_retry_started_again_in_the_millisecond_it_failed_keeps_its_attempts_apart() -> None:
    # a retry due at once starts again in the exchange that settled it: the same ms
    record = {
        "st": "completed", "enq": "1000", "start": "1500", "fin": "1800", "att": "2",
        "wk": "w1", "cls": "standard", "use": "100,0",
    }  # fmt: skip
    retry = {"delay": 0, "err": "ValueError", "at": 1500, "start": 1100, "wk": "w1", "att": 1}
    answer = explain(record, [Event(1500, "retry", {**retry, "use": "200,50"})])
    shown = [(s.what, s.attempt, s.from_ms, s.to_ms, s.reported_ms) for s in answer.segments]
    assert shown == [
        ("queued", 0, 1000, 1100, None),
        ("running", 1, 1100, 1500, (200, 50)),
        ("backoff", 0, 1500, 1500, None),
        ("running", 2, 1500, 1800, (100, 0)),
    ]
    assert answer.segments[1].why == (
        "attempt 1 on worker w1, failed with ValueError; ran 400 ms, of which 250 ms in model "
        "and tool calls it reported (200 ms model, 50 ms tools)"
    )
    # calls made side by side may report more than the attempt ran
    record["use"] = "900,0"
    last = explain(record, [Event(1500, "retry", retry)]).segments[-1]
    assert last.why.endswith(
        "ran 300 ms, and 900 ms in model calls it reported: more than it ran, its calls overlapping"
    )


FLAKY, ATTEMPTS = 3, 4


def test_a_job_behind_a_retry_storm_is_told_the_retries_and_their_share(
    tmp_path: Path, namespace: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli, spec = explain_command(tmp_path, monkeypatch, namespace, redis_url)

    async def storm() -> str:
        app = make_app(namespace, redis_url)

        @app.task(attempts=ATTEMPTS, backoff=Backoff(0, 0, "none"))
        async def flaky(n: int) -> None:
            raise ConnectionError(f"upstream down ({n})")

        @app.task
        async def hello(n: int) -> int:
            return n

        async with app:
            failing = await flaky.enqueue_many([(n,) for n in range(FLAKY)], tenant="acme")
            victim = await hello.enqueue(7, tenant="acme")
            # one slot: each retry is due at once and keeps its place at the head of the
            # tenant's queue, so the victim starts last, after every attempt of the others
            async with running_worker(app, concurrency=1):
                assert await victim.result(timeout=WAIT) == 7
                for job in failing:
                    assert await job.status() == "failed"
            ring = await app.store.read(class_starts(app.store.keys, "default", "standard"))
        counted = [unpack(v) for v in ring.buckets.values()]
        assert (sum(n for n, _ in counted), sum(r for _, r in counted)) == (
            FLAKY * ATTEMPTS + 1,
            FLAKY * (ATTEMPTS - 1),
        )
        return victim.id

    job_id = asyncio.run(storm())
    starts, retries = FLAKY * ATTEMPTS + 1, FLAKY * (ATTEMPTS - 1)
    told = (
        f"meanwhile {retries} retry attempts of other jobs started in class standard: "
        f"{retries / starts:.0%} of the {starts} starts there in the "
    )
    shown = CliRunner().invoke(cli, ["explain", spec, job_id], env={"COLUMNS": "400"})
    assert shown.exit_code == 0, shown.output
    print(shown.output)
    assert told in shown.output
    as_json = CliRunner().invoke(cli, ["explain", spec, job_id, "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    [queued] = [s for s in data["segments"] if s["what"] == "queued"]
    assert re.search(re.escape(told) + r"\d+ s around its wait$", queued["why"])
    assert data["retries"]["starts"] == starts
    assert data["retries"]["others_retries"] == retries
    assert data["causes"][-1] == "retries"
    assert told in data["summary"]


async def test_the_ring_of_starts_keeps_its_span_and_no_more(
    redis_url: str, namespace: str
) -> None:
    app, quiet = _app(namespace, redis_url)
    async with app:
        key = app.store.keys.class_key("default", "standard", "starts")
        now = bucket_of(await app.store.server_time_ms())
        async with raw_client(redis_url) as client:
            # a ring left full of seconds long past, and one second still in its span
            stale = {str(now - BUCKETS - 100 - i): 1 for i in range(BUCKETS + 1)}
            await client.hset(key, mapping={**stale, str(now - 10): RETRY_START + 2})
            job = await quiet.enqueue(tenant="acme")
            async with running_worker(app):
                assert await job.result(timeout=WAIT) == "ok"
            fields = await client.hgetall(key)
    seconds = {int(k): int(v) for k, v in fields.items()}
    assert len(seconds) <= BUCKETS + 1
    assert min(seconds) == now - 10 and unpack(seconds[now - 10]) == (2, 1)
    # the job's start, counted in its second (one second later, should the clock turn)
    assert sum(unpack(v)[0] for s, v in seconds.items() if s >= now) == 1
