"""One enqueue hashes its tenant to a shard once, and the app holds its shard count in
one object, against a real server."""

from __future__ import annotations

import pytest

import fairlane.store.shards as shards_module
from tests.shards.test_sharding import sharded_app, tenants_of

pytestmark = pytest.mark.anyio


async def test_the_registry_and_the_stores_share_one_shard_map(
    redis_url: str, namespace: str
) -> None:
    app = sharded_app(namespace, redis_url, 3)
    assert app.registry.factory.shards is app.registry.shard_map is app.sharded.map
    assert app.shards == app.sharded.count == 3


async def test_an_enqueue_hashes_its_tenant_once(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = sharded_app(namespace, redis_url, 4)

    @app.task(name="echo")
    async def echo(n: int) -> int:
        return n

    hashed: list[str] = []
    real = shards_module.shard_of_tenant

    def counted(tenant: str, count: int) -> int:
        hashed.append(tenant)
        return real(tenant, count)

    (tenant,) = tenants_of(app, [3])[3]
    async with app:
        monkeypatch.setattr(shards_module, "shard_of_tenant", counted)
        job = await echo.enqueue(1, tenant=tenant)
        assert hashed == [tenant]
        assert (await echo.submit(2, tenant=tenant)).job is not None
        assert hashed == [tenant] * 2
        batch = await echo.enqueue_many([(3,), (4,), (5,)], tenant=tenant)
        assert hashed == [tenant] * 3
        monkeypatch.undo()
        # each stored in the tenant's shard, where its id says it is
        for handle in (job, *batch):
            assert app.sharded.map.of_job(handle.id) == 3
            assert await handle.status() == "queued"
