"""An operator's pauses in the dispatch step (``policy/pauses.py``, rules P1-P5): what a
paused tenant, task, key or lane gets from a fetch, what comes back on resume, and what
a quarantined tenant's submission is told."""

from __future__ import annotations

import asyncio

import pytest

from fairlane.policy.pauses import Scope, ScopeKind
from fairlane.store.api import Store
from fairlane.store.wire import NewJob, Outcome, Reply, limit_entry

pytestmark = [pytest.mark.anyio, pytest.mark.contract]

LANES = ["a"]


def _job(tenant: str, n: int, task: str = "w.job", key: str = "") -> NewJob:
    return NewJob(
        f"{tenant}-{task}-{n:03d}", tenant, 0, task, "[]", 1, "", 0, "0,0", "0,0",
        fairness_key=key,
    )  # fmt: skip


async def _fetch(store: Store, n: int, *, done: bool = True) -> list[str]:
    """Up to ``n`` jobs' ids, in the order dispatch gave them; ``done``: acked at once, so
    that no work is left in flight."""
    got = await store.exchange("w", LANES, n, 60_000, slots=100)
    if done and got.jobs:
        await store.ack(LANES, [Outcome(j.id, j.token, "ok", "1") for j in got.jobs], "w")
    return [j.id for j in got.jobs]


def tenant(name: str) -> Scope:
    return Scope(ScopeKind.TENANT, tenant=name)


async def test_a_paused_tenant_starts_nothing_and_comes_back_level(store: Store) -> None:
    await store.enqueue("a", [_job("x", n) for n in range(6)] + [_job("y", n) for n in range(6)])
    done = await store.pause(tenant("x"), lanes=LANES)
    assert done.new and done.until_ms == 0
    got = await _fetch(store, 4)
    assert got == [f"y-w.job-{n:03d}" for n in range(4)]
    # held: out of the fair set, noted in the class
    fair = await store.client.zrange(store.keys.class_key("a", "standard", "fair"), 0, -1)
    assert fair == [b"y"]
    held = await store.client.smembers(store.keys.class_key("a", "standard", "held"))
    assert held == {b"x"}
    # new work of a held tenant waits too (its queue is not empty: it stays out)
    await store.enqueue("a", [_job("x", 9)])
    assert all(i.startswith("y") for i in await _fetch(store, 1))
    assert await store.resume_step(tenant("x")) == (True, 0)
    assert await store.resume_step(tenant("x")) == (False, 0)
    # back at max(F, V - run / active), nothing in flight: at V, level with the work y
    # finished -- neither an hour of credit nor behind it
    vt = await store.client.hget(store.keys.class_key("a", "standard", "vt"), "V")
    fair = await store.client.zrange(
        store.keys.class_key("a", "standard", "fair"), 0, -1, withscores=True
    )
    assert dict(fair) == {b"x": float(vt), b"y": float(vt) + 1}
    got = [i[0] for i in await _fetch(store, 6)]
    assert got == ["x", "x", "y", "x", "x", "x"]  # y's last job after one round
    # nothing left paused: the lanes' flags are gone
    assert await store.client.hget(store.keys.lane("a").state, "P") is None


async def test_a_paused_task_parks_its_jobs_and_resume_puts_them_back_in_order(
    store: Store,
) -> None:
    await store.enqueue("a", [_job("x", n, task="bad") for n in range(3)])
    await store.enqueue("a", [_job("x", n) for n in range(3)])
    await store.pause(Scope(ScopeKind.TASK, task="bad"), lanes=LANES)
    got = await _fetch(store, 10)
    assert got == [f"x-w.job-{n:03d}" for n in range(3)]
    entries = await store.pause_entries()
    assert [(e.scope.task, e.parked) for e in entries] == [("bad", 3)]
    state = await store.client.hgetall(store.keys.lane("a").state)
    assert int(state.get(b"d:standard", 0)) == 0  # parked work is not demand
    # a parked job can be cancelled: it leaves the parked set
    assert await store.cancel("x-bad-001") == "cancelled"
    # in chunks: one job a call here
    bad = Scope(ScopeKind.TASK, task="bad")
    assert await store.resume_step(bad, budget=1) == (True, 1)
    assert await store.resume_step(bad, budget=1) == (True, 0)
    assert await store.resume_step(bad, budget=1) == (False, 0)
    assert await _fetch(store, 10) == ["x-bad-000", "x-bad-002"]


async def test_a_paused_fairness_key_parks_only_that_key(store: Store) -> None:
    await store.enqueue("a", [_job("x", n, key="k1") for n in range(2)])
    await store.enqueue("a", [_job("x", n + 5, key="k2") for n in range(2)])
    await store.pause(Scope(ScopeKind.KEY, tenant="x", key="k1"), lanes=LANES)
    assert await _fetch(store, 10) == ["x-w.job-005", "x-w.job-006"]
    await store.resume_step(Scope(ScopeKind.KEY, tenant="x", key="k1"))
    assert await _fetch(store, 10) == ["x-w.job-000", "x-w.job-001"]


async def test_a_paused_lane_gives_nothing_and_keeps_its_queues(store: Store) -> None:
    await store.enqueue("a", [_job("x", n) for n in range(2)])
    scope = Scope(ScopeKind.LANE, lane="a")
    await store.pause(scope, lanes=LANES)
    assert await _fetch(store, 10) == []
    await store.resume_step(scope)
    assert len(await _fetch(store, 10)) == 2


async def test_an_expired_pause_is_lifted_by_the_next_dispatch(store: Store) -> None:
    await store.enqueue("a", [_job("x", n, task="bad") for n in range(2)])
    await store.pause(Scope(ScopeKind.TASK, task="bad"), for_ms=1, lanes=LANES)
    await store.pause(tenant("z"), for_ms=60_000, lanes=LANES)
    # the first fetch may still see it; by the next, 10 ms later, the 1 ms are gone
    got = await _fetch(store, 10)
    await asyncio.sleep(0.01)
    got += await _fetch(store, 10)
    assert sorted(got) == ["x-bad-000", "x-bad-001"]
    assert [e.scope.tenant for e in await store.pause_entries()] == ["z"]


async def test_a_quarantined_tenant_is_refused_and_nothing_is_stored(store: Store) -> None:
    await store.pause(Scope(ScopeKind.REFUSE, tenant="x"), for_ms=30_000, lanes=LANES)
    [refused] = await store.submit("a", [_job("x", 0)])
    assert refused.code == Reply.TENANT_PAUSED and refused.reason == "tenant_paused"
    assert refused.paused_ms is not None and 29_000 < refused.paused_ms <= 30_000
    assert not await store.client.exists(store.keys.job("x-w.job-000"))
    [ok] = await store.submit("a", [_job("y", 0)])
    assert ok.code == Reply.ACCEPTED


def _keyed(tenant: str, n: int) -> NewJob:
    job = _job(tenant, n)
    job.limits = [limit_entry("k", 1)]
    return job


async def _offered(store: Store) -> list[str]:
    thr = await store.client.hgetall(store.keys.throttles)
    return sorted(f.decode()[2:] for f in thr if f.startswith(b"w:"))


async def test_a_paused_tenants_waiters_hold_no_offers(store: Store) -> None:
    """P4: the key's one slot is released while x's next job is the key's next waiter;
    x is paused, so the offer goes on to y at once, and y's jobs use the key."""
    await store.enqueue("a", [_keyed("x", 0)])
    [running] = (await store.exchange("w", LANES, 1, 60_000, slots=100)).jobs
    await store.enqueue("a", [_keyed("x", 1), _keyed("y", 0), _keyed("y", 1)])
    assert await _fetch(store, 10) == []  # all three park on the key
    await store.pause(tenant("x"), lanes=LANES)
    await store.ack(LANES, [Outcome(running.id, running.token, "ok", "1")], "w")
    assert await _offered(store) == ["y-w.job-000"]
    assert await _fetch(store, 10) == ["y-w.job-000"]
    assert await _fetch(store, 10) == ["y-w.job-001"]
    # x's job waits in its queue holding nothing, and passes the key again on resume
    assert await _offered(store) == []
    await store.resume_step(tenant("x"))
    assert await _fetch(store, 10) == ["x-w.job-001"]


async def test_a_pause_takes_back_offers_given_before_it(store: Store) -> None:
    """An offer made before the pause (x's job woken, not yet fetched) is swept back by
    the pause, so the key's slot is not stranded behind a held tenant."""
    await store.enqueue("a", [_keyed("x", 0)])
    [running] = (await store.exchange("w", LANES, 1, 60_000, slots=100)).jobs
    await store.enqueue("a", [_keyed("x", 1), _keyed("y", 0)])
    assert await _fetch(store, 10) == []
    await store.ack(LANES, [Outcome(running.id, running.token, "ok", "1")], "w")
    assert await _offered(store) == ["x-w.job-001"]  # x's turn on the key
    await store.pause(tenant("x"), lanes=LANES)
    assert await _offered(store) == ["y-w.job-000"]
    assert await _fetch(store, 10) == ["y-w.job-000"]
