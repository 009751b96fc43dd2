"""The slot pool a worker's shard loops share (fairlane.runtime.slots).

Its rules, each on a real event loop: reserved slots are counted once and given back
whatever the call did, a turn's ask never takes the pool over its capacity, loops get
the turn by their shards' standing (lowest used/weight, then in order of arrival) and
ask no more than their shard's part while others wait for theirs, a job handed back
unstarted leaves the pool as it was, and resource pressure narrows what a turn may ask
for.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import pytest

from fairlane.policy.backpressure import Bounds, Reading
from fairlane.policy.fetch import Wait
from fairlane.runtime.pressure import PressureGauge
from fairlane.runtime.slots import SlotPool, SlotStats

pytestmark = pytest.mark.anyio


class Dial:
    """A sensor whose memory reading the test sets (share of the limit; soft 0.8, hard 0.9)."""

    name = "dial"

    def __init__(self, value: float) -> None:
        self.value = value

    def read(self) -> Sequence[Reading]:
        return [Reading("memory", self.value, 0.8, 0.9, stop=True)]


def gauge(dial: Dial, concurrency: int) -> PressureGauge:
    return PressureGauge([dial], concurrency, Bounds(min_fraction=0.25, recovery=0.5))


# -- counting ------------------------------------------------------------------------------


def test_a_new_pool_is_all_free() -> None:
    pool = SlotPool(8, batch=100)
    assert pool.statistics() == SlotStats(
        concurrency=8, used=0, reserved=0, free=8, waiting=0, turns=0
    )
    with pytest.raises(AttributeError):
        pool.statistics().used = 1  # type: ignore[misc]


@pytest.mark.parametrize(("concurrency", "batch"), [(0, 1), (1, 0)])
def test_a_pool_needs_a_slot_and_a_batch(concurrency: int, batch: int) -> None:
    with pytest.raises(ValueError):
        SlotPool(concurrency, batch=batch)


def test_reserved_slots_are_counted_once_and_given_back() -> None:
    pool = SlotPool(10, batch=100)
    with pool.reserving(4):
        with pool.reserving(3):  # another shard's call, out at the same time
            assert (pool.reserved, pool.free()) == (7, 3)
        assert (pool.reserved, pool.free()) == (4, 6)
    assert (pool.reserved, pool.free()) == (0, 10)


def test_a_call_that_fails_gives_its_reservation_back() -> None:
    pool = SlotPool(4, batch=100)
    with pytest.raises(ConnectionError), pool.reserving(4):
        assert pool.free() == 0
        raise ConnectionError("the store went away")
    assert pool.statistics().reserved == 0 and pool.free() == 4


def test_leased_jobs_move_from_reserved_to_used_without_counting_twice() -> None:
    pool = SlotPool(10, batch=100)
    with pool.reserving(6):
        leased = [1, 3]  # the reply: two jobs, one of them three slots wide
    for width in leased:
        pool.occupy(width)
    assert (pool.used, pool.reserved, pool.free()) == (4, 0, 6)
    pool.vacate(3)
    assert (pool.used, pool.free()) == (1, 9)


def test_a_negative_reservation_is_refused() -> None:
    pool = SlotPool(2, batch=1)
    with pytest.raises(ValueError), pool.reserving(-1):
        pass
    assert pool.reserved == 0


# -- a turn's ask ----------------------------------------------------------------------------


def test_a_turn_asks_wide_or_capped_from_what_is_free() -> None:
    pool = SlotPool(10, batch=100)
    pool.occupy(2)
    assert pool.plan(widen=True).want == 8
    assert pool.plan(widen=False).want == 5  # half the slots per call
    with pool.reserving(5):
        assert pool.plan(widen=True).want == 3
    assert SlotPool(10, batch=2).plan(widen=False).want == 2


def test_a_full_pool_waits_for_a_slot() -> None:
    pool = SlotPool(2, batch=100)
    pool.occupy(1)
    with pool.reserving(1):
        plan = pool.plan(widen=True)
    assert plan.want == 0 and plan.wait is Wait.FULL


def test_pressure_narrows_the_ask_and_holds_at_the_hard_threshold() -> None:
    dial = Dial(0.5)
    pool = SlotPool(8, batch=100, pressure=gauge(dial, 8))
    # before the first sample every free slot may be asked for
    assert pool.room() == 8 and pool.plan(widen=True).wait is Wait.NONE
    assert pool.pressure is not None
    pool.pressure.sample(0.0)
    assert pool.room() == 8
    dial.value = 0.85  # halfway from soft to hard: 5 of the 8 slots
    pool.pressure.sample(1.0)
    pool.occupy(2)
    assert pool.room() == 3 and pool.plan(widen=True).want == 3
    dial.value = 0.95
    pool.pressure.sample(2.0)
    assert pool.holding and pool.room() == 0
    plan = pool.plan(widen=True)
    assert plan.want == 0 and plan.wait is Wait.PRESSURE


async def test_turns_never_take_the_pool_over_its_capacity() -> None:
    """Three shards' loops take turns, ask, lease jobs of random widths that fit the ask
    and run them a random while: slots held and reserved never pass the capacity."""
    pool = SlotPool(7, batch=3)
    rng = random.Random(15)
    highest = 0

    async def run(width: int) -> None:
        for _ in range(rng.randrange(3)):
            await asyncio.sleep(0)
        pool.vacate(width)

    async def shard(jobs: asyncio.TaskGroup) -> None:
        nonlocal highest
        widen = True
        for _ in range(60):
            async with pool.turn():
                plan = pool.plan(widen=widen)
                if plan.want > 0:
                    with pool.reserving(plan.want):
                        highest = max(highest, pool.used + pool.reserved)
                        await asyncio.sleep(0)  # the exchange is out
                        widths: list[int] = []
                        while sum(widths) < plan.want and rng.random() < 0.8:
                            width = rng.randint(1, plan.widest - sum(widths))
                            widths.append(width)
                    for width in widths:
                        pool.occupy(width)
                        jobs.create_task(run(width))
                    pool.notify()
                    highest = max(highest, pool.used + pool.reserved)
            if plan.want == 0:
                await pool.wait_freed()
            widen = not widen

    async with asyncio.TaskGroup() as jobs, asyncio.TaskGroup() as shards:
        for _ in range(3):
            shards.create_task(shard(jobs))
    assert 0 < highest <= 7
    assert pool.statistics() == SlotStats(7, 0, 0, 7, 0, 180)


# -- the turn --------------------------------------------------------------------------------


async def test_loops_get_the_turn_in_order_of_arrival() -> None:
    pool = SlotPool(4, batch=100)
    order: list[str] = []
    release = asyncio.Event()

    async def loop(name: str, hold: bool) -> None:
        async with pool.turn():
            order.append(name)
            if hold:
                await release.wait()

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(loop("first", hold=True))
        await asyncio.sleep(0)
        for name in ("b", "c", "a"):
            tasks.create_task(loop(name, hold=False))
            await asyncio.sleep(0)
        assert pool.statistics().waiting == 3
        release.set()
    assert order == ["first", "b", "c", "a"]
    assert pool.statistics().turns == 4 and pool.statistics().waiting == 0


async def test_the_turn_is_free_only_when_no_loop_holds_it_or_is_woken_to_take_it() -> None:
    pool = SlotPool(4, batch=100)
    release = asyncio.Event()
    seen: list[bool] = []

    async def holder() -> None:
        async with pool.turn():
            await release.wait()

    async def next_in_line() -> None:
        async with pool.turn():
            seen.append(pool.turn_free())

    assert pool.turn_free()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(holder())
        await asyncio.sleep(0)
        assert not pool.turn_free()
        tasks.create_task(next_in_line())
        await asyncio.sleep(0)
        release.set()
        await asyncio.sleep(0)  # the holder has let go; the next one is woken, not yet in
        assert not pool.turn_free()
    assert seen == [False] and pool.turn_free()


async def test_a_loop_cancelled_in_the_queue_leaves_it() -> None:
    pool = SlotPool(4, batch=100)
    release = asyncio.Event()
    entered: list[str] = []

    async def loop(name: str) -> None:
        async with pool.turn():
            entered.append(name)
            await release.wait()

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(loop("holder"))
        await asyncio.sleep(0)
        waiting = tasks.create_task(loop("gone"))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.sleep(0)
        assert pool.statistics().waiting == 0
        release.set()
    assert entered == ["holder"]


async def test_the_turn_goes_to_the_shard_furthest_below_its_part() -> None:
    pool = SlotPool(10, batch=100)
    order: list[str] = []
    release = asyncio.Event()
    for shard, weight, used in (("a", 1.0, 2), ("b", 4.0, 4), ("c", 1.0, 0)):
        pool.weigh(shard, weight)
        pool.occupy(used, shard)

    async def loop(name: str, hold: bool) -> None:
        async with pool.turn(None if hold else name):
            order.append(name)
            if hold:
                await release.wait()

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(loop("holder", hold=True))
        await asyncio.sleep(0)
        for name in ("a", "b", "c"):
            tasks.create_task(loop(name, hold=False))
            await asyncio.sleep(0)
        release.set()
    # used/weight: c 0, b 1, a 2
    assert order == ["holder", "c", "b", "a"]


async def test_a_turn_asks_no_more_than_its_shards_part_while_others_wait() -> None:
    pool = SlotPool(10, batch=100)
    pool.weigh("lone", 1.0)
    pool.weigh("crowd", 4.0)
    async with pool.turn("crowd"):
        pass
    async with pool.turn("lone"):
        plan = pool.plan(widen=True, shard="lone")
    assert (plan.want, plan.wait) == (2, Wait.NONE)
    pool.occupy(2, "lone")
    async with pool.turn("lone"):
        assert pool.plan(widen=True, shard="lone").wait is Wait.SHARE
    async with pool.turn("crowd"):
        assert pool.plan(widen=True, shard="crowd").want == 8
    # the crowd's loop waits on its wake lists: its part is the lone shard's at once
    pool.rest("crowd")
    assert pool.freed.is_set()
    async with pool.turn("lone"):
        assert pool.plan(widen=True, shard="lone").want == 8
    assert [s.used for s in pool.statistics().shares] == [2, 0]


async def test_a_loop_granted_the_turn_then_cancelled_passes_it_on() -> None:
    pool = SlotPool(4, batch=100)
    release = asyncio.Event()
    entered: list[str] = []

    async def loop(name: str) -> None:
        async with pool.turn(name):
            entered.append(name)
            await release.wait()

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(loop("holder"))
        await asyncio.sleep(0)
        granted = tasks.create_task(loop("granted"))
        await asyncio.sleep(0)
        tasks.create_task(loop("next"))
        await asyncio.sleep(0)
        release.set()
        await asyncio.sleep(0)  # the holder lets go: "granted" is chosen, not yet running
        granted.cancel()
    assert entered == ["holder", "next"]
    assert pool.turn_free()


async def test_a_loop_cancelled_while_the_turn_is_released_is_passed_over() -> None:
    pool = SlotPool(4, batch=100)
    release = asyncio.Event()
    entered: list[str] = []

    async def loop(name: str) -> None:
        async with pool.turn(name):
            entered.append(name)
            await release.wait()

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(loop("holder"))
        await asyncio.sleep(0)
        gone = tasks.create_task(loop("gone"))
        await asyncio.sleep(0)
        tasks.create_task(loop("next"))
        await asyncio.sleep(0)
        release.set()  # the holder lets go first, then
        gone.cancel()  # the wait is cancelled before its task runs again
    assert entered == ["holder", "next"]


# -- hand-offs and waking --------------------------------------------------------------------


def test_a_handed_job_starts_only_in_a_free_slot() -> None:
    pool = SlotPool(3, batch=100)
    assert pool.takes_handed()
    pool.occupy(2)
    assert pool.takes_handed()  # wider than what is free: it starts, and the pool is over
    pool.occupy(2)
    assert pool.free() == -1
    before = pool.statistics()
    assert not pool.takes_handed()  # handed back unstarted: nothing held
    assert pool.statistics() == before
    pool.vacate(2)
    assert pool.takes_handed()  # a slot is free again


def test_a_handed_job_goes_back_while_pressure_holds() -> None:
    dial = Dial(0.95)
    pool = SlotPool(4, batch=100, pressure=gauge(dial, 4))
    assert pool.pressure is not None
    pool.pressure.sample(0.0)
    assert not pool.takes_handed()
    assert pool.statistics().used == 0


async def test_a_freed_slot_wakes_a_waiting_loop() -> None:
    pool = SlotPool(1, batch=100)
    pool.occupy(1)
    assert await pool.wait_freed(0.01) is False  # nothing ended meanwhile

    async def finish() -> None:
        await asyncio.sleep(0)
        pool.vacate(1)

    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(finish())
        assert await pool.wait_freed() is True
    assert pool.free() == 1


async def test_a_wake_before_the_wait_does_not_count() -> None:
    pool = SlotPool(1, batch=100)
    pool.notify()  # an old signal: the waiter looks again only after a new one
    assert await pool.wait_freed(0.01) is False
