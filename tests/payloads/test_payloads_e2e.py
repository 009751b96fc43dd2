"""Large payloads end to end: a real worker, a real server and each payload store.

Arguments and results over the threshold must reach the function and the producer
whole while the job record holds only a reference; a reference is read only when
the attempt runs; one that cannot be read fails the attempt clearly; and retention
of the record takes the payloads with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from fairlane import App, Backoff, Context, Job, Retention, TaskFailed
from fairlane.codec import PayloadTooLarge
from fairlane.codec.refs import decode_ref, is_ref
from fairlane.gateway.ui.actions import retry
from fairlane.payloads import PayloadMissing, PayloadStore
from fairlane.payloads.directory import DirectoryPayloadStore
from fairlane.payloads.s3 import S3PayloadStore
from fairlane.payloads.sweep import sweep_once
from fairlane.store.payloadindex import split_member
from tests.e2e.helpers import WAIT, eventually, fast_settings, running_worker

# they test payload stores more than the server: one backend is enough, and the
# tests of the index (marked contract) also run on a cluster
pytestmark = [pytest.mark.anyio, pytest.mark.embedded_only]

THRESHOLD = 1024
NO_WAIT = Backoff(base=0.01, cap=0.01, jitter="none")


def make_app(namespace: str, redis_url: str, store: PayloadStore | None, **payloads: Any) -> App:
    settings = fast_settings(payloads={"threshold_bytes": THRESHOLD, **payloads})
    return App(namespace, redis_url=redis_url, settings=settings, payloads=store)


class ReadLog:
    """A payload store that notes when each payload is read, around a real store."""

    def __init__(self, inner: PayloadStore) -> None:
        self.inner = inner
        self.reads: list[tuple[str, float]] = []

    async def put(self, name: str, data: bytes) -> None:
        await self.inner.put(name, data)

    async def get(self, name: str) -> bytes:
        self.reads.append((name, time.monotonic()))
        return await self.inner.get(name)

    async def delete(self, names: Sequence[str]) -> None:
        await self.inner.delete(names)


def stored_names(store: PayloadStore) -> set[str]:
    """Every payload a store holds, listed from the directory or the bucket itself."""
    if isinstance(store, DirectoryPayloadStore):
        return {p.name for p in store.root.rglob("*") if p.is_file()}
    assert isinstance(store, S3PayloadStore)
    listed = store.client.list_objects_v2(Bucket=store.bucket, Prefix=store.prefix)
    return {item["Key"].removeprefix(store.prefix) for item in listed.get("Contents", [])}


async def present(store: PayloadStore, name: str) -> bool:
    try:
        await store.get(name)
    except PayloadMissing:
        return False
    return True


# the payload index's commands must also work on a cluster
@pytest.mark.contract
async def test_large_args_and_result_travel_by_reference(
    redis_url: str, namespace: str, payload_store: PayloadStore
) -> None:
    app = make_app(namespace, redis_url, payload_store)

    @app.task
    async def echo(blob: str, times: int) -> dict[str, str]:
        return {"out": blob * times}

    big = "x" * 200_000
    async with app, running_worker(app):
        job = await echo.enqueue(big, 2)
        assert await job.result(timeout=WAIT) == {"out": big * 2}
        args, res = await app.store.job_fields(job.id, "args", "res")
        assert args is not None and res is not None
        # the record holds only the references: ~150 bytes each, not 200 kB and 400 kB
        assert is_ref(args) and len(args) < 300
        assert is_ref(res) and len(res) < 300
        arg_ref, res_ref = decode_ref(args), decode_ref(res)
        assert arg_ref.name.startswith(f"{job.id}.args.")
        assert res_ref.size == len(b'{"out":""}') + 400_000
        assert len(await payload_store.get(res_ref.name)) == res_ref.size
        # small payloads stay in the record as they were
        small = await echo.enqueue("y", 3)
        assert await small.result(timeout=WAIT) == {"out": "yyy"}
        (args,) = await app.store.job_fields(small.id, "args")
        assert args == b'{"blob":"y","times":3}'
        assert await app.store.client.zcard(app.store.keys.payloads) == 2


async def test_a_reference_is_read_only_when_the_attempt_runs(
    redis_url: str, namespace: str, tmp_path: Any
) -> None:
    store = ReadLog(DirectoryPayloadStore(tmp_path))
    app = make_app(namespace, redis_url, store)
    started: list[float] = []

    @app.task
    async def size(blob: bytes) -> int:
        started.append(time.monotonic())
        return len(blob)

    async with app, running_worker(app):
        enqueued = time.monotonic()
        job = await size.enqueue(b"\x00" * 50_000, delay=0.5)
        await asyncio.sleep(0.3)
        assert store.reads == []  # stored, fetched by nobody yet
        assert await job.result(timeout=WAIT) == 50_000
    (name, read_at), *others = store.reads
    assert ".args." in name and others == []  # one read; the small result is inline
    assert enqueued + 0.45 < read_at <= started[0]


async def test_a_missing_payload_fails_each_attempt_clearly(
    redis_url: str, namespace: str, payload_store: PayloadStore
) -> None:
    app = make_app(namespace, redis_url, payload_store)
    ran = 0

    @app.task(attempts=2, backoff=NO_WAIT)
    async def consume(blob: str) -> None:
        nonlocal ran
        ran += 1

    async with app:
        job = await consume.enqueue("z" * 5_000)
        (args,) = await app.store.job_fields(job.id, "args")
        assert args is not None
        name = decode_ref(args).name
        await payload_store.delete([name])
        async with running_worker(app):
            with pytest.raises(TaskFailed) as failed:
                await job.result(timeout=WAIT)
        assert failed.value.type_name == "PayloadUnavailable"
        assert "arguments cannot be read" in failed.value.message
        assert name in failed.value.message
        info = await job.info()
        assert (info.status, info.attempts, ran) == ("failed", 2, 0)
        assert job.id in [job_id for job_id, _ in await app.dead_letters()]


# the payload index's commands must also work on a cluster
@pytest.mark.contract
async def test_retention_takes_the_payloads_with_the_records(
    redis_url: str, namespace: str, payload_store: PayloadStore
) -> None:
    app = make_app(namespace, redis_url, payload_store, grace=0.2, recheck_interval=0.2)

    @app.task(retention=Retention(completed=2))
    async def double(blob: str) -> str:
        return blob + blob

    async with app, running_worker(app):
        jobs = []
        for n in range(5):  # one at a time: retention may remove a record awaited later
            jobs.append(await double.enqueue(f"{n}" * 3_000))
            assert await jobs[-1].result(timeout=WAIT) == f"{n}" * 6_000
        names = {}
        for job in jobs[-2:]:
            args, res = await app.store.job_fields(job.id, "args", "res")
            assert args is not None and res is not None
            names[job.id] = [decode_ref(args).name, decode_ref(res).name]
        index = app.store.keys.payloads

        async def only_the_kept_remain() -> bool:
            return await app.store.client.zcard(index) == 4

        # retention removed the first three records; the sweep follows within a second
        await eventually(only_the_kept_remain, timeout=10)
        members = {m.decode() for m in await app.store.client.zrange(index, 0, -1)}
        assert members == {f"{job_id}|{n}" for job_id, pair in names.items() for n in pair}
        # the removed jobs' payloads are gone from the store itself, not just the index
        assert stored_names(payload_store) == {n for pair in names.values() for n in pair}
        for pair in names.values():
            assert all([await present(payload_store, n) for n in pair])


async def test_the_server_limit_applies_to_the_reference(
    redis_url: str, namespace: str, tmp_path: Any
) -> None:
    settings = dict(
        max_payload_bytes=4_000, payloads={"threshold_bytes": 2_000, "max_bytes": 50_000}
    )
    plain = App(namespace, redis_url=redis_url, settings=fast_settings(**settings))
    offloading = App(
        namespace,
        redis_url=redis_url,
        settings=fast_settings(**settings),
        payloads=DirectoryPayloadStore(tmp_path),
    )
    for app in (plain, offloading):

        @app.task(name="size")
        async def size(blob: str) -> int:
            return len(blob)

    with pytest.raises(PayloadTooLarge, match="max_payload_bytes"):
        plain.tasks["size"].encode_args(("a" * 10_000,), {})
    with pytest.raises(PayloadTooLarge, match=r"payloads\.max_bytes"):
        offloading.tasks["size"].encode_args(("a" * 60_000,), {})
    async with offloading, running_worker(offloading):
        job = await offloading.tasks["size"].enqueue("a" * 10_000)
        assert await job.result(timeout=WAIT) == 10_000


async def test_a_result_that_looks_like_a_reference_is_kept_as_it_is(
    redis_url: str, namespace: str, tmp_path: Any
) -> None:
    app = make_app(namespace, redis_url, DirectoryPayloadStore(tmp_path))

    @app.task
    async def tricky() -> dict[str, str]:
        return {"$fl_ref": "not-a-reference"}

    async with app, running_worker(app):
        job = await tricky.enqueue()
        assert await job.result(timeout=WAIT) == {"$fl_ref": "not-a-reference"}
        (res,) = await app.store.job_fields(job.id, "res")
        assert res is not None and decode_ref(res).size == len(b'{"$fl_ref":"not-a-reference"}')


async def test_a_copy_of_a_stored_job_gets_its_own_payload(
    redis_url: str, namespace: str, tmp_path: Any
) -> None:
    store = DirectoryPayloadStore(tmp_path)
    app = make_app(namespace, redis_url, store)
    calls: list[int] = []

    @app.task(attempts=1)
    async def flaky(blob: str) -> int:
        calls.append(len(blob))
        if len(calls) == 1:
            raise RuntimeError("first time")
        return len(blob)

    async with app, running_worker(app):
        job = await flaky.enqueue("q" * 5_000)
        with pytest.raises(TaskFailed):
            await job.result(timeout=WAIT)
        outcome, copy_id = await retry(app, job.id)
        assert outcome == "accepted" and copy_id is not None
        copy = Job(flaky, copy_id)
        assert await copy.result(timeout=WAIT) == 5_000
        (old,), (new,) = [await app.store.job_fields(j, "args") for j in (job.id, copy_id)]
        assert old is not None and new is not None
        assert decode_ref(new).name.startswith(f"{copy_id}.args.")
        assert decode_ref(new).sha256 == decode_ref(old).sha256
    assert calls == [5_000, 5_000]


@pytest.mark.contract
async def test_purge_removes_the_payloads_of_every_shard(
    redis_url: str, namespace: str, payload_store: PayloadStore
) -> None:
    settings = fast_settings(payloads={"threshold_bytes": THRESHOLD})
    app = App(namespace, redis_url=redis_url, settings=settings, payloads=payload_store, shards=3)

    @app.task
    async def echo(blob: str) -> str:
        return blob

    async with app:
        before = stored_names(payload_store)
        for i in range(6):  # tenants over the shards; nothing runs, the payloads wait
            await echo.enqueue("x" * (THRESHOLD * 2), tenant=f"tenant-{i}")
        assert len({app.shard_of(f"tenant-{i}") for i in range(6)}) > 1
        assert len(stored_names(payload_store) - before) == 6
        assert await app.purge() > 0
        assert stored_names(payload_store) - before == set()


@pytest.mark.contract
async def test_a_childs_large_result_lives_as_long_as_its_run(
    redis_url: str, namespace: str, payload_store: PayloadStore
) -> None:
    app = make_app(namespace, redis_url, payload_store)
    big = "y" * (THRESHOLD * 3)

    @app.task(name="draft")
    async def draft() -> str:
        return big

    @app.workflow(name="review")
    async def review(ctx: Context) -> int:
        (text,) = await ctx.gather(ctx.call(draft))
        await ctx.sleep(0.01)  # a second slice replays the children's results
        return len(text)

    async with app:
        before = stored_names(payload_store)
        run = await review.enqueue()
        async with running_worker(app):
            assert await run.result(timeout=WAIT) == len(big)
        (name,) = stored_names(payload_store) - before
        store = app.store
        owners = {split_member(m)[0] for m in await store.client.zrange(store.keys.payloads, 0, -1)}
        assert owners == {run.id}
        # the child's record goes (retention), the run's stays: the payload stays too
        await store.client.delete(store.keys.job(f"{run.id}.0.0"))
        assert app.payloads is not None
        far = int(time.time() * 1000) + 10**9
        await sweep_once(store, app.payloads, far)
        assert name in stored_names(payload_store)
        # and goes with the run's record
        await store.client.delete(store.keys.job(run.id))
        await sweep_once(store, app.payloads, far + 10**9)
        assert name not in stored_names(payload_store)
