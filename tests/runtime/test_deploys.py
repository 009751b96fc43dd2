"""Rolling deploys with real workers on a real server: jobs a worker cannot run wait for one
that can, within a deploy window, without spending attempts.

Two apps of one name stand for two versions of the same code: the producer's (newer)
task takes an argument the older worker's does not, or the older worker has no such task
at all. The older worker hands each such job back (``handback``): it is due again after
``worker.handback_delay``, its attempt given back (every task here has one attempt, so
a spent attempt would dead-letter it at once), counted as ``handed_back`` and not as a
retry or a failure, and the job runs on the newer worker that replaces it. Past
``worker.deploy_window`` from its first hand-back it is dead-lettered with the reason.
A task declared with ``unknown_kwargs="drop"`` runs such a job without the argument,
on the async path and in a process child (which decodes the arguments again).
"""

from __future__ import annotations

from typing import Any

import pytest

from fairlane import App, TaskFailed
from fairlane.insight.explain import explain
from fairlane.store.records import JobRecord
from tests.e2e.helpers import WAIT, children_import_tests, eventually, make_app, running_worker

pytestmark = pytest.mark.anyio

NAME = "deploys.greet"
#: hand-backs come round quickly here; the window outlasts every test
DEPLOY: dict[str, Any] = {"deploy_window": 60.0, "handback_delay": 0.05}


def greet_sync(name: str) -> str:
    """The older version, run in a process child (imported there by path)."""
    return f"hello {name}"


async def record_of(app: App, job_id: str) -> JobRecord:
    record = await app.sharded.store_for_job(job_id).read_job(job_id)
    assert record is not None
    return record


async def handed_back(app: App, at_least: int) -> bool:
    return (await app.stats()).get("handed_back", 0) >= at_least


async def test_an_argument_an_older_worker_lacks_waits_for_a_newer_worker(
    redis_url: str, namespace: str
) -> None:
    old = make_app(namespace, redis_url, worker=DEPLOY)
    new = make_app(namespace, redis_url, worker=DEPLOY)
    ran: list[str] = []

    @old.task(name=NAME, attempts=1)
    async def greet_v1(name: str) -> str:
        ran.append("v1")
        return f"hello {name}"

    @new.task(name=NAME, attempts=1)
    async def greet_v2(name: str, shout: bool = False) -> str:
        ran.append("v2")
        text = f"hello {name}"
        return text.upper() if shout else text

    async with old, new:
        job = await greet_v2.enqueue("ann", shout=True)
        async with running_worker(old):
            await eventually(lambda: handed_back(new, 3))
        waiting = await record_of(new, job.id)
        # no attempt spent: with one attempt, a failure would have dead-lettered it
        assert waiting.status in ("scheduled", "queued"), waiting
        assert waiting.attempts == 0
        assert waiting.failure is not None and waiting.failure.type == "MalformedArguments"
        assert "unknown field `shout`" in waiting.failure.message
        assert "handed back for another worker" in waiting.failure.message
        # the rolling deploy replaces the older worker with a newer one
        async with running_worker(new):
            assert await job.result(timeout=WAIT) == "HELLO ANN"
        done = await record_of(new, job.id)
        stats = await new.stats()
        events = await new.store.job_events(job.id)
    assert ran == ["v2"]
    assert done.attempts == 1
    assert "retried" not in stats and "failed" not in stats, stats
    handbacks = [e for e in events if e.kind == "handback"]
    assert len(handbacks) == stats["handed_back"] >= 3
    answer = explain(done, events)
    print(answer.summary)
    assert "deploy" in answer.causes
    assert any("handed back for another worker" in s.why for s in answer.segments)


async def test_past_the_deploy_window_the_job_is_dead_lettered_with_the_reason(
    redis_url: str, namespace: str
) -> None:
    old = make_app(namespace, redis_url, worker={"deploy_window": 0.3, "handback_delay": 0.05})
    new = make_app(namespace, redis_url)

    @old.task(name=NAME, attempts=1)
    async def greet_v1(name: str) -> str:
        return f"hello {name}"

    @new.task(name=NAME, attempts=1)
    async def greet_v2(name: str, shout: bool = False) -> str:
        return name

    async with old, new:
        job = await greet_v2.enqueue("ann", shout=True)
        async with running_worker(old):
            with pytest.raises(TaskFailed) as failed:
                await job.result(timeout=WAIT)
        record = await record_of(new, job.id)
        stats = await new.stats()
        dead = [job_id for job_id, _ in await new.dead_letters()]
    print(failed.value)
    assert failed.value.type_name == "MalformedArguments"
    message = failed.value.message
    assert message.startswith("no worker ran the job within the deploy window (0.3s")
    assert f"task {NAME!r}" in message and "unknown field `shout`" in message
    assert 'unknown_kwargs="drop"' in message  # the way out, for an argument it can go without
    # the hand-backs gave their attempts back; the lease that ended it is the one counted
    assert record.status == "failed" and record.attempts == 1
    assert dead == [job.id]
    # each hand-back counted as one; the dead letter as the one failure
    assert stats["handed_back"] >= 2 and stats["failed"] == 1 and "retried" not in stats, stats


async def test_a_window_of_zero_dead_letters_at_the_first_hand_back(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    worker_app = make_app(namespace, redis_url, worker={"deploy_window": 0})
    producer = make_app(namespace, redis_url)

    @producer.task(name="deploys.absent")
    async def absent() -> None:
        return None

    async with worker_app, producer:
        job = await absent.enqueue()
        async with running_worker(worker_app):
            with pytest.raises(TaskFailed) as failed:
                await job.result(timeout=WAIT)
        stats = await producer.stats()
    assert failed.value.type_name == "UnknownTask"
    assert "no task named 'deploys.absent' in this worker" in failed.value.message
    assert "handed_back" not in stats and stats["failed"] == 1, stats
    # the worker's log says what happens, not "handing back ... for up to 0s"
    said = [r.getMessage() for r in caplog.records if "deploys.absent" in r.getMessage()]
    assert said and all("dead-lettering jobs of task" in text for text in said), said


async def test_an_unknown_task_waits_for_a_worker_that_knows_it(
    redis_url: str, namespace: str
) -> None:
    old = make_app(namespace, redis_url, worker=DEPLOY)
    new = make_app(namespace, redis_url, worker=DEPLOY)

    @old.task(name="deploys.other")
    async def other() -> None:
        return None

    @new.task(name="deploys.fresh", attempts=1)
    async def fresh(n: int) -> int:
        return n * 2

    async with old, new:
        job = await fresh.enqueue(21)
        async with running_worker(old):
            await eventually(lambda: handed_back(new, 2))
        waiting = await record_of(new, job.id)
        assert waiting.status in ("scheduled", "queued") and waiting.attempts == 0, waiting
        assert waiting.failure is not None and waiting.failure.type == "UnknownTask"
        async with running_worker(new):
            assert await job.result(timeout=WAIT) == 42
        stats = await new.stats()
    assert "retried" not in stats and "failed" not in stats, stats


@pytest.mark.parametrize("executor", ["async", "process"])
async def test_a_task_that_drops_unknown_arguments_runs_without_them(
    redis_url: str, namespace: str, executor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    children_import_tests(monkeypatch)
    old = make_app(namespace, redis_url, worker=DEPLOY)
    new = make_app(namespace, redis_url)

    async def greet_async(name: str) -> str:
        return f"hello {name}"

    fn = greet_async if executor == "async" else greet_sync
    old.task(name=NAME, attempts=1, executor=executor, unknown_kwargs="drop")(fn)  # type: ignore[call-overload]

    @new.task(name=NAME, attempts=1)
    async def greet_v2(name: str, shout: bool = False, lang: str = "en") -> str:
        return name

    async with old, new:
        jobs = [
            await greet_v2.enqueue("ann", shout=True, lang="fr"),
            await greet_v2.enqueue("bob"),  # fits both versions
        ]
        async with running_worker(old):
            results = [await job.result(timeout=WAIT) for job in jobs]
        stats = await new.stats()
    assert results == ["hello ann", "hello bob"]
    assert "handed_back" not in stats and stats["completed"] == 2, stats


async def test_a_missing_argument_is_handed_back_even_by_a_task_that_drops(
    redis_url: str, namespace: str
) -> None:
    # an older producer's job lacks what the newer task needs: dropping cannot help
    old = make_app(namespace, redis_url)
    new = make_app(namespace, redis_url, worker={"deploy_window": 0.2, "handback_delay": 0.05})

    @old.task(name=NAME, attempts=1)
    async def greet_v1(name: str) -> str:
        return name

    @new.task(name=NAME, attempts=1, unknown_kwargs="drop")
    async def greet_v2(name: str, lang: str) -> str:
        return f"{lang}: {name}"

    async with old, new:
        job = await greet_v1.enqueue("ann")
        async with running_worker(new):
            with pytest.raises(TaskFailed) as failed:
                await job.result(timeout=WAIT)
    assert failed.value.type_name == "MalformedArguments"
    assert "missing required field `lang`" in failed.value.message
    assert "unknown_kwargs" not in failed.value.message  # no advice that would not help
