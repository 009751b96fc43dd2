"""Rate keys with real workers, each test on a private server: bound, rate, fairness, debt.

Every start is read from the job's record (``start``: the server's clock at the lease,
the moment the key's tokens were taken or just after), never from the test's clock.

* Window bound and long-run rate: a backlog on ``Rate(10, per=1.0, burst=5)``; in any
  window of one second at most 15 jobs start, and the key starts 10 a second within 2 %.
* Fair: three tenants backlogged on one key (enqueued one after the other, so FIFO would
  give the window to the first) take a third of its tokens each, within 2 points.
* Debt: a tenant declaring 0.01 units for jobs that use 20 on a ``cost="units"`` key is
  held to what they used from its second job on; the bucket replayed with the pure rules
  (``fairlane.policy.rates``) on the recorded starts and ends has room for every start.
* Quiet: a fleet holding a backlog parked on a slow key sends no more commands per
  second than the same fleet idle without it.

``Throttled`` and bad input are ``test_rate_pushback.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

import fairlane
from fairlane import App, Estimate, Rate
from fairlane.policy.rates import Bucket, correct, level, take
from fairlane.store.records import JobRecord
from fairlane.testing import RedisServer
from tests.e2e.helpers import WAIT, make_app, raw_client, running_worker, running_workers

pytestmark = pytest.mark.anyio

KEY = "model:gpt"


@pytest.fixture
def server_url() -> Iterator[str]:
    """A private server for one test: the command counts and clocks are this test's alone."""
    with RedisServer() as server:
        yield server.url


async def records(app: App, jobs: Sequence[fairlane.Job[Any]]) -> list[JobRecord]:
    out = []
    for job in jobs:
        record = await app.sharded.store_for_job(job.id).read_job(job.id)
        assert record is not None, job
        out.append(record)
    return out


def started(record: JobRecord) -> int:
    assert record.started_ms is not None, record
    return record.started_ms


def finished(record: JobRecord) -> int:
    assert record.finished_ms is not None, record
    return record.finished_ms


def used_units(record: JobRecord) -> float:
    assert record.used_mu is not None, record
    return record.used_mu / 1000


# -- the window bound and the long-run rate ----------------------------------------------------


async def test_a_backlogged_key_keeps_its_window_bound_and_its_long_run_rate(
    server_url: str,
) -> None:
    limit, per, burst = 10, 1.0, 5
    after_burst = 60  # 5 start at once, then 60 at 10 a second: 6 s
    app = make_app("window", server_url)

    @app.task(rates={KEY: Rate(limit, per=per, burst=burst)})
    async def work(i: int) -> int:
        await asyncio.sleep(0.005)
        return i

    async with app:
        jobs = await work.enqueue_many([(i,) for i in range(burst + after_burst)], tenant="a")
        async with running_worker(app, concurrency=10):
            for job in jobs:
                await job.result(timeout=WAIT)
        starts = sorted(started(r) for r in await records(app, jobs))

    per_ms = per * 1000
    busiest = max(sum(1 for s in starts if first <= s <= first + per_ms) for first in starts)
    print(f"most starts in a window of {per} s: {busiest}; starts (ms): {starts}")
    assert busiest <= limit + burst, starts

    # The bucket is full at the first take: the k-th start after the burst is due k / rate
    # after it, and a wake that comes late loses nothing (the bucket refilled meanwhile,
    # the next is due as soon), so over-admission raises this figure and only the last
    # start's own lateness lowers it. That lateness is below 1000 / hz = 100 ms on a
    # default server (an idle worker's timed BLPOP ends on the server's cron tick; with
    # --hz 100 this figure is within 0.1 %): 6 s after the first take keeps it under
    # 1.7 %, inside the 2 % the issue promises, while a key woken a tick late per token,
    # or not at its due time at all, is off by far more.
    rate = after_burst / ((starts[-1] - starts[0]) / 1000)
    print(f"long-run rate: {rate:.3f}/s (limit {limit / per:g}/s)")
    assert abs(rate / (limit / per) - 1) <= 0.02, rate


# -- fair shares of one key --------------------------------------------------------------------


async def test_three_backlogged_tenants_take_a_third_of_a_keys_tokens_each(
    server_url: str,
) -> None:
    each, skip, window = 80, 10, 180
    tenants = ("first", "second", "third")
    app = make_app("shares", server_url)
    order: list[str] = []
    enough = asyncio.Event()

    # no concurrency limit on the key, and far more slots than the 100 a second it starts
    # of 5 ms jobs: its tokens are what the jobs wait for
    @app.task(rates={KEY: Rate(100, per=1.0, burst=5)})
    async def work(owner: str) -> None:
        order.append(owner)
        if len(order) >= skip + window:
            enough.set()
        await asyncio.sleep(0.005)

    async with app:
        # one tenant after the other: in arrival order the window would be first's alone
        for tenant in tenants:
            await work.enqueue_many([(tenant,)] * each, tenant=tenant)
        async with running_worker(app, concurrency=20):
            async with asyncio.timeout(WAIT):
                await enough.wait()

    seen = order[skip : skip + window]
    shares = {t: seen.count(t) / window for t in tenants}
    print(f"shares of {window} starts on the key: {shares}")
    for tenant in tenants:
        # still backlogged at the window's end: it had parked work all through
        assert order[: skip + window].count(tenant) < each, order
        assert abs(shares[tenant] - 1 / 3) <= 0.02, shares


# -- held to what it really used ---------------------------------------------------------------


async def test_tiny_estimates_for_big_jobs_are_held_to_what_they_used_from_the_second_job(
    server_url: str,
) -> None:
    rate = Rate(20, per=1.0, burst=10, cost="units")
    used_tokens = 20_000  # 20 units at 1 unit per 1k tokens
    app = make_app("debt", server_url)

    # A job's tokens are taken when it is woken, and a woken job may wait for a worker's
    # slot with them: one slot on the key makes each take follow the previous job's
    # correction (the ack corrects before it releases), so each start shows the debt.
    @app.task(rates={KEY: rate}, limits={KEY: 1})
    async def research(i: int) -> int:
        fairlane.context().report_usage(
            input_tokens=used_tokens // 2, output_tokens=used_tokens // 2
        )
        return i

    tiny = Estimate(input_tokens=10, max_output_tokens=0)  # declares 0.01 units
    async with app, raw_client(server_url) as client:

        async def rate_cost(job: fairlane.Job[Any]) -> float:
            rmu = await client.hget(app.sharded.store_for_job(job.id).keys.job(job.id), "rmu")
            assert rmu is not None, "a job on a units key records its rate cost (rmu)"
            return int(rmu) / 1000

        jobs = await research.enqueue_many([(i,) for i in range(3)], tenant="small", estimate=tiny)
        async with running_worker(app, concurrency=4):
            for job in jobs:
                await job.result(timeout=WAIT)
        recs = await records(app, jobs)
        costs = [await rate_cost(job) for job in jobs]
        # enqueued once its tenant's jobs were learned to cost 20: it costs the burst
        later = await rate_cost(await research.enqueue(3, tenant="small", estimate=tiny))

    runs = sorted(zip(recs, costs, strict=True), key=lambda rc: started(rc[0]))
    used = [used_units(rec) for rec, _ in runs]
    print(f"rate costs {costs} (enqueued later: {later}), used {used}")
    assert all(u >= used_tokens / 1000 for u in used), used
    assert costs[0] <= 0.02, "a new tenant's first job costs what it declares (0.01 units)"
    assert later == rate.capacity, later

    # Replay the key with the pure rules on the server's own times: a take at each start
    # (the lease: at or after the wake that took the tokens, when the level was no
    # higher), the correction (declared less used: a debt) at each end. Every start must
    # find its cost in the bucket; a store that forgot the debts would start the second
    # job as soon as the first ended, with 9.99 units of the burst left: a level of -10.
    bucket = Bucket.full(rate, started(runs[0][0]))
    slack = rate.limit / rate.per_ms  # one ms of refill: the record's times are whole ms
    gaps = []
    for i, (rec, cost) in enumerate(runs):
        at = started(rec)
        if i:
            short = cost - level(rate, bucket, at)
            assert short <= slack, (i, at, short, bucket)
            end = finished(runs[i - 1][0])
            implied = max(0.0, cost - level(rate, bucket, end)) * rate.per_ms / rate.limit
            gaps.append((at - end, round(implied)))
        bucket = take(rate, bucket, cost, at)
        bucket = correct(rate, bucket, cost - used_units(rec), finished(rec))
    print(f"(gap after the previous job's end, the wait its debt implies) in ms: {gaps}")
    for gap, implied in gaps:
        assert implied >= 400  # each job's debt is half a second of refill or more
        # woken at its due time, not by some later timer (a bound, not a speed target)
        assert gap <= implied + 1000, gaps


# -- a quiet fleet -----------------------------------------------------------------------------


async def commands_per_second(client: Any, seconds: float) -> float:
    before = (await client.info("stats"))["total_commands_processed"]
    await asyncio.sleep(seconds)
    after = (await client.info("stats"))["total_commands_processed"]
    return (after - before) / seconds


async def test_an_idle_fleet_holding_a_rate_limited_backlog_stays_quiet(server_url: str) -> None:
    # Timers of 1 s, so that the fleet's own housekeeping is a small and steady baseline
    # (about 70 commands a second for two workers) and windows of 2 s hold whole ticks.
    app = make_app("quiet", server_url, lease={"sweep_interval": 1.0}, worker={"idle_block": 1.0})

    # one job a minute: after the first, the backlog is parked with a due a minute away
    @app.task(rates={KEY: Rate(1, per=60.0, burst=1)})
    async def slow(i: int) -> int:
        return i

    async with app, raw_client(server_url) as client, running_workers(app, count=2, concurrency=4):
        await asyncio.sleep(0.5)  # past the workers' start-up
        idle = await commands_per_second(client, 2.0)
        first = await slow.enqueue(0, tenant="t0")
        await first.result(timeout=WAIT)
        backlog = [
            job
            for t in range(3)
            for job in await slow.enqueue_many([(i,) for i in range(20)], tenant=f"t{t}")
        ]
        await asyncio.sleep(0.5)  # the fleet fetches them and they park on the key
        parked = await commands_per_second(client, 2.0)
        statuses = {await job.status() for job in backlog}
    print(f"commands/s idle: {idle:.1f}, holding {len(backlog)} parked jobs: {parked:.1f}")
    assert statuses == {"throttled"}, statuses  # fetched, and parked on the key
    # The same fleet's own timers (lease sweeps, heartbeats, blocking waits of idle_block)
    # set both figures; two windows may still catch a tick more or less of a timer that
    # drifts, and the measuring INFO calls count too: hence 20 % and 2 a second. A fleet
    # that polled the parked key (a due time in the past, a wake per parked job) would send
    # tens or hundreds a second more.
    assert parked <= idle * 1.2 + 2, (idle, parked)
