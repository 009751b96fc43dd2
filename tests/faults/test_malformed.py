"""Malformed data in every key a worker reads: dead-lettered with a reason, never run, no crash.

Each test stores good jobs, corrupts what a worker will read (a job record's fields,
a workflow run's history, a tenant queue or the leases set pointing at nothing, a
worker's inbox, a job key of the wrong type, a tenant's settings), then runs a real
worker on it. Every corrupt job must end failed and in the dead-letter set with an
error that says what was wrong; where there is no job left to settle (a dangling id)
the entry is dropped. The task function must never be called for a corrupt job, and
the same worker must go on serving good jobs enqueued afterwards: a worker that
crashes fails the test (``running_workers`` re-raises it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest

import fairlane
from fairlane import App, Backoff
from fairlane.app.job import Job
from fairlane.errors import TaskFailed
from fairlane.store.wire import Outcome, parse_fetched
from tests.e2e.helpers import WAIT, eventually, make_app, running_worker

pytestmark = pytest.mark.anyio

NO_WAIT = Backoff(base=0.01, cap=0.01, jitter="none")
PACK = msgspec.msgpack.Encoder()

Corrupt = Callable[[Any, str], Awaitable[Any]]  # the app's client, a job's key


def _hset(field: str, value: bytes | str) -> Corrupt:
    return lambda client, key: client.hset(key, field, value)


def _hset_optional(field: str, value: bytes | str) -> Corrupt:
    """An optional field (``dl``, ``lim``...) corrupted in a record that holds optional
    fields: its ``x`` says so, as every writer of one sets it (``core.read`` in
    ``store/lua/core.lua``)."""
    return lambda client, key: client.hset(key, mapping={field: value, "x": "1"})


def _hdel(field: str) -> Corrupt:
    return lambda client, key: client.hdel(key, field)


RECORD, ARGS = "MalformedJob", "MalformedArguments"
# label -> (corruption of the job hash, the error type, words its message must hold)
FIELD_CASES: dict[str, tuple[Corrupt, str, str]] = {
    "args not json": (_hset("args", b"{not json"), ARGS, "signature"),
    "args a list": (_hset("args", b"[1, 2]"), ARGS, "signature"),
    "args wrong type": (_hset("args", b'{"n": "seven"}'), ARGS, "do not fit"),
    "args extra field": (_hset("args", b'{"n": 1, "m": 2}'), ARGS, "do not fit"),
    "args empty": (_hset("args", b""), ARGS, "signature"),
    "args missing": (_hdel("args"), RECORD, "field args"),
    "args not utf-8": (_hset("args", b'{"n": "\xff\xfe"}'), RECORD, "field args"),
    "task missing": (_hdel("task"), RECORD, "field task"),
    "task not utf-8": (_hset("task", b"count\xc0"), RECORD, "field task"),
    "tenant not utf-8": (_hset("tenant", b"\xfftenant"), RECORD, "field tenant"),
    "budget not a number": (_hset("max", "three"), RECORD, "field max"),
    "budget fractional": (_hset("max", "2.5"), RECORD, "field max"),
    "budget infinite": (_hset("max", "1e999"), RECORD, "field max"),
    "backoff garbage": (_hset("bo", "soon,later,full"), RECORD, "field bo"),
    "backoff bad jitter": (_hset("bo", "1.0,60.0,sideways"), RECORD, "field bo"),
    "backoff not a spec": (_hset("bo", b"\x00\x01"), RECORD, "field bo"),
    "timeout not a number": (_hset("to", "a while"), RECORD, "field to"),
    "timeout negative": (_hset("to", "-5"), RECORD, "field to"),
    "timeout nan": (_hset("to", "nan"), RECORD, "field to"),
    "deadline not a number": (_hset_optional("dl", "tomorrow"), RECORD, "field dl"),
    "deadline fractional": (_hset_optional("dl", "99999999999999.5"), RECORD, "field dl"),
    "attempt not a number": (_hset("att", "1.5"), RECORD, "field att"),
    "enqueued not a number": (_hset("enq", "1e400"), RECORD, "field enq"),
    "slots not a number": (_hset("sl", "two"), RECORD, "field sl"),
    "slots zero": (_hset("sl", "0"), RECORD, "field sl"),
    "class not utf-8": (_hset("cls", b"standard\xff"), RECORD, "field cls"),
    "limits not msgpack": (_hset_optional("lim", b"\xc1\xc1garbage"), RECORD, "field lim"),
    "limits a string": (_hset_optional("lim", PACK.encode("doc:1")), RECORD, "field lim"),
    "limits bad pair": (_hset_optional("lim", PACK.encode([["doc:1", "x"]])), RECORD, "field lim"),
    "limits a map": (_hset_optional("lim", PACK.encode({"doc:1": 2})), RECORD, "field lim"),
    "priority not a number": (_hset("prio", "high"), RECORD, "field prio"),
    "order not a number": (_hset("seq", "first"), RECORD, "field seq"),
    "charge not a number": (_hset("cu", "lots"), RECORD, "field cu"),
}


async def _dead_with(job: Job[Any], type_name: str, words: str) -> None:
    with pytest.raises(TaskFailed) as caught:
        await job.result(timeout=WAIT)
    assert caught.value.type_name == type_name, caught.value
    assert words in caught.value.message, caught.value.message
    assert await job.status() == "failed"


async def _dead_letters(app: App) -> set[str]:
    return {job_id for job_id, _ in await app.dead_letters(limit=1000)}


async def test_corrupt_job_fields_are_dead_lettered_with_the_field_named(
    redis_url: str, namespace: str
) -> None:
    # no deploy window: a record no worker can run is dead at once, not handed back
    app = make_app(namespace, redis_url, worker={"deploy_window": 0})
    ran: list[int] = []

    @app.task(name="count", attempts=3, backoff=NO_WAIT)
    async def count(n: int) -> int:
        ran.append(n)
        return n

    async with app:
        client = app.store.client
        bad: dict[str, Job[int]] = {}
        for label, (corrupt, _, _) in FIELD_CASES.items():
            job = await count.enqueue(-1)
            await corrupt(client, app.store.keys.job(job.id))
            bad[label] = job
        good = await count.enqueue(1)
        # sound, though unusual: an empty backoff is the default one, no timeout is 0
        defaulted = await count.enqueue(4)
        await client.hset(app.store.keys.job(defaulted.id), mapping={"bo": "", "to": "0"})
        # an optional field written into a record that says it holds none (no x) by
        # something other than Fairlane is not read: the job runs as it was enqueued
        stray = await count.enqueue(5)
        await client.hset(app.store.keys.job(stray.id), mapping={"dl": "tomorrow", "lim": "?"})
        async with running_worker(app) as worker:
            assert await good.result(timeout=WAIT) == 1
            assert await defaulted.result(timeout=WAIT) == 4
            assert await stray.result(timeout=WAIT) == 5
            for label, job in bad.items():
                _, type_name, words = FIELD_CASES[label]
                try:
                    await _dead_with(job, type_name, words)
                except BaseException as exc:
                    raise AssertionError(f"{label}: {exc}") from exc
            # the worker survived every one of them and still serves
            assert await (await count.enqueue(2)).result(timeout=WAIT) == 2
            assert worker.statistics().fenced == 0
        assert await _dead_letters(app) == {job.id for job in bad.values()}
        for label, job in bad.items():
            # failed on its first lease at most (never leased: no attempt, absent)
            att = await client.hget(app.store.keys.job(job.id), "att")
            assert att in (None, b"0", b"1", b"1.5"), f"{label}: attempts {att!r}"
            # and still shown, the field that does not parse left at its default
            info = await job.info()
            assert (info.id, info.status) == (job.id, "failed"), label
            assert info.error, label
        # the lane's counts of waiting and running slots are back to nothing, a damaged
        # width (0, a fraction, text) read as the width the job was counted at
        state = await client.hgetall(app.store.keys.lane("default").state)
        counts = {k: v for k, v in state.items() if k[:2] in (b"d:", b"f:", b"g:")}
        assert counts and set(counts.values()) == {b"0"}, counts
    assert sorted(ran) == [1, 2, 4, 5], "a corrupt job was executed"


async def test_unknown_task_is_dead_lettered_after_its_attempts_never_run(
    redis_url: str, namespace: str
) -> None:
    # no deploy window: a record no worker can run is dead at once, not handed back
    app = make_app(namespace, redis_url, worker={"deploy_window": 0})
    ran: list[str] = []

    @app.task(name="known", attempts=2, backoff=NO_WAIT)
    async def known(tag: str) -> str:
        ran.append(tag)
        return tag

    async with app:
        job = await known.enqueue("renamed")
        await app.store.client.hset(app.store.keys.job(job.id), "task", "no.such.task")
        async with running_worker(app):
            await _dead_with(job, "UnknownTask", "no.such.task")
            assert await (await known.enqueue("good")).result(timeout=WAIT) == "good"
        assert await _dead_letters(app) == {job.id}
    assert ran == ["good"]


async def test_dangling_ids_and_wrong_key_types_are_dropped(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    ran: list[int] = []

    @app.task(name="count", attempts=3, backoff=NO_WAIT)
    async def count(n: int) -> int:
        ran.append(n)
        return n

    async with app:
        client, keys = app.store.client, app.store.keys
        # a tenant queue and a scheduled set pointing at records that are gone
        queued = await count.enqueue(-1)
        scheduled = await count.enqueue(-2, delay=0.2)
        await client.delete(keys.job(queued.id), keys.job(scheduled.id))
        # a job key that is no longer a hash
        clobbered = await count.enqueue(-3)
        await client.delete(keys.job(clobbered.id))
        await client.set(keys.job(clobbered.id), "not a hash")
        # the leases set naming a job that does not exist
        await client.zadd(keys.leases, {"ghost-lease": 0})
        good = await count.enqueue(1)
        async with running_worker(app):
            assert await good.result(timeout=WAIT) == 1

            async def settled() -> bool:
                lane = keys.lane(app.settings.default_lane)
                waiting = await client.zcard(lane.delayed)
                queue = keys.tenant_queue(app.settings.default_lane, "standard", "default")
                leased = await client.zrange(keys.leases, 0, -1)
                return waiting == 0 and await client.zcard(queue) == 0 and not leased

            await eventually(settled)
            assert await (await count.enqueue(2)).result(timeout=WAIT) == 2
        assert await client.get(keys.job(clobbered.id)) == b"not a hash"  # left for a human
    assert sorted(ran) == [1, 2]


async def test_garbage_in_a_workers_inbox_is_dropped(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)

    @app.task(name="echo")
    async def echo(n: int) -> int:
        return n

    async with app:
        client, keys = app.store.client, app.store.keys
        async with running_worker(app) as worker:
            assert await (await echo.enqueue(1)).result(timeout=WAIT) == 1
            inbox = keys.inbox(worker.id)
            # while it blocks on its inbox (BLPOP), and while it is busy (exchange reads it)
            for junk in (b"\xc1 not msgpack", PACK.encode("a string"), PACK.encode([1, 2])):
                await client.rpush(inbox, junk)
                await asyncio.sleep(0.1)
                assert await (await echo.enqueue(2)).result(timeout=WAIT) == 2
            await client.rpush(inbox, b"\xc1", PACK.encode({"a": 1}))
            jobs = await echo.enqueue_many([(n,) for n in range(50)])
            assert [await j.result(timeout=WAIT) for j in jobs] == list(range(50))
            assert await client.llen(inbox) == 0


async def _not_a_list(client: Any, key: str) -> None:
    await client.delete(key)
    await client.set(key, "steps")


async def test_corrupt_run_history_fails_the_run_at_once(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    calls: list[str] = []

    async def step(tag: str) -> str:
        calls.append(tag)
        return tag

    @app.workflow(name="flow", attempts=3, backoff=NO_WAIT)
    async def flow(ctx: fairlane.Context, tag: str) -> str:
        first = await ctx.step("first", step, f"{tag}/first")
        await ctx.wait_for_signal("go", timeout=60)  # corrupted while it waits here
        return first + await ctx.step("second", step, f"{tag}/second")

    corruptions: dict[str, Corrupt] = {
        "not msgpack": lambda c, k: c.rpush(k, b"\xc1\xc1"),
        "wrong arity": lambda c, k: c.rpush(k, PACK.encode(["step", "x"])),
        "wrong types": lambda c, k: c.lset(k, 0, PACK.encode([1, 2, 3, 4, "ms", 6, 7])),
        "not a list": _not_a_list,
        "bad step value": lambda c, k: c.lset(
            k, 0, PACK.encode(["step", "first", "ok", "}{", 1, "w", 1])
        ),
        "bad failure count": lambda c, k: c.hset(k.replace(":steps", ":h"), "a:second", "x"),
    }
    async with app:
        client, keys = app.store.client, app.store.keys
        runs = {label: await flow.enqueue(label) for label in corruptions}
        async with running_worker(app):
            # every run checkpoints its first step, then sleeps
            async def first_steps_done() -> bool:
                lengths = [await client.llen(keys.run(r.id, "steps")) for r in runs.values()]
                return all(n >= 1 for n in lengths)

            await eventually(first_steps_done)
            for label, corrupt in corruptions.items():
                await corrupt(client, keys.run(runs[label].id, "steps"))
                assert await app.signal(runs[label].id, "go", True) == "delivered"
            for label, run in runs.items():
                try:
                    await _dead_with(run, "fairlane.store.runs.CorruptRunHistory", "history")
                except BaseException as exc:
                    raise AssertionError(f"{label}: {exc}") from exc
                assert (await run.info()).attempts <= 2, label  # failed at once, no retry
            good = await flow.enqueue("good")
            assert await app.signal(good.id, "go", True) == "delivered"  # kept until it waits
            assert await good.result(timeout=WAIT) == "good/firstgood/second"
        assert await _dead_letters(app) == {r.id for r in runs.values()}
    # each corrupt run's first step ran once, in the slice before the corruption; no
    # step ran after it
    assert sorted(calls) == sorted(
        [f"{label}/first" for label in corruptions] + ["good/first", "good/second"]
    )


async def test_corrupt_tenant_settings_do_not_stop_dispatch(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)

    @app.task(name="echo")
    async def echo(n: int) -> int:
        return n

    async with app:
        await app.tenants.configure("acme", max_concurrency=2)
        await app.store.client.hset(app.store.keys.tlimits, "acme", "two,lots,,")
        async with running_worker(app):
            jobs = await echo.enqueue_many([(n,) for n in range(5)], tenant="acme")
            assert [await j.result(timeout=WAIT) for j in jobs] == list(range(5))


async def test_a_record_corrupted_while_it_runs_fails_neither_retry_nor_sweep(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)

    @app.task(name="count", attempts=5, backoff=NO_WAIT)
    async def count(n: int) -> int:
        return n

    async with app:
        store, client, keys = app.store, app.store.client, app.store.keys
        lane = [app.settings.default_lane]
        lost, failing = await count.enqueue(1), await count.enqueue(2)
        # leased by a worker that is about to vanish (this test, by hand)
        fetched = await store.exchange("gone:1:x", lane, 2, 60_000)
        assert {j.id for j in fetched.jobs} == {lost.id, failing.id}
        for job in (lost, failing):
            # (a deadline is an optional field: a record holding one says so in `x`)
            await client.hset(keys.job(job.id), mapping={"bo": "x,y,full", "dl": "soon", "x": "1"})
        # one attempt fails and is retried; the other's lease lapses and is swept
        token = next(j.token for j in fetched.jobs if j.id == failing.id)
        err = b'{"type":"E","message":"m","traceback":""}'.decode()
        assert await store.ack(lane, [Outcome(failing.id, token, "retry", err)]) == [1]
        await client.zadd(keys.leases, {lost.id: 0})
        retried, dead = await store.sweep(100, 1, 600_000)
        assert (retried, dead) == ([lost.id], [])
        # both wait for another attempt, which their corrupt record now refuses
        async with running_worker(app):
            for job in (lost, failing):
                await _dead_with(job, RECORD, "field dl")
            assert await (await count.enqueue(3)).result(timeout=WAIT) == 3


def test_a_fetched_row_the_worker_cannot_read_is_set_aside() -> None:
    good = ["j1", "7", 1, "count", '{"n": 1}', 0, 0, "default", 3, "1.0,60.0,full", 5, 1]
    bad = ["j2", "8", 1.5, "count", '{"n": 1}', 0, 0, "default", 3, "1.0,60.0,full", 5, 1]
    unreadable = [None]
    fetched = parse_fetched(PACK.encode([-1, [], [good, bad, unreadable]]))
    assert [j.id for j in fetched.jobs] == ["j1"]
    assert fetched.malformed == [("j2", "8")]
