"""The Lua tenant ceiling against ``fairlane.policy.ceilings``, on the real server.

``Store.tenant_limit_now`` returns the limit the scripts compute for a tenant and the
signals it came from (rate, mean duration, the lane's ``C`` and load); the limit must be
``ceilings.tenant_limit`` of those very signals, with the store's pressure bounds. The
signals themselves are checked against the store's own state: ``C`` and the load against
the lane's cached slots, the mean duration against ``DurationMean`` fed the durations
of the acked attempts (``fin - start``), the rate against ``RateWindow`` at the instants
bracketing the call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from fairlane.policy.ceilings import (
    F_MAX,
    F_MIN,
    RATE_BUCKETS,
    RATE_WIDTH_MS,
    DurationMean,
    RateWindow,
    TenantLimits,
    tenant_limit,
)
from fairlane.store.api import Store
from fairlane.store.wire import NewJob, Outcome

T = TypeVar("T")
LANE = "c"
SETTINGS = {
    "bursty": TenantLimits(floor=1, burst_floor=2, burst_pct=0.5),
    "capped": TenantLimits(floor=2, max_concurrency=5, burst_pct=1.0),
    "static": TenantLimits(floor=1, max_concurrency=1),
    "steady": TenantLimits(floor=3, burst_floor=1),
}


def _job(job_id: str, tenant: str) -> NewJob:
    return NewJob(
        id=job_id,
        tenant=tenant,
        priority=0,
        task="ceil.job",
        args="{}",
        max_attempts=1,
        backoff="0,0,none",
        timeout=0,
        keep_completed="-1,-1",
        keep_failed="-1,-1",
    )


@pytest.fixture
def store(redis_url: str, namespace: str) -> Iterator[tuple[Store, asyncio.AbstractEventLoop]]:
    loop = asyncio.new_event_loop()
    store = Store.from_url(redis_url, namespace, max_connections=2)
    loop.run_until_complete(store.connect())
    try:
        yield store, loop
    finally:
        loop.run_until_complete(store.aclose())
        loop.close()


class Scenario:
    """A store under test and what the test fed it: submission times, durations."""

    def __init__(self, store: Store, loop: asyncio.AbstractEventLoop) -> None:
        self.st, self.loop = store, loop
        self.submitted: dict[str, list[int]] = {t: [] for t in [*SETTINGS, "free"]}
        self.means = {t: DurationMean() for t in SETTINGS}
        self.checked: set[tuple[str, int | None]] = set()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def server_ms(self) -> int:
        sec, usec = self.run(self.st.client.time())
        return int(sec) * 1000 + int(usec) // 1000

    def enqueue(self, tenant: str, count: int) -> None:
        jobs = [_job(f"{tenant}{i}", tenant) for i in range(count)]
        assert [c for _, c in self.run(self.st.enqueue(LANE, jobs))] == [1] * count
        enq = self.run(self.st.job_fields(jobs[0].id, "enq"))[0]
        assert enq is not None
        self.submitted[tenant] += [int(enq)] * count

    def settled(self, outcomes: list[Outcome]) -> None:
        """Feed the acked attempts' durations to the means, as the store does."""
        for job in outcomes:
            start, fin = self.run(self.st.job_fields(job.id, "start", "fin"))
            assert start is not None and fin is not None
            tenant = job.id.rstrip("0123456789")
            if tenant in self.means:
                self.means[tenant].observe(max(0, int(fin) - int(start)) / 1000)

    def check(self) -> None:
        lane = self.run(self.st.lane_state(LANE))
        for tenant in [*SETTINGS, "free"]:
            before = self.server_ms()
            sig = self.run(self.st.tenant_limit_now(LANE, tenant))
            after = self.server_ms()
            assert sig.capacity == lane.capacity
            assert sig.load == sum(lane.in_flight.values()) + sum(lane.waiting.values())
            if tenant not in SETTINGS:
                assert sig.limit is None
                continue
            expected = tenant_limit(
                SETTINGS[tenant],
                sig.rate_per_min,
                sig.mean_duration_s,
                sig.capacity,
                sig.load,
                f_min=F_MIN,
                f_max=F_MAX,
            )
            assert sig.limit == expected, (tenant, sig)
            self.checked.add((tenant, sig.limit))
            assert sig.mean_duration_s == pytest.approx(self.means[tenant].value(), rel=1e-12)
            rates = []
            for now in range(before, after + 1):
                window = RateWindow(RATE_BUCKETS, RATE_WIDTH_MS)
                for at in self.submitted[tenant]:
                    window.add(at)
                rates.append(window.per_minute(now))
            assert any(sig.rate_per_min == pytest.approx(r, rel=1e-12) for r in rates)


@pytest.mark.contract
def test_lua_tenant_ceiling_is_the_policys(
    store: tuple[Store, asyncio.AbstractEventLoop],
) -> None:
    sc = Scenario(*store)
    for tenant, limits in SETTINGS.items():
        sc.run(sc.st.configure_tenant_limits(tenant, limits))
    sc.check()  # no signals yet
    for tenant, count in [("bursty", 6), ("capped", 9), ("static", 3), ("steady", 2), ("free", 4)]:
        sc.enqueue(tenant, count)
        sc.check()
    # a worker of 4 slots: C = 4 against a load of all those jobs (pressure: factor < 1)
    held = sc.run(sc.st.exchange("w", [LANE], 4, 60_000, slots=4)).jobs
    sc.check()
    for _ in range(6):  # ack what runs, take more: durations feed the means
        time.sleep(0.01)
        outcomes = [Outcome(j.id, j.token, "ok", "1") for j in held]
        held = sc.run(sc.st.exchange("w", [LANE], 4, 60_000, outcomes, slots=4)).jobs
        sc.settled(outcomes)
        sc.check()
    # a long mean duration makes Little's law earn more than the floor (the signals are
    # the store's: set one directly, as many long jobs would)
    sig_key = sc.st.keys.prefix + "sig:capped"
    sc.run(sc.st.client.hset(sig_key, mapping={"dm": "90.5", "dn": "7"}))
    sc.means["capped"] = DurationMean()
    sc.means["capped"].observe(90.5)
    sc.check()
    # the pool drains: the factor stretches towards F_MAX
    outcomes = [Outcome(j.id, j.token, "ok", "1") for j in held]
    sc.run(sc.st.ack([LANE], outcomes))
    sc.settled(outcomes)
    sc.check()
    limits = {limit for _, limit in sc.checked}
    assert len(limits) >= 3, f"the scenario reaches too few limits: {sorted(sc.checked)}"
