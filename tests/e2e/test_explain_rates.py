"""``explain`` for jobs on rate keys: parked for tokens, woken by the key, pushed back by
the upstream (``Throttled``), and, while a job still waits, when the key's next tokens
are due and a pause with its cause.

Pure tests pin the sentences from a record, events and the keys' state as the read
model gives it; the end-to-end tests run real jobs through real workers on a real
server and read the answer as the command line and the dashboard do. Assertions are
about causes, keys and order, never about exact timings.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fairlane import App, Throttled
from fairlane.cli.explain import explain as explain_command
from fairlane.insight.explain import Explanation, explain, rate_keys_now, rate_text
from fairlane.policy.rates import Adaptive, Rate
from fairlane.store.records import Event
from fairlane.store.views.rates import JobRates, RateKeyView, job_rates, rate_keys
from tests.e2e.helpers import WAIT, eventually, make_app, running_worker

RATE = Rate(2, per=1.0)


def _record(**fields: bytes) -> dict[str, bytes]:
    return {"st": b"queued", "enq": b"1000", "cls": b"standard", "att": b"0", **fields}


def test_a_job_parked_on_a_rate_key_is_explained_by_the_key_and_its_rate() -> None:
    rates = JobRates({"model:x": RATE})
    done = _record(st=b"completed", att=b"1", start=b"2600", fin=b"2700", wk=b"w1")
    events = [Event(1000, "parked", {"key": "model:x"}), Event(2500, "granted", {"key": "model:x"})]
    answer = explain(done, events, rates=rates)
    parked = [s for s in answer.segments if s.what == "parked"]
    assert len(parked) == 1
    assert parked[0].why == "parked on rate key model:x (2 per 1 s, burst 2) in its tenant's group"
    assert (parked[0].cause, parked[0].about, parked[0].ms) == ("rate", ("model:x",), 1500)
    woken = [s for s in answer.segments if s.from_ms == 2500]
    assert woken[0].why.startswith("woken by rate key model:x, its tokens taken (its waiters")
    assert "rate" in answer.causes and answer.summary.endswith("; completed.")
    # without its rate keys (a record read by an earlier reader), the same key is a
    # throttle key, as before
    plain = explain(done, events)
    assert [s.cause for s in plain.segments if s.what == "parked"] == ["throttle"]


def test_a_job_still_waiting_is_told_when_the_next_tokens_are_due_and_of_a_pause() -> None:
    view = RateKeyView(
        "model:x",
        now_ms=5000,
        rate=RATE,
        tokens=0.2,
        paused_until_ms=8000,
        pause_cause="429 from job j7",
        waiters=3,
        due_ms=8000,
    )
    rates = JobRates({"model:x": RATE}, keys={"model:x": view})
    answer = explain(
        _record(), [Event(1000, "parked", {"key": "model:x"})], now_ms=5000, rates=rates
    )
    last = answer.segments[-1]
    assert last.open and last.what == "parked" and last.cause == "rate"
    assert last.why == (
        "parked on rate key model:x (2 per 1 s, burst 2) in its tenant's group; the key is "
        "paused (429 from job j7) for 3.0 s more, its next tokens are due in 3.0 s"
    )
    # not paused, short of tokens: when they are due (a units key: the job's own cost)
    units = Rate(10, per=1.0, cost="units")
    short = RateKeyView("model:u", 5000, units, tokens=1.0, waiters=1)
    rates = JobRates({"model:u": units}, units=4.0, keys={"model:u": short})
    answer = explain(
        _record(), [Event(1000, "parked", {"key": "model:u"})], now_ms=5000, rates=rates
    )
    assert answer.segments[-1].why.endswith("its next tokens are due in 300 ms")
    # a segment that ended is told nothing of the key's state now
    ended = explain(
        _record(),
        [Event(1000, "parked", {"key": "model:u"}), Event(2000, "granted", {"key": "model:u"})],
        now_ms=5000,
        rates=rates,
    )
    assert "due" not in ended.segments[1].why


def test_a_pushback_ends_the_attempt_and_pauses_the_job_until_the_pause_ends() -> None:
    rates = JobRates({"model:x": RATE}, pushbacks=1)
    done = _record(st=b"completed", att=b"1", start=b"14000", fin=b"14100", wk=b"w1")
    events = [
        # as the store logs it: the pause's end, the pushed attempt; its key is the job's
        Event(2000, "pushback", {"delay": 12000, "err": "Throttled", "at": 14000, "start": 1500}),
        Event(14000, "due", {}),
    ]
    answer = explain(done, events, rates=rates)
    whats = [(s.what, s.from_ms, s.to_ms) for s in answer.segments]
    assert whats == [
        ("queued", 1000, 1500),
        ("running", 1500, 2000),
        ("paused", 2000, 14000),
        ("queued", 14000, 14000),
        ("running", 14000, 14100),
    ]
    running, paused = answer.segments[1], answer.segments[2]
    assert running.why.endswith("pushed back by the upstream on key model:x (Throttled)")
    assert paused.why == (
        "key model:x (2 per 1 s, burst 2) paused for 12.0 s by the upstream's pushback, due "
        "again at the pause's end with its attempt given back"
    )
    assert (paused.cause, paused.about) == ("pushback", ("model:x",))
    # a job on two keys: the key the event names, else none named
    two = JobRates({"model:x": RATE, "user:a/1": RATE})
    named = [Event(2000, "pushback", {"key": "user:a/1", "at": 14000, "start": 1500})]
    assert explain(done, named, rates=two).segments[2].about == ("user:a/1",)
    unnamed = explain(done, events, rates=two).segments[2]
    assert (unnamed.what, unnamed.cause, unnamed.about) == ("paused", "pushback", ())
    assert unnamed.why.startswith("one of its keys paused by the upstream's pushback")


def test_a_jobs_rate_keys_now_in_plain_values() -> None:
    units = Rate(90_000, per=60.0, burst=10_000, cost="units")
    view = RateKeyView(
        "model:gpt",
        5000,
        units,
        tokens=-120.0,
        adaptive=12.5,
        adaptive_bounds=Adaptive(40, 1),
        waiters=1,
    )
    rates = JobRates(
        {"model:gpt": units, "user:a/1": RATE},
        {"model:gpt": Adaptive(40, 1)},
        units=6.8,
        keys={"model:gpt": view},
    )
    rows = {r["key"]: r for r in rate_keys_now(rates)}
    gpt = rows["model:gpt"]
    assert gpt["cost"] == 6.8 and gpt["tokens"] == -120.0
    assert gpt["adaptive"] == {"limit": 12, "max": 40, "min": 1}
    assert gpt["text"].startswith(
        "key model:gpt: 90,000 units per 60 s, burst 10,000; adaptive limit 12 in [1, 40]; "
        "-120.00 tokens now; its next tokens are due in"
    )
    assert rows["user:a/1"]["text"] == "key user:a/1: 2 per 1 s, burst 2"
    assert rate_text(Rate(0.5, per=0.25, burst=1.5)) == "0.5 per 0.25 s, burst 1.5"


# -- end to end: real jobs, a real worker, a real server --------------------------------

APP_SOURCE = """
from fairlane import App
from tests.e2e.helpers import fast_settings

app = App({name!r}, redis_url={url!r}, settings=fast_settings())
"""


async def _explained(app: App, job_id: str) -> Explanation:
    store = app.store_for_job(job_id)
    record = await store.job_record(job_id)
    events = await store.job_events(job_id)
    rates = await store.read(job_rates(store.keys, job_id))
    answer = explain(record, events, now_ms=await store.server_time_ms(), rates=rates)
    print(f"{job_id}: {answer.summary}")
    return answer


@pytest.mark.anyio
async def test_a_job_that_waited_for_tokens_and_one_pushed_back_end_to_end(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    pushed: list[int] = []

    @app.task(rates={"model:x": Rate(20, per=1.0, burst=1)})  # a token each 50 ms
    async def call(n: int) -> int:
        if n == 2 and not pushed:
            pushed.append(n)
            raise Throttled("model:x", retry_after=0.3)
        return n

    async with app:
        jobs = [await call.enqueue(i, tenant="acme") for i in range(3)]
        async with running_worker(app, concurrency=3):
            assert [await j.result(timeout=WAIT) for j in jobs] == [0, 1, 2]
        waited = await _explained(app, jobs[1].id)
        pushed_back = await _explained(app, jobs[2].id)
        info = await jobs[2].info()
    parked = [s for s in waited.segments if s.what == "parked"]
    assert parked and parked[0].cause == "rate" and parked[0].about == ("model:x",)
    assert parked[0].why.startswith("parked on rate key model:x (20 per 1 s, burst 1)")
    assert "rate" in waited.causes and waited.summary.endswith("; completed.")
    # the pushback ended its first run; it ran again after the pause, its attempt given back
    paused = [s for s in pushed_back.segments if s.what == "paused"]
    assert len(paused) == 1 and (paused[0].cause, paused[0].about) == ("pushback", ("model:x",))
    runs = [s for s in pushed_back.segments if s.what == "running"]
    assert len(runs) == 2 and runs[0].why.endswith("(Throttled)")
    assert (runs[0].cause, runs[1].cause) == ("pushback", "")
    assert pushed_back.segments.index(paused[0]) == pushed_back.segments.index(runs[0]) + 1
    assert info.attempts == 1


def test_the_explain_command_tells_a_waiting_job_when_its_tokens_are_due(
    tmp_path: Path, namespace: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"rates_{namespace}"
    (tmp_path / f"{module}.py").write_text(APP_SOURCE.format(name=namespace, url=redis_url))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])

    async def one_waits() -> str:
        app = make_app(namespace, redis_url)

        @app.task(rates={"model:slow": Rate(1, per=60.0)})
        async def call(n: int) -> int:
            return n

        async with app:
            first = await call.enqueue(1, tenant="acme")
            second = await call.enqueue(2, tenant="acme")
            async with running_worker(app, concurrency=2):
                await first.result(timeout=WAIT)

                async def parked() -> bool:
                    events = await app.store.job_events(second.id)
                    return any(e.kind == "parked" for e in events)

                await eventually(parked)
        return second.id

    job_id = asyncio.run(one_waits())
    cli = typer.Typer()
    cli.command("explain")(explain_command)
    cli.command("noop")(lambda: None)  # two commands: the first is a subcommand, not the app
    spec = f"{module}:app"
    shown = CliRunner().invoke(cli, ["explain", spec, job_id], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    print(shown.output)
    text = " ".join(shown.output.split())
    assert "parked on rate key model:slow (1 per 60 s, burst 1) in its tenant's group" in text
    assert "its next tokens are due in" in text
    assert "key model:slow: 1 per 60 s, burst 1;" in text
    as_json = CliRunner().invoke(cli, ["explain", spec, job_id, "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.output)
    (row,) = data["rate_keys"]
    assert row["key"] == "model:slow" and row["rate"]["per"] == 60.0 and row["cost"] == 1.0
    assert row["due_ms"] is not None and row["tokens"] < 1.0
    assert data["segments"][-1]["cause"] == "rate" and data["segments"][-1]["open"]


@pytest.mark.anyio
async def test_a_job_paused_by_its_keys_pushback_is_told_the_pause_and_its_cause(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task(rates={"model:p": Rate(100, per=1.0)})
    async def call(n: int) -> int:
        raise Throttled("model:p", retry_after=60.0, message="429 from the upstream")

    async with app:
        job = await call.enqueue(1, tenant="acme")
        async with running_worker(app, concurrency=1):

            async def pushed() -> bool:
                return any(e.kind == "pushback" for e in await app.store.job_events(job.id))

            await eventually(pushed)
        answer = await _explained(app, job.id)
        view = (await app.store.view(rate_keys)).get("model:p")
    last = answer.segments[-1]
    assert (last.what, last.open, last.cause, last.about) == (
        "paused",
        True,
        "pushback",
        ("model:p",),
    )
    assert "the key is paused (429 from the upstream) for" in last.why
    assert view is not None and view.paused and view.pause_cause == "429 from the upstream"
    assert view.pushbacks == 1 and answer.status == "scheduled"
    run = answer.segments[-2]
    assert (run.what, run.cause, run.about) == ("running", "pushback", ("model:p",))
    assert "(pushed back by the upstream, its attempt given back)" in answer.summary
