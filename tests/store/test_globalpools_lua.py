"""A global admission pool on one shard of an app of three, on the real store.

A pool of an app of many shards is the global key ``pool:<lane>``
(``fairlane.policy.globalkeys``: ``pool_part``, ``pool_scaled``): the shard admits
against its part of the pool's capacity and bounds, an equal share until a balancer's
order sets one. Its report counts milli-units and what it refused; a raised part admits
deferred jobs that now fit, in the order's call. A random run of submissions, finishes
and orders holds the Lua to the model those two functions make.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest

from fairlane.policy.admission import AdmissionClass, EstimationSettings, PoolConfig
from fairlane.policy.classes import ClassTable, ServiceClass
from fairlane.policy.globalkeys import Order, pool_key, pool_part, pool_scaled
from fairlane.store.api import Store
from fairlane.store.globalkeys import Refused, ShardReport
from fairlane.store.wire import NewJob, Outcome, Reply

pytestmark = pytest.mark.anyio

LANE, CLS, WORKER, LONG, SHARDS = "gp", "std", "w1", 600_000, 3
KEY = pool_key(LANE)
TABLE = ClassTable((ServiceClass(CLS, nominal_share=1.0),))
ESTIMATION = EstimationSettings(max_reservation_units=4, safety_multiplier=1.0)


def _pool(when_full: str, *, max_queue: int = 50, max_deferred: int = 50) -> PoolConfig:
    return PoolConfig(
        capacity_units=4.0,
        classes=(
            AdmissionClass(
                CLS, max_queue=max_queue, max_deferred=max_deferred, when_full=when_full
            ),
        ),
    )


def job(job_id: str, tenant: str = "a", mu: int = 1000) -> NewJob:
    return NewJob(
        job_id, tenant, 0, "gp.job", "[]", 1, "", 0, "0,0", "100,-1",
        service_class=CLS, declared_mu=mu, declared=1,
    )  # fmt: skip


@pytest.fixture
async def shard(redis_url: str, namespace: str) -> AsyncIterator[Store]:
    """Shard 0 of an app of three, on the session's server."""
    store = Store.from_url(redis_url, namespace, shards=SHARDS)
    await store.connect()
    try:
        yield store
    finally:
        await store.aclose()


async def declare(store: Store, pool: PoolConfig) -> None:
    await store.declare_lane(LANE, TABLE, "jobs")
    await store.declare_admission(LANE, TABLE, pool, ESTIMATION)
    await store.exchange(WORKER, [LANE], 0, LONG, slots=10)


async def reserved(store: Store) -> int:
    return int(await store.client.hget(store.keys.lane(LANE).state, f"ar:{CLS}") or 0)


async def statuses(store: Store, ids: list[str]) -> list[str]:
    out = []
    for i in ids:
        raw = await store.client.hget(store.keys.job(i), "st")
        out.append(raw.decode() if raw else "")
    return out


async def test_without_a_part_a_shard_admits_its_equal_share(shard: Store) -> None:
    await declare(shard, _pool("reject"))
    replies = await shard.submit(LANE, [job("a"), job("b"), job("c")])
    # 4 units over 3 shards: floor(4000 / 3) = 1333 milli-units, one job of 1000
    assert [r.code for r in replies] == [Reply.ACCEPTED, Reply.REJECTED, Reply.REJECTED]
    assert [r.reason for r in replies[1:]] == ["class_full", "class_full"]
    report = await shard.report_keys(1)
    assert isinstance(report, ShardReport)
    entry = report.keys[KEY]
    assert entry.part == pytest.approx(1 / SHARDS)
    assert (entry.limit, entry.used, entry.waiting, entry.active) == (4000, 1000, 2000, True)
    assert entry.weight == pytest.approx(2.0)
    # the refusals were read: the next report has none
    again = await shard.report_keys(2)
    assert isinstance(again, ShardReport)
    assert (again.keys[KEY].waiting, again.keys[KEY].active) == (0, True)


async def test_a_raised_part_admits_deferred_jobs_in_the_orders_call(shard: Store) -> None:
    await declare(shard, _pool("defer"))
    replies = await shard.submit(LANE, [job("a"), job("b", "u"), job("c", "v")])
    assert [r.code for r in replies] == [Reply.ACCEPTED, Reply.DEFERRED, Reply.DEFERRED]
    report = await shard.report_keys(1)
    assert isinstance(report, ShardReport)
    # two deferred jobs, each at the admitted jobs' mean reservation, of two tenants
    assert (report.keys[KEY].waiting, report.keys[KEY].weight) == (2000, pytest.approx(2.0))
    assert await shard.order_keys(1, [Order(KEY, 0.75)]) == {KEY: pytest.approx(0.75)}
    assert await statuses(shard, ["b", "c"]) == ["queued", "queued"]
    assert await reserved(shard) == 3000
    # a lower takes nothing back: the shard holds what it reserved until it is released
    assert await shard.order_keys(2, [Order(KEY, 0.25)]) == {KEY: pytest.approx(0.75)}
    assert (await shard.submit(LANE, [job("d")]))[0].code == Reply.DEFERRED
    # an order of an older pass is refused
    assert await shard.order_keys(1, [Order(KEY, 1.0)]) == Refused(2)


async def test_queue_bounds_scale_to_the_part_and_a_tenants_stay_whole(shard: Store) -> None:
    await declare(shard, _pool("defer", max_queue=6, max_deferred=6))
    await shard.order_keys(1, [Order(KEY, 0.5)])
    # half the pool: max_queue 3 admitted, max_deferred 3 deferred, then refused
    jobs = [job(f"y{i}", mu=100) for i in range(6)] + [job("t", "other", mu=100)]
    codes = [r.code for r in await shard.submit(LANE, jobs)]
    assert codes == [*[Reply.ACCEPTED] * 3, *[Reply.DEFERRED] * 3, Reply.REJECTED]


async def test_a_shards_pool_agrees_with_its_model(shard: Store) -> None:
    """Reject mode, one class: a job of ``mu`` is admitted iff the shard's reservations
    and count stay within the pool's capacity and ``max_queue`` scaled to its part."""
    await declare(shard, _pool("reject", max_queue=5))
    rng = random.Random(7)
    part: float | None = None
    held: dict[str, int] = {}
    running: dict[str, str] = {}
    epoch = n = 0
    for _ in range(200):
        roll = rng.random()
        p = pool_part(part, SHARDS)
        if roll < 0.5:
            n += 1
            mu = rng.choice([250, 500, 1000, 1500])
            fits = len(held) < pool_scaled(5, p) and sum(held.values()) + mu <= pool_scaled(4000, p)
            (reply,) = await shard.submit(LANE, [job(f"j{n}", rng.choice("abc"), mu)])
            assert (reply.code == Reply.ACCEPTED) == fits, (mu, p, held)
            if fits:
                held[f"j{n}"] = mu
        elif roll < 0.8 and held:
            got = await shard.exchange(WORKER, [LANE], 10, LONG, slots=10)
            running.update({j.id: j.token for j in got.jobs})
            done = rng.choice(sorted(running))
            await shard.exchange(
                WORKER, [LANE], 0, LONG, [Outcome(done, running.pop(done), "ok")], slots=10
            )
            del held[done]
        else:
            epoch += 1
            part = rng.choice([0.0, 0.2, 0.5, 1 / 3, 0.9])
            answer = await shard.order_keys(epoch, [Order(KEY, part)])
            assert answer == {KEY: pytest.approx(max(part, sum(held.values()) / 4000))}
        assert await reserved(shard) == sum(held.values())
