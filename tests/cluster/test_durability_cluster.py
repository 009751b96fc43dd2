"""Acknowledged enqueues (``durability=``) on the session's 3-master Redis Cluster.

The enqueue script and its WAIT / WAITAOF go to the primary holding the app's slot on
one connection. That primary has no replica, so WAIT reports the shortfall within the
timeout; WAITAOF answers for its own AOF, refused while the AOF is off and confirmed
once ``appendonly`` is switched on for the test. A slot marked as migrating makes the
node refuse the script (TRYAGAIN, or ASK as a moved slot would), which must surface as
``StoreUnavailable``, not a raw reply.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis

from fairlane import App
from fairlane.app.admission import NotAcknowledged
from fairlane.app.task import Task
from fairlane.config.settings import DurabilitySettings
from fairlane.store.api import Store
from fairlane.store.durability import submit_acknowledged
from fairlane.store.wire import NewJob, StoreUnavailable
from tests.e2e.helpers import fast_settings

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.contract,
    pytest.mark.parametrize("redis_url", ["cluster"], indirect=True),
]


def _command(client: redis.Redis, *args: str | int) -> Any:
    run: Any = client.execute_command  # unannotated in redis-py
    return run(*args)


WAIT_S = 0.3


@pytest.fixture
async def app(redis_url: str, namespace: str) -> AsyncIterator[App]:
    app = App(namespace, redis_url=redis_url, settings=fast_settings())

    @app.task(name="work")
    async def work(n: int) -> int:
        return n

    async with app:
        yield app


def _work(app: App) -> Task[Any, int]:
    task: Task[Any, int] = app.tasks["work"]
    return task


@pytest.fixture
async def slot_primary(app: App) -> AsyncIterator[redis.Redis]:
    """A plain client of the primary holding the app's slot."""
    node = (await app.store.slot_node())["target_nodes"]
    client = redis.Redis(host=node.host, port=node.port, socket_timeout=5.0)
    try:
        yield client
    finally:
        client.close()


def _persistence(client: redis.Redis) -> dict[str, Any]:
    info: dict[str, Any] = client.info("persistence")
    return info


@pytest.fixture
def aof_on(slot_primary: redis.Redis) -> Iterator[None]:
    """``appendonly yes`` on the slot's primary for one test, once its first rewrite is done
    (WAITAOF cannot confirm a local fsync before then)."""
    slot_primary.config_set("appendonly", "yes")
    try:
        deadline = time.monotonic() + 5.0
        while True:
            info = _persistence(slot_primary)
            if info.get("aof_enabled") == 1 and not (
                info.get("aof_rewrite_in_progress") or info.get("aof_rewrite_scheduled")
            ):
                break
            assert time.monotonic() < deadline, f"the AOF did not start: {info}"
            time.sleep(0.02)
        yield
    finally:
        slot_primary.config_set("appendonly", "no")


async def test_waitaof_reports_the_aof_as_the_slots_primary_has_it(
    app: App, slot_primary: redis.Redis
) -> None:
    work = _work(app)
    assert _persistence(slot_primary).get("aof_enabled") == 0
    refused = await work.submit(1, durability=DurabilitySettings(aof=True, timeout=WAIT_S))
    ack = refused.acknowledgement
    assert refused.status == "accepted" and ack is not None
    assert not ack.met and ack.error is not None and "appendonly" in ack.error, ack
    assert refused.job is not None and await refused.job.status() == "queued"


@pytest.mark.usefixtures("aof_on")
async def test_waitaof_confirms_the_local_fsync_with_the_aof_on(app: App) -> None:
    answer = await _work(app).submit(2, durability=DurabilitySettings(aof=True, timeout=1.0))
    ack = answer.acknowledgement
    assert answer.status == "accepted" and ack is not None
    assert ack.met and ack.local and ack.replicas == 0 and ack.error is None, ack
    assert answer.job is not None and await answer.job.status() == "queued"


async def test_wait_for_a_missing_replica_reports_the_shortfall_in_time(app: App) -> None:
    work = _work(app)
    for asked in (DurabilitySettings(replicas=1, timeout=WAIT_S),
                  DurabilitySettings(replicas=1, aof=True, timeout=WAIT_S)):  # fmt: skip
        began = time.monotonic()
        answer = await work.submit(3, durability=asked)
        took = time.monotonic() - began
        ack = answer.acknowledgement
        assert answer.status == "accepted" and ack is not None
        assert not ack.met and ack.replicas == 0, ack
        if not asked.aof:  # WAITAOF with the AOF off is refused at once, WAIT waits
            assert WAIT_S - 0.05 <= took < WAIT_S + 1.0, took
        assert answer.job is not None and await answer.job.status() == "queued"


async def test_enqueue_raises_not_acknowledged_with_the_jobs_stored(app: App) -> None:
    work = _work(app)
    with pytest.raises(NotAcknowledged) as raised:
        await work.enqueue(4, durability=DurabilitySettings(replicas=1, timeout=0.1))
    assert len(raised.value.jobs) == 1 and "1 replica" in str(raised.value)
    assert await raised.value.jobs[0].status() == "queued"
    with pytest.raises(NotAcknowledged) as many:
        await work.enqueue_many(
            [(5,), (6,)], durability=DurabilitySettings(replicas=1, timeout=0.1)
        )
    assert Counter([await job.status() for job in many.value.jobs]) == {"queued": 2}


def _migrate_away(primary: redis.Redis, key: str) -> int:
    """Mark ``key``'s slot as migrating from ``primary`` to another node; its slot number."""
    slot = int(_command(primary, "CLUSTER", "KEYSLOT", key))
    me = _command(primary, "CLUSTER", "MYID")
    me = me.decode() if isinstance(me, bytes) else str(me)
    nodes = _command(primary, "CLUSTER", "NODES")
    text = nodes.decode() if isinstance(nodes, bytes) else str(nodes)
    other = next(line.split()[0] for line in text.splitlines() if line and not line.startswith(me))
    _command(primary, "CLUSTER", "SETSLOT", slot, "MIGRATING", other)
    return slot


@pytest.mark.parametrize("keys", ["some", "none"])
async def test_a_slot_in_migration_is_store_unavailable(
    app: App, redis_url: str, namespace: str, keys: str
) -> None:
    # a migrating node refuses a script whose keys it lacks: with some of them, TRYAGAIN;
    # with none (an app that never wrote), ASK, which redirects like MOVED
    store = app.store if keys == "some" else Store.from_url(redis_url, namespace + "_bare")
    node = (await store.slot_node())["target_nodes"]
    primary = redis.Redis(host=node.host, port=node.port, socket_timeout=5.0)
    job = NewJob("moved-1", "acme", 0, "work", "[7]", 1, "", 0.0, "", "")
    slot = _migrate_away(primary, store.keys.stats)
    try:
        with pytest.raises(StoreUnavailable, match="slot is moving") as raised:
            await submit_acknowledged(
                store, "fresh", [job], DurabilitySettings(replicas=1, timeout=WAIT_S)
            )
        expected = "TryAgainError" if keys == "some" else "AskError"
        assert expected in str(raised.value)
    finally:
        _command(primary, "CLUSTER", "SETSLOT", slot, "STABLE")
        primary.close()
        if store is not app.store:
            await store.aclose()
    if keys == "some":  # the slot served again: the same call goes through
        (reply,), ack = await submit_acknowledged(
            store, "fresh", [job], DurabilitySettings(replicas=1, timeout=0.1)
        )
        assert reply.id == "moved-1" and reply.code == 1 and not ack.met
