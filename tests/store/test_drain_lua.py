"""Draining by a filter on the real store (``lua/drain.lua``): every waiting job the
filter matches ends cancelled, as ``cancel`` would leave it, and nothing else changes.

A drained tenant's reservations, its queue-bound room, its place in the fair set and the
lane's waiting counts go back to what the other tenants hold; each waiting state is
drained (scheduled, deferred, throttled, queued) and a running job is not; a dry run
changes nothing; a drain cut off and started again from the start finishes; each call
stays within its bounds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis

from fairlane.policy.admission import AdmissionClass, EstimationSettings, PoolConfig
from fairlane.policy.classes import ClassTable, ServiceClass
from fairlane.store.api import Store
from fairlane.store.drain import DrainFilter, DrainSource, DrainStep
from fairlane.store.wire import NewJob, Outcome, Reply

pytestmark = pytest.mark.anyio

LANE, CLS, WORKER, LONG = "dr", "std", "w1", 600_000
LANES = {LANE: [CLS]}
TABLE = ClassTable((ServiceClass(CLS, nominal_share=1.0),))
#: the bound a tenant fills: a further job is refused until its jobs are gone
TENANT_BOUND = 2000


def job(job_id: str, tenant: str, **fields: Any) -> NewJob:
    spec: dict[str, Any] = dict(
        id=job_id, tenant=tenant, priority=0, task="dr.job", args="[]", max_attempts=1,
        backoff="0,0,none", timeout=0, keep_completed="-1,-1", keep_failed="-1,-1",
        service_class=CLS,
    )  # fmt: skip
    spec.update(fields)
    return NewJob(**spec)


def jobs(name: str, n: int, start: int = 0, **fields: Any) -> list[NewJob]:
    """``n`` jobs ``<name><i>``, of the tenant ``name`` begins with unless one is given."""
    tenant = fields.pop("tenant", name.split("-", maxsplit=1)[0])
    return [job(f"{name}{i}", tenant, **fields) for i in range(start, start + n)]


async def with_pool(store: Store, capacity: float = 100_000.0, defer: bool = False) -> None:
    await store.declare_lane(LANE, TABLE, "jobs")
    pool = PoolConfig(
        capacity_units=capacity,
        classes=(
            AdmissionClass(
                CLS,
                max_queue=10_000,
                tenant_max_queue=TENANT_BOUND,
                when_full="defer" if defer else "reject",
            ),
        ),
    )
    await store.declare_admission(
        LANE, TABLE, pool, EstimationSettings(max_reservation_units=2, safety_multiplier=1.0)
    )


async def drain_all(
    store: Store, flt: DrainFilter, *, dry_run: bool = False, **bounds: int
) -> tuple[int, list[DrainStep]]:
    """Walk every source ``flt`` names to its end: the jobs matched, and each call."""
    steps: list[DrainStep] = []
    for source in await store.drain_sources(LANES, flt):
        cursor = "0"
        while True:
            step = await store.drain_step(source, flt, cursor, dry_run=dry_run, **bounds)
            steps.append(step)
            cursor = step.cursor
            if step.done:
                break
    return sum(s.matched for s in steps), steps


async def statuses(store: Store, ids: Sequence[str]) -> Counter[str]:
    pipe = store.client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(store.keys.job(job_id), "st")
    return Counter((st or b"-").decode() for st in await pipe.execute())


async def lane_counts(store: Store) -> dict[str, Any]:
    state = await store.client.hgetall(store.keys.lane(LANE).state)
    wanted = (f"d:{CLS}", f"an:{CLS}", f"ar:{CLS}", f"W:{CLS}")
    held = await store.client.hgetall(f"{store.keys.prefix}lane:{LANE}:adm:t")
    fair = store.keys.class_key(LANE, CLS, "fair")
    return {
        **{name: float(state.get(name.encode(), 0)) for name in wanted},
        "admitted": {k.decode(): int(v) for k, v in held.items()},
        "fair": [t.decode() for t in await store.client.zrange(fair, 0, -1)],
    }


async def test_a_drain_cancels_one_tenants_jobs_and_frees_what_they_held(store: Store) -> None:
    await with_pool(store)
    await store.enqueue(LANE, jobs("b", 300))
    before_a = await lane_counts(store)
    for start in range(0, TENANT_BOUND, 500):
        await store.enqueue(LANE, jobs("a", 500, start))
    # the tenant's bound is full: one more is refused
    [refused] = await store.submit(LANE, [job("a-late", "a")])
    assert refused.code == Reply.REJECTED
    flt = DrainFilter(tenant="a")
    counted, _ = await drain_all(store, flt, dry_run=True)
    assert counted == TENANT_BOUND
    assert await statuses(store, [f"a{i}" for i in range(TENANT_BOUND)]) == {"queued": 2000}

    cancelled, steps = await drain_all(store, flt)
    assert cancelled == TENANT_BOUND and len(steps) > 2  # in chunks
    assert await statuses(store, [f"a{i}" for i in range(TENANT_BOUND)]) == {"cancelled": 2000}
    assert await statuses(store, [f"b{i}" for i in range(300)]) == {"queued": 300}
    # reservations, waiting slots, the fair set and its weight: b's alone, as before a came
    assert await lane_counts(store) == before_a
    assert before_a["admitted"] == {f"{CLS}|b": 300} and before_a["fair"] == ["b"]
    assert (await store.stats())["cancelled"] == TENANT_BOUND
    # the bound has room again, and a second drain finds nothing
    [again] = await store.submit(LANE, [job("a-again", "a")])
    assert again.code == Reply.ACCEPTED
    assert (await drain_all(store, DrainFilter(tenant="a", enqueued_before_ms=0)))[0] == 0


async def test_every_waiting_state_is_drained_and_a_running_job_is_not(store: Store) -> None:
    # a pool of 3 units, filled in turn: small jobs first (1 milli-unit each), then a's
    # two running jobs take what is left, so that its later jobs are deferred
    await with_pool(store, capacity=3.0, defer=True)
    small = {"declared_mu": 1, "declared": 1}
    keyed = {"limits": [["k", 1]], **small}
    # throttled: a job of the key runs, the rest park on it
    await store.enqueue(LANE, [job("c-key", "c", **keyed)])
    got = await store.exchange(WORKER, [LANE], 1, LONG, slots=40)
    assert [j.id for j in got.jobs] == ["c-key"]
    await store.enqueue(LANE, jobs("a-wait", 6, **keyed) + jobs("b-wait", 2, **keyed))
    assert (await store.exchange(WORKER, [LANE], 20, LONG, slots=40)).jobs == []
    later = {"delay_ms": LONG, **small}
    await store.enqueue(LANE, jobs("a-later", 4, **later) + jobs("b-later", 2, **later))
    running = {"declared_mu": 1492, "declared": 1}
    await store.enqueue(LANE, [job("a-run1", "a", **running), job("a-run2", "a", **running)])
    ran = await store.exchange(WORKER, [LANE], 2, LONG, slots=40)
    assert {j.id for j in ran.jobs} == {"a-run1", "a-run2"}
    await store.enqueue(LANE, jobs("a-defer", 5) + jobs("b-defer", 3))
    counts = {("a", "defer"): 5, ("b", "defer"): 3, ("a", "later"): 4, ("b", "later"): 2}
    counts |= {("a", "wait"): 6, ("b", "wait"): 2}
    every = [f"{t}-{state}{i}" for (t, state), n in counts.items() for i in range(n)]
    before = await statuses(store, every)
    assert before == {"deferred": 8, "scheduled": 6, "throttled": 8}

    assert (await drain_all(store, DrainFilter(tenant="a"), dry_run=True))[0] == 15
    assert (await drain_all(store, DrainFilter(tenant="a")))[0] == 15
    a_ids = [i for i in every if i.startswith("a-")]
    assert await statuses(store, a_ids) == {"cancelled": 15}
    b_ids = [i for i in every if i.startswith("b-")]
    assert await statuses(store, b_ids) == {"deferred": 3, "scheduled": 2, "throttled": 2}
    assert await statuses(store, ["a-run1", "a-run2", "c-key"]) == {"running": 3}
    # the deferred count and the waiters: b's alone
    state = await store.client.hget(store.keys.lane(LANE).state, f"ad:{CLS}")
    assert int(state) == 3
    waiters = await store.client.zrange(store.keys.throttle_waiters, 0, -1)
    assert sorted(w.rsplit(b"\0", 1)[1].decode() for w in waiters) == ["b-wait0", "b-wait1"]
    # the key goes on to b's waiters when c's job ends
    done = [Outcome("c-key", got.jobs[0].token, "ok")]
    await store.exchange(WORKER, [LANE], 0, LONG, done, slots=40)
    assert (await statuses(store, ["b-wait0"]))["queued"] == 1


async def test_each_filter_takes_its_jobs_alone(store: Store) -> None:
    await store.declare_lane(LANE, TABLE, "jobs")
    await store.enqueue(LANE, jobs("old", 40, task="dr.other"))
    cut = await store.server_time_ms() + 1
    while await store.server_time_ms() <= cut:
        pass
    await store.enqueue(
        LANE,
        jobs("t", 30, task="dr.other")
        + jobs("k", 20, fairness_key="user-1", tenant="kk")
        + jobs("p", 10, delay_ms=LONG),
    )
    everyone = [f"old{i}" for i in range(40)] + [f"t{i}" for i in range(30)]
    everyone += [f"k{i}" for i in range(20)] + [f"p{i}" for i in range(10)]
    cases = [
        (DrainFilter(enqueued_before_ms=cut), 40),
        (DrainFilter(enqueued_after_ms=cut, task="dr.other"), 30),
        (DrainFilter(fairness_key="user-1"), 20),
        (DrainFilter(states=("scheduled",)), 10),
        (DrainFilter(service_class="none-such"), 0),
    ]
    for flt, expected in cases:
        assert (await drain_all(store, flt, dry_run=True))[0] == expected, flt
    assert await statuses(store, everyone) == {"queued": 90, "scheduled": 10}
    for flt, expected in cases:
        assert (await drain_all(store, flt))[0] == expected, flt
    assert await statuses(store, everyone) == {"cancelled": 100}


async def test_a_drain_cut_off_finishes_when_started_again(store: Store) -> None:
    await store.declare_lane(LANE, TABLE, "jobs")
    await store.enqueue(LANE, jobs("a", 1500) + jobs("b", 50))
    flt = DrainFilter(tenant="a")
    [source] = await store.drain_sources(LANES, DrainFilter(tenant="a", states=("queued",)))
    first = await store.drain_step(source, flt, limit=100)
    second = await store.drain_step(source, flt, first.cursor, limit=100)
    assert not second.done and 0 < first.matched + second.matched < 1500
    # started again from the start, with the same filter: the rest
    rest, _ = await drain_all(store, flt)
    assert first.matched + second.matched + rest == 1500
    assert await statuses(store, [f"a{i}" for i in range(1500)]) == {"cancelled": 1500}
    assert await statuses(store, [f"b{i}" for i in range(50)]) == {"queued": 50}


async def test_each_call_stays_within_its_bounds(store: Store) -> None:
    await store.declare_lane(LANE, TABLE, "jobs")
    await store.enqueue(LANE, jobs("a", 3000))
    source = DrainSource("queued", LANE, CLS, "a")
    flt = DrainFilter(tenant="a")
    # no time at all: one page a call (ZSCAN's COUNT 8; a bucket's chain may add a few)
    for _ in range(5):
        step = await store.drain_step(source, flt, budget_us=0, dry_run=True)
        assert 0 < step.seen < 32
    # a bound of entries: stopped at the first page that reaches it; a server that gives
    # scripts no clock (Redis 7.0) bounds every call by a few pages instead (CLOCKLESS)
    step = await store.drain_step(source, flt, limit=200, budget_us=10**9, dry_run=True)
    if step.cpu_us < 0:
        assert 24 <= step.seen < 32
    else:
        assert 200 <= step.seen < 232


@pytest.mark.embedded_only  # it counts every command the server ran: a private server's
async def test_no_drain_call_runs_more_commands_than_its_chunk(
    store: Store, redis_url: str
) -> None:
    """SLOWLOG logs every command (the session's private server, this test alone on it):
    the commands a script runs are logged just before its FCALL, so each drain call's
    are counted. A call's size is bounded by its entries and its CPU budget; the count
    bounds it as a budget would, whatever the machine's speed."""
    await store.declare_lane(LANE, TABLE, "jobs")
    await store.enqueue(LANE, jobs("a", 3000) + jobs("b", 100))
    flt = DrainFilter(tenant="a")
    sources = await store.drain_sources(LANES, flt)
    client = aioredis.Redis.from_url(redis_url)
    saved = await client.config_get("slowlog-*")
    try:
        await client.config_set("slowlog-log-slower-than", 0)
        await client.config_set("slowlog-max-len", 200_000)
        await client.slowlog_reset()
        steps: list[DrainStep] = []
        for source in sources:
            steps.append(await store.drain_step(source, flt))
            while not steps[-1].done:
                steps.append(await store.drain_step(source, flt, steps[-1].cursor))
        log = await client.slowlog_get(200_000)
    finally:
        await client.config_set("slowlog-log-slower-than", saved["slowlog-log-slower-than"])
        await client.config_set("slowlog-max-len", saved["slowlog-max-len"])
        await client.aclose()
    assert sum(s.matched for s in steps) == 3000
    # nothing but the drain ran since the reset: every other entry is a script's command
    # (logged under ?:0 by Redis 7.0, under its caller by later servers)
    inner, per_call = 0, []
    for entry in sorted(log, key=lambda e: e["id"]):
        words = entry["command"].split()
        if words[0].upper() == b"FCALL":
            assert words[1].endswith(b"_drain")
            per_call.append(inner)
            inner = 0
        elif words[0].upper() != b"SLOWLOG":
            inner += 1
    assert len(per_call) == len(steps)
    # a cancelled queued job costs six commands: its record read, its cancel's three
    # (ZREM, HINCRBY, ZCARD) and its finish's two; a call ends within a page of its CPU
    # budget, far below its 1000 entries
    assert sum(per_call) >= 6 * 3000
    assert max(per_call) <= 6 * 600, per_call
