"""A batch's jobs as the store keeps them: each the job its call would make alone.

``Task.enqueue_many`` checks and encodes what a batch shares once, and makes each job a
copy of the first with its own id and arguments. These tests hold that to the one-call
path on a real server: every field the record keeps is the same as a lone
``enqueue``'s with the same options, save those of the job itself (id, arguments,
enqueue time and FIFO number, the deadline measured from that time).
"""

from __future__ import annotations

import pytest

from fairlane import App, Rate
from fairlane.app.task import EnqueueOptions
from fairlane.store.keys import job_shard
from tests.e2e.helpers import fast_settings

pytestmark = pytest.mark.anyio

#: fields that are the job's own, not the batch's
OWN = frozenset({b"args", b"enq", b"seq", b"run", b"dl"})
OPTIONS: EnqueueOptions = {
    "tenant": "acme",
    "fairness_key": "user-7",
    "priority": 3,
    "service_class": "guaranteed",
    "slots": 2,
    "limits": {"upstream": 1000},
    "rates": {"api": Rate(1_000_000, per=1)},
    "estimate": 2.5,
    "deadline": 3600,
}


async def _record(app: App, job_id: str) -> dict[bytes, bytes]:
    store = app.sharded.store_for_job(job_id)
    raw: dict[bytes, bytes] = await store.client.hgetall(store.keys.job(job_id))
    return raw


async def test_each_job_of_a_batch_is_stored_as_its_lone_call_would_be(
    redis_url: str, namespace: str
) -> None:
    app = App(namespace, redis_url=redis_url, settings=fast_settings())

    @app.task
    async def scale(n: int, factor: float = 1.0) -> float:
        return n * factor

    async with app:
        # guaranteed is restricted: the tenant is entitled to it
        await app.tenants.configure("acme", classes=["guaranteed"])
        alone = await scale.enqueue(0, **OPTIONS)
        batch = await scale.enqueue_many([(i, i / 2) for i in range(1, 40)], **OPTIONS)
        assert len({alone.id, *(job.id for job in batch)}) == 40
        expected = {k: v for k, v in (await _record(app, alone.id)).items() if k not in OWN}
        assert expected[b"fk"] == b"user-7" and b"lim" in expected and b"rk" in expected
        for i, job in enumerate(batch, 1):
            record = await _record(app, job.id)
            assert {k: v for k, v in record.items() if k not in OWN} == expected
            assert record[b"args"] == f'{{"n":{i},"factor":{i / 2}}}'.encode()
            assert set(record) == set(await _record(app, alone.id))


async def test_a_batch_names_its_tenants_shard_in_every_id(redis_url: str, namespace: str) -> None:
    app = App(namespace, redis_url=redis_url, settings=fast_settings(), shards=3)

    @app.task
    async def echo(n: int) -> int:
        return n

    async with app:
        for tenant in ("a", "b", "c", "d"):
            jobs = await echo.enqueue_many([(i,) for i in range(25)], tenant=tenant)
            assert {job_shard(job.id, 3) for job in jobs} == {app.shard_of(tenant)}
            assert len({job.id for job in jobs}) == 25
            for job in jobs[:3] + jobs[-3:]:
                assert (await job.info()).tenant == tenant
