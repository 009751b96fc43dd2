"""A shard's side of global keys on the real store, held to its model.

``ShardParts`` (``fairlane.policy.globalkeys``) is the model of one shard's part of one
key: the part in force, the slots in use, the highest epoch seen. Random runs of
reports, orders (some of a stale epoch), jobs arriving on the key and jobs ending drive
the Lua (``gk_report``, ``gk_order``, the dispatch) and the model alike; after every
step they agree on the part, the slots used, the jobs waiting and each call's answer.
"""

from __future__ import annotations

import random

import pytest

from fairlane.policy.globalkeys import Order, ShardParts, slots_of
from fairlane.policy.rates import Rate
from fairlane.store.api import Store
from fairlane.store.globalkeys import Refused, ShardReport
from fairlane.store.wire import NewJob, Outcome, rate_entry

pytestmark = pytest.mark.anyio

LANE, KEY, LIMIT = "a", "model:big", 4


def _job(
    job_id: str, *, limits: list[tuple[str, int]] | None = None, rates: list[object] | None = None
) -> NewJob:
    return NewJob(
        id=job_id, tenant="t", priority=0, task="t.job", args="{}", max_attempts=1,
        backoff="0,0,none", timeout=0, keep_completed="-1,-1", keep_failed="-1,-1",
        limits=[(KEY, LIMIT)] if limits is None else limits, rates=rates or [],
    )  # fmt: skip


class Shard:
    """The store's side: jobs leased, and what its key's state says."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.running: dict[str, str] = {}
        self.n = 0

    async def lease_woken(self) -> None:
        got = await self.store.exchange("w", [LANE], 100, 60_000)
        self.running.update({j.id: j.token for j in got.jobs})

    async def arrive(self) -> None:
        self.n += 1
        await self.store.enqueue(LANE, [_job(f"j{self.n}")])
        await self.lease_woken()

    async def end(self, rng: random.Random) -> None:
        job = rng.choice(sorted(self.running))
        token = self.running.pop(job)
        await self.store.exchange("w", [LANE], 0, 60_000, [Outcome(job, token, "ok")])
        await self.lease_woken()

    async def state(self) -> tuple[int, int]:
        keys = self.store.keys
        used, offers = await self.store.client.hmget(keys.throttles, [f"u:{KEY}", f"o:{KEY}"])
        waiting = await self.store.client.zlexcount(keys.throttle_waiters, f"[{KEY}\0", f"({KEY}\1")
        return int(used or 0) + int(offers or 0), int(waiting)


async def test_a_shards_part_agrees_with_its_model(store: Store) -> None:
    for seed in range(3):
        await store.client.delete(store.keys.throttles, store.keys.throttle_waiters)
        await store.enable_global_keys()
        rng = random.Random(seed)
        shard, model = Shard(store), ShardParts(LIMIT)
        waiting = 0
        epoch = 0
        for _ in range(120):
            roll = rng.random()
            if roll < 0.35:
                await shard.arrive()
                if not model.start():
                    waiting += 1
            elif roll < 0.6 and shard.running:
                await shard.end(rng)
                model.end()
            elif roll < 0.75:
                epoch += rng.choice([0, 1, 1])
                got = await store.report_keys(epoch)
                want = model.report(epoch)
                assert isinstance(got, Refused) == (want is None)
                if isinstance(got, ShardReport) and KEY in got.keys:
                    assert got.keys[KEY].part == model.part
                    assert got.keys[KEY].waiting == waiting
            else:
                stale = rng.random() < 0.2
                e = max(0, epoch - 1) if stale else epoch
                part = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0])
                held = await store.order_keys(e, [Order(KEY, part)])
                want = model.order(e, part)
                assert isinstance(held, Refused) == (want is None)
                if not isinstance(held, Refused):
                    assert held[KEY] == pytest.approx(want)
                await shard.lease_woken()
            # a raise or an end woke waiters up to the room the part gives
            woken = min(waiting, max(0, slots_of(model.part, LIMIT) - model.used))
            model.used += woken
            waiting -= woken
            assert await shard.state() == (model.used, waiting)
            assert len(shard.running) == model.used
        assert model.used <= LIMIT


async def test_without_a_part_a_global_key_runs_nothing(store: Store) -> None:
    await store.enable_global_keys()
    await store.enqueue(LANE, [_job("a"), _job("b")])
    got = await store.exchange("w", [LANE], 10, 60_000)
    assert got.jobs == []
    report = await store.report_keys(1)
    assert isinstance(report, ShardReport)
    entry = report.keys[KEY]
    assert (entry.part, entry.waiting, entry.limit, entry.active) == (0.0, 2, LIMIT, True)
    assert await store.order_keys(1, [Order(KEY, 0.25)]) == {KEY: 0.25}
    got = await store.exchange("w", [LANE], 10, 60_000)
    assert [j.id for j in got.jobs] == ["a"]


async def test_tenant_keys_stay_local(store: Store) -> None:
    await store.enable_global_keys()
    cap = f"lane:{LANE}:tenant:t"
    await store.enqueue(LANE, [_job("a", limits=[(cap, 2)]), _job("b", limits=[(cap, 2)])])
    got = await store.exchange("w", [LANE], 10, 60_000)
    assert sorted(j.id for j in got.jobs) == ["a", "b"]
    report = await store.report_keys(1)
    assert isinstance(report, ShardReport) and report.keys == {}


async def test_a_rate_part_scales_the_bucket_and_starts_empty(store: Store) -> None:
    await store.enable_global_keys()
    rate = rate_entry("model:rpm", Rate(10, per=1.0))
    jobs = [_job(f"r{i}", limits=[], rates=[rate]) for i in range(10)]
    await store.enqueue(LANE, jobs)
    assert (await store.exchange("w", [LANE], 20, 60_000)).jobs == []
    await store.order_keys(1, [Order("model:rpm", 0.5)])
    # a global key's bucket starts empty: what its part refills (5 a second), no burst
    started = len((await store.exchange("w", [LANE], 20, 60_000)).jobs)
    assert started <= 1


async def test_a_refusal_names_the_epoch_seen_and_the_counter_moves_past_it(
    store: Store,
) -> None:
    assert isinstance(await store.report_keys(7), ShardReport)
    assert await store.report_keys(3) == Refused(7)
    assert await store.order_keys(5, [Order(KEY, 0.5)]) == Refused(7)
    await store.epoch_past(7)
    assert await store.next_epoch() > 7
