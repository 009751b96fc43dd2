"""Global keys seen: the metrics' gauges of each key and each shard's part of it, the
balancer's passes, and the dashboard's table, read from a real server.

An app of two shards on one server, its keys made global and given parts by hand (the
balancer's calls), the worker's own balancer slowed so that it leaves them as given:
shard 0 holds a quarter of a key of limit 4 and its tenant (weight 2) has four jobs,
shard 1 holds three quarters and its tenant has two.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fairlane import App
from fairlane.gateway import create_app
from fairlane.metrics.globalkeys import BalancerCollector, global_key_families
from fairlane.policy.globalkeys import Order
from fairlane.runtime.balancer import KeyBalancer, PassResult
from fairlane.store.globalkeys import Refused
from fairlane.store.views.globalkeys import GlobalKeys, GlobalKeyView, ShardPart, global_keys
from tests.e2e.helpers import WAIT, eventually, fast_settings
from tests.e2e.test_explain_global_keys import _worker_without_passes
from tests.metrics.helpers import parse, scrape_store, series, store_reader, value
from tests.shards.test_sharding import tenants_of
from tests.ui.helpers import ADMIN, ADMIN_KEY

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def parked_on_a_global_key(namespace: str, redis_url: str) -> AsyncIterator[App]:
    app = App(namespace, redis_url=redis_url, settings=fast_settings(), shards=2)
    release = asyncio.Event()

    @app.task(limits={"model:big": 4}, gateway=True)
    async def call_model() -> None:
        await release.wait()

    tenants = tenants_of(app, [0, 1])
    async with app:
        await app.tenants.configure(tenants[0][0], weight=2)
        for store in app.stores:
            await store.enable_global_keys()
        epoch = await app.stores[0].next_epoch()
        for store, part in zip(app.stores, (0.25, 0.75), strict=True):
            assert not isinstance(
                await store.order_keys(epoch, [Order("model:big", part)]), Refused
            )
        jobs = await call_model.enqueue_many([()] * 4, tenant=tenants[0][0])
        jobs += await call_model.enqueue_many([()] * 2, tenant=tenants[1][0])
        async with _worker_without_passes(app):

            async def settled() -> bool:
                shared = await app.store.view(global_keys, 10)
                (view,) = shared.keys or [None]
                return view is not None and (view.parts[0].waiting, view.parts[1].used) == (3, 2)

            await eventually(settled)
            yield app
            release.set()
            await asyncio.gather(*(job.result(timeout=WAIT) for job in jobs))


async def test_the_metrics_show_each_shards_part_of_a_global_key(
    redis_url: str, namespace: str
) -> None:
    async with parked_on_a_global_key(namespace, redis_url) as app:
        reader = store_reader(app, redis_url, shards=2)
        try:
            got = await scrape_store(reader)
        finally:
            reader.close()
    print({k: v for k, v in got.items() if k.startswith("fairlane_global_key")})
    assert value(got, "fairlane_global_keys") == 1.0
    assert value(got, "fairlane_global_key_limit", key="model:big") == 4.0
    expected = {
        "fairlane_global_key_part": (0.25, 0.75),
        "fairlane_global_key_held_slots": (1.0, 3.0),
        "fairlane_global_key_used_slots": (1.0, 2.0),
        "fairlane_global_key_waiting": (3.0, 0.0),
        "fairlane_global_key_waiting_weight": (2.0, 0.0),
    }
    for name, (first, second) in expected.items():
        assert series(got, name) == {
            (("key", "model:big"), ("shard", "0")): first,
            (("key", "model:big"), ("shard", "1")): second,
        }, name


async def test_the_dashboard_shows_each_shards_part_of_a_global_key(
    redis_url: str, namespace: str
) -> None:
    async with parked_on_a_global_key(namespace, redis_url) as app:
        api = create_app(app, admin_key=ADMIN_KEY)
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            overview = (await http.get("/ui/api/overview", headers=ADMIN)).json()
            page = (await http.get("/ui/static/app.js")).text
    shared = overview["global_keys"]
    assert shared["known"] == 1
    (row,) = shared["keys"]
    assert (row["key"], row["limit"]) == ("model:big", 4)
    assert row["shards"] == [
        {"shard": 0, "part": 0.25, "held": 1, "used": 1, "waiting": 3, "weight": 2.0},
        {"shard": 1, "part": 0.75, "held": 3, "used": 2, "waiting": 0, "weight": 0.0},
    ]
    assert 'h("h2", {}, "Global keys")' in page


def _scrape(collector: Any) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry()
    registry.register(collector)
    return parse(generate_latest(registry).decode())


class _Families:
    def __init__(self, keys: GlobalKeys, top_n: int) -> None:
        self.keys, self.top_n = keys, top_n

    def collect(self) -> Any:
        return global_key_families(self.keys, self.top_n)


def _view(key: str, used: int, waiting: int) -> GlobalKeyView:
    parts = (ShardPart(0, 0.5, 2, used, waiting, float(waiting)), ShardPart(1, 0.5, 2, 0, 1, 1.0))
    return GlobalKeyView(key, 4, parts)


def test_the_key_label_is_bounded_to_the_keys_most_used_and_waited_for() -> None:
    keys = GlobalKeys(True, [_view("a", 2, 5), _view("b", 0, 1), _view("c", 1, 0)], 6)
    got = _scrape(_Families(keys, top_n=1))
    assert {dict(k)["key"] for k in series(got, "fairlane_global_key_part")} == {"a"}
    # the others' use, waiters and weight are summed per shard under other
    assert value(got, "fairlane_global_key_used_slots", key="other", shard="0") == 1.0
    assert value(got, "fairlane_global_key_waiting", key="other", shard="0") == 1.0
    assert value(got, "fairlane_global_key_waiting", key="other", shard="1") == 2.0
    assert value(got, "fairlane_global_key_waiting_weight", key="other", shard="1") == 2.0
    assert series(got, "fairlane_global_key_limit") == {(("key", "a"),): 4.0}
    # an app whose keys are not global exports none of them
    assert _scrape(_Families(GlobalKeys(), top_n=1)) == {}


async def test_the_balancer_exports_its_passes(redis_url: str, namespace: str) -> None:
    app = App(namespace, redis_url=redis_url, settings=fast_settings(), shards=2)
    async with app:
        balancer = KeyBalancer(app.stores, "w1")
        got = _scrape(BalancerCollector(balancer))
        assert value(got, "fairlane_global_key_balancer_passes_total") == 0.0
        assert "fairlane_global_key_balancer_last_pass_keys" not in got
        balancer.last = await balancer.run_pass()
        balancer.passes += 1
        assert isinstance(balancer.last, PassResult)
        got = _scrape(BalancerCollector(balancer))
    assert value(got, "fairlane_global_key_balancer_passes_total") == 1.0
    assert value(got, "fairlane_global_key_balancer_last_pass_keys") == 0.0
    assert value(got, "fairlane_global_key_balancer_last_pass_orders", step="raise") == 0.0
