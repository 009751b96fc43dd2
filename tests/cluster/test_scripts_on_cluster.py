"""Every script of the Lua library, and every client call the store makes, on a Redis Cluster.

One scenario drives a whole app through its public API on a private 3-master
:class:`fairlane.testing.RedisCluster`: tasks that complete, retry, die and are redriven,
a cancelled job, a drained tenant, an admission pool that defers, tenant settings (the
WATCH transaction), a workflow with a step, a durable sleep, a child and a signal, and a
worker that renews, sweeps and leaves. The store's ``fcall`` is observed (not replaced)
and the names it called must be every function the library registers: a script whose
keys spanned two slots would fail with CROSSSLOT and the scenario with it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis

from fairlane import App, Backoff, Context, TaskFailed
from fairlane.config.pools import parse_config
from fairlane.policy.globalkeys import Order
from fairlane.registry import CallOptions
from fairlane.store.api import Store, unlink_matching
from fairlane.store.apikeys import KeyRecord
from fairlane.store.connection import create_client
from fairlane.store.globalkeys import ShardReport
from fairlane.store.keys import AppKeys
from fairlane.store.library import FUNCTION_PREFIX, LIBRARY_CODE
from tests.e2e.helpers import WAIT, app_keys, eventually, fast_settings, running_worker

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.contract,
    pytest.mark.parametrize("redis_url", ["cluster"], indirect=True),
]

LIBRARY_FUNCTIONS = frozenset(
    re.findall(r"function_name = '" + re.escape(FUNCTION_PREFIX) + r"(\w+)'", LIBRARY_CODE)
)
LIBRARY_NAME = re.search(r"#!lua name=(\w+)", LIBRARY_CODE).group(1)  # type: ignore[union-attr]
QUICK = Backoff(base=0.05, cap=0.1, jitter="none")
CONFIG = {
    "pools": {
        "gated": {
            "capacity_units": 2,  # one job of 1.25 units (default x safety) fits, not two
            "classes": {"standard": {"nominal_share": 1.0, "response_when_full": "defer"}},
        }
    }
}


def _observe(store: Store, called: set[str]) -> None:
    inner = store.fcall

    async def fcall(name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        reply = await inner(name, keys, args)
        called.add(name)
        return reply

    store.fcall = fcall  # type: ignore[method-assign]


async def test_the_library_is_loaded_on_every_primary(redis_url: str, namespace: str) -> None:
    store = Store.from_url(redis_url, namespace)
    try:
        await store.connect()
        client = store.client
        assert isinstance(client, aioredis.RedisCluster)
        primaries = client.get_primaries()
        assert len(primaries) == 3
        for node in primaries:
            # asked of each node on a connection of its own, not through the cluster client
            direct = aioredis.Redis(host=node.host, port=node.port)
            try:
                libraries = await direct.function_list(library=LIBRARY_NAME)
            finally:
                await direct.aclose()
            assert len(libraries) == 1, node.name
    finally:
        await store.aclose()


async def test_every_script_runs_on_a_cluster(redis_url: str, namespace: str) -> None:  # noqa: PLR0915 - one scenario
    app = App(
        namespace,
        redis_url=redis_url,
        settings=fast_settings(),
        config=parse_config(CONFIG),
    )
    gate = asyncio.Event()

    @app.task(attempts=2, backoff=QUICK)
    async def echo(text: str) -> str:
        return text

    @app.task(attempts=1)
    async def broken() -> None:
        raise LookupError("always")

    @app.task
    async def slow() -> str:
        await asyncio.sleep(0.5)  # longer than the renew interval (0.2 s)
        return "slow"

    @app.task(lane="gated")
    async def gated(n: int) -> int:
        await gate.wait()
        return n

    async def double(n: int) -> int:
        return 2 * n

    @app.workflow()
    async def flow(ctx: Context, n: int) -> list[object]:
        doubled = await ctx.step("double", double, n)
        await ctx.sleep(0.05)
        child = await ctx.run(echo, f"child-{doubled}")
        signal = await ctx.wait_for_signal("go", timeout=WAIT)
        return [doubled, child, signal]

    called: set[str] = set()
    async with app:
        _observe(app.store, called)
        await app.store.claim_layout()
        await app.declare_tasks()
        await app.declare_lanes()
        await app.tenants.configure("acme", weight=3)
        await app.tenants.configure("acme", floor=1, max_concurrency=4)
        assert (await app.tenants.limits("acme")) is not None
        await app.store.tenant_limit_now("default", "acme")

        later = await echo.enqueue("never", tenant="acme", delay=60)
        assert await later.cancel() == "cancelled"
        # an operator's pause (with its sweep of offers) and resume
        paused = app.pauses.scope(task=echo.name)
        await app.pauses.pause(paused, reason="on a cluster")
        assert (await app.pauses.resume(paused)).was_paused
        assert await app.store.take_back_offers([later.id]) == 0  # it holds none
        await echo.enqueue_many([("x",), ("y",)], tenant="drained", delay=60)
        assert (await app.drain(tenant="drained", task=echo)).cancelled == 2
        first = await gated.submit(1, tenant="acme")
        second = await gated.submit(2, tenant="acme")
        assert (first.status, second.status) == ("accepted", "deferred")

        async with running_worker(app, lanes=["default", "gated"], concurrency=4) as worker:
            hello = await echo.enqueue("hi", tenant="acme")
            assert await hello.result(timeout=WAIT) == "hi"
            # what the attempt took, sent on; a submission that asks for its start estimate
            assert await worker.durations.send() > 0
            asked = await echo.submit("asked", tenant="acme", estimate_start=True)
            assert asked.status == "accepted" and asked.job is not None
            dead = await broken.enqueue(tenant="beta")
            with pytest.raises(TaskFailed):
                await dead.result(timeout=WAIT)
            assert dead.id in [job_id for job_id, _ in await app.dead_letters()]
            assert await app.redrive([dead.id]) == [dead.id]
            with pytest.raises(TaskFailed):
                await dead.result(timeout=WAIT)
            assert await (await slow.enqueue()).result(timeout=WAIT) == "slow"
            run = await flow.enqueue(4, tenant="acme")
            await eventually(lambda: _waiting(app, run.id))
            assert await app.signal(run.id, "go", "yes") == "delivered"
            assert await run.result(timeout=WAIT) == [8, "child-8", "yes"]
            gate.set()
            assert first.job is not None and second.job is not None
            assert await first.job.result(timeout=WAIT) == 1
            assert await second.job.result(timeout=WAIT) == 2
            history = await app.store.runs.history(run.id)
            assert [s.kind for s in history.steps][:2] == ["step", "sleep"]
            # the worker's sweep runs every 0.3 s; wait for one to pass
            await eventually(lambda: _swept(called))
            # its beats go from a thread, by the blocking twin of the call: seen where
            # the script writes them
            if await app.store.client.zscore(app.store.keys.beats, worker.id) is not None:
                called.add("beat")
        await app.tenants.reset("acme")
        assert await app.tenants.limits("acme") is None
        # a worker's tenant sweep runs every minute; one pass by hand covers the script
        swept = await app.store.sweep_tenants("0", 1000, 3600.0)
        assert swept.examined > 0
        assert (await app.stats()).get("fenced", 0) == 0
        # a gateway's submit: the key's record checked by the enqueue in the same step
        records = app.store.key_records
        await records.add("0123456789ab", KeyRecord("acme", "d" * 64, 0))
        guard = records.guard("0123456789ab", KeyRecord("acme", "d" * 64, 0))
        guarded = echo.new_job(echo.encode_args(("guarded",), {}), CallOptions(tenant="acme"))
        assert (await echo.submit_job(guarded, guard=guard)).status == "accepted"
        # a shard's side of global keys (an app of many shards runs them from its
        # balancer; tests/cluster/test_global_keys.py runs that)
        await app.store.enable_global_keys()
        assert await app.store.order_keys(1, [Order("model:x", 0.5)]) == {"model:x": 0.5}
        report = await app.store.report_keys(2)
        assert isinstance(report, ShardReport) and report.keys["model:x"].part == 0.5
        keys = await app_keys(redis_url, namespace)
        assert keys
        assert await app.purge() == len(keys)

    assert len(LIBRARY_FUNCTIONS) >= 20, LIBRARY_FUNCTIONS
    missing = LIBRARY_FUNCTIONS - called
    assert not missing, f"scripts not run on the cluster: {sorted(missing)}"


async def _waiting(app: App, run_id: str) -> bool:
    status, wait = await app.store.job_fields(run_id, "st", "wf")
    return status == b"scheduled" and wait is not None and wait.decode().startswith("sig")


async def _swept(called: set[str]) -> bool:
    return "sweep" in called


async def test_purge_scans_every_primary(redis_url: str, namespace: str) -> None:
    # keys of other hash tags land on every primary: a purge pattern that matches them
    # must find them all, which a SCAN of one node would not
    client = create_client(redis_url)
    assert isinstance(client, aioredis.RedisCluster)
    try:
        names = [f"{namespace}:{{{i}}}" for i in range(60)]
        for name in names:
            await client.set(name, 1)
        slots = {client.keyslot(n) for n in names}
        nodes = {client.get_node_from_key(n).name for n in names}
        assert len(slots) > 3 and len(nodes) == 3
        assert await unlink_matching(client, f"{namespace}:*") == len(names)
    finally:
        await client.aclose()


async def test_keys_of_an_app_share_one_slot(redis_url: str, namespace: str) -> None:
    keys = AppKeys.for_app(namespace)
    store = Store.from_url(redis_url, namespace)
    try:
        assert isinstance(store.client, aioredis.RedisCluster)
        slots = {store.client.keyslot(k) for k in [*keys.common(), keys.job("x"), keys.inbox("w")]}
        assert len(slots) == 1
        assert await store.server_time_ms() > 0
    finally:
        await store.aclose()
